"""The training loop: `train(config, output_path)` and its result.

Output layout at `output_path`:
    config.json          the TrainLmConfig (and settings) this run was started with
    checkpoints/{step}/  orbax checkpoints (train state + metadata), the latest `keep`
    metrics.jsonl        one row per step: step, loss, learning_rate, grad_norm,
                         and at log points tokens_per_second, mfu; eval rows
    params.npz           final parameters ("layers/q_proj", ...), float32
    model_config.json    the LlamaConfig of params.npz
    loss_curve.png       train loss (line) and eval loss (dots)
    train_result.json    the TrainResult, written last: its presence means done

Rerunning `train` on the same `output_path` resumes from the latest checkpoint:
batch `step` is a pure function of the config (see data.py), the step function
is deterministic, so a resumed run ends with the same parameters as one that was
never interrupted (bitwise on CPU).

Multi-host (`distributed.py`): every process runs `train` (process 0 with the caller's config,
the others with what it publishes); the mesh spans all their devices, each process reads only
its rows of each batch, all take part in checkpoints, and process 0 alone logs and writes the
files above, after every process has finished its steps and checkpoints.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marin_dagster import fs
from marin_dagster.levanter import distributed
from marin_dagster.levanter.checkpoint import Checkpointer, save_params
from marin_dagster.levanter.config import LlamaConfig, TrainerSettings, TrainLmConfig
from marin_dagster.levanter.data import (
    EvalSet,
    MixtureDataset,
    TrainInputError,
    check_token_ids,
    open_eval_sets,
)
from marin_dagster.levanter.evaluation import EvalResult, mean_eval_loss, run_eval
from marin_dagster.levanter.mesh import (
    batch_sharding,
    global_batch,
    make_mesh,
    process_rows,
    replicated,
    state_shardings,
)
from marin_dagster.levanter.metrics import (
    MFU_FORMULA,
    MetricsLog,
    peak_flops,
    training_flops_per_token,
)
from marin_dagster.levanter.model import Params, init_params, loss_fn, token_losses
from marin_dagster.levanter.optim import AdamConfig
from marin_dagster.levanter.plot import loss_curve_png
from marin_dagster.levanter.sample import generate

logger = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """The loss or gradient norm became NaN or infinite."""


@dataclass
class TrainResult:
    output_path: str
    final_step: int
    final_train_loss: float
    eval: dict[str, EvalResult]
    eval_loss: float | None
    tokens_per_second: float | None
    mfu: float | None
    total_tokens: int
    num_parameters: int
    flops_per_token: float
    peak_flops: float
    resumed_from_step: int | None
    sample_text: str | None
    sample_ids: list[int]
    params_path: str
    metrics_path: str
    loss_curve_path: str
    checkpoint_path: str
    num_devices: int = 1
    mfu_formula: str = MFU_FORMULA

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["eval"] = {k: v.to_dict() for k, v in self.eval.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainResult:
        d = dict(d)
        d["eval"] = {k: EvalResult(**v) for k, v in d["eval"].items()}
        return cls(**d)


# --- the compiled pieces, cached so several runs in one process compile once ---------------


@functools.lru_cache(maxsize=16)
def _compiled(
    model: LlamaConfig,
    optimizer: AdamConfig,
    num_train_steps: int,
    dtype_name: str,
    mesh: jax.sharding.Mesh,
    parallelism: str,
    remat: str = "none",
    z_loss_weight: float = 0.0,
):
    dtype = jnp.dtype(dtype_name)
    tx = optimizer.build(num_train_steps)
    schedule = optimizer.lr_scheduler(num_train_steps)

    def init_state(key: jax.Array) -> dict[str, Any]:
        params = init_params(model, key)
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    abstract = jax.eval_shape(init_state, jax.random.PRNGKey(0))
    shardings = state_shardings(abstract, mesh, parallelism)
    rep = replicated(mesh)
    tokens_sharding = batch_sharding(mesh)

    def train_step(state: dict[str, Any], tokens: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(
            state["params"], tokens, model, dtype, remat=remat, z_loss_weight=z_loss_weight
        )
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": schedule(state["step"]),
        }
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

    def eval_step(params: Params, tokens: jax.Array, row_mask: jax.Array):
        losses = token_losses(params, tokens, model, dtype)
        weights = jnp.broadcast_to(row_mask[:, None], losses.shape)
        return jnp.sum(losses * weights), jnp.sum(weights)

    return {
        "init": jax.jit(init_state, out_shardings=shardings),
        "train_step": jax.jit(
            train_step,
            in_shardings=(shardings, tokens_sharding),
            out_shardings=(shardings, rep),
            donate_argnums=0,
        ),
        "eval_step": jax.jit(
            eval_step,
            in_shardings=(shardings["params"], tokens_sharding, rep),
            out_shardings=(rep, rep),
        ),
        "shardings": shardings,
        "tokens_sharding": tokens_sharding,
    }


# --- set-up: everything that can be wrong fails before any compute ---------------------------


def resolve_model(config: TrainLmConfig) -> LlamaConfig:
    model = config.model
    if config.tokenizer_vocab_size is not None:
        if model.vocab_size is None:
            model = model.with_vocab(config.tokenizer_vocab_size)
        elif model.vocab_size < config.tokenizer_vocab_size:
            # Larger is padding, as Levanter rounds its vocabulary axis up and Hugging Face
            # models ship it (Qwen's 151,936 rows for 151,665 tokens): rows never a target.
            raise TrainInputError(
                f"model.vocab_size is {model.vocab_size} but the tokenizer has "
                f"{config.tokenizer_vocab_size} tokens (tokenizer_vocab_size): the model needs "
                "a row for each; leave model.vocab_size unset to take it from the tokenizer, "
                "or give at least as many (more pads the vocabulary)"
            )
    if model.vocab_size is None:
        raise TrainInputError(
            "model.vocab_size is unset: pass tokenizer_vocab_size (the tokenizer's vocabulary size)"
        )
    return model


def with_split(datasets: Mapping[str, str], split: str) -> dict[str, str]:
    """The datasets ({name: cache path}) whose cache holds `split`."""
    return {
        name: path
        for name, path in datasets.items()
        if fs.exists(fs.join(fs.normalize(path), split, "shard_ledger.json"))
    }


def default_validation(config: TrainLmConfig) -> dict[str, str]:
    """Each training dataset's validation split, named by its cache folder."""
    named: dict[str, str] = {}
    for path in config.datasets:
        base = fs.basename(path)
        named[base if base not in named else f"{base}-{len(named)}"] = path
    return with_split(named, config.validation_split)


