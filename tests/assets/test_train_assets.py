"""train_lm(...) and evaluate(...) as assets: tiny models on the real corpus, a real instance."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import numpy as np
import pytest

from marin_dagster import fs
from marin_dagster.execution.asset import step_for
from marin_dagster.execution.version import versioned_fields
from marin_dagster.levanter import AdamConfig, llama_nano
from marin_dagster.levanter.checkpoint import load_params
from tests.conftest import REPO, run_warnings, subprocess_env

TINY = dataclasses.replace(
    llama_nano, seq_len=128, hidden_dim=32, intermediate_dim=64, num_layers=1
)


def build(
    vocab_size: int = 512,
    steps: int = 12,
    checkpoint_every_steps: int | None = None,
    resources: str = "cpu",
    seq_len: int = 128,
    compute_dtype: str = "float32",
):
    from assets import sample_corpus, tokenized, tokenizer
    from assets.train import evaluate, train_lm

    corpus = sample_corpus("raw/shakespeare", num_shards=2)
    tok = tokenizer("tokenizers/shakespeare-bpe", source=corpus, vocab_size=vocab_size)
    ds = tokenized("tokenized/shakespeare", source=corpus, tokenizer=tok, validation=0.1)
    model = train_lm(
        "checkpoints/tiny-shakespeare",
        model=TINY,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=2),
        datasets={ds: 1.0},
        batch_size=4,
        seq_len=seq_len,
        num_train_steps=steps,
        checkpoint_every_steps=checkpoint_every_steps,
        resources=resources,
        compute_dtype=compute_dtype,
    )
    ev = evaluate(
        "eval/tiny-shakespeare",
        checkpoint=model,
        datasets=[ds],
        max_batches=2,
        compute_dtype=compute_dtype,
    )
    return [corpus, tok, ds, model, ev]


def _resources(prefix, downloads):
    from resources.levanter import LevanterResource
    from resources.storage import StorageResource
    from resources.zephyr import ZephyrResource

    return {
        "storage": StorageResource(prefix=prefix, downloads=downloads),
        "zephyr": ZephyrResource(max_workers=2),
        "levanter": LevanterResource(log_every=2, checkpoint_every_minutes=None),
    }


def _meta(result, asset):
    return {
        k: v.value
        for k, v in result.asset_materializations_for_node(asset.op.name)[0].metadata.items()
    }


def test_train_lm_and_evaluate_assets(tmp_path, downloads):
    assets = build()
    model, ev = assets[3], assets[4]
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            assets, instance=instance, resources=_resources(str(tmp_path / "data"), downloads)
        )
        meta = _meta(result, model)
        assert meta["steps"] == 12
        assert meta["total_tokens"] == 12 * 4 * 128
        assert np.isfinite(meta["final_train_loss"]) and meta["final_train_loss"] < np.log(512)
        assert meta["eval_loss"] is not None and meta["tokens_per_second"] > 0
        assert set(meta["eval"]) == {"tokenized/shakespeare"}, "eval sets are named by asset"
        assert 0 < meta["mfu"] < 1
        assert meta["loss_curve"].startswith("![loss curve](data:image/png;base64,")
        assert meta["sample"].startswith("```")
        assert meta["path"].endswith(
            f"checkpoints/tiny-shakespeare-{model.code_versions_by_key[model.key]}"
        )
        for name in ("metrics.jsonl", "config.json"):
            assert fs.exists(fs.join(meta["path"], name))
        ev_meta = _meta(result, ev)
        assert ev_meta["tokenized/shakespeare/loss"] > 0
        assert ev_meta["tokenized/shakespeare/bits_per_byte"] > 0
    # The evaluation is a table `marin sql` shows (it showed "holds no ... files").
    from marin_dagster.ducky import AssetEntry, connect, resolve_catalog

    prefix = str(tmp_path / "data")
    entry = AssetEntry("eval/tiny-shakespeare", "evaluate", ev.code_versions_by_key[ev.key])
    (view,) = resolve_catalog(prefix, [entry])
    rows = (
        connect([view], prefix)
        .execute('SELECT checkpoint, dataset, loss FROM "eval/tiny-shakespeare"')
        .fetchall()
    )
    assert [row[:2] for row in rows] == [(fs.basename(meta["path"]), "tokenized/shakespeare")]
    assert round(rows[0][2], 4) == ev_meta["tokenized/shakespeare/loss"]  # metadata's rounded


def test_compute_dtype_is_in_the_version_and_reaches_the_model(tmp_path, downloads):
    """A bfloat16 model is another version (beside the float32 one, never skipped as it),
    and it trains and evaluates in bfloat16. At float32 the field stays out of the version,
    so steps built before it existed are not redone."""
    single, half = build(), build(compute_dtype="bfloat16")
    for a, b in zip(single[3:], half[3:], strict=True):
        assert "compute_dtype" not in versioned_fields(step_for(a).config), step_for(a).name
        assert versioned_fields(step_for(b).config)["compute_dtype"] == "bfloat16"
        assert a.code_versions_by_key[a.key] != b.code_versions_by_key[b.key], step_for(a).name
    prefix = str(tmp_path / "data")
    with dg.instance_for_test() as instance:
        meta = {}
        for name, assets in (("float32", single), ("bfloat16", half)):
            result = dg.materialize(
                assets, instance=instance, resources=_resources(prefix, downloads)
            )
            meta[name] = (_meta(result, assets[3]), _meta(result, assets[4]))
    (f32, f32_eval), (bf16, bf16_eval) = meta["float32"], meta["bfloat16"]
    assert bf16["skipped"] is False and bf16["path"] != f32["path"]
    recorded = fs.read_json_or_none(fs.join(bf16["path"], "config.json"))
    assert recorded["train"]["compute_dtype"] == "bfloat16"
    # Same data, seed and steps: the losses differ only by bfloat16's rounding.
    assert bf16["final_train_loss"] != f32["final_train_loss"]
    assert bf16["final_train_loss"] == pytest.approx(f32["final_train_loss"], rel=0.05)
    key = "tokenized/shakespeare/loss"
    assert bf16_eval[key] != f32_eval[key]
    assert bf16_eval[key] == pytest.approx(f32_eval[key], rel=0.05)


def test_evaluate_scores_at_the_length_the_checkpoint_was_trained_at():
    """Not the model's maximum: the training's own eval figures are at the trained length,
    and the length is in the evaluate step's version."""
    from assets.train import evaluate

    ds, short = build(seq_len=64)[2:4]
    assert step_for(evaluate("eval/short", checkpoint=short, datasets=[ds])).config.seq_len == 64
    shorter = evaluate("eval/short", checkpoint=short, datasets=[ds], seq_len=32)
    assert step_for(shorter).config.seq_len == 32
    with pytest.raises(ValueError, match=r"seq_len=256 is above the model's maximum \("):
        evaluate("eval/long", checkpoint=short, datasets=[ds], seq_len=256)


