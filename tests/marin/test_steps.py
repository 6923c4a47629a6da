"""Marin's step API lowered to Dagster assets: versions, references, skip, scripts and locations."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time

import dagster as dg
import pytest

from marin_dagster.execution.asset import step_for
from marin_dagster.execution.status import StatusRecord, StepStatus, read_status, write_status
from marin_dagster.marin import (
    ExecutorStep,
    InputName,
    StepRunner,
    executor_main,
    instantiate,
    lower,
    output_path_of,
    this_output_path,
    versioned,
)
from marin_dagster.marin.runner import PlanError
from tests.conftest import REPO, subprocess_env

DAGSTER = os.path.join(os.path.dirname(sys.executable), "dagster")


@dataclasses.dataclass(frozen=True)
class Cfg:
    output: str
    n: int
    workers: int = 1
    inputs: tuple = ()


def noop(config: Cfg) -> None:
    pass


def _version(step: ExecutorStep) -> str:
    return step_for(lower(step)).version


def test_only_versioned_values_the_name_and_the_inputs_versions_enter_the_version():
    a = ExecutorStep("t/a", noop, Cfg(this_output_path(), versioned(1), workers=2))
    assert _version(a) == _version(
        ExecutorStep("t/a", noop, Cfg(this_output_path(), versioned(1), workers=16))
    )
    assert _version(a) != _version(ExecutorStep("t/a", noop, Cfg(this_output_path(), versioned(2))))
    assert _version(a) != _version(
        ExecutorStep("t/a2", noop, Cfg(this_output_path(), versioned(1)))
    )

    def consumer(upstream: ExecutorStep, sub: str = "x.txt") -> ExecutorStep:
        return ExecutorStep(
            "t/b",
            noop,
            Cfg(this_output_path(), versioned(0), inputs=(output_path_of(upstream, sub),)),
        )

    b = consumer(a)
    assert lower(b).asset_deps[lower(b).key] == {lower(a).key}  # the reference is lineage
    a2 = ExecutorStep("t/a", noop, Cfg(this_output_path(), versioned(2)))
    assert _version(consumer(a2)) != _version(b)  # an input's version flows downstream
    assert _version(consumer(a, "y.txt")) != _version(b)  # so does the sub-path read
    assert lower(b) is lower(b)  # one asset per step
    assert lower(b).code_versions_by_key[lower(b).key] == _version(b)


def test_instantiate_replaces_references_by_paths():
    a = ExecutorStep("t/a", noop, Cfg(this_output_path(), versioned(1)))
    cfg = Cfg(
        this_output_path("out"),
        versioned(3),
        inputs=(output_path_of(a, "f.txt"), InputName.hardcoded("/fixed"), {"k": versioned([1])}),
    )
    got = instantiate(cfg, {"t/a": "/data/t/a-1234"}, "/data/t/b-5678", "/data")
    assert got == Cfg(
        "/data/t/b-5678/out", 3, inputs=("/data/t/a-1234/f.txt", "/fixed", {"k": [1]})
    )


def test_bad_steps_are_refused_where_they_are_defined():
    with pytest.raises(ValueError, match="not allowed"):
        ExecutorStep("../up", noop, Cfg(this_output_path(), 1))
    with pytest.raises(TypeError, match="fn must be a function"):
        ExecutorStep("t/x", "noop", Cfg(this_output_path(), 1))
    with pytest.raises(ValueError, match="resources="):
        ExecutorStep("t/x", noop, Cfg(this_output_path(), 1), resources="gpu:nonesuch")
    with pytest.raises(TypeError, match="output_path_of takes an ExecutorStep"):
        lower(ExecutorStep("t/x", noop, Cfg(this_output_path(), 1, inputs=(output_path_of(3),))))


EXPERIMENT = """
import dataclasses, json, os

from marin_dagster.marin import ExecutorStep, executor_main, output_path_of, this_output_path, versioned
from marin_dagster.zephyr import Dataset, ZephyrContext


@dataclasses.dataclass(frozen=True)
class MakeConfig:
    output_path: str
    lines: int
    log_every: int = 10


def make(config):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write("make\\n")
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "data.txt"), "w") as f:
        f.write("\\n".join(f"line {i}" for i in range(config.lines)))