def checkpoint_interval(config: TrainLmConfig, settings: TrainerSettings) -> int:
    """Steps between checkpoints: the config's, else the settings', else a tenth of the run."""
    for every in (config.checkpoint_every_steps, settings.checkpoint_every_steps):
        if every is not None:
            return every
    return max(1, math.ceil(config.num_train_steps / 10))


def _record_config(
    output_path: str, config: TrainLmConfig, model: LlamaConfig, settings: TrainerSettings
) -> None:
    """Write config.json; a rerun on the same output must train the same thing (its checkpoint
    policy may differ)."""
    path = fs.join(output_path, "config.json")
    previous = fs.read_json_or_none(path)
    if (
        previous is not None
        and TrainLmConfig.from_dict(previous["train"]).result_fields() != config.result_fields()
    ):
        raise TrainInputError(
            f"{path} holds a different training config than this run's; a rerun on the same "
            "output_path resumes the same run: use a new output_path for a new config"
        )
    fs.write_json(
        path,
        {
            "train": config.to_dict(),
            "model": model.to_dict(),
            "settings": dataclasses.asdict(settings),
        },
    )


@dataclass
class _Run:
    """What the loop and the end of the run share: set up once, read only."""

    config: TrainLmConfig
    settings: TrainerSettings
    model: LlamaConfig
    output_path: str
    data: MixtureDataset
    first_batch: np.ndarray
    eval_sets: list[EvalSet]
    compiled: dict[str, Any]
    n_devices: int
    flops_per_token: float
    peak_flops: float
    # This process's rows [start, stop) of each batch (all of them in a single process).
    rows: tuple[int, int]
    leader: bool = True
    # Source bytes per token id, for exact bits per byte (evaluate.run_eval); None: averages.
    token_bytes: np.ndarray | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.config.train_seq_len

    def batch(self, step: int) -> np.ndarray:
        """This process's rows of batch `step`."""
        if step == 0:
            return self.first_batch
        size = self.config.batch_size
        if self.rows == (0, size):
            return self.data.batch(step, size)
        return self.data.examples(step * size + np.arange(*self.rows, dtype=np.int64))

    def evaluate(self, params: Params) -> dict[str, EvalResult]:
        return run_eval(
            self.compiled["eval_step"],
            params,
            self.eval_sets,
            self.config.train_seq_len,
            self.config.batch_size,
            self.config.max_eval_batches,
            self.compiled["tokens_sharding"],
            self.model.vocab_size,
            self.token_bytes,
        )


