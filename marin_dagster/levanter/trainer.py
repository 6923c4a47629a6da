"""The training loop: `train(config, output_path)` and its configs and result.

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
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marin_dagster import fs
from marin_dagster.levanter.checkpoint import Checkpointer
from marin_dagster.levanter.config import LlamaConfig
from marin_dagster.levanter.data import (
    EvalSet,
    MixtureDataset,
    TrainInputError,
    eval_batches,
    open_eval_sets,
)
from marin_dagster.levanter.mesh import (
    PARALLELISMS,
    Parallelism,
    batch_sharding,
    make_mesh,
    replicated,
    state_shardings,
)
from marin_dagster.levanter.metrics import (
    MFU_FORMULA,
    MetricsLog,
    peak_flops,
    training_flops_per_token,
)
from marin_dagster.levanter.model import REMAT_POLICIES, Params, init_params, loss_fn, token_losses
from marin_dagster.levanter.optim import AdamConfig
from marin_dagster.levanter.plot import loss_curve_png
from marin_dagster.levanter.sample import generate

logger = logging.getLogger(__name__)

COMPUTE_DTYPES = ("float32", "bfloat16")


class TrainingDivergedError(RuntimeError):
    """The loss or gradient norm became NaN or infinite."""


@dataclass(frozen=True)
class TrainLmConfig:
    """What is trained: everything here changes the result (and so the version)."""

    model: LlamaConfig
    datasets: Mapping[str, float]  # token cache path -> mixture weight
    optimizer: AdamConfig = field(default_factory=AdamConfig)
    batch_size: int = 8
    seq_len: int | None = None  # default: model.seq_len
    num_train_steps: int = 100
    seed: int = 0
    # Validation sets {name: cache path}, read from `validation_split`. None: the
    # validation split of every training dataset that has one.
    validation: Mapping[str, str] | None = None
    validation_split: str = "validation"
    train_split: str = "train"
    steps_per_eval: int | None = None  # None: only at the end
    max_eval_batches: int | None = 16
    # The tokenizer's vocabulary size; sets model.vocab_size when that is unset.
    tokenizer_vocab_size: int | None = None
    # Checkpoint policy; None takes TrainerSettings' values.
    checkpoint_every: int | None = None
    keep: int | None = None
    data_block_size: int = 2048

    @property
    def train_seq_len(self) -> int:
        return self.seq_len if self.seq_len is not None else self.model.seq_len

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["datasets"] = dict(self.datasets)
        d["validation"] = None if self.validation is None else dict(self.validation)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainLmConfig:
        d = dict(d)
        d["model"] = LlamaConfig.from_dict(d["model"])
        d["optimizer"] = AdamConfig.from_dict(d["optimizer"])
        return cls(**d)


@dataclass(frozen=True)
class TrainerSettings:
    """How it runs (LevanterResource builds these): precision, devices, checkpoints, logging."""

    compute_dtype: str = "float32"
    num_devices: int | None = None  # None: all local devices
    parallelism: Parallelism = "data_parallel"
    remat: str = "dots"  # activation memory: model.REMAT_POLICIES (dots: fastest measured, docs/benchmarks.md)
    # None: every tenth of the run (num_train_steps / 10, rounded up), so a killed run loses at
    # most a tenth of its work however short it is; the minutes bound long runs.
    checkpoint_every_steps: int | None = None
    checkpoint_every_minutes: float | None = 10.0
    keep: int | None = 2
    log_every: int = 10
    peak_flops_per_device: float | None = None  # None: known accelerators, or a CPU estimate
    sample_tokens: int = 64
    sample_temperature: float = 0.8

    def __post_init__(self) -> None:
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {self.compute_dtype!r}")
        if self.parallelism not in PARALLELISMS:
            raise ValueError(f"parallelism must be one of {PARALLELISMS}, got {self.parallelism!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps < 1:
            raise ValueError(f"checkpoint_every_steps must be positive or None, got {self.checkpoint_every_steps}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")


@dataclass
class EvalResult:
    name: str
    loss: float
    perplexity: float
    bits_per_byte: float | None
    num_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
def _compiled(model: LlamaConfig, optimizer: AdamConfig, num_train_steps: int, dtype_name: str,
              mesh: jax.sharding.Mesh, parallelism: str, remat: str = "none"):
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
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], tokens, model, dtype, remat=remat)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "learning_rate": schedule(state["step"])}
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

    def eval_step(params: Params, tokens: jax.Array, row_mask: jax.Array):
        losses = token_losses(params, tokens, model, dtype)
        weights = jnp.broadcast_to(row_mask[:, None], losses.shape)
        return jnp.sum(losses * weights), jnp.sum(weights)

    return {
        "init": jax.jit(init_state, out_shardings=shardings),
        "train_step": jax.jit(train_step, in_shardings=(shardings, tokens_sharding),
                              out_shardings=(shardings, rep), donate_argnums=0),
        "eval_step": jax.jit(eval_step, in_shardings=(shardings["params"], tokens_sharding, rep),
                             out_shardings=(rep, rep)),
        "shardings": shardings,
        "tokens_sharding": tokens_sharding,
    }


# --- validation before any compute ----------------------------------------------------------

def resolve_model(config: TrainLmConfig) -> LlamaConfig:
    model = config.model
    if config.tokenizer_vocab_size is not None:
        if model.vocab_size is None:
            model = model.with_vocab(config.tokenizer_vocab_size)
        elif model.vocab_size != config.tokenizer_vocab_size:
            raise TrainInputError(
                f"model.vocab_size is {model.vocab_size} but the tokenizer has "
                f"{config.tokenizer_vocab_size} tokens (tokenizer_vocab_size): they must match; "
                "leave model.vocab_size unset to take it from the tokenizer")
    if model.vocab_size is None:
        raise TrainInputError("model.vocab_size is unset: pass tokenizer_vocab_size (the tokenizer's vocabulary size)")
    return model


def validate(config: TrainLmConfig, settings: TrainerSettings, n_devices: int) -> None:
    seq_len = config.train_seq_len
    if seq_len < 2:
        raise TrainInputError(f"seq_len must be at least 2 (a token and its target), got {seq_len}")
    if seq_len > config.model.seq_len:
        raise TrainInputError(
            f"seq_len={seq_len} is above the model's maximum (model.seq_len={config.model.seq_len}); "
            "lower seq_len or use a model config with a longer seq_len")
    for name in ("batch_size", "num_train_steps"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise TrainInputError(f"{name} must be a positive integer, got {value!r}")
    if config.batch_size % n_devices:
        raise TrainInputError(
            f"batch_size={config.batch_size} is not divisible by the {n_devices} devices of the mesh; "
            "use a multiple of the device count")
    if config.steps_per_eval is not None and config.steps_per_eval < 1:
        raise TrainInputError(f"steps_per_eval must be positive or None, got {config.steps_per_eval}")


def _check_tokens(batch: np.ndarray, vocab_size: int, where: str) -> None:
    top = int(batch.max())
    if top >= vocab_size:
        raise TrainInputError(
            f"{where}: token id {top} is outside the model's vocabulary (model.vocab_size={vocab_size}); "
            "the cache was built with a different tokenizer than the model's vocab_size says")


def with_split(datasets: Mapping[str, str], split: str) -> dict[str, str]:
    """The datasets ({name: cache path}) whose cache holds `split`."""
    return {name: path for name, path in datasets.items()
            if fs.exists(fs.join(fs.normalize(path), split, "shard_ledger.json"))}


def default_validation(config: TrainLmConfig) -> dict[str, str]:
    """Each training dataset's validation split, named by its cache folder."""
    named: dict[str, str] = {}
    for path in config.datasets:
        base = fs.basename(path)
        named[base if base not in named else f"{base}-{len(named)}"] = path
    return with_split(named, config.validation_split)


