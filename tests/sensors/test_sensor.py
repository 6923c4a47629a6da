"""The watched-folder sensor, evaluated with `build_sensor_context` against a real instance."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import pytest

from assets import Experiment, folder_corpus, watched_folder
from assets.sensors import watched_folder_sensor
from marin_dagster.datasets.watch import forget_folder_states
from marin_dagster.execution.asset import StepContext, step_for, versioned_asset
from marin_dagster.execution.status import StatusRecord, StepStatus, read_status, write_status
from marin_dagster.execution.tags import CONTENT_TAG, WATCH_TAG
from marin_dagster.execution.version import StepConfig
from resources import local_resources

SETTLE_S = 0.4


@pytest.fixture(autouse=True)
def fresh_states() -> Iterator[None]:
    forget_folder_states()
    yield
    forget_folder_states()


@pytest.fixture(scope="module")
def instance(tmp_path_factory) -> Iterator[dg.DagsterInstance]:
    """One real sqlite instance for the module (each test's runs are told apart by their folder)."""
    with dg.instance_for_test(temp_dir=str(tmp_path_factory.mktemp("dagster_home"))) as inst:
        yield inst


class Ticker:
    """Evaluates a sensor like the daemon does: the cursor carries over between ticks."""

    def __init__(
        self, sensor: dg.SensorDefinition, defs: dg.Definitions, instance: dg.DagsterInstance
    ):
        self.sensor, self.defs, self.instance = sensor, defs, instance
        self.cursor: str | None = None
        self.requests: list[dg.RunRequest] = []
        self.results: list[Any] = []

    def tick(self) -> Any:
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, definitions=self.defs
        )
        result = self.sensor(context)
        self.cursor = result.cursor
        self.requests.extend(result.run_requests or [])
        self.results.append(result)
        return result

    def settle(self) -> Any:
        time.sleep(SETTLE_S + 0.1)
        return self.tick()


def reason(result: Any) -> str:
    return result.skip_reason.skip_message if result.skip_reason else ""


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def build(folder: str, prefix: str, watch: bool = True, leaves: Any = None, **corpus_config):
    inbox = watched_folder("raw/inbox", folder)
    corpus = folder_corpus("raw/inbox_corpus", source=inbox, **corpus_config)
    experiment = Experiment("inbox", leaves=leaves(corpus) if leaves else [corpus])
    sensor = watched_folder_sensor(inbox, experiment, settle_s=SETTLE_S, watch=watch)
    defs = dg.Definitions(
        assets=experiment.assets(),
        jobs=[experiment.job()],
        sensors=[sensor],
        resources=local_resources(prefix),
    )
    return inbox, corpus, experiment, sensor, defs


def baseline(ticker: Ticker) -> dg.RunRequest:
    """The first content seen is requested once it is quiet."""
    first = ticker.tick()
    assert not first.run_requests and "waiting" in reason(first)
    second = ticker.settle()
    assert len(second.run_requests) == 1
    return second.run_requests[0]


@pytest.mark.parametrize("watch", [True, False], ids=["watchdog", "polling"])
def test_a_burst_of_100_files_gives_one_run(tmp_path, instance, watch):
    folder = str(tmp_path / "inbox")
    write(os.path.join(folder, "seed.txt"), "seed")
    inbox, corpus, experiment, sensor, defs = build(folder, str(tmp_path / "data"), watch=watch)
    ticker = Ticker(sensor, defs, instance)
    first = baseline(ticker)
    assert first.asset_selection == [corpus.key]
    assert first.tags[WATCH_TAG] == sensor.name and "marin/force" not in first.tags

    start = time.time()
    for i in range(100):
        write(os.path.join(folder, "burst", f"f{i:03d}.txt"), f"text {i}")
        if i % 10 == 0:
            ticker.tick()  # ticks land in the middle of the burst
        time.sleep(max(0.0, start + (i + 1) / 100 - time.time()))
    for _ in range(3):
        ticker.settle()
    assert len(ticker.requests) == 2, [reason(r) for r in ticker.results]
    burst_run = ticker.requests[1]
    assert burst_run.tags[CONTENT_TAG] != first.tags[CONTENT_TAG]
    assert json.loads(ticker.cursor)["requested"] == burst_run.tags[CONTENT_TAG]
    # The observation of the new content carries it as the folder's data version.
    observed = [e for r in ticker.results for e in (r.asset_events or [])]
    assert observed[-1].asset_key == inbox.key
    assert observed[-1].tags["dagster/data_version"] == burst_run.tags[CONTENT_TAG]


