"""The `marin` console script.

    marin init [HOME]                     create DAGSTER_HOME with its dagster.yaml
    marin status [-f exp.py | -m module]  every asset: version, status, path, size
    marin sql "SELECT ..." [-f exp.py]    query the dataset views, print a table (--limit rows)
    marin sql --serve --port 8765         the read-only HTTP SQL service (ducky/service.py), at most
                                          --max-rows rows and --max-bytes bytes per response
    marin export-hf CHECKPOINT OUT        a train output or checkpoints/{step} as a Hugging Face
                                          Llama folder (config.json + model.safetensors; --dtype)
                                          with the tokenizer its train_lm step trained with
                                          (-f exp.py, or --tokenizer DIR)
    marin import-hf FOLDER OUT            a Hugging Face Llama folder as params.npz +
                                          model_config.json, which `evaluate` reads

The assets are those of the code location (`marin_dagster.definitions`), or of the
experiment file or module named with -f / -m (as `dagster dev` takes them); the prefix is
MARIN_PREFIX (default ./data) unless `--prefix` is given.
"""

from __future__ import annotations

import argparse
import datetime
import errno
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from marin_dagster import fs
from marin_dagster.execution.instance import DEFAULT_HOME, DagsterHomeError, ensure_home

logger = logging.getLogger(__name__)


class LocationError(ValueError):
    """An experiment file or module that cannot be loaded as given."""