def _numbered(line):
    return {"n": int(line.split()[1])}


def count(config):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write("count\\n")
    with open(config["input"]) as f:
        lines = f.read().splitlines()
    # a function of this file in Zephyr's workers: by value, wherever the file was loaded from
    with ZephyrContext(max_workers=1) as ctx:
        n = len(ctx.execute(Dataset.from_list(lines).map(_numbered)).results)
    with open(os.path.join(config["output"], "count.json"), "w") as f:
        json.dump({"lines": n}, f)


made = ExecutorStep(
    name="exp/made", fn=make, config=MakeConfig(this_output_path(), versioned(LINES))
)
counted = ExecutorStep(
    name="exp/counted",
    fn=count,
    config={"input": output_path_of(made, "data.txt"), "output": this_output_path()},
    description="Counts the lines that exp/made wrote.",
)

if __name__ == "__main__":
    executor_main(steps=[counted])
"""


def _write_experiment(tmp_path, lines: int = 7) -> str:
    path = tmp_path / "my_exp.py"
    path.write_text(EXPERIMENT.replace("LINES", str(lines)))
    return str(path)


def _runs(log: str) -> list[str]:
    return open(log).read().split() if os.path.exists(log) else []


def _outputs(prefix: str, name: str) -> list[str]:
    folder, stem = os.path.split(os.path.join(prefix, name))
    return sorted(os.path.join(folder, d) for d in os.listdir(folder) if d.startswith(stem + "-"))


def _instance(home: str) -> dg.DagsterInstance:
    """The sqlite instance the subprocesses wrote, opened from its folder."""
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(home))


def test_a_file_of_steps_is_a_script_and_a_code_location(tmp_path):
    exp = _write_experiment(tmp_path)
    prefix, log = str(tmp_path / "data"), str(tmp_path / "runs.log")
    env = subprocess_env(DAGSTER_HOME=str(tmp_path / "home"), RUNS_LOG=log)

    def script(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, exp, *args], env=env, cwd=REPO, capture_output=True, text=True
        )

    first = script("--prefix", prefix)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _runs(log) == ["make", "count"]
    (counted_dir,) = _outputs(prefix, "exp/counted")
    assert json.load(open(os.path.join(counted_dir, "count.json"))) == {"lines": 7}
    info = json.load(open(os.path.join(counted_dir, ".executor_info")))
    (made_dir,) = _outputs(prefix, "exp/made")
    assert info["name"] == "exp/counted" and info["fn"].endswith(".count")
    assert info["config"]["input"] == os.path.join(made_dir, "data.txt")
    assert info["dependencies"] == {"exp/made": made_dir}
    assert made_dir.endswith(
        "-" + json.load(open(os.path.join(made_dir, ".executor_info")))["version"]
    )

    # Second run: both outputs hold SUCCESS for their versions, so nothing runs.
    again = script("--prefix", prefix)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _runs(log) == ["make", "count"]
    plan = script("--prefix", prefix, "--dry_run", "true")
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert [
        line.split()[:2] for line in plan.stdout.splitlines() if line.startswith(("skip", "run"))
    ] == [
        ["skip", os.path.basename(made_dir).join(["exp/", ""])],
        ["skip", os.path.basename(counted_dir).join(["exp/", ""])],
    ]

    # The same file as a code location: `dagster job execute -f`, a job named after the file,
    # each step run by the project's executor in its own process. A new prefix: both run.
    other = str(tmp_path / "other")
    run = subprocess.run(
        [DAGSTER, "job", "execute", "-f", exp, "-j", "my_exp_job"],
        env={**env, "MARIN_PREFIX": other},
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert _runs(log) == ["make", "count", "make", "count"]
    (counted_other,) = _outputs(other, "exp/counted")
    assert os.path.basename(counted_other) == os.path.basename(counted_dir)  # same version
    with _instance(env["DAGSTER_HOME"]) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(["exp", "counted"]))
        md = event.asset_materialization.metadata
        assert md["skipped"].value is False and md["fn"].value.endswith(".count")
        assert event.asset_materialization.tags["dagster/code_version"] == info["version"]

    # A changed versioned value reruns the step and everything below it.
    exp = _write_experiment(tmp_path, lines=9)
    changed = script("--prefix", prefix)
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert _runs(log)[4:] == ["make", "count"]
    assert len(_outputs(prefix, "exp/counted")) == 2


def test_step_runner_reports_a_step_that_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))

    def broken(config: Cfg) -> None:
        raise RuntimeError("the step's own error")

    step = ExecutorStep("t/broken", broken, Cfg(this_output_path(), versioned(1)))
    with pytest.raises(Exception, match="the step's own error"):
        StepRunner(prefix=str(tmp_path / "data")).run([step])
    with pytest.raises(PlanError, match="FAILED before"):
        StepRunner(prefix=str(tmp_path / "data")).run([step], force_run_failed=False)


def test_executor_main_answers_a_flag_it_cannot_honour_with_an_error_not_a_traceback(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))

    def broken(config: Cfg) -> None:
        raise RuntimeError("the step's own error")

    step = ExecutorStep("t/broken", broken, Cfg(this_output_path(), versioned(1)))
    prefix = ["--prefix", str(tmp_path / "data")]
    with pytest.raises(Exception, match="the step's own error"):
        executor_main(steps=[step], argv=prefix)
    for flags, message in [
        (["--force_run_failed", "false"], "steps ['t/broken'] FAILED before; rerun with"),
        (["--run_only", "nomatch"], "run_only ['nomatch'] matches no step; the steps: t/broken"),
        (["--run_only", "(unclosed"], "run_only '(unclosed' is not a regular expression"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            executor_main(steps=[step], argv=[*prefix, *flags])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err and "Traceback" not in err, err

    # The dry run says what the run would do: refuse the FAILED step, for the same reason.
    version = step_for(lower(step)).version
    for flags, action, last in [
        (["--force_run_failed", "false"], "refuse", "nothing would run: steps ['t/broken']"),
        ([], "run", f"run    t/broken-{version} (executor_step, FAILED)"),
    ]:
        assert executor_main(steps=[step], argv=[*prefix, "--dry_run", *flags]) is None
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith(f"{action:6} t/broken-{version} (executor_step, FAILED)")
        assert lines[-1].startswith(last), lines


def test_the_dry_run_rebuilds_what_an_input_rebuilt_with_other_data_makes_outdated(
    tmp_path, monkeypatch, capsys
):
    """An input rebuilt at its version with other data (forced, a watched folder's files):
    the step after it is rebuilt by the run, so the dry run says `run`, not `skip`; and so
    are the steps after that one, whose input the run rebuilds (they said `skip`, and the
    run then retrained a model)."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    a = ExecutorStep("t/a", noop, Cfg(this_output_path(), versioned(1)))
    b = ExecutorStep(
        "t/b", noop, Cfg(this_output_path(), versioned(1), inputs=(output_path_of(a),))
    )
    c = ExecutorStep(
        "t/c", noop, Cfg(this_output_path(), versioned(1), inputs=(output_path_of(b),))
    )
    prefix = ["--prefix", str(tmp_path / "data")]
    executor_main(steps=[c], argv=prefix)
    capsys.readouterr()
    va, vb, vc = (step_for(lower(s)).version for s in (a, b, c))
    a_out = str(tmp_path / "data" / f"t/a-{va}")
    write_status(a_out, dataclasses.replace(read_status(a_out), data_version="other data"))

    assert executor_main(steps=[c], argv=[*prefix, "--dry_run"]) is None
    assert capsys.readouterr().out.splitlines() == [
        f"skip   t/a-{va} (executor_step, SUCCESS) -> {a_out}",
        f"run    t/b-{vb} (executor_step, SUCCESS, inputs changed) -> "
        f"{tmp_path / 'data' / f't/b-{vb}'}",
        f"run    t/c-{vc} (executor_step, SUCCESS; after t/b, if its new output differs) -> "
        f"{tmp_path / 'data' / f't/c-{vc}'}",
    ]


def test_a_failed_step_does_not_stop_the_steps_that_do_not_depend_on_it(tmp_path, monkeypatch):
    """`python exp.py` stopped at the first failure: a branch of the graph independent of
    it never started, and nothing said so. Now the run goes on as `dagster job execute`
    does, and the error names what failed and what was skipped after it."""
    from assets.experiment import StepsFailedError

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))

    def broken(config: Cfg) -> None:
        raise RuntimeError("the step's own error")

    bad = ExecutorStep("t/bad", broken, Cfg(this_output_path(), versioned(1)))
    after = ExecutorStep(
        "t/after", noop, Cfg(this_output_path(), versioned(1), inputs=(output_path_of(bad),))
    )
    good = ExecutorStep("t/good", noop, Cfg(this_output_path(), versioned(1)))
    prefix = str(tmp_path / "data")
    with pytest.raises(StepsFailedError) as err:
        executor_main(steps=[after, good], argv=["--prefix", prefix])
    message = str(err.value)
    assert "1 step(s) failed; skipped after them: t__after; the other 1 step(s) ran." in message
    assert "t__bad: RuntimeError: the step's own error" in message
    good_out = f"{prefix}/t/good-{step_for(lower(good)).version}"
    assert read_status(good_out).status == StepStatus.SUCCESS