def test_restoring_identical_content_gives_no_run(tmp_path, instance):
    folder = str(tmp_path / "inbox")
    write(os.path.join(folder, "a.txt"), "to be")
    write(os.path.join(folder, "b.txt"), "or not")
    # Polling: every tick sees the folder as it is (watchdog events may arrive a tick late).
    *_, sensor, defs = build(folder, str(tmp_path / "data"), watch=False)
    ticker = Ticker(sensor, defs, instance)
    baseline(ticker)

    write(os.path.join(folder, "a.txt"), "edited")
    os.remove(os.path.join(folder, "b.txt"))
    changed = ticker.tick()
    assert "waiting" in reason(changed)
    write(os.path.join(folder, "a.txt"), "to be")  # same bytes, new mtime
    write(os.path.join(folder, "b.txt"), "or not")
    for _ in range(2):
        result = ticker.settle()
        assert not result.run_requests and "unchanged" in reason(result)
    assert len(ticker.requests) == 1


def test_added_changed_and_deleted_files_each_give_a_run(tmp_path, instance):
    folder = str(tmp_path / "inbox")
    write(os.path.join(folder, "a.txt"), "one")
    *_, sensor, defs = build(folder, str(tmp_path / "data"))
    ticker = Ticker(sensor, defs, instance)
    baseline(ticker)
    changes = [
        (lambda: write(os.path.join(folder, "sub", "b.txt"), "two"), 1),
        (lambda: write(os.path.join(folder, "a.txt"), "one, edited"), 1),
        (lambda: os.remove(os.path.join(folder, "sub", "b.txt")), 1),
        (lambda: write(os.path.join(folder, ".a.txt.swp"), "editor noise"), 0),
    ]
    for change, runs in changes:
        before = len(ticker.requests)
        change()
        ticker.tick()
        ticker.settle()
        ticker.settle()
        assert len(ticker.requests) == before + runs
    hashes = [r.tags[CONTENT_TAG] for r in ticker.requests]
    assert len(hashes) == 4 and len(set(hashes)) == 4


def test_a_file_the_corpus_does_not_read_gives_no_run(tmp_path, instance):
    """A corpus reading `*.txt` only: notes dropped beside the texts build nothing, so they
    request no run (they used to start one in which every step skipped)."""
    folder = str(tmp_path / "inbox")
    write(os.path.join(folder, "notes.md"), "not read")
    inbox, _, _, sensor, defs = build(folder, str(tmp_path / "data"), watch=False, pattern="*.txt")
    ticker = Ticker(sensor, defs, instance)
    for _ in range(2):
        result = ticker.settle()
        assert not result.run_requests
        assert "no files under" in reason(result) and "matching '*.txt'" in reason(result)

    write(os.path.join(folder, "a.txt"), "one")
    first = baseline(ticker)
    for change in (
        lambda: write(os.path.join(folder, "notes.md"), "edited, still not read"),
        lambda: write(os.path.join(folder, "more.csv"), "x,y"),
    ):
        change()
        for _ in range(2):
            result = ticker.settle()
            assert not result.run_requests and "unchanged" in reason(result), reason(result)
    write(os.path.join(folder, "b.txt"), "two")
    ticker.tick()
    (second,) = ticker.settle().run_requests
    assert second.tags[CONTENT_TAG] != first.tags[CONTENT_TAG]
    # The folder's own data version covers every file, as its observation records it.
    observed = [e for r in ticker.results for e in (r.asset_events or [])]
    assert observed[-1].asset_key == inbox.key
    assert observed[-1].tags["dagster/data_version"] != second.tags[CONTENT_TAG]


def test_a_change_while_the_code_server_was_down_is_found(tmp_path, instance):
    """The cursor keeps the last requested content hash; a fresh process scans the folder in full."""
    folder = str(tmp_path / "inbox")
    write(os.path.join(folder, "a.txt"), "one")
    *_, sensor, defs = build(folder, str(tmp_path / "data"))
    ticker = Ticker(sensor, defs, instance)
    baseline(ticker)

    forget_folder_states()  # the code server stops: stat cache and observer are gone
    unchanged = ticker.settle()
    assert not unchanged.run_requests and "unchanged" in reason(unchanged)
    forget_folder_states()
    write(os.path.join(folder, "a.txt"), "two")  # written while nothing watched
    ticker.tick()
    found = ticker.settle()
    assert len(found.run_requests) == 1


class GateConfig(StepConfig):
    gate: str


def _gated(corpus: dg.AssetsDefinition, gate: str) -> list[dg.AssetsDefinition]:
    def run(config: GateConfig, inputs: Mapping[str, str], out: str, step: StepContext) -> dict:
        deadline = time.time() + 120
        while not os.path.exists(config.gate):
            if time.time() > deadline:
                raise TimeoutError(f"gate {config.gate} never opened")
            time.sleep(0.05)
        return {}

    return [
        versioned_asset(
            name="checks/inbox_gate",
            kind="gate",
            config=GateConfig(gate=gate),
            run=run,
            upstream={"corpus": corpus},
        )
    ]


