"""Deduplicated datasets: `deduplicated(name, source, mode=...)` on dupekit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from assets.dataset import records_text_key
from marin_dagster.datasets.files import dataset_files
from marin_dagster.dupekit import DedupConfig, deduplicate
from marin_dagster.execution.asset import StepContext, defining, versioned_asset
from marin_dagster.iris import ResourceConfig


def _table(counts: Mapping[str, Any]) -> str:
    levels = {
        k: v for k, v in counts.items() if isinstance(v, dict) and k in ("document", "paragraph")
    }
    columns = sorted({c for v in levels.values() for c in v if isinstance(v[c], int | float)})
    lines = ["| level | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for level, values in levels.items():
        lines.append(f"| {level} | " + " | ".join(f"{values.get(c, '')}" for c in columns) + " |")
    return "\n".join(lines)


def _run(
    config: DedupConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    # Dedup runs several pipelines (hashes, LSH rounds, the writers) on one context of the
    # resource's: each logs its progress in the run log, and the metadata adds them up.
    zephyr = step.resources.zephyr
    with zephyr.context(log=step.log, output_path=output_path) as zephyr_context:
        result = deduplicate(
            dataset_files(inputs["source"]), output_path, config=config, context=zephyr_context
        )
    counts = result.flat_counts()
    step.log.info(f"dedup ({config.mode}): {counts}")
    return {
        **{k.replace("/", "_"): v for k, v in counts.items()},
        "mode": config.mode,
        "counts": dg.MetadataValue.json(result.counts),
        "summary": dg.MetadataValue.md(_table(result.counts)),
        **zephyr.metadata(zephyr_context),
    }


def deduplicated(
    name: str,
    source: dg.AssetsDefinition,
    mode: str = "fuzzy",
    *,
    resources: str | ResourceConfig = "cpu",
    **config: Any,
) -> dg.AssetsDefinition:
    """`source` without its duplicates (exact, paragraph or fuzzy MinHash-LSH), with attributes.

    `config` takes `DedupConfig`'s fields. Fuzzy dedup checks doubtful links exactly
    (`verify=True`, the default), so a removed document is always joined to its cluster's
    kept document through links whose true Jaccard reaches `threshold`; `verify=False`
    is faster but links on one shared band bucket and wrongly removes documents (see
    `DedupConfig.verify`).
    """
    with defining("deduplicated", name):
        config.setdefault("text_key", records_text_key(source))
        cfg = DedupConfig(mode=mode, **config)
    return versioned_asset(
        name=name,
        kind="deduplicated",
        config=cfg,
        run=_run,
        upstream={"source": source},
        description=f"{mode} deduplication of the source (dupekit): documents/ keeps one document "
        "per duplicate cluster; attributes/ flags each input document.",
        resources=resources,
        required_resources=("zephyr",),
        kinds=("json",),
        # A file of duplicates alone changes the attributes and counts, not the documents.
        data_folder="documents",
    )