# --- helpers --------------------------------------------------------------------------------

def flatten_params(params: Params) -> dict[str, np.ndarray]:
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        flat["/".join(str(getattr(k, "key", k)) for k in path)] = np.asarray(jax.device_get(leaf))
    return flat


def unflatten_params(flat: Mapping[str, np.ndarray]) -> Params:
    params: dict[str, Any] = {}
    for key, value in flat.items():
        node = params
        parts = key.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = jnp.asarray(value)
    return params


def save_params(path: str, params: Params) -> None:
    buf = io.BytesIO()
    np.savez(buf, **flatten_params(params))
    fs.write_bytes(path, buf.getvalue())


def load_params(path: str) -> Params:
    with np.load(io.BytesIO(fs.read_bytes(path))) as z:
        return unflatten_params({k: z[k] for k in z.files})


def run_eval(eval_step: Callable, params: Params, eval_sets: list[EvalSet], seq_len: int,
             batch_size: int, max_batches: int | None, tokens_sharding: Any,
             vocab_size: int) -> dict[str, EvalResult]:
    results = {}
    for es in eval_sets:
        total, count = 0.0, 0.0
        for tokens, mask in eval_batches(es, seq_len, batch_size, max_batches):
            _check_tokens(tokens, vocab_size, f"validation[{es.name!r}]")
            s, c = eval_step(params, jax.device_put(tokens, tokens_sharding), jnp.asarray(mask))
            total += float(s)
            count += float(c)
        loss = total / count
        bpb = None if es.bytes_per_token is None else loss / math.log(2) / es.bytes_per_token
        results[es.name] = EvalResult(es.name, loss, math.exp(min(loss, 700.0)), bpb, int(count))
    return results


