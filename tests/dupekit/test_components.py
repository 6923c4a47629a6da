"""Connected components over Zephyr rounds: equal to a union-find reference on graphs that
need many rounds, edges added after the nodes were built, and a clear error when the round
budget runs out."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from marin_dagster import fs
from marin_dagster.dupekit.components import build_nodes, connected_components, propagate_labels
from marin_dagster.zephyr import Dataset, ZephyrContext


def _reference(edges: list[tuple[str, str]]) -> dict[str, str]:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in parent}


def _states(result) -> dict[str, dict]:
    fsys, root = fs.url_to_fs(result.node_files)
    out = {}
    for path in fsys.glob(root):
        with fsys.open(path, "rb") as f:
            for line in gzip.decompress(f.read()).splitlines():
                node = json.loads(line)
                out[node["node"]] = node
    return out


def _labels(result) -> dict[str, str]:
    return {node: state["label"] for node, state in _states(result).items()}


def _links(edges: list[tuple[str, str]]) -> Dataset:
    return Dataset.from_list([p for a, b in edges for p in ((a, [b]), (b, [a]))])


def _graph(seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    # A path whose smallest key sits at one end: its label crosses every edge, one per round.
    path = [f"p{i:03d}" for i in range(30)]
    edges = list(zip(path, path[1:], strict=False))
    # A star, isolated pairs, and a random sparse graph over other keys.
    edges += [("s000", f"s{i:03d}") for i in range(1, 12)]
    edges += [(f"q{i:03d}a", f"q{i:03d}b") for i in range(8)]
    nodes = [f"r{i:03d}" for i in range(60)]
    edges += [tuple(rng.sample(nodes, 2)) for _ in range(45)]
    rng.shuffle(edges)
    return edges


def test_components_equal_union_find_on_a_graph_needing_many_rounds(tmp_path) -> None:
    edges = _graph(0)
    with ZephyrContext(max_workers=2, backend="inline") as ctx:
        result = connected_components(_links(edges), ctx, str(tmp_path / "cc"), num_shards=3)
    assert _labels(result) == _reference(edges)
    assert result.nodes == len(_reference(edges))
    assert result.iterations >= 29, "the path's label moves one edge per round"


def test_doubtful_links_do_not_join_until_added_as_edges(tmp_path) -> None:
    """Doubtful neighbours stay in the node files and link nothing; the edges written beside
    the node files after round 0 (the checked ones) join the graph in the first round."""
    edges = _graph(1)
    doubtful = [("p005", "s003"), ("q000a", "q001b"), ("r001", "x000"), ("x001", "x002")]
    added = [("p005", "s003"), ("x001", "x002")]  # the two that pass their check
    links = [p for a, b in edges for p in ((a, [b]), (b, [a]))]
    links += [p for a, b in doubtful for p in ((a, [], [b]), (b, [], [a]))]
    with ZephyrContext(max_workers=2, backend="inline") as ctx:
        graph = build_nodes(Dataset.from_list(links), ctx, str(tmp_path / "cc"), num_shards=3)
        states = _states(graph)
        assert states["x000"]["adj"] == [] and states["x000"]["doubtful"] == ["r001"]
        assert states["q000a"]["doubtful"] == ["q001b"]
        fs.write_bytes(
            fs.join(graph.folder, "added-00000-of-00001.jsonl.gz"),
            gzip.compress(
                b"".join(json.dumps({"a": a, "b": b}).encode() + b"\n" for a, b in added)
            ),
        )
        result = propagate_labels(graph, ctx, str(tmp_path / "cc"), num_shards=3)
    labels = _labels(result)
    reference = _reference(edges + added)
    assert labels == {**reference, "x000": "x000", "r001": reference.get("r001", "r001")}
    assert labels["p005"] == labels["s003"] == "p000" and labels["x002"] == "x001"
    assert labels["q000a"] != labels["q001b"]
    assert not any("doubtful" in state for state in _states(result).values())


def test_running_out_of_rounds_says_which_setting_to_raise(tmp_path) -> None:
    path = [f"p{i:03d}" for i in range(10)]
    edges = list(zip(path, path[1:], strict=False))
    with (
        ZephyrContext(max_workers=2, backend="inline") as ctx,
        pytest.raises(RuntimeError, match="did not converge in 3 rounds.*raise cc_max_iterations"),
    ):
        connected_components(
            _links(edges), ctx, str(tmp_path / "cc"), num_shards=2, max_iterations=3
        )