def _set_up(config: TrainLmConfig, settings: TrainerSettings, output_path: str) -> _Run:
    mesh = make_mesh(settings.num_devices)
    n_devices = mesh.devices.size
    if config.batch_size % n_devices:
        raise TrainInputError(
            f"batch_size={config.batch_size} is not divisible by the {n_devices} devices of the mesh; "
            "use a multiple of the device count"
        )
    model = resolve_model(config)
    seq_len = config.train_seq_len
    data = MixtureDataset(
        config.datasets,
        seq_len,
        config.seed,
        split=config.train_split,
        block_size=config.data_block_size,
    )
    validation = config.validation if config.validation is not None else default_validation(config)
    eval_sets = open_eval_sets(validation, seq_len, config.validation_split)
    rows = process_rows(batch_sharding(mesh), config.batch_size)
    first = data.examples(np.arange(*rows, dtype=np.int64))
    check_token_ids(first, model.vocab_size, "datasets")
    leader = distributed.is_leader()
    if leader:
        _record_config(output_path, config, model, settings)
    compiled = _compiled(
        model,
        config.optimizer,
        config.num_train_steps,
        config.compute_dtype,
        mesh,
        settings.parallelism,
        settings.remat,
        config.z_loss_weight or 0.0,
    )
    return _Run(
        config,
        settings,
        model,
        output_path,
        data,
        first,
        eval_sets,
        compiled,
        n_devices,
        training_flops_per_token(model, seq_len),
        peak_flops(list(mesh.devices.flat), settings.peak_flops_per_device),
        rows,
        leader,
    )


@dataclass
class _Clock:
    """Training time between sync points; the first interval (compilation) is not counted."""

    started: float | None = None
    steps: int = 0
    seconds: float = 0.0
    timed_steps: int = 0

    def lap(self, tokens_per_step: int) -> float | None:
        """Tokens per second since the last restart; None for the first interval."""
        if self.started is None:
            return None
        elapsed = time.perf_counter() - self.started
        self.seconds += elapsed
        self.timed_steps += self.steps
        return self.steps * tokens_per_step / elapsed if elapsed > 0 else None

    def restart(self) -> None:
        self.started, self.steps = time.perf_counter(), 0


# --- the loop -------------------------------------------------------------------------------