def _mean_eval_loss(results: Mapping[str, EvalResult]) -> float | None:
    n = sum(r.num_tokens for r in results.values())
    return None if not n else sum(r.loss * r.num_tokens for r in results.values()) / n


# --- the loop -------------------------------------------------------------------------------

def checkpoint_interval(config: TrainLmConfig, settings: TrainerSettings) -> int:
    """Steps between checkpoints: the config's, else the settings', else a tenth of the run."""
    for every in (config.checkpoint_every, settings.checkpoint_every_steps):
        if every is not None:
            return every
    return max(1, math.ceil(config.num_train_steps / 10))


def train(config: TrainLmConfig, output_path: str, *, settings: TrainerSettings | None = None,
          on_metrics: Callable[[dict[str, Any]], None] | None = None,
          decode: Callable[[list[int]], str] | None = None,
          sample_prompt: list[int] | None = None,
          log: logging.Logger | Any = None) -> TrainResult:
    """Train (or resume training) the model of `config`; outputs under `output_path`.

    `on_metrics` receives each logged row (every `settings.log_every` steps, and
    eval rows). `decode` turns token ids into text for the sample generated at the
    end (from `sample_prompt`, default the EOS token). `log` (default this module's
    logger) hears what the run does besides metrics, such as resuming.
    """
    log = log or logger
    settings = settings or TrainerSettings()
    output_path = fs.normalize(output_path)
    mesh = make_mesh(settings.num_devices)
    n_devices = mesh.devices.size
    validate(config, settings, n_devices)
    model = resolve_model(config)
    seq_len, batch_size = config.train_seq_len, config.batch_size
    data = MixtureDataset(config.datasets, seq_len, config.seed, split=config.train_split,
                          block_size=config.data_block_size)
    validation = config.validation if config.validation is not None else default_validation(config)
    eval_sets = open_eval_sets(validation, seq_len, config.validation_split)
    first = data.batch(0, batch_size)
    _check_tokens(first, model.vocab_size, "datasets")

    run_config = {"train": config.to_dict(), "model": model.to_dict(),
                  "settings": dataclasses.asdict(settings)}
    config_path = fs.join(output_path, "config.json")
    previous = fs.read_json_or_none(config_path)
    if previous is not None and previous.get("train") != json_roundtrip(run_config["train"]):
        raise TrainInputError(
            f"{config_path} holds a different training config than this run's; a rerun on the same "
            "output_path resumes the same run: use a new output_path for a new config")
    fs.write_json(config_path, run_config)

    compiled = _compiled(model, config.optimizer, config.num_train_steps, settings.compute_dtype,
                         mesh, settings.parallelism, settings.remat)
    train_step, tokens_sharding = compiled["train_step"], compiled["tokens_sharding"]
    flops_per_token = training_flops_per_token(model, seq_len)
    peak = peak_flops(list(mesh.devices.flat), settings.peak_flops_per_device)
    tokens_per_step = batch_size * seq_len

    checkpointer = Checkpointer(
        fs.join(output_path, "checkpoints"),
        keep=config.keep if config.keep is not None else settings.keep,
        every_steps=checkpoint_interval(config, settings),
        every_minutes=settings.checkpoint_every_minutes)
    metrics_log = MetricsLog(fs.join(output_path, "metrics.jsonl"))
    try:
        state = compiled["init"](jax.random.PRNGKey(config.seed))
        start = 0
        latest = checkpointer.latest_step()
        if latest is not None:
            state, _ = checkpointer.restore(latest, state)
            start = int(jax.device_get(state["step"]))
            metrics_log.load_until(start, drop_eval_at_end=start >= config.num_train_steps)
            log.info(f"resumed from step {start} (the checkpoint in {checkpointer.step_path(start)}); "
                     f"{config.num_train_steps - start} of {config.num_train_steps} steps to go")
        resumed_from = start if latest is not None else None

        last_loss = float("nan")
        train_seconds, timed_steps = 0.0, 0
        pending: list[tuple[int, dict[str, Any]]] = []
        interval_start, interval_steps = None, 0
        evals: dict[str, EvalResult] = {}

        for step in range(start, config.num_train_steps):
            batch = first if step == 0 else data.batch(step, batch_size)
            if step:
                _check_tokens(batch, model.vocab_size, f"datasets (batch {step})")
            state, metrics = train_step(state, jax.device_put(batch, tokens_sharding))
            done = step + 1
            pending.append((done, metrics))
            interval_steps += 1
            is_last = done == config.num_train_steps
            is_eval = config.steps_per_eval is not None and done % config.steps_per_eval == 0
            is_ckpt = is_last or checkpointer.should_save(done)
            is_log = is_last or done % settings.log_every == 0 or interval_start is None
            if not (is_log or is_eval or is_ckpt):
                continue
            # A sync point: fetch the pending steps' metrics, check them, log.
            fetched = jax.device_get([m for _, m in pending])
            now = time.perf_counter()
            rate = None
            if interval_start is not None:
                elapsed = now - interval_start
                train_seconds += elapsed
                timed_steps += interval_steps
                rate = interval_steps * tokens_per_step / elapsed if elapsed > 0 else None
            for (s, _), m in zip(pending, fetched, strict=True):
                loss, gnorm = float(m["loss"]), float(m["grad_norm"])
                if not (math.isfinite(loss) and math.isfinite(gnorm)):
                    raise TrainingDivergedError(
                        f"training diverged at step {s}: loss={loss}, grad_norm={gnorm}. The last good "
                        f"checkpoint (step {checkpointer.latest_step()}) is kept in "
                        f"{checkpointer.directory}; lower optimizer.learning_rate or check the data")
                metrics_log.append({"step": s, "loss": loss, "grad_norm": gnorm,
                                    "learning_rate": float(m["learning_rate"]),
                                    "tokens": s * tokens_per_step})
                last_loss = loss
            row = dict(metrics_log.rows[-1])
            if rate is not None:
                row["tokens_per_second"] = rate
                row["mfu"] = rate * flops_per_token / peak
                metrics_log.rows[-1] = row
            pending = []
            if is_log:
                logger.info("step %d/%d loss %.4f lr %.3g grad_norm %.3f%s", done, config.num_train_steps,
                            row["loss"], row["learning_rate"], row["grad_norm"],
                            "" if rate is None else f" tokens/s {rate:.0f} MFU {row['mfu']:.2%}")
                if on_metrics is not None:
                    on_metrics(row)
            if is_eval and eval_sets and not is_last:
                evals = run_eval(compiled["eval_step"], state["params"], eval_sets, seq_len, batch_size,
                                 config.max_eval_batches, tokens_sharding, model.vocab_size)
                _log_eval(evals, done, metrics_log, on_metrics)
            if is_ckpt:
                checkpointer.save(done, state, {"step": done, "loss": last_loss})
                metrics_log.flush()
            interval_start, interval_steps = time.perf_counter(), 0

        checkpointer.wait()
        final_step = int(jax.device_get(state["step"]))
        if eval_sets:
            evals = run_eval(compiled["eval_step"], state["params"], eval_sets, seq_len, batch_size,
                             config.max_eval_batches, tokens_sharding, model.vocab_size)
            _log_eval(evals, final_step, metrics_log, on_metrics)
        metrics_log.flush()

        train_rows = [r for r in metrics_log.rows if "loss" in r]
        if not math.isfinite(last_loss) and train_rows:
            last_loss = train_rows[-1]["loss"]
        rates = [r["tokens_per_second"] for r in train_rows if "tokens_per_second" in r]
        tokens_per_second = (timed_steps * tokens_per_step / train_seconds if train_seconds > 0
                             else (float(np.mean(rates)) if rates else None))
        params_path = fs.join(output_path, "params.npz")
        save_params(params_path, state["params"])
        fs.write_json(fs.join(output_path, "model_config.json"), model.to_dict())
        curve_path = fs.join(output_path, "loss_curve.png")
        eval_points = [(r["step"], r[k]) for r in metrics_log.rows for k in r
                       if k.startswith("eval/") and k.endswith("/loss")]
        fs.write_bytes(curve_path, loss_curve_png([(r["step"], r["loss"]) for r in train_rows], eval_points))

        prompt = sample_prompt or [data.components[0].cache.eos_id or int(first[0, 0])]
        sample_ids = generate(state["params"], model, prompt, settings.sample_tokens,
                              temperature=settings.sample_temperature, seed=config.seed,
                              compute_dtype=settings.compute_dtype) if settings.sample_tokens else []
        result = TrainResult(
            output_path=output_path, final_step=final_step, final_train_loss=last_loss,
            eval=evals, eval_loss=_mean_eval_loss(evals), tokens_per_second=tokens_per_second,
            mfu=None if tokens_per_second is None else tokens_per_second * flops_per_token / peak,
            total_tokens=final_step * tokens_per_step, num_parameters=model.num_parameters(),
            flops_per_token=flops_per_token, peak_flops=peak, resumed_from_step=resumed_from,
            sample_text=None if decode is None or not sample_ids else decode(prompt + sample_ids), sample_ids=sample_ids,
            params_path=params_path, metrics_path=metrics_log.path, loss_curve_path=curve_path,
            checkpoint_path=checkpointer.step_path(final_step), num_devices=n_devices)
        fs.write_json(fs.join(output_path, "train_result.json"), result.to_dict())
        return result
    finally:
        checkpointer.close()


def json_roundtrip(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True))


def _log_eval(evals: Mapping[str, EvalResult], step: int, metrics_log: MetricsLog,
              on_metrics: Callable[[dict[str, Any]], None] | None) -> None:
    row: dict[str, Any] = {"step": step}
    for name, r in evals.items():
        row[f"eval/{name}/loss"] = r.loss
        row[f"eval/{name}/perplexity"] = r.perplexity
        if r.bits_per_byte is not None:
            row[f"eval/{name}/bpb"] = r.bits_per_byte
        logger.info("step %d eval %s: loss %.4f perplexity %.2f%s", step, name, r.loss, r.perplexity,
                    "" if r.bits_per_byte is None else f" bpb {r.bits_per_byte:.4f}")
    metrics_log.append(row)
    if on_metrics is not None:
        on_metrics(row)