def test_a_prefix_that_is_a_file_is_said_not_a_traceback(tmp_path, monkeypatch, capsys):
    """`--prefix` (or MARIN_PREFIX) naming a file: the dry run and `marin status` failed
    with NotADirectoryError on a status file under it."""
    from marin_dagster.cli import main

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    afile = tmp_path / "afile"
    afile.write_text("hi")
    step = ExecutorStep("t/p", noop, Cfg(this_output_path(), versioned(1)))
    with pytest.raises(SystemExit):
        executor_main(steps=[step], argv=["--prefix", str(afile), "--dry_run"])
    assert f"storage prefix '{afile}' is a file, not a folder" in capsys.readouterr().err
    assert main(["status", "--prefix", str(afile)]) == 2
    assert f"marin status: storage prefix '{afile}' is a file" in capsys.readouterr().err


def test_an_input_being_rebuilt_does_not_make_the_step_after_it_outdated(
    tmp_path, monkeypatch, capsys
):
    """A forced rebuild of `a`, killed: `marin status` called `b` outdated, "built from inputs
    that changed since", where nothing had changed yet (the rebuild resumed to the same data,
    and `b` skipped)."""
    from marin_dagster.cli import status_rows

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    a = ExecutorStep("t/a", noop, Cfg(this_output_path(), versioned(2)))
    b = ExecutorStep(
        "t/b", noop, Cfg(this_output_path(), versioned(2), inputs=(output_path_of(a),))
    )
    prefix = str(tmp_path / "data")
    executor_main(steps=[b], argv=["--prefix", prefix])
    a_out = f"{prefix}/t/a-{step_for(lower(a)).version}"
    write_status(a_out, dataclasses.replace(read_status(a_out), status=StepStatus.RUNNING))
    _, rows = status_rows(prefix, steps=[step_for(lower(a)), step_for(lower(b))])
    assert [row[2] for row in rows] == ["interrupted", "SUCCESS"]


