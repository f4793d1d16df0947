"""Check that a graph follows the topology conventions before anything relies on it."""
from __future__ import annotations

import math
import numbers

import networkx as nx

from ._graph import KINDS, is_int
from .errors import ValidationError
from .machines.parts import TRANSPORTS as _TRANSPORTS


def _positive(value) -> bool:
    if type(value) is float:        # the usual case, without the abstract-class checks
        return math.isfinite(value) and value > 0
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def validate_topology(G) -> nx.Graph:
    """Check ``G`` and return it unchanged.

    Checks: an undirected simple ``nx.Graph``; node ids are strings; every node has a
    ``kind`` in {"gpu", "switch", "nic", "cpu"}; at least one GPU; GPU ``rank`` values are
    integers, unique and contiguous from 0 (and only GPUs have a rank); a NIC's
    ``in_order_128``, if present, is a bool; every edge has a
    positive finite ``bandwidth`` (bytes/s) and ``latency`` (s) and, if present, a non-empty
    string ``link``; no self-loops; connected.

    Raises
    ------
    ValidationError
        Naming the first bad node or edge, the field and its value.
    """
    if not isinstance(G, nx.Graph):
        raise ValidationError(f"topology must be a networkx Graph, not {type(G).__name__}")
    if G.is_directed() or G.is_multigraph():
        raise ValidationError(f"topology must be an undirected simple nx.Graph, not "
                              f"{type(G).__name__}")
    if G.number_of_nodes() == 0:
        raise ValidationError("topology has no nodes")
    ranks = {}
    for n, d in G.nodes(data=True):
        if not isinstance(n, str):
            raise ValidationError(f"node {n!r}: id must be a string, not {type(n).__name__}")
        kind = d.get("kind")
        if kind not in KINDS:
            raise ValidationError(f"node {n!r}: kind={kind!r} must be one of {', '.join(KINDS)}")
        if kind == "gpu":
            rank = d.get("rank")
            if not is_int(rank):
                raise ValidationError(f"node {n!r}: rank={rank!r} must be an integer")
            if rank in ranks:
                raise ValidationError(f"node {n!r}: rank={rank} is also the rank of node "
                                      f"{ranks[rank]!r}")
            ranks[int(rank)] = n
        elif kind == "nic" and "transport" in d and d["transport"] not in \
                _TRANSPORTS.get(d.get("protocol", "ib"), ()):
            raise ValidationError(f"node {n!r}: transport={d['transport']!r} cannot run on a "
                                  f"NIC of kind {d.get('protocol', 'ib')!r} (it runs: "
                                  f"{', '.join(_TRANSPORTS.get(d.get('protocol', 'ib'), ()))})")
        elif kind == "nic" and not isinstance(d.get("in_order_128", True), bool):
            raise ValidationError(f"node {n!r}: in_order_128={d['in_order_128']!r} must be "
                                  f"True or False")
        if kind != "gpu" and "rank" in d:
            raise ValidationError(f"node {n!r}: rank={d['rank']!r} on a {kind} node "
                                  f"(only GPUs have ranks)")
    if not ranks:
        raise ValidationError("topology has no GPU (no node with kind='gpu')")
    if max(ranks) != len(ranks) - 1 or min(ranks) != 0:
        missing = next(r for r in range(len(ranks) + 1) if r not in ranks)
        raise ValidationError(f"GPU ranks must be contiguous from 0: rank {missing} is missing "
                              f"(ranks {min(ranks)}..{max(ranks)} over {len(ranks)} GPUs)")
    for a, b, d in G.edges(data=True):
        if a == b:
            raise ValidationError(f"edge ({a!r}, {b!r}): self-loop")
        for field in ("bandwidth", "latency"):
            value = d.get(field)
            if not _positive(value):
                unit = "bytes/s" if field == "bandwidth" else "s"
                raise ValidationError(f"edge ({a!r}, {b!r}): {field}={value!r} must be a "
                                      f"positive finite number ({unit})")
        if "link" in d and (not isinstance(d["link"], str) or not d["link"]):
            raise ValidationError(f"edge ({a!r}, {b!r}): link={d['link']!r} must be a "
                                  f"non-empty string")
    if not nx.is_connected(G):
        parts = sorted(nx.connected_components(G), key=len, reverse=True)
        lone = sorted(parts[1])[:3]
        raise ValidationError(f"topology is not connected: {len(parts)} parts; e.g. node "
                              f"{lone[0]!r} cannot reach node {sorted(parts[0])[0]!r}")
    return G