def train(
    config: TrainLmConfig,
    output_path: str,
    *,
    settings: TrainerSettings | None = None,
    on_metrics: Callable[[dict[str, Any]], None] | None = None,
    decode: Callable[[list[int]], str] | None = None,
    sample_prompt: list[int] | None = None,
    log: logging.Logger | Any = None,
    token_bytes: np.ndarray | None = None,
) -> TrainResult:
    """Train (or resume training) the model of `config`; outputs under `output_path`.

    `on_metrics` receives each logged row (every `settings.log_every` steps, and
    eval rows). `decode` turns token ids into text for the sample generated at the
    end (from `sample_prompt`, default the EOS token). `log` (default this module's
    logger) hears what the run does besides metrics, such as resuming. `token_bytes` (source
    bytes per token id) makes the evals' bits per byte count the bytes of the tokens scored.
    """
    log = log or logger
    settings = settings or TrainerSettings()
    output_path = fs.normalize(output_path)
    topology = distributed.initialize_from_env()
    if topology.multi_process:
        if topology.is_leader:
            distributed.publish_job(
                {
                    "config": config.to_dict(),
                    "output_path": output_path,
                    "settings": dataclasses.asdict(settings),
                }
            )
        else:  # process 0 alone logs and reports
            on_metrics = None
    run = dataclasses.replace(_set_up(config, settings, output_path), token_bytes=token_bytes)
    sequences = sum(c.num_sequences for c in run.data.components)
    if run.leader and config.batch_size > sequences:
        log.warning(
            f"batch_size={config.batch_size} is more than the {sequences:,} sequences of "
            f"seq_len={config.train_seq_len} the training data holds: each batch repeats the "
            f"data {config.batch_size / sequences:.1f} times. Lower batch_size, or add data"
        )
    train_step, tokens_sharding = run.compiled["train_step"], run.compiled["tokens_sharding"]
    checkpointer = Checkpointer(
        fs.join(run.output_path, "checkpoints"),
        keep=config.keep if config.keep is not None else settings.keep,
        checkpoint_every_steps=checkpoint_interval(config, settings),
        checkpoint_every_minutes=settings.checkpoint_every_minutes,
    )
    metrics_log = MetricsLog(fs.join(run.output_path, "metrics.jsonl"))
    try:
        # Start, or resume from the latest checkpoint.
        state = run.compiled["init"](jax.random.PRNGKey(config.seed))
        resumed_from = None
        if (latest := checkpointer.latest_step()) is not None:
            state, _ = checkpointer.restore(latest, state)
            resumed_from = int(jax.device_get(state["step"]))
            metrics_log.load_until(
                resumed_from, drop_eval_at_end=resumed_from >= config.num_train_steps
            )
            if run.leader:
                log.info(
                    f"resumed from step {resumed_from} (the checkpoint in "
                    f"{checkpointer.step_path(resumed_from)}); "
                    f"{config.num_train_steps - resumed_from} of {config.num_train_steps} "
                    "steps to go"
                )

        # One step per batch. Metrics stay on the device until a sync point (a log, eval or
        # checkpoint step), so the host does not wait for the device in between.
        clock, pending = _Clock(), []
        for step in range(resumed_from or 0, config.num_train_steps):
            batch = run.batch(step)
            if step:
                check_token_ids(batch, run.model.vocab_size, f"datasets (batch {step})")
            state, metrics = train_step(
                state, global_batch(batch, tokens_sharding, config.batch_size)
            )
            done = step + 1
            pending.append((done, metrics))
            clock.steps += 1
            is_last = done == config.num_train_steps
            is_eval = config.steps_per_eval is not None and done % config.steps_per_eval == 0
            is_ckpt = is_last or checkpointer.should_save(done)
            is_log = is_last or done % settings.log_every == 0 or clock.started is None
            if not (is_log or is_eval or is_ckpt):
                continue

            # A sync point: fetch the pending steps' metrics (which waits for the device, so the
            # lap times the steps, not their dispatch), check them, log.
            row = _record_metrics(pending, metrics_log, checkpointer, run.tokens_per_step)
            rate = clock.lap(run.tokens_per_step)
            pending = []
            if rate is not None:
                row.update(tokens_per_second=rate, mfu=rate * run.flops_per_token / run.peak_flops)
                metrics_log.rows[-1] = row
            if is_log and run.leader:
                logger.info(
                    "step %d/%d loss %.4f lr %.3g grad_norm %.3f%s",
                    done,
                    config.num_train_steps,
                    row["loss"],
                    row["learning_rate"],
                    row["grad_norm"],
                    "" if rate is None else f" tokens/s {rate:.0f} MFU {row['mfu']:.2%}",
                )
                if on_metrics is not None:
                    on_metrics(row)
            if is_eval and run.eval_sets and not is_last:
                evals = run.evaluate(state["params"])
                _log_eval(evals, done, metrics_log, on_metrics, run.leader)
            if is_ckpt:
                checkpointer.save(done, state, {"step": done, "loss": row["loss"]})
                if run.leader:
                    metrics_log.flush()
            clock.restart()

        checkpointer.wait()
        # Every process's steps and checkpoints are done before process 0 writes the end.
        distributed.barrier("marin-levanter-train-steps-done")
        return _finish(
            run,
            state,
            metrics_log,
            checkpointer,
            clock,
            resumed_from,
            on_metrics,
            decode,
            sample_prompt,
        )
    except Exception as e:
        if topology.multi_process:
            distributed.leave_if_peer_lost(e)
        raise
    finally:
        checkpointer.close()