SEED = """
from assets import tokenized, train_lm
from marin_dagster.levanter import AdamConfig, Qwen3Config
from marin_dagster.marin import ResourceConfig, StepRunner, lower

ARTIFACT_VERSION = "v1"

# 1. Tokenize a small sample of enhancer sequences.
enhancers_tokenized = tokenized(
    name="tokenized/zoonomia-ccre-non-promoter-tutorial",
    source="marin-dna/zoonomia-v1-v3_ccre_non_promoter-tutorial",
    tokenizer="marin-dna/tokenizer-char-bos",
    text_key="sequence",
    sample_count=64,
    version=ARTIFACT_VERSION,
)

# 2. Define a tiny Qwen3 decoder.
tiny_qwen3 = Qwen3Config(
    max_seq_len=256,  # 255 DNA bases plus the BOS token
    hidden_dim=32,
    intermediate_dim=128,
    num_heads=4,
    num_kv_heads=2,
    num_layers=2,
)

# 3. Train for a few steps on CPU.
tiny_enhancer_model = train_lm(
    name="checkpoints/tiny-dna-qwen3-cpu",
    version=ARTIFACT_VERSION,
    model=tiny_qwen3,
    optimizer=AdamConfig(learning_rate=6e-4, weight_decay=0.1),
    datasets={enhancers_tokenized: 1.0},
    batch_size=4,
    seq_len=tiny_qwen3.max_seq_len,
    num_train_steps=10,
    z_loss_weight=None,
    evals=None,
    resources=ResourceConfig.with_cpu(),
)

if __name__ == "__main__":
    StepRunner().run([lower(tiny_enhancer_model)])
"""


