"""train() and evaluate() end to end on real token caches, in this process.

Every run here shares one model/optimizer/step count, so the train step compiles once.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import struct
import time
import zlib

import numpy as np
import pytest

from marin_dagster.levanter import (
    AdamConfig,
    LlamaConfig,
    TrainerSettings,
    TrainingDivergedError,
    TrainInputError,
    TrainLmConfig,
    TrainResult,
    evaluate,
)
from marin_dagster.levanter import train as train_fn
from marin_dagster.levanter.checkpoint import load_params
from marin_dagster.tokenize import TokenCache
from resources.levanter import LevanterResource
from tests.levanter.caches import write_cache

VOCAB = 50
MODEL = LlamaConfig(
    seq_len=32, hidden_dim=32, intermediate_dim=64, num_heads=4, num_kv_heads=2, num_layers=2
)
OPT = AdamConfig(learning_rate=3e-3, warmup=3)
STEPS = 40


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("caches")
    return {
        # A repeating pattern: learnable, so eval loss must fall well below log(VOCAB).
        "pattern": write_cache(
            str(root / "pattern"), VOCAB, 6000, period=7, validation_tokens=1200
        ),
        "noise": write_cache(str(root / "noise"), VOCAB, 3000, seed=5),
    }


def _config(caches: dict[str, str], **kw) -> TrainLmConfig:
    base = dict(
        model=MODEL,
        optimizer=OPT,
        datasets={caches["pattern"]: 1.0, caches["noise"]: 0.25},
        batch_size=4,
        seq_len=16,
        num_train_steps=STEPS,
        tokenizer_vocab_size=VOCAB,
        steps_per_eval=20,
        max_eval_batches=4,
        checkpoint_every_steps=8,
        keep=2,
    )
    base.update(kw)
    return TrainLmConfig(**base)


@pytest.fixture(scope="module")
def run(
    caches: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[TrainResult, list[str]]:
    out = str(tmp_path_factory.mktemp("run") / "out")
    logger = logging.getLogger("tests.levanter.train")
    logger.setLevel(logging.INFO)
    handler = _Records()
    logger.addHandler(handler)
    resource = LevanterResource(log_every=10, checkpoint_every_minutes=None)
    try:
        result = train_fn(
            _config(caches),
            out,
            settings=resource.settings(),
            on_metrics=resource.metrics_logger(logger),
            decode=lambda ids: "|".join(map(str, ids)),
        )
    finally:
        logger.removeHandler(handler)
    return result, handler.messages


def test_outputs_and_learning(run: tuple[TrainResult, list[str]]) -> None:
    result, _ = run
    out = result.output_path
    for name in (
        "config.json",
        "metrics.jsonl",
        "params.npz",
        "model_config.json",
        "loss_curve.png",
        "train_result.json",
    ):
        assert os.path.isfile(os.path.join(out, name)), name
    # keep=2: of the checkpoints every 8 steps, 32 and 40 remain.
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["32", "40"]
    assert result.final_step == STEPS and result.total_tokens == STEPS * 4 * 16
    assert result.eval["pattern"].loss < 0.6 * math.log(VOCAB)
    assert result.eval["pattern"].perplexity == pytest.approx(math.exp(result.eval["pattern"].loss))
    assert result.eval["pattern"].bits_per_byte == pytest.approx(
        result.eval["pattern"].loss / math.log(2) / 3.5, rel=0.05
    )
    assert list(result.eval) == ["pattern"]  # the noise cache has no validation split
    assert result.tokens_per_second > 0 and 0 < result.mfu < 1
    assert (
        result.sample_text is not None and len(result.sample_ids) == MODEL.seq_len - 1
    )  # 64 asked, capped by the window
    assert result.sample_text.split("|")[1:] == [str(i) for i in result.sample_ids]
    assert TrainResult.from_dict(json.load(open(os.path.join(out, "train_result.json")))) == result


def test_metrics_jsonl_and_logger(run: tuple[TrainResult, list[str]]) -> None:
    result, messages = run
    rows = [json.loads(line) for line in open(result.metrics_path)]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, STEPS + 1))
    assert train_rows[0]["learning_rate"] == 0.0 and train_rows[3][
        "learning_rate"
    ] == pytest.approx(3e-3)
    assert all(r["grad_norm"] > 0 for r in train_rows)
    timed = [r for r in train_rows if "tokens_per_second" in r]
    assert [r["step"] for r in timed] == [
        8,
        10,
        16,
        20,
        24,
        30,
        32,
        40,
    ]  # log, checkpoint, eval points
    assert all(0 < r["mfu"] < 1 for r in timed)
    evals = [r for r in rows if "eval/pattern/loss" in r]
    assert [r["step"] for r in evals] == [20, 40]
    assert evals[1]["eval/pattern/loss"] < evals[0]["eval/pattern/loss"]
    assert any(m.startswith("step 10 loss") and "mfu" in m for m in messages)
    assert any("eval/pattern/loss" in m for m in messages)


def test_loss_curve_is_a_png(run: tuple[TrainResult, list[str]]) -> None:
    data = open(run[0].loss_curve_path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    pixels = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, width * 3 + 1)[:, 1:]
    blue = np.all(pixels.reshape(height, width, 3) == (31, 119, 180), axis=-1)
    red = np.all(pixels.reshape(height, width, 3) == (214, 39, 40), axis=-1)
    assert blue.sum() > 100 and red.sum() > 0
    # Loss falls: the line starts high (small row index) on the left and ends lower on the right.
    cols = np.nonzero(blue.any(axis=0))[0]
    first_rows, last_rows = np.nonzero(blue[:, cols[0]])[0], np.nonzero(blue[:, cols[-1]])[0]
    assert first_rows.mean() < last_rows.mean()


def test_evaluate_matches_training_eval(
    run: tuple[TrainResult, list[str]], caches: dict[str, str]
) -> None:
    result, _ = run
    # seq_len unset: the run trained at 16, below MODEL.seq_len (32), and the eval is at 16 too.
    for path, seq_len in itertools.product(
        (result.output_path, result.checkpoint_path), (16, None)
    ):
        got = evaluate(
            path, {"pattern": caches["pattern"]}, seq_len=seq_len, batch_size=4, max_batches=4
        )
        assert got["pattern"].num_tokens == result.eval["pattern"].num_tokens
        assert got["pattern"].loss == pytest.approx(result.eval["pattern"].loss, rel=1e-6)
        assert got["pattern"].bits_per_byte == pytest.approx(
            result.eval["pattern"].bits_per_byte, rel=1e-6
        )
    everything = evaluate(result.output_path, [caches["pattern"]])
    assert everything["pattern"].num_tokens == (1200 // 16) * 15


def test_bits_per_byte_counts_the_bytes_of_the_tokens_scored(
    run: tuple[TrainResult, list[str]], caches: dict[str, str], tmp_path
) -> None:
    result, _ = run
    # Bytes per token id that vary (EOS none), so the first sequences' bytes per token differ
    # from the split's average, which bits per byte used to take whatever was scored.
    token_bytes = np.arange(VOCAB) % 5
    cache = TokenCache.open(caches["pattern"], "validation")
    scored = cache.sequences(np.arange(4 * 4), 16)[:, 1:]  # max_batches=4 of 4 rows
    got = evaluate(
        result.output_path,
        {"pattern": caches["pattern"]},
        batch_size=4,
        max_batches=4,
        token_bytes=token_bytes,
    )["pattern"]
    assert got.num_tokens == scored.size
    expected = got.loss * got.num_tokens / math.log(2) / token_bytes[scored].sum()
    assert got.bits_per_byte == pytest.approx(expected, rel=1e-9)
    # Training's own evals count the same bytes.
    again = train_fn(
        _config(caches),
        str(tmp_path / "out"),
        settings=TrainerSettings(log_every=10, checkpoint_every_minutes=None, sample_tokens=0),
        token_bytes=token_bytes,
    )
    assert again.eval["pattern"].loss == pytest.approx(got.loss, rel=1e-6)
    assert again.eval["pattern"].bits_per_byte == pytest.approx(got.bits_per_byte, rel=1e-6)


def test_rerun_of_a_finished_run_trains_nothing(
    run: tuple[TrainResult, list[str]], caches: dict[str, str]
) -> None:
    result, _ = run
    before = load_params(result.params_path)
    again = train_fn(
        _config(caches),
        result.output_path,
        settings=TrainerSettings(log_every=10, checkpoint_every_minutes=None),
    )
    assert again.resumed_from_step == STEPS and again.final_step == STEPS
    assert again.eval["pattern"].loss == result.eval["pattern"].loss
    after = load_params(again.params_path)
    assert all(np.array_equal(before["layers"][k], after["layers"][k]) for k in before["layers"])
    steps = [json.loads(line)["step"] for line in open(again.metrics_path)]
    assert steps.count(STEPS) == 2  # the last train row and one final eval row, not duplicated


def test_a_changed_config_on_the_same_output_is_refused(
    run: tuple[TrainResult, list[str]], caches: dict[str, str]
) -> None:
    with pytest.raises(TrainInputError, match="different training config"):
        train_fn(_config(caches, seed=1), run[0].output_path)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"seq_len": 64}, r"seq_len=64 is above the model's maximum \(model.seq_len=32\)"),
        (
            {"tokenizer_vocab_size": 60, "model": MODEL.with_vocab(VOCAB)},
            "model.vocab_size is 50 but the tokenizer has 60",
        ),
        (
            {"tokenizer_vocab_size": None, "model": MODEL.with_vocab(20)},
            r"token id \d+ is outside the model's vocabulary",
        ),
        ({"tokenizer_vocab_size": None}, "model.vocab_size is unset"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        (
            {"compute_dtype": "float16"},
            "compute_dtype must be one of float32, bfloat16, got 'float16'",
        ),
    ],
)
def test_bad_input_fails_before_any_compute(
    caches: dict[str, str], tmp_path, overrides, match
) -> None:
    out = tmp_path / "out"
    with pytest.raises(TrainInputError, match=match):
        train_fn(_config(caches, **overrides), str(out))
    assert not (out / "checkpoints").exists()


def test_a_vocabulary_padded_past_the_tokenizers_trains(caches: dict[str, str], tmp_path) -> None:
    """A model with more rows than tokens (Levanter pads its vocabulary axis; Hugging Face
    models such as Qwen ship padded) was refused: the sizes had to match."""
    config = _config(caches, model=MODEL.with_vocab(VOCAB + 14), num_train_steps=3, keep=1)
    result = train_fn(config, str(tmp_path / "out"))
    assert result.final_train_loss < math.log(VOCAB + 14) + 1


def test_bad_mixture_weight_is_named(caches: dict[str, str], tmp_path) -> None:
    with pytest.raises(TrainInputError, match=r"datasets\[.*noise'\]: mixture weight"):
        train_fn(
            _config(caches, datasets={caches["pattern"]: 1.0, caches["noise"]: 0}),
            str(tmp_path / "o"),
        )


def test_divergence_stops_and_keeps_the_last_good_checkpoint(
    caches: dict[str, str], tmp_path
) -> None:
    out = str(tmp_path / "out")
    config = _config(
        caches,
        optimizer=dataclasses.replace(OPT, learning_rate=1e30, max_grad_norm=None),
        checkpoint_every_steps=1,
        steps_per_eval=None,
    )
    with pytest.raises(
        TrainingDivergedError, match=r"training diverged at step (\d+).*last good checkpoint"
    ) as e:
        train_fn(config, out, settings=TrainerSettings(log_every=1, checkpoint_every_minutes=None))
    bad_step = int(e.value.args[0].split("step ")[1].split(":")[0])
    saved = sorted(int(s) for s in os.listdir(os.path.join(out, "checkpoints")) if s.isdigit())
    assert saved and max(saved) == bad_step - 1
    # The kept checkpoint holds finite parameters, and evaluate can read it.
    got = evaluate(
        os.path.join(out, "checkpoints", str(max(saved))),
        {"p": caches["pattern"]},
        seq_len=16,
        batch_size=4,
        max_batches=1,
    )
    assert "p" in got


def test_throughput_times_the_steps_not_their_dispatch(caches: dict[str, str], tmp_path) -> None:
    """JAX returns from a step before the device has run it: each logged tokens/s must come
    from time that includes the device's work, so it cannot beat the wall clock between two
    log lines (it read 25x too fast, MFU 766% on the demo, when the clock stopped before the
    metrics were fetched)."""
    model = dataclasses.replace(
        MODEL, hidden_dim=128, intermediate_dim=512, num_layers=4, seq_len=64
    )
    seen: list[tuple[float, dict]] = []
    result = train_fn(
        _config(
            caches,
            model=model,
            seq_len=64,
            batch_size=8,
            num_train_steps=14,
            steps_per_eval=None,
            checkpoint_every_steps=1000,
        ),
        str(tmp_path / "out"),
        settings=TrainerSettings(log_every=2, checkpoint_every_minutes=None, sample_tokens=0),
        on_metrics=lambda row: seen.append((time.perf_counter(), row)),
    )
    timed = [(t, row) for t, row in seen if "tokens_per_second" in row]
    assert len(timed) >= 4
    tokens_per_step = 8 * 64
    for (t0, r0), (t1, r1) in zip(timed, timed[1:], strict=False):
        wall_rate = (r1["step"] - r0["step"]) * tokens_per_step / (t1 - t0)
        assert r1["tokens_per_second"] <= 1.5 * wall_rate, (r1, wall_rate)
        assert 0 < r1["mfu"] < 1
    assert 0 < result.mfu < 1


def test_a_batch_larger_than_the_data_is_warned_of(caches: dict[str, str], tmp_path) -> None:
    small = write_cache(str(tmp_path / "small"), VOCAB, 200, seed=3)  # 12 sequences of 16
    logger = logging.getLogger("tests.levanter.small")
    handler = _Records()
    logger.addHandler(handler)
    try:
        for batch_size in (8, 24):
            train_fn(
                _config(
                    caches,
                    datasets={small: 1.0},
                    batch_size=batch_size,
                    num_train_steps=1,
                    steps_per_eval=None,
                ),
                str(tmp_path / f"out-{batch_size}"),
                settings=TrainerSettings(checkpoint_every_minutes=None, sample_tokens=0),
                log=logger,
            )
    finally:
        logger.removeHandler(handler)
    warned = [m for m in handler.messages if "repeats the data" in m]
    assert warned == [
        "batch_size=24 is more than the 12 sequences of seq_len=16 the training data holds: "
        "each batch repeats the data 2.0 times. Lower batch_size, or add data"
    ]