def test_a_change_during_a_running_run_gives_a_later_run(tmp_path, instance):
    folder = str(tmp_path / "inbox")
    gate = str(tmp_path / "gate")
    write(os.path.join(folder, "a.txt"), "one")
    _, corpus, experiment, sensor, defs = build(
        folder, str(tmp_path / "data"), watch=False, leaves=lambda c: _gated(c, gate)
    )
    ticker = Ticker(sensor, defs, instance)
    first = baseline(ticker)
    assert len(first.asset_selection) == 2

    job = defs.resolve_job_def(experiment.job_name)
    outcome: dict[str, Any] = {}

    def execute() -> None:
        outcome["result"] = job.execute_in_process(
            instance=instance, asset_selection=first.asset_selection, tags=first.tags
        )

    runner = threading.Thread(target=execute)
    runner.start()
    try:
        deadline = time.time() + 60
        while not instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            assert time.time() < deadline, "the run did not start"
            time.sleep(0.1)
        write(os.path.join(folder, "a.txt"), "two")
        ticker.tick()
        for _ in range(2):
            waiting = ticker.settle()
            assert not waiting.run_requests and "not finished" in reason(waiting)
    finally:
        write(gate, "open")
        runner.join(120)
    assert outcome["result"].success
    later = ticker.tick()
    assert len(later.run_requests) == 1
    assert later.run_requests[0].tags[CONTENT_TAG] != first.tags[CONTENT_TAG]


def test_an_empty_folder_gives_no_run_until_files_arrive(tmp_path, instance):
    folder = str(tmp_path / "inbox")
    os.makedirs(folder)
    *_, sensor, defs = build(folder, str(tmp_path / "data"), watch=False)
    ticker = Ticker(sensor, defs, instance)
    for _ in range(2):
        result = ticker.settle()
        assert not result.run_requests and "no files" in reason(result)
    write(os.path.join(folder, "a.jsonl"), '{"text": "to be"}\n')
    assert "waiting" in reason(ticker.tick())
    assert len(ticker.settle().run_requests) == 1


class CountedConfig(StepConfig):
    counter: str


def _counted(name: str, upstream: dg.AssetsDefinition, counter: str) -> dg.AssetsDefinition:
    """A step that writes the same bytes whatever its input, and counts its runs."""

    def run(config: CountedConfig, inputs: Mapping[str, str], out: str, step: StepContext) -> dict:
        with open(config.counter, "a") as f:
            f.write("run\n")
        write(os.path.join(out, "summary.txt"), "the same summary")
        return {}

    return versioned_asset(
        name=name,
        kind="counted",
        config=CountedConfig(counter=counter),
        run=run,
        upstream={"source": upstream},
    )


def _runs(counter: str) -> int:
    with open(counter) as f:
        return len(f.read().splitlines())


def test_a_sensor_run_rebuilds_only_what_the_new_files_change(tmp_path, instance):
    """A file landing rebuilds the corpus and the steps whose inputs changed; a step whose
    input came out the same is skipped, not redone from scratch (the sensor's runs used to
    force every step below the folder: a new file retrained everything)."""
    folder, prefix = str(tmp_path / "inbox"), str(tmp_path / "data")
    summary_runs, after_runs = str(tmp_path / "summary.runs"), str(tmp_path / "after.runs")
    write(os.path.join(folder, "a.txt"), "one")

    def leaves(corpus: dg.AssetsDefinition) -> list[dg.AssetsDefinition]:
        summary = _counted("checks/summary", corpus, summary_runs)
        return [_counted("checks/after", summary, after_runs)]

    _, corpus, experiment, sensor, defs = build(folder, prefix, watch=False, leaves=leaves)
    job = defs.resolve_job_def(experiment.job_name)
    ticker = Ticker(sensor, defs, instance)

    def run_request(request: dg.RunRequest) -> None:
        result = job.execute_in_process(
            instance=instance, asset_selection=request.asset_selection, tags=request.tags
        )
        assert result.success

    run_request(baseline(ticker))
    assert (_runs(summary_runs), _runs(after_runs)) == (1, 1)
    corpus_path = os.path.join(prefix, f"raw/inbox_corpus-{step_for(corpus).version}")
    first = read_status(corpus_path).data_version

    write(os.path.join(folder, "b.txt"), "two")
    ticker.tick()
    (request,) = ticker.settle().run_requests
    run_request(request)
    assert read_status(corpus_path).data_version != first  # b.txt is in the corpus
    assert (_runs(summary_runs), _runs(after_runs)) == (2, 1)

    # A corpus recorded before SUCCESS held what it was built from is rebuilt on a change:
    # its version holds only the folder's path, and nothing forces it any more.
    record = read_status(corpus_path)
    write_status(corpus_path, StatusRecord(StepStatus.SUCCESS, record.version, record.data_version))
    write(os.path.join(folder, "c.txt"), "three")
    ticker.tick()
    (request,) = ticker.settle().run_requests
    run_request(request)
    assert read_status(corpus_path).inputs is not None
    assert read_status(corpus_path).data_version != record.data_version
    assert (_runs(summary_runs), _runs(after_runs)) == (3, 1)