def _char_tokenizer() -> bytes:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["<bos>", "<eos>", "<unk>", "A", "C", "G", "T", "N"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 0)]
    )
    return tok.to_str().encode()


def _sequences(n: int) -> bytes:
    import random

    rng = random.Random(0)
    return b"".join(
        (
            json.dumps({"sequence": "".join(rng.choice("ACGT") for _ in range(255)), "id": i})
            + "\n"
        ).encode()
        for i in range(n)
    )


def test_the_seed_example_runs_as_written_as_a_script_and_a_job(tmp_path):
    """The seed's tokenized + train_lm example, imports aside; TinyStories-like data and the
    tokenizer come from the stand-in hub (HF_ENDPOINT), not the internet."""
    from tests.hub import stand_in_hub

    seed = tmp_path / "tiny_dna.py"
    seed.write_text(textwrap.dedent(SEED))
    datasets = {
        "marin-dna/zoonomia-v1-v3_ccre_non_promoter-tutorial": {"data/train.jsonl": _sequences(200)}
    }
    models = {"marin-dna/tokenizer-char-bos": {"tokenizer.json": _char_tokenizer()}}
    with stand_in_hub(datasets=datasets, models=models) as hub:
        env = subprocess_env(
            DAGSTER_HOME=str(tmp_path / "home"), MARIN_PREFIX=str(tmp_path / "data")
        )

        def script() -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, str(seed)], env=env, cwd=REPO, capture_output=True, text=True
            )

        first = script()
        assert first.returncode == 0, first.stderr[-4000:]
        home = env["DAGSTER_HOME"]
        with _instance(home) as instance:
            key = dg.AssetKey(["checkpoints", "tiny-dna-qwen3-cpu_checkpoint"])
            md = instance.get_latest_materialization_event(key).asset_materialization.metadata
            assert md["steps"].value == 10 and md["skipped"].value is False
            tokens = dg.AssetKey(["tokenized", "zoonomia-ccre-non-promoter-tutorial_tokens"])
            tmd = instance.get_latest_materialization_event(tokens).asset_materialization.metadata
            assert tmd["documents"].value == 64  # sample_count
            assert tmd["tokens"].value == 64 * (1 + 255 + 1)  # the template's BOS, bases, EOS
        downloads = len(hub.requests)

        # Second run: everything skips (and the hub is asked only for the revision).
        second = script()
        assert second.returncode == 0, second.stderr[-4000:]
        # The same file through the CLI: loads as a code location, skips too.
        run = subprocess.run(
            [DAGSTER, "job", "execute", "-f", str(seed), "-j", "tiny_dna_job"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        with _instance(home) as instance:
            events = instance.fetch_materializations(key, limit=10).records
            assert [e.asset_materialization.metadata["skipped"].value for e in events] == [
                True,
                True,
                False,
            ]
        assert not [r for r in hub.requests[downloads:] if "/resolve/" in str(r)]


def test_the_shipped_marin_style_experiment_runs_as_a_script(tmp_path):
    """assets/experiments/shakespeare_words.py: ExecutorSteps over a factory's asset (the
    default experiment's dedup), as executor_main runs them."""
    env = subprocess_env(DAGSTER_HOME=str(tmp_path / "home"))
    exp = os.path.join(REPO, "assets", "experiments", "shakespeare_words.py")
    prefix = str(tmp_path / "data")
    run = subprocess.run(
        [sys.executable, exp, "--prefix", prefix], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-4000:]
    (summary,) = _outputs(prefix, "analysis/shakespeare-summary")
    rows = [
        line.split("\t") for line in open(os.path.join(summary, "summary.tsv")).read().splitlines()
    ]
    assert len(rows) == 20 and rows[0][0] == "the"  # min_length=3 keeps "the", drops "i", "a"
    counts = [int(n) for _, n in rows]
    assert counts == sorted(counts, reverse=True) and counts[0] > 10_000
    (words,) = _outputs(prefix, "analysis/shakespeare-words")
    info = json.load(open(os.path.join(words, ".executor_info")))
    assert info["versioned"] == {
        "input_path": "DEP[dedup/shakespeare]",
        "top_k": 200,
        "min_length": 3,
    }
    assert info["config"]["input_path"].startswith(os.path.join(prefix, "dedup", "shakespeare-"))
    plan = subprocess.run(
        [sys.executable, exp, "--prefix", prefix, "--dry_run"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert plan.returncode == 0, plan.stderr[-4000:]
    assert [
        line.split()[0]
        for line in plan.stdout.splitlines()
        if line.split()[:1] in (["skip"], ["run"])
    ] == ["skip"] * 4


def test_a_prefix_and_a_storage_resource_together_are_refused(tmp_path):
    """Both say where outputs go; which one won would be a guess."""
    from resources.storage import StorageResource

    step = ExecutorStep("t/where", noop, Cfg(this_output_path(), versioned(1)))
    storage = StorageResource(prefix=str(tmp_path / "other"))
    with pytest.raises(PlanError, match=r"--prefix and a storage resource both say where"):
        StepRunner(prefix=str(tmp_path / "data")).run([step], resources={"storage": storage})
    assert not (tmp_path / "data").exists() and not (tmp_path / "other").exists()


def test_a_refused_dry_run_lists_no_step_as_run(tmp_path, monkeypatch, capsys):
    """With --force_run_failed false and a FAILED step, nothing runs: the other steps read
    `run` above the line that said so."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))

    def broken(config: Cfg) -> None:
        raise RuntimeError("the step's own error")

    bad = ExecutorStep("t/bad", broken, Cfg(this_output_path(), versioned(1)))
    fresh = ExecutorStep("t/fresh", noop, Cfg(this_output_path(), versioned(1)))
    prefix = ["--prefix", str(tmp_path / "data")]
    with pytest.raises(Exception, match="the step's own error") as err:
        executor_main(steps=[bad], argv=prefix)
    assert "1 step(s) failed. The run's log" in str(err.value), "no other step ran"
    capsys.readouterr()
    flags = [*prefix, "--dry_run", "--force_run_failed", "false"]
    assert executor_main(steps=[bad, fresh], argv=flags) is None
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"refuse t/bad-{_version(bad)} (executor_step, FAILED)")
    assert lines[1].startswith(
        f"skip   t/fresh-{_version(fresh)} (executor_step, missing; the run is refused)"
    )
    assert lines[2].startswith("nothing would run: steps ['t/bad'] FAILED before")


def _write_doc(config: Cfg) -> None:
    with open(os.path.join(config.output, "doc.txt"), "w") as f:
        f.write(f"n={config.n}")


def test_a_plain_value_changed_does_not_rebuild_the_steps_after_a_rebuilt_step(
    tmp_path, monkeypatch
):
    """`.executor_info` (which records plain values, and the function as `__main__.f` or
    `exp.f` by command) was in the data version: a step rebuilt with the same data but
    another plain value made the steps after it rebuild."""
    import shutil

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    prefix = ["--prefix", str(tmp_path / "data")]

    def chain(workers: int) -> tuple[ExecutorStep, ExecutorStep]:
        a = ExecutorStep("t/pa", _write_doc, Cfg(this_output_path(), versioned(1), workers))
        b = ExecutorStep(
            "t/pb", noop, Cfg(this_output_path(), versioned(1), inputs=(output_path_of(a),))
        )
        return a, b

    a, b = chain(workers=1)
    executor_main(steps=[b], argv=prefix)
    a_out = tmp_path / "data" / f"t/pa-{_version(a)}"
    b_out = str(tmp_path / "data" / f"t/pb-{_version(b)}")
    built = read_status(b_out)
    shutil.rmtree(a_out)
    a, b = chain(workers=9)
    executor_main(steps=[b], argv=prefix)
    assert json.loads((a_out / ".executor_info").read_text())["config"]["workers"] == 9
    assert read_status(str(a_out)).status == StepStatus.SUCCESS
    assert read_status(b_out) == built, "the step after it was rebuilt"


def test_one_name_for_two_configs_is_a_flag_style_error_with_the_fix(tmp_path, monkeypatch, capsys):
    """A Marin sweep of one step name (Marin keeps name-<hash> per config) ended in a
    DuplicateAssetError traceback; it is the script's one-line error, with the fix."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    sweep = [ExecutorStep("t/sweep", noop, Cfg(this_output_path(), versioned(n))) for n in (1, 2)]
    with pytest.raises(SystemExit) as exit_:
        executor_main(steps=sweep, argv=["--prefix", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "asset 't/sweep' is defined twice with different configs" in err
    assert "give each its own name, such as 't/sweep-<what differs>'" in err
    assert not (tmp_path / "data").exists()


def test_storage_that_does_not_answer_is_the_dry_runs_one_line(tmp_path, monkeypatch, capsys):
    """A gs:// prefix whose server is down: after gcsfs's retries (about 35 s, waited out
    here) the dry run ended in an aiohttp traceback."""
    import gcsfs

    from tests.conftest import free_port

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    gcsfs.GCSFileSystem.clear_instance_cache()  # one made for the tests' live emulator
    step = ExecutorStep("t/down", noop, Cfg(this_output_path(), versioned(1)))
    try:
        with pytest.raises(SystemExit) as exit_:
            executor_main(steps=[step], argv=["--prefix", "gs://down-bucket/p", "--dry_run"])
    finally:
        gcsfs.GCSFileSystem.clear_instance_cache()
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "error: cannot reach the storage of gs://down-bucket/p (" in err
    assert "check that it is up and reachable" in err


def test_the_dry_run_says_a_killed_steps_output_is_interrupted(tmp_path, monkeypatch, capsys):
    """`marin status` said `interrupted` where the dry run said plain RUNNING, as if a live
    run held it. A RUNNING status with no live lease is what a killed run leaves."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    step = ExecutorStep("t/killed", noop, Cfg(this_output_path(), versioned(1)))
    out = str(tmp_path / "data" / f"t/killed-{_version(step)}")
    write_status(out, StatusRecord(StepStatus.RUNNING, _version(step)))
    assert (
        executor_main(steps=[step], argv=["--prefix", str(tmp_path / "data"), "--dry_run"]) is None
    )
    assert capsys.readouterr().out.startswith(
        f"run    t/killed-{_version(step)} (executor_step, RUNNING, interrupted) -> {out}"
    )


WRITER = """
import pathlib, sys, time
from marin_dagster.execution.step import execute_step

path, version, ready = sys.argv[1:]

def work(out):
    pathlib.Path(ready).touch()
    time.sleep(4)
    (pathlib.Path(out) / "n.txt").write_text("late")

execute_step(path, version, work)
"""


def test_an_input_another_run_is_writing_is_waited_for(tmp_path, monkeypatch):
    """A forced rebuild of an input (or a run launched beside this one) holds it RUNNING
    under a live lease: the step after it failed at once, advising to build it."""
    from resources import local_resources

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    a = ExecutorStep("t/wa", noop, Cfg(this_output_path(), versioned(1)))
    b = ExecutorStep(
        "t/wb", noop, Cfg(this_output_path(), versioned(1), inputs=(output_path_of(a),))
    )
    a_out = str(tmp_path / "data" / f"t/wa-{_version(a)}")
    ready = tmp_path / "ready"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, a_out, _version(a), str(ready)],
        env=subprocess_env(),
        cwd=REPO,
    )
    try:
        deadline = time.time() + 120
        while not ready.exists():
            assert writer.poll() is None and time.time() < deadline, "the writer did not start"
            time.sleep(0.1)
        with dg.instance_for_test() as instance:
            result = dg.materialize(
                [lower(a), lower(b)],
                selection=[lower(b).key],
                instance=instance,
                resources=local_resources(str(tmp_path / "data")),
            )
        assert result.success
        assert writer.wait(60) == 0
    finally:
        writer.kill()
    assert read_status(a_out).status == StepStatus.SUCCESS
    assert read_status(str(tmp_path / "data" / f"t/wb-{_version(b)}")).status == StepStatus.SUCCESS