def test_train_lm_rejects_bad_mixtures(tmp_path):
    from assets import sample_corpus
    from assets.train import train_lm

    corpus, tok, ds, *_ = build()
    with pytest.raises(ValueError, match="mixture weight must be a positive number"):
        train_lm("checkpoints/x", model=TINY, datasets={ds: 0.0}, batch_size=4, num_train_steps=1)
    with pytest.raises(ValueError, match="must be tokenized"):
        train_lm(
            "checkpoints/x",
            model=TINY,
            datasets={sample_corpus("raw/shakespeare"): 1.0},
            batch_size=4,
            num_train_steps=1,
        )
    with pytest.raises(ValueError, match="datasets is empty"):
        train_lm("checkpoints/x", model=TINY, datasets={}, batch_size=4, num_train_steps=1)


def _materialize_main() -> None:
    """Subprocess entry: materialize the tiny experiment against DAGSTER_HOME, with the
    checkpoint policy as shipped (no checkpoint_every_steps on the step, the resource's defaults)."""
    from resources.levanter import LevanterResource

    prefix, downloads = sys.argv[1], sys.argv[2]
    assets = build(steps=40)
    instance = dg.DagsterInstance.get()
    result = dg.materialize(
        assets[:4],
        instance=instance,
        resources={**_resources(prefix, downloads), "levanter": LevanterResource(log_every=2)},
    )
    step_log = [
        e.user_message
        for e in instance.all_logs(result.run_id)
        if e.step_key == assets[3].op.name and not e.is_dagster_event
    ]
    sys.stdout.write(
        json.dumps(
            {
                "resumed_from_step": _meta(result, assets[3])["resumed_from_step"],
                "step_log": step_log,
            }
        )
        + "\n"
    )