def _load_module(python_file: str | None, module_name: str | None) -> Any:
    """The module of `-f FILE` (loaded as Dagster loads it: by path, its folder importable)
    or of `-m MODULE`."""
    import importlib
    import importlib.util

    if module_name:
        # Dagster's -m imports from the working directory too
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is None or not (module_name + ".").startswith(e.name + "."):
                raise  # the module is there; something it imports is not
            raise LocationError(
                f"-m {module_name}: no module {e.name!r} here ({os.getcwd()}) or on the import "
                "path; run from the folder that holds it, or give the file with -f"
            ) from None
    path = os.path.abspath(os.path.expanduser(python_file or ""))
    if not os.path.isfile(path):
        raise LocationError(f"-f {python_file}: no such file")
    name = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    # The file's own imports of its neighbours, and, as Dagster's -f (its working directory),
    # of packages in the folder it runs from (`from experiments.defaults import ...`).
    for folder in (os.getcwd(), os.path.dirname(path)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except ImportError as e:
        raise LocationError(
            f"-f {python_file}: {type(e).__name__}: {e} (imports resolve from the file's folder "
            f"and from {os.getcwd()}, the folder this runs in)"
        ) from e
    return module


def _steps(python_file: str | None = None, module_name: str | None = None) -> list[Any]:
    """The assets of an experiment file or module if one is named, else of the code location
    (`marin_dagster.definitions`), upstream first."""
    from marin_dagster.execution.asset import upstream_closure

    if python_file or module_name:
        import dagster as dg

        from assets.location import module_experiments

        try:
            experiments = module_experiments(vars(_load_module(python_file, module_name)))
        except LocationError:
            raise
        except dg.DagsterInvariantViolationError as e:  # a file of no steps: said, no traceback
            raise LocationError(str(e)) from None
        except (ValueError, TypeError) as e:
            # The factories' and steps' definition errors name the file, line and what to do;
            # a traceback before them buried that. `python FILE` still shows one.
            raise LocationError(f"{python_file or module_name}: {e}") from None
    else:
        from marin_dagster.definitions import load_experiments

        experiments = load_experiments()
    return upstream_closure([leaf for e in experiments for leaf in e.leaves])


def _prefix(arg: str | None) -> str:
    from marin_dagster import fs
    from resources.storage import StorageError, default_prefix, prefix_problem

    prefix = fs.normalize(arg or default_prefix())
    try:
        prefix_problem(prefix)  # a file: nothing under it to read (a traceback before)
    except StorageError as e:
        raise LocationError(str(e)) from None
    return prefix


def _catalog(prefix: str, steps: list[Any]) -> Any:
    from marin_dagster.ducky import resolve_views
    from resources.ducky import asset_entry

    def catalog() -> list[Any]:
        return resolve_views(prefix, [asset_entry(s) for s in steps if s.kind != "watched_folder"])

    return catalog


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _instance() -> Any:
    """The persistent instance whose history the runs wrote, or None (with a note on stderr
    saying why) where there is none; never creates one.

    DAGSTER_HOME, else ./.dagster when it exists. Without a dagster.yaml, Dagster itself
    keeps its history in sqlite under DAGSTER_HOME/history (it only warns), so that
    history is read too.
    """
    import dagster as dg

    home = os.environ.get("DAGSTER_HOME")
    if not home and os.path.isdir(DEFAULT_HOME):
        home = DEFAULT_HOME
    why = None
    if not home:
        why = f"DAGSTER_HOME is unset and there is no {DEFAULT_HOME} here"
    elif os.path.exists(home) and not os.path.isdir(home):
        why = f"DAGSTER_HOME={home} is a file, not a folder"
    elif not os.path.isdir(home):
        why = f"DAGSTER_HOME={home} does not exist"
    elif not any(os.path.exists(os.path.join(home, f)) for f in ("dagster.yaml", "history")):
        why = f"DAGSTER_HOME={home} holds no dagster.yaml and no history/ yet"
    if why is not None:
        sys.stderr.write(
            f"marin status: no Dagster run history: {why}; last materializations show as -. "
            "Set DAGSTER_HOME to the folder your runs used (`marin init DIR` makes one)\n"
        )
        return None
    home = os.path.abspath(home)
    os.environ["DAGSTER_HOME"] = home
    # Dagster's note that dagster.yaml is missing is for whoever writes there; this only reads.
    quiet = logging.getLogger("dagster")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return dg.DagsterInstance.get()
    finally:
        quiet.setLevel(level)


# The tag Dagster gives each materialization: the asset's code_version (a step's version).
CODE_VERSION_TAG = "dagster/code_version"


def _last_materialization(instance: Any, step: Any, path: str) -> str:
    """When and by which run this step's version was last materialized at `path`, or "-".

    An asset key outlives its versions: only events tagged with this version's code_version
    count, so a new version's row never shows the old version's run. One Dagster home may
    serve several prefixes (MARIN_PREFIX changed, two experiments side by side): an event
    whose output was elsewhere does not count either, or a missing output would show a run.
    """
    wanted = step.asset.code_versions_by_key.get(step.asset.key)
    # A run that skips the step materializes it too: the run that built it is the one to show
    # (a skip's, marked so, only when no build of this output is in the history).
    skip = None
    cursor = None
    while True:
        page = instance.fetch_materializations(step.asset.key, limit=100, cursor=cursor)
        for record in page.records:
            event = record.event_log_entry
            metadata = event.asset_materialization.metadata
            tags = event.asset_materialization.tags or {}
            where = metadata.get("path")
            if where is not None and where.value != path:
                continue
            if wanted is None or tags.get(CODE_VERSION_TAG) == wanted:
                when = datetime.datetime.fromtimestamp(event.timestamp, datetime.UTC)
                shown = f"{when:%Y-%m-%d %H:%M:%S} UTC (run {event.run_id[:8]})"
                skipped = metadata.get("skipped")
                if skipped is None or not skipped.value:
                    return shown
                skip = skip or f"{shown}, a skip"
        if not page.has_more:
            return skip or "-"
        cursor = page.cursor


# A RUNNING output whose lease's holder is gone: the run that wrote it was killed.
INTERRUPTED = "interrupted"
# A SUCCESS output built from inputs that have changed since (at the same versions).
OUTDATED = "outdated"
# A step whose source holds nothing now (an empty inbox): a run skips it and what follows.
NOTHING_TO_BUILD = "nothing to build"
# A SUCCESS output whose own inputs are as built, after a step that is outdated: a run
# rebuilds that step, and this one too if the step's output comes out different.
UPSTREAM_OUTDATED = "upstream outdated"


def _running_state(path: str) -> str:
    """RUNNING while a live run holds the output's lease, else INTERRUPTED.

    The status file says RUNNING from the start of the work until its end, so a run killed
    in between (kill -9, OOM, a lost machine) leaves it so; the lease tells: its holder's
    process on this host is gone, or its heartbeat is older than the lease's stale limit.
    """
    from marin_dagster.execution.lease import holder_gone

    return INTERRUPTED if holder_gone(path) else "RUNNING"


def status_rows(
    prefix: str, instance: Any = None, steps: list[Any] | None = None
) -> tuple[list[str], list[list[Any]]]:
    """The `marin status` table: one row per asset of `steps` (the code location's)."""
    from marin_dagster import fs
    from marin_dagster.execution.status import MANIFEST_FILE, StepStatus, read_status

    def output_path(name: str, version: str) -> str:
        return fs.join(prefix, f"{name}-{version}")

    columns = ["asset", "version", "status", "output", "size", "last materialization"]
    rows = []
    steps = _steps() if steps is None else steps
    for step in steps:
        if step.kind == "watched_folder":
            path, state, size = step.config.path, "watched", None
        else:
            path = output_path(step.name, step.version)
            try:
                record = read_status(path)
            except ValueError as e:
                record, state = None, f"invalid ({e})"
            else:
                state = record.status.value if record else "missing"
                if record is not None and record.status == StepStatus.RUNNING:
                    state = _running_state(path)
                elif step.why_nothing_to_build():
                    state = NOTHING_TO_BUILD
                elif record is not None and record.status == StepStatus.SUCCESS:
                    if step.changed_inputs(record, output_path):
                        state = OUTDATED
            size = None
            if record is not None:
                manifest = fs.read_json_or_none(fs.join(path, MANIFEST_FILE))
                if manifest is not None:
                    size = sum(f["size"] for f in manifest.get("files", {}).values())
        last = "-" if instance is None else _last_materialization(instance, step, path)
        rows.append([step.name, step.version, state, path, _human_bytes(size), last])
    # Outdated passes down (steps come upstream first): the tokenizer after an outdated dedup
    # showed SUCCESS, as if nothing after the new files would change.
    by_name = {row[0]: row for row in rows}
    for step in steps:
        row = by_name[step.name]
        if row[2] == StepStatus.SUCCESS.value and any(
            by_name.get(up.name, [None, None, None])[2] in (OUTDATED, UPSTREAM_OUTDATED)
            for up in step.upstream.values()
        ):
            row[2] = UPSTREAM_OUTDATED
    return columns, rows


def _cmd_status(args: argparse.Namespace) -> int:
    from marin_dagster.ducky import format_table

    instance = _instance()
    if instance is not None:
        from marin_dagster.execution.instance import fail_orphaned_runs

        ended = fail_orphaned_runs(instance)
        if ended:
            sys.stderr.write(
                f"marin status: marked {len(ended)} run(s) whose process on this host is "
                f"gone as failed: {', '.join(ended)}\n"
            )
    steps = _steps(args.file, args.module)
    columns, rows = status_rows(_prefix(args.prefix), instance, steps)
    if args.json:
        sys.stdout.write(
            json.dumps([dict(zip(columns, r, strict=True)) for r in rows], indent=2) + "\n"
        )
    else:
        sys.stdout.write(format_table(columns, rows, max_width=100))
    if any(row[2] == OUTDATED for row in rows):
        sys.stderr.write(
            f"marin status: {OUTDATED}: SUCCESS, built from inputs that changed since (an "
            "input rebuilt with other data, a watched folder's files). Materializing the asset "
            "rebuilds it\n"
        )
    if any(row[2] == UPSTREAM_OUTDATED for row in rows):
        sys.stderr.write(
            f"marin status: {UPSTREAM_OUTDATED}: SUCCESS, after a step that is outdated; a run "
            "rebuilds that step, and this one too if its output comes out different\n"
        )
    by_name = {s.name: s for s in steps}
    for row in rows:
        if row[2] == NOTHING_TO_BUILD:
            sys.stderr.write(
                f"marin status: {row[0]}: {NOTHING_TO_BUILD}: {by_name[row[0]].why_nothing_to_build()}. A "
                "run skips it and the steps after it; what they built before stays as it was\n"
            )
    if any(row[2] == INTERRUPTED for row in rows):
        sys.stderr.write(
            f"marin status: {INTERRUPTED}: the run writing the output ended without recording "
            "its end (killed, or its last status write failed, e.g. on a full disk: its run's "
            "log says which), and its lease is stale. Materialize the asset again: the new run "
            "takes the output over and resumes from what was finished\n"
        )
    return 0


DEFAULT_PRINT_LIMIT = 1000


def _count(least: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value

    return parse


def _size(text: str) -> int:
    """Bytes: 16777216, 16MiB, 512KiB, 1G."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write bytes, or e.g. 16MiB, 512KiB"
        )
    unit = (match.group(2) or "B").upper()[0]
    value = int(float(match.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is below 1 byte")
    return value


def _print_views(service: Any, of_a_file: bool) -> None:
    unavailable = service.unavailable()
    tables = ", ".join(f'"{t["name"]}"' for t in service.tables()) or (
        "none"
        if unavailable
        else "none (materialize an asset first)"
        if of_a_file
        # an experiment file's own assets are not the code location's
        else "none of the code location's assets is built (an experiment file's: -f FILE)"
    )
    sys.stderr.write(f"views: {tables}\n")
    if unavailable:
        names = ", ".join(f'"{name}"' for name in unavailable)
        sys.stderr.write(f"unavailable (see the warnings above): {names}\n")


def _cmd_sql(args: argparse.Namespace) -> int:
    from marin_dagster.ducky import format_table
    from marin_dagster.ducky.service import (
        QueryFailed,
        QueryRefused,
        QueryTimeout,
        ResultTooLarge,
        SqlService,
        human_bytes,
    )

    prefix = _prefix(args.prefix)
    steps = _steps(args.file, args.module)
    if args.serve:
        service = SqlService(
            prefix,
            _catalog(prefix, steps),
            max_rows=args.max_rows,
            max_bytes=args.max_bytes,
            timeout_s=args.timeout,
        )
        try:
            server = service.make_server(args.host, args.port)
        except OSError as e:
            # Only the bind's errors: the catalog's storage errors are OSErrors too.
            if e.errno == errno.EADDRINUSE:
                sys.stderr.write(
                    f"marin sql: port {args.port} on {args.host} is already in use (another "
                    f"marin sql --serve?); pick another with --port\n"
                )
                return 1
            if e.errno == errno.EADDRNOTAVAIL:
                sys.stderr.write(
                    f"marin sql: cannot listen on --host {args.host}: it is not an address of "
                    f"this machine; use 127.0.0.1, or 0.0.0.0 for every interface\n"
                )
                return 1
            raise
        host, port = server.server_address[:2]
        sys.stdout.write(
            f"marin sql: serving {len(service.tables())} views on http://{host}:{port} "
            f"(POST /query, GET /tables); at most {service.max_rows:,} rows and "
            f"{human_bytes(service.max_bytes)} per response\n"
        )
        sys.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return 0
    if not args.query:
        sys.stderr.write(
            "marin sql: give a query, e.g. marin sql 'SELECT * FROM \"raw/shakespeare\" LIMIT 5', "
            "or --serve\n"
        )
        return 2
    limit = DEFAULT_PRINT_LIMIT if args.limit is None else args.limit
    service = SqlService(
        prefix,
        _catalog(prefix, steps),
        max_rows=max(limit, 1),
        max_bytes=args.max_bytes,
        timeout_s=args.timeout,
    )
    try:
        result = service.query(args.query, limit)
    except ResultTooLarge as e:
        sys.stderr.write(f"marin sql: {e}; or raise --max-bytes\n")
        return 1
    except (QueryRefused, QueryTimeout, QueryFailed) as e:
        sys.stderr.write(f"marin sql: {e}\n")
        _print_views(service, of_a_file=bool(args.file or args.module))
        return 1
    for note in result["notes"]:
        sys.stderr.write(f"marin sql: note: {note}\n")
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    sys.stdout.write(format_table(result["columns"], result["rows"]))
    more = " (more rows not shown; raise --limit)" if result["truncated"] else ""
    sys.stdout.write(f"({result['row_count']} rows{more})\n")
    return 0


def _train_output(checkpoint: str) -> str:
    """The train output a checkpoint path is or is in (`{output}/checkpoints/{step}`)."""
    from marin_dagster import fs

    if fs.exists(fs.join(checkpoint, "params.npz")):
        return checkpoint
    return checkpoint.rstrip("/").rsplit("/", 2)[0]


def _trained_tokenizer(train_output: str, args: argparse.Namespace) -> tuple[str | None, str]:
    """The tokenizer `train_output` was trained with, or None and why it is unknown.

    A train output holds a copy of its tokenizer; one written before it did is found through
    the train_lm step of the code location that writes it (its tokenizer is an input, under
    the same prefix).
    """
    from marin_dagster import fs
    from marin_dagster.tokenize.tokenizer import TOKENIZER_FILE

    if fs.exists(fs.join(train_output, TOKENIZER_FILE)):
        return train_output, ""
    where = (
        f"-f {args.file}"
        if args.file
        else f"-m {args.module}"
        if args.module
        else "the code location (marin_dagster.definitions)"
    )
    for step in _steps(args.file, args.module):
        suffix = f"/{step.name}-{step.version}"
        if step.kind == "train_lm" and train_output.rstrip("/").endswith(suffix):
            tok = step.upstream["tokenizer"]
            path = fs.join(train_output.rstrip("/")[: -len(suffix)], f"{tok.name}-{tok.version}")
            if fs.exists(fs.join(path, TOKENIZER_FILE)):
                return path, ""
            return None, (
                f"its tokenizer {tok.name} (version {tok.version}) has no {TOKENIZER_FILE} at "
                f"{path}; materialize it, or give --tokenizer"
            )
    return None, (
        f"no train_lm step of {where} writes {train_output}; name the experiment file that "
        "trained it with -f, or give the tokenizer with --tokenizer DIR"
    )


def _cmd_export_hf(args: argparse.Namespace) -> int:
    from marin_dagster import fs
    from marin_dagster.levanter.hf import HfFormatError, export_hf

    checkpoint = fs.normalize(args.checkpoint)
    if not fs.exists(checkpoint):
        sys.stderr.write(
            f"marin export-hf: {checkpoint} does not exist; give a train output "
            "({prefix}/{name}-{version}, e.g. from `marin status`) or one of its "
            "checkpoints/{step} folders\n"
        )
        return 1
    tokenizer, why = args.tokenizer, ""
    if tokenizer is None:
        tokenizer, why = _trained_tokenizer(_train_output(checkpoint), args)
    try:
        out = export_hf(
            checkpoint, args.out, dtype=args.dtype, overwrite=args.overwrite, tokenizer=tokenizer
        )
    except (HfFormatError, FileExistsError, FileNotFoundError) as e:
        sys.stderr.write(f"marin export-hf: {e}\n")
        return 1
    dtype = args.dtype or "the checkpoint's dtype"
    sys.stdout.write(f"wrote a Hugging Face LlamaForCausalLM folder ({dtype}): {out}\n")
    if tokenizer is not None:
        sys.stdout.write(f"with the tokenizer of {tokenizer}\n")
    else:
        sys.stderr.write(
            f"marin export-hf: no tokenizer written (config.json's bos/eos_token_id are null): "
            f"{why}\n"
        )
    return 0


def _cmd_import_hf(args: argparse.Namespace) -> int:
    from marin_dagster import fs
    from marin_dagster.levanter.hf import HfFormatError, import_hf_to_dir

    try:
        config = import_hf_to_dir(args.folder, args.out, overwrite=args.overwrite)
    except (HfFormatError, FileExistsError) as e:
        sys.stderr.write(f"marin import-hf: {e}\n")
        return 1
    sys.stdout.write(
        f"wrote params.npz + model_config.json ({config.num_parameters():,} parameters, "
        f"float32): {fs.normalize(args.out)}\n"
    )
    return 0


def _port(text: str) -> int:
    """A TCP port, refused by argparse in one line (99999 ended in OverflowError's traceback)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 0-65535 (0: any free one)")
    return port


def _location_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "-f",
        "--python-file",
        dest="file",
        help="the assets of this experiment file, as `dagster dev -f` loads it "
        "(default: the code location's, marin_dagster.definitions)",
    )
    where.add_argument("-m", "--module-name", dest="module", help="... or of this module")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marin", description="marin-dagster utilities")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser(
        "init", help="create DAGSTER_HOME (default ./.dagster) with its dagster.yaml"
    )
    init.add_argument("home", nargs="?", default=None)

    status = sub.add_parser(
        "status", help="each asset: version, status, output path, size, last run"
    )
    status.add_argument("--prefix", help="storage prefix (default MARIN_PREFIX or ./data)")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _location_arguments(status)

    sql = sub.add_parser("sql", help="SQL over the dataset views (read-only)")
    sql.add_argument("query", nargs="?", help="e.g. 'SELECT * FROM \"raw/shakespeare\" LIMIT 5'")
    sql.add_argument("--prefix", help="storage prefix (default MARIN_PREFIX or ./data)")
    sql.add_argument(
        "--limit",
        type=_count(0),
        default=None,
        help=f"most rows one query prints (default {DEFAULT_PRINT_LIMIT}; not with --serve, "
        'where a client sends "limit" per request)',
    )
    sql.add_argument(
        "--max-rows",
        type=_count(1),
        default=10_000,
        help="--serve: most rows per response; more is a 413 (default 10000)",
    )
    sql.add_argument(
        "--max-bytes",
        type=_size,
        default=16 << 20,
        help="most bytes of rows as JSON per response; more is a 413 (default 16MiB)",
    )
    sql.add_argument("--timeout", type=float, default=30.0, help="seconds per query (default 30)")
    sql.add_argument("--json", action="store_true", help="print the result as JSON")
    sql.add_argument("--serve", action="store_true", help="serve POST /query over HTTP instead")
    sql.add_argument("--host", default="127.0.0.1")
    sql.add_argument("--port", type=_port, default=8765)
    _location_arguments(sql)

    export_hf = sub.add_parser(
        "export-hf",
        help="a train output or orbax step directory as a Hugging Face Llama folder",
    )
    export_hf.add_argument(
        "checkpoint", help="train output (params.npz) or {output}/checkpoints/{step}"
    )
    export_hf.add_argument("out", help="the folder to write (config.json + model.safetensors)")
    export_hf.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="weights' dtype (default: the checkpoint's, float32)",
    )
    export_hf.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    export_hf.add_argument(
        "--tokenizer",
        help="the tokenizer to include (a tokenizer.json or a folder holding one; default: the "
        "one the code location's train_lm step trained with)",
    )
    _location_arguments(export_hf)

    import_hf = sub.add_parser(
        "import-hf", help="a Hugging Face Llama folder as params.npz + model_config.json"
    )
    import_hf.add_argument("folder", help="config.json + model.safetensors (or sharded)")
    import_hf.add_argument("out", help="the folder to write; `evaluate` reads it")
    import_hf.add_argument("--overwrite", action="store_true", help="replace an existing OUT")

    args = parser.parse_args(argv)
    if args.command == "sql" and args.serve and args.limit is not None:
        parser.error(
            "--limit sets the rows one query prints; with --serve, --max-rows caps every response "
            'and a client sends "limit" in its request'
        )
    # Our own logs only: Dagster's storage layer logs its migrations at INFO.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("marin_dagster").setLevel(
        logging.INFO if args.command != "sql" or args.serve else logging.WARNING
    )
    # gcsfs logs each retry's traceback, and a bucket-type probe that fails on an emulator;
    # an error that ends a command is reported below, once, with what to do.
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    if args.command == "init":
        try:
            home = ensure_home(args.home)
        except DagsterHomeError as e:
            sys.stderr.write(f"marin init: {e}\n")
            return 1
        sys.stdout.write(f"DAGSTER_HOME={home}\n")
        return 0
    if args.command == "import-hf":
        return _cmd_import_hf(args)
    # export-hf: orbax warns that a step's state/ has no _CHECKPOINT_METADATA. The trainer's
    # checkpoint manager keeps that file (step timestamps) one level up; the restore needs only
    # state/'s own _METADATA, so the warning says nothing wrong.
    logging.getLogger("absl").setLevel(logging.ERROR)
    commands = {"status": _cmd_status, "sql": _cmd_sql, "export-hf": _cmd_export_hf}
    try:
        return commands[args.command](args)
    except LocationError as e:
        sys.stderr.write(f"marin {args.command}: {e}\n")
        return 2
    except Exception as e:
        if not fs.unreachable(e):
            raise
        # A storage server that does not answer: gcsfs's retries end in 30 frames of aiohttp.
        prefix = getattr(args, "prefix", None) or os.environ.get("MARIN_PREFIX") or "./data"
        sys.stderr.write(
            f"marin {args.command}: cannot reach the storage of {prefix}: {type(e).__name__}: "
            f"{e}; check that it is up and reachable (STORAGE_EMULATOR_HOST for an emulator, "
            "the network, credentials), then run it again\n"
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
