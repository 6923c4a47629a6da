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

A node may also hold *doubtful* neighbours: candidate links that are not
edges yet. Whoever checks them writes the ones that hold as edge files, and
the first round adds those edges to both of their nodes.
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
_PATTERN = "part-{shard:05d}-of-{total:05d}.jsonl.gz"


def source_of(links: tuple) -> str:
    return links[0]


def build_node(node: str, links: Iterator[tuple]) -> Iterator[dict]:
    """A node from its adjacency fragments: `(node, [neighbours])` or `(node, [neighbours], [doubtful])`."""
    adjacency: set[str] = set()
    doubtful: set[str] = set()
    for link in links:
        adjacency.update(link[1])
        if len(link) > 2:
            doubtful.update(link[2])
    counters.increment("dedup/fuzzy/cc_nodes")
    state = {
        "node": node,
        "adj": sorted(adjacency),
        "label": min([node, *adjacency]),
        "changed": True,
    }
    if doubtful - adjacency:
        state["doubtful"] = sorted(doubtful - adjacency)
        counters.increment("dedup/fuzzy/doubtful_ends", len(state["doubtful"]))
    yield state


def messages(record: dict) -> Iterator[tuple[str, str | None, dict | None, str | None]]:
    """`(receiver, label, own state, new neighbour)`.

    A node sends itself its state, and its label to its neighbours if it
    changed; an added edge `{"a", "b"}` tells each end about the other.
    """
    if "node" not in record:
        yield record["a"], None, None, record["b"]
        yield record["b"], None, None, record["a"]
        return
    yield record["node"], None, record, None
    if record["changed"]:
        for neighbour in record["adj"]:
            yield neighbour, record["label"], None, None


def receiver_of(message: tuple) -> str:
    return message[0]


def update_label(node: str, incoming: Iterator[tuple]) -> Iterator[dict]:
    state: dict | None = None
    best: str | None = None
    added: set[str] = set()
    for _receiver, label, own, neighbour in incoming:
        if own is not None:
            state = own
        elif neighbour is not None:
            added.add(neighbour)
        elif best is None or label < best:
            best = label
    if state is None:
        raise ValueError(
            f"connected components lost the state of node {node!r}: a message "
            "reached a node that no file holds (were the node files changed?)"
        )
    state = {k: v for k, v in state.items() if k != "doubtful"}  # decided by now
    if added - set(state["adj"]):
        # New neighbours: both ends send their labels next round.
        state["adj"] = sorted(added | set(state["adj"]))
        best = min(best or state["label"], state["label"])
        counters.increment(CHANGED_COUNTER)
        yield {**state, "label": best, "changed": True}
        return
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

    @property
    def folder(self) -> str:
        return self.node_files.rsplit("/", 1)[0]


def build_nodes(links: Dataset, ctx: Any, work_dir: str, num_shards: int) -> ComponentsResult:
    """Round 0: one node file record per linked document, labelled within its neighbourhood.

    `links` yields adjacency fragments, `(node, [neighbours])` or `(node,
    [neighbours], [doubtful neighbours])`, each edge in both directions (a
    node may come in several fragments).
    """
    first = fs.join(work_dir, "it_0")
    result = ctx.execute(
        links.group_by(key=source_of, reducer=build_node, num_output_shards=num_shards).write_jsonl(
            fs.join(first, _PATTERN)
        )
    )
    return ComponentsResult(
        fs.join(first, "*.jsonl.gz"),
        0,
        int(result.counters.get("dedup/fuzzy/cc_nodes", 0)),
        result.counters.as_dict(),
    )


def propagate_labels(
    graph: ComponentsResult, ctx: Any, work_dir: str, num_shards: int, max_iterations: int = 64
) -> ComponentsResult:
    """Rounds of min-label propagation from `build_nodes`' files until no label changes.

    Files of `{"a", "b"}` edges written beside the node files (in
    `graph.folder`) join the graph in the first round.
    """
    if graph.nodes == 0:
        return graph
    current = fs.join(work_dir, "it_0")
    for iteration in range(1, max_iterations + 1):
        nxt = fs.join(work_dir, f"it_{iteration}")
        result = ctx.execute(
            Dataset.from_files(fs.join(current, "*.jsonl.gz"))
            .load_jsonl()
            .flat_map(messages)
            .group_by(key=receiver_of, reducer=update_label, num_output_shards=num_shards)
            .write_jsonl(fs.join(nxt, _PATTERN))
        )
        fs.remove(current, recursive=True)
        current = nxt
        changed = int(result.counters.get(CHANGED_COUNTER, 0))
        logger.info("connected components round %d: %d labels changed", iteration, changed)
        if changed == 0:
            return ComponentsResult(
                fs.join(current, "*.jsonl.gz"), iteration, graph.nodes, graph.first_counters
            )
    raise RuntimeError(
        f"connected components did not converge in {max_iterations} rounds "
        f"(nodes still changing); raise cc_max_iterations"
    )


def connected_components(
    links: Dataset, ctx: Any, work_dir: str, num_shards: int, max_iterations: int = 64
) -> ComponentsResult:
    """Labels every linked node with its component's smallest node key.

    Returns the glob of the final node files (records `{node, adj, label,
    changed}`) with the round count.
    """
    graph = build_nodes(links, ctx, work_dir, num_shards)
    return propagate_labels(graph, ctx, work_dir, num_shards, max_iterations)