def test_killed_training_resumes_from_its_checkpoint(tmp_path, dagster_home, downloads):
    """Killed at step 30 of 40 with the default checkpoint policy (a checkpoint every tenth of
    the run), the rerun resumes from step 28, says so before training, and ends with the
    parameters of an uninterrupted run."""
    prefix = str(tmp_path / "data")
    cmd = [
        sys.executable,
        "-c",
        "from tests.assets.test_train_assets import _materialize_main; _materialize_main()",
        prefix,
        downloads,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=subprocess_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    model = build(steps=40)[3]
    output = fs.join(
        prefix, f"checkpoints/tiny-shakespeare-{model.code_versions_by_key[model.key]}"
    )
    deadline = time.time() + 600
    while not (
        os.path.isdir(output)
        and any(n.isdigit() and int(n) >= 28 for n in _checkpoint_steps(output))
    ):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    from marin_dagster.execution.status import StepStatus, read_status

    assert read_status(output).status == StepStatus.RUNNING
    assert not fs.exists(fs.join(output, "params.npz")), (
        "the final params are written only at the end"
    )
    rerun = subprocess.run(
        cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads(rerun.stdout.splitlines()[-1])
    assert 28 <= report["resumed_from_step"] < 40, (
        "killed after the last step: the test is too slow"
    )
    step_log = report["step_log"]
    said = [
        i
        for i, m in enumerate(step_log)
        if m.startswith(f"resumed from step {report['resumed_from_step']} ")
    ]
    trained = [i for i, m in enumerate(step_log) if m.startswith("step ")]
    assert said and trained and said[0] < trained[0], step_log

    clean_prefix = str(tmp_path / "clean")
    clean = subprocess.run(
        [*cmd[:3], clean_prefix, downloads],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert clean.returncode == 0, clean.stderr[-3000:]
    resumed = load_params(fs.join(output, "params.npz"))
    uninterrupted = load_params(fs.join(clean_prefix, output[len(prefix) + 1 :], "params.npz"))
    flat_a, flat_b = _flatten(resumed), _flatten(uninterrupted)
    assert flat_a.keys() == flat_b.keys()
    for key in flat_a:
        np.testing.assert_array_equal(flat_a[key], flat_b[key], err_msg=key)


def _checkpoint_steps(output: str) -> list[str]:
    folder = os.path.join(output, "checkpoints")
    return os.listdir(folder) if os.path.isdir(folder) else []


def _flatten(params) -> dict:
    from marin_dagster.levanter.checkpoint import flatten_params

    return flatten_params(params)


def test_an_accelerator_asked_for_and_not_there_is_warned_of(tmp_path, downloads):
    """A script (or a CPU-only jax) trains on the CPU whatever `resources=` asks: it says so,
    with the fix, and the metadata names the device."""
    corpus, tok, ds, model, _ = build(steps=2, resources="gpu:1")
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [corpus, tok, ds, model],
            instance=instance,
            resources=_resources(str(tmp_path / "data"), downloads),
        )
        warnings = [
            w
            for w in run_warnings(instance, result.run_id, model.op.name)
            if "asks for an accelerator" in w
        ]
    assert len(warnings) == 1 and "resources='gpu:1'" in warnings[0]
    assert "jax[cuda12]" in warnings[0]
    assert _meta(result, model)["device_kind"] == "cpu"


def test_a_dataset_too_small_to_train_on_is_named_by_its_asset(tmp_path, downloads):
    """The engine names the token cache by path; the failure also names the asset, which is
    what the experiment file calls it."""
    from assets import dataset, tokenized, tokenizer
    from assets.train import train_lm

    src = tmp_path / "notes"
    src.mkdir()
    docs = [{"text": f"note {i}: the quick brown fox jumps over the lazy dog."} for i in range(4)]
    (src / "notes.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    raw = dataset("raw/notes", str(src))
    tok = tokenizer("tokenizers/notes-bpe", source=raw, vocab_size=300)
    ds = tokenized("tokenized/notes", source=raw, tokenizer=tok)
    model = train_lm(
        "checkpoints/notes", model=TINY, datasets={ds: 1.0}, batch_size=2, num_train_steps=2
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw, tok, ds, model],
            instance=instance,
            resources=_resources(str(tmp_path / "data"), downloads),
            raise_on_error=False,
        )
    assert not result.success
    message = result.failure_data_for_node(model.op.name).error.to_string()
    assert "fewer than one sequence of seq_len=128" in message
    cache = fs.join(str(tmp_path / "data"), "tokenized", "notes-")
    assert f"{cache}" in message and "is the asset tokenized/notes" in message