def _record_metrics(
    pending: list[tuple[int, dict[str, Any]]],
    metrics_log: MetricsLog,
    checkpointer: Checkpointer,
    tokens_per_step: int,
) -> dict[str, Any]:
    """Fetch the pending steps' metrics into the log; stop on a NaN or infinite one. Returns the
    last step's row."""
    fetched = jax.device_get([m for _, m in pending])
    for (step, _), m in zip(pending, fetched, strict=True):
        loss, gnorm = float(m["loss"]), float(m["grad_norm"])
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            raise TrainingDivergedError(
                f"training diverged at step {step}: loss={loss}, grad_norm={gnorm}. The last good "
                f"checkpoint (step {checkpointer.latest_step()}) is kept in "
                f"{checkpointer.directory}; lower optimizer.learning_rate or check the data"
            )
        metrics_log.append(
            {
                "step": step,
                "loss": loss,
                "grad_norm": gnorm,
                "learning_rate": float(m["learning_rate"]),
                "tokens": step * tokens_per_step,
            }
        )
    return dict(metrics_log.rows[-1])


def _log_eval(
    evals: Mapping[str, EvalResult],
    step: int,
    metrics_log: MetricsLog,
    on_metrics: Callable[[dict[str, Any]], None] | None,
    leader: bool = True,
) -> None:
    row: dict[str, Any] = {"step": step}
    for name, r in evals.items():
        row[f"eval/{name}/loss"] = r.loss
        row[f"eval/{name}/perplexity"] = r.perplexity
        if r.bits_per_byte is not None:
            row[f"eval/{name}/bpb"] = r.bits_per_byte
        if not leader:
            continue
        logger.info(
            "step %d eval %s: loss %.4f perplexity %.2f%s",
            step,
            name,
            r.loss,
            r.perplexity,
            "" if r.bits_per_byte is None else f" bpb {r.bits_per_byte:.4f}",
        )
    metrics_log.append(row)
    if on_metrics is not None:
        on_metrics(row)


# --- the end of the run ---------------------------------------------------------------------


