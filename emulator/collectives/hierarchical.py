"""Hierarchical two-level allreduce (NCCL's tree/ring split across machines, Horovod's
hierarchical allreduce): reduce-scatter inside each machine over NVLink/PCIe, an allreduce of
each local segment across machines along its rail (local GPU r of every machine), then an
allgather inside each machine.

The machines come from the graph: GPUs carry the ``host`` attribute that
:func:`topologies.cluster` sets. Every machine must hold the same number of the ranks.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ._builder import Builder
from .ring import allreduce_pass, ring_pass, segment_chunks


def hosts_of(graph, ranks) -> list[list[int]]:
    """The ranks grouped by machine (``host`` attribute of their GPU nodes), in rank order."""
    if graph is None:
        raise ConfigError("algorithm 'hierarchical' needs graph= (GPUs grouped by host)")
    import topologies

    nodes = topologies.gpus(graph)
    groups: dict = {}
    for r in ranks:
        if r >= len(nodes):
            raise ConfigError(f"hierarchical: rank {r} is not in the graph ({len(nodes)} GPUs)")
        host = graph.nodes[nodes[r]].get("host")
        if host is None:
            raise ConfigError(f"hierarchical: GPU {nodes[r]!r} has no 'host' attribute; build the "
                              f"graph with topologies.cluster")
        groups.setdefault(host, []).append(r)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1:
        raise ConfigError(f"hierarchical: machines hold different numbers of ranks "
                          f"{sorted(len(g) for g in groups.values())}")
    return [groups[h] for h in sorted(groups)]


def allreduce(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Two-level allreduce of ``nbytes`` over machines x local GPUs."""
    hosts = hosts_of(graph, ranks)
    H, g = len(hosts), len(hosts[0])
    b = Builder()
    seg_chunks = segment_chunks(nbytes, g, chunks)          # (g, c): local segment r, chunk i
    c = seg_chunks.shape[1]
    # 1. reduce-scatter inside each machine: local position r ends owning segment r.
    owned = np.full((H, g, c), -1, dtype=np.int64)          # arrival ids making segment r whole
    if g >= 2:
        for h, local in enumerate(hosts):
            ids = ring_pass(b, local, seg_chunks, g - 1, -1, "intra_reduce_scatter")
            owned[h] = np.roll(ids[-1], 1, axis=0)          # position r receives from r-1
    # 2. allreduce of segment r across machines, along rail r.
    # One extra column: a rank's own last send, which follows all its earlier receives.
    reduced = np.concatenate([owned, np.full((H, g, 1), -1, dtype=np.int64)], axis=2)
    if H >= 2:
        for r in range(g):
            rail = [hosts[h][r] for h in range(H)]
            first = [owned[:, r, i] for i in range(c)]
            ids = allreduce_pass(b, rail, segment_chunks(int(seg_chunks[r].sum()), H, chunks),
                                 first_deps=first)
            # Machine h holds segment r whole once its last receives arrived (position x
            # receives from x-1) and its own last send, which needed all earlier receives.
            reduced[:, r, :c] = np.roll(ids[-1], 1, axis=0)
            reduced[:, r, c] = ids[-1][:, -1]
    # 3. allgather inside each machine, position r starting with its reduced segment r.
    if g >= 2:
        for h, local in enumerate(hosts):
            first = [reduced[h, :, i] for i in range(reduced.shape[2])]
            ring_pass(b, local, seg_chunks, g - 1, 0, "intra_allgather", first_deps=first)
    return b.build(ranks, "allreduce", "hierarchical", nbytes, chunks)
