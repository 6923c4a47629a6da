"""Connected components of the candidate graph, at scale, over Zephyr group_by rounds.

Min-label propagation, as Marin's dupekit does it: every node starts with
the smallest node key among itself and its neighbours; each round, a node
whose label changed sends it to its neighbours (a group_by on the receiving
node), and takes the smallest label it receives. When a round changes no
label, every node holds the smallest node key of its component. Each round
reads the previous round's node files and writes new ones, so no process
holds the graph: a worker holds one node's neighbour list at a time.
Bucket links are stars around each bucket's minimum, so most components
settle in one or two rounds; a round costs one shuffle of the nodes whose
label moved.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from marin_dagster import fs
from marin_dagster.zephyr import counters
from marin_dagster.zephyr.dataset import Dataset

logger = logging.getLogger(__name__)

CHANGED_COUNTER = "dedup/fuzzy/cc_changed"


def source_of(links: tuple[str, list[str]]) -> str:
    return links[0]


def build_node(node: str, links: Iterator[tuple[str, list[str]]]) -> Iterator[dict]:
    adjacency = sorted({dest for _src, dests in links for dest in dests})
    counters.increment("dedup/fuzzy/cc_nodes")
    yield {"node": node, "adj": adjacency, "label": min(node, adjacency[0]), "changed": True}


def messages(state: dict) -> Iterator[tuple[str, str | None, dict | None]]:
    """`(receiver, label, own state)`: the node to itself, its new label to its neighbours."""
    yield state["node"], None, state
    if state["changed"]:
        for neighbour in state["adj"]:
            yield neighbour, state["label"], None


def receiver_of(message: tuple) -> str:
    return message[0]


def update_label(node: str, incoming: Iterator[tuple[str, str | None, dict | None]]
                 ) -> Iterator[dict]:
    state: dict | None = None
    best: str | None = None
    for _receiver, label, own in incoming:
        if own is not None:
            state = own
        elif best is None or label < best:
            best = label
    if state is None:
        raise ValueError(f"connected components lost the state of node {node!r}: a message "
                         "reached a node that no file holds (were the node files changed?)")
    changed = best is not None and best < state["label"]
    if changed:
        counters.increment(CHANGED_COUNTER)
    yield {**state, "label": best if changed else state["label"], "changed": changed}


@dataclass
class ComponentsResult:
    node_files: str
    iterations: int
    nodes: int
    # The counters of the first execution, which also ran the stages feeding `links`.
    first_counters: dict[str, float]


def connected_components(links: Dataset, ctx: Any, work_dir: str, num_shards: int,
                         max_iterations: int = 64) -> ComponentsResult:
    """Labels every linked node with its component's smallest node key.

    `links` yields `(node, [neighbours])` adjacency fragments, each edge in both
    directions (a node may come in several fragments). Returns the glob
    of the final node files (records `{node, adj, label, changed}`).
    """
    pattern = "part-{shard:05d}-of-{total:05d}.jsonl.gz"
    first = fs.join(work_dir, "it_0")
    result = ctx.execute(
        links.group_by(key=source_of, reducer=build_node, num_output_shards=num_shards)
        .write_jsonl(fs.join(first, pattern)))
    nodes = int(result.counters.get("dedup/fuzzy/cc_nodes", 0))
    first_counters = result.counters.as_dict()
    if nodes == 0:
        return ComponentsResult(fs.join(first, "*.jsonl.gz"), 0, 0, first_counters)
    current = first
    for iteration in range(1, max_iterations + 1):
        nxt = fs.join(work_dir, f"it_{iteration}")
        result = ctx.execute(
            Dataset.from_files(fs.join(current, "*.jsonl.gz")).load_jsonl()
            .flat_map(messages)
            .group_by(key=receiver_of, reducer=update_label, num_output_shards=num_shards)
            .write_jsonl(fs.join(nxt, pattern)))
        fs.remove(current, recursive=True)
        current = nxt
        changed = int(result.counters.get(CHANGED_COUNTER, 0))
        logger.info("connected components round %d: %d labels changed", iteration, changed)
        if changed == 0:
            return ComponentsResult(fs.join(current, "*.jsonl.gz"), iteration, nodes,
                                    first_counters)
    raise RuntimeError(f"connected components did not converge in {max_iterations} rounds "
                       f"(nodes still changing); raise cc_max_iterations")