def _finish(
    run: _Run,
    state: dict[str, Any],
    metrics_log: MetricsLog,
    checkpointer: Checkpointer,
    clock: _Clock,
    resumed_from: int | None,
    on_metrics: Callable[[dict[str, Any]], None] | None,
    decode: Callable[[list[int]], str] | None,
    sample_prompt: list[int] | None,
) -> TrainResult:
    """Final eval, parameters, loss curve and sample; the TrainResult written last."""
    final_step = int(jax.device_get(state["step"]))
    evals: dict[str, EvalResult] = {}
    if run.eval_sets:
        evals = run.evaluate(state["params"])
        _log_eval(evals, final_step, metrics_log, on_metrics, run.leader)
    # Several processes: the FSDP-sharded parameters gathered whole on every host (a
    # collective, so all take part); process 0 alone writes.
    params = state["params"] if jax.process_count() == 1 else distributed.allgather(state["params"])
    if not run.leader:
        return _follower_result(run, final_step, evals, resumed_from, checkpointer)
    metrics_log.flush()

    train_rows = [r for r in metrics_log.rows if "loss" in r]
    # A run resumed at its end timed nothing: its rate is that of the rows it logged before.
    rates = [r["tokens_per_second"] for r in train_rows if "tokens_per_second" in r]
    tokens_per_second = (
        clock.timed_steps * run.tokens_per_step / clock.seconds
        if clock.seconds > 0
        else (float(np.mean(rates)) if rates else None)
    )
    out = run.output_path
    params_path = fs.join(out, "params.npz")
    save_params(params_path, params)
    fs.write_json(fs.join(out, "model_config.json"), run.model.to_dict())
    curve_path = fs.join(out, "loss_curve.png")
    eval_points = [
        (r["step"], r[k])
        for r in metrics_log.rows
        for k in r
        if k.startswith("eval/") and k.endswith("/loss")
    ]
    fs.write_bytes(
        curve_path, loss_curve_png([(r["step"], r["loss"]) for r in train_rows], eval_points)
    )

    settings = run.settings
    prompt = sample_prompt or [run.data.components[0].cache.eos_id or int(run.first_batch[0, 0])]
    sample_ids = (
        generate(
            params,
            run.model,
            prompt,
            settings.sample_tokens,
            temperature=settings.sample_temperature,
            seed=run.config.seed,
            compute_dtype=run.config.compute_dtype,
        )
        if settings.sample_tokens
        else []
    )
    result = TrainResult(
        output_path=out,
        final_step=final_step,
        final_train_loss=train_rows[-1]["loss"] if train_rows else float("nan"),
        eval=evals,
        eval_loss=mean_eval_loss(evals),
        tokens_per_second=tokens_per_second,
        mfu=None
        if tokens_per_second is None
        else tokens_per_second * run.flops_per_token / run.peak_flops,
        total_tokens=final_step * run.tokens_per_step,
        num_parameters=run.model.num_parameters(),
        flops_per_token=run.flops_per_token,
        peak_flops=run.peak_flops,
        resumed_from_step=resumed_from,
        sample_text=None if decode is None or not sample_ids else decode(prompt + sample_ids),
        sample_ids=sample_ids,
        params_path=params_path,
        metrics_path=metrics_log.path,
        loss_curve_path=curve_path,
        checkpoint_path=checkpointer.step_path(final_step),
        num_devices=run.n_devices,
    )
    fs.write_json(fs.join(out, "train_result.json"), result.to_dict())
    return result


def _follower_result(
    run: _Run,
    final_step: int,
    evals: dict[str, EvalResult],
    resumed_from: int | None,
    checkpointer: Checkpointer,
) -> TrainResult:
    """What a process other than 0 returns: the run's numbers, nothing written."""
    out = run.output_path
    return TrainResult(
        output_path=out,
        final_step=final_step,
        final_train_loss=float("nan"),
        eval=evals,
        eval_loss=mean_eval_loss(evals),
        tokens_per_second=None,
        mfu=None,
        total_tokens=final_step * run.tokens_per_step,
        num_parameters=run.model.num_parameters(),
        flops_per_token=run.flops_per_token,
        peak_flops=run.peak_flops,
        resumed_from_step=resumed_from,
        sample_text=None,
        sample_ids=[],
        params_path=fs.join(out, "params.npz"),
        metrics_path=fs.join(out, "metrics.jsonl"),
        loss_curve_path=fs.join(out, "loss_curve.png"),
        checkpoint_path=checkpointer.step_path(final_step),
        num_devices=run.n_devices,
    )
