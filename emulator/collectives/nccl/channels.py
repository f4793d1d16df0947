"""NCCL's channels: the rings (and the trees built on them) that carry a collective.

NCCL's graph search (src/graph/search.cc) finds rings that use the fastest paths of a node and,
between nodes, leave and enter every node through the same NIC, one NIC per channel: a rail-
aligned ring. A node's part of a ring starts at a GPU next to the channel's NIC and ends at
another GPU next to it (``NET/c GPU/a ... GPU/b NET/c`` in NCCL_DEBUG=GRAPH logs), so the
network traffic of a channel never crosses a CPU. This module builds the same structure:

- one node with NVLinks between GPU pairs (DGX-1's hybrid cube-mesh): rings that follow NVLinks
  only, each lane used by one ring, every ring in both directions;
- one node on a switch (NVSwitch or PCIe): one ring in rank order (NCCL's further rings there
  repeat the same links in the same order, which a fluid model merges);
- several nodes: one ring per NIC, through the GPUs next to that NIC, with the network hop
  routed ``GPU -> its NIC -> the next node's NIC (same rail) -> GPU`` (:class:`Route` via
  waypoints). Between the NICs, each hop takes the equal-cost fabric path that least loads
  the links the other hops already use, as an InfiniBand subnet manager's balanced routing
  (OpenSM's ftree and updn engines) spreads the flows of a job, rather than a hash that may
  put two channels on one spine link;
- trees: NCCL's double binary tree over the nodes of each channel (src/graph/trees.cc) and a
  chain through each node's GPUs in ring order, rooted at the GPU next to the NIC.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from .. import tree as textbook_tree
from . import constants as C
from . import pipeline
from .graphfacts import INTRA_CLASSES, NVLINK_CLASSES, _link_class
from .system import NcclSystem


@dataclass(frozen=True)
class Ring:
    """One channel's ring: ``order[r]`` sends to ``order[r + 1]`` along ``stops[r]`` (node ids:
    source GPU, waypoints, destination GPU); ``flow`` is the ECMP label of its network legs;
    ``nics`` the NIC the channel uses on each node (None without one)."""

    order: tuple
    stops: tuple
    flow: int
    nics: tuple


def _mesh_edges(system: NcclSystem, ranks) -> dict:
    """Direct GPU-GPU NVLink edges between ``ranks``: {(a, b): lanes} with a < b."""
    G = system.G
    out = {}
    for a in ranks:
        for b in ranks:
            if a < b and G.has_edge(system.gpu(a), system.gpu(b)):
                d = G.edges[system.gpu(a), system.gpu(b)]
                if d.get("link") == "nvlink":
                    out[(a, b)] = int(d.get("lanes", 1))
    return out


def _ham_path(ranks, lanes: dict, start: int, end: int | None):
    """A path through all ``ranks`` from ``start`` over edges with lanes left, ending at ``end``
    (or, with ``end`` None, closing a cycle back to ``start``); DFS, ranks in sorted order."""
    n = len(ranks)

    def ok(a, b):
        return lanes.get((min(a, b), max(a, b)), 0) > 0

    path = [start]
    seen = {start}

    def dfs():
        if len(path) == n:
            last = path[-1]
            return ok(last, start) if end is None else last == end
        for nxt in sorted(ranks):
            if nxt in seen or not ok(path[-1], nxt):
                continue
            if end is not None and nxt == end and len(path) < n - 1:
                continue
            path.append(nxt)
            seen.add(nxt)
            if dfs():
                return True
            path.pop()
            seen.discard(nxt)
        return False

    return list(path) if dfs() else None


def _use(lanes: dict, cycle) -> None:
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        lanes[(min(a, b), max(a, b))] -= 1


def _all_cycles(ranks, lanes: dict) -> list:
    """Every Hamiltonian cycle over edges with lanes, once (starting at the smallest rank,
    second rank below the last)."""
    first = min(ranks)
    n = len(ranks)
    out = []

    def ok(a, b):
        return lanes.get((min(a, b), max(a, b)), 0) > 0

    def dfs(path, seen):
        if len(path) == n:
            if ok(path[-1], first) and path[1] < path[-1]:
                out.append(list(path))
            return
        for nxt in sorted(ranks):
            if nxt not in seen and ok(path[-1], nxt):
                path.append(nxt)
                seen.add(nxt)
                dfs(path, seen)
                path.pop()
                seen.discard(nxt)

    dfs([first], {first})
    return out


def _mesh_cycles(system: NcclSystem, ranks) -> list:
    """The most lane-disjoint Hamiltonian cycles over the NVLink mesh of one node (may be
    empty): an exhaustive search, as NCCL's search.cc tries ring orders until it runs out."""
    lanes = _mesh_edges(system, ranks)
    if len(ranks) < 3 or not lanes or len(ranks) > 10:
        return []
    cycles = _all_cycles(ranks, lanes)
    best: list = []

    def fits(cyc, left):
        need = {}
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            e = (min(a, b), max(a, b))
            need[e] = need.get(e, 0) + 1
        return all(left.get(e, 0) >= k for e, k in need.items())

    def pick(i, chosen, left):
        nonlocal best
        if len(chosen) > len(best):
            best = list(chosen)
        for j in range(i, len(cycles)):
            if fits(cycles[j], left):
                _use(left, cycles[j])
                chosen.append(cycles[j])
                pick(j + 1, chosen, left)
                chosen.pop()
                for a, b in zip(cycles[j], cycles[j][1:] + cycles[j][:1]):
                    left[(min(a, b), max(a, b))] += 1
            if len(best) * 2 >= min(sum(v for e, v in lanes.items() if r in e) for r in ranks):
                return                          # every lane of the busiest GPU is used

    pick(0, [], dict(lanes))
    return best


def _intra_order(system: NcclSystem, grp, a: int, b: int) -> list:
    """The node's GPUs from ``a`` to ``b``: over NVLinks when they form a mesh, else a, the
    others in rank order, b."""
    if a == b:
        return [a]
    # an NVSwitch machine needs no mesh (8,192 GPUs: 8,192 machine-channel pairs skip it)
    lanes = {} if system.nvswitch else _mesh_edges(system, grp)
    if lanes:
        path = _ham_path(grp, lanes, a, b)
        if path is not None:
            return path
    mid = [r for r in grp if r not in (a, b)]
    return [a, *mid, b]


def _entry_exit(system: NcclSystem, nic: str, c: int) -> tuple:
    """(entry GPU, exit GPU) of channel ``c`` on the node of ``nic``: the GPUs nearest the NIC,
    alternating which one enters so that each GPU's PCIe link carries one way of one channel."""
    near = system.near[nic]
    lat = system.latency
    bound = lat(nic, system.gpu(near[0])) * (1 + 1e-9)
    best = [r for r in near if lat(nic, system.gpu(r)) <= bound]
    if len(near) == 1:
        return near[0], near[0]
    if len(best) >= 2:
        i = c % len(best)
        return best[i], best[(i + 1) % len(best)]
    return near[0], near[1]


def base_rings(system: NcclSystem) -> tuple[list, bool]:
    """NCCL's distinct rings on ``system`` and whether they all repeat one ring (a switch);
    found once per system (rings are immutable), as NCCL searches once per communicator."""
    rings, switch = system.kept("base_rings", (), lambda: _base_rings(system))
    return list(rings), switch


def _base_rings(system: NcclSystem) -> tuple[list, bool]:
    nodes = system.nodes
    if len(nodes) == 1:
        grp = list(nodes[0])
        cycles = [] if system.nvswitch else _mesh_cycles(system, grp)
        if cycles:
            rings = []
            for k, cyc in enumerate(cycles):
                for order in (cyc, [cyc[0], *reversed(cyc[1:])]):
                    rings.append(_ring(system, [order], [None], flow=len(rings)))
            return rings, False
        return [_ring(system, [grp], [None], flow=0)], True
    k = min(len(n) for n in system.nics)
    if k == 0:
        return [_ring(system, [list(g) for g in nodes], [None] * len(nodes), flow=0)], True
    rings = []
    for c in range(k):
        parts, nics = [], []
        for h, grp in enumerate(nodes):
            nic = system.nics[h][c]
            a, b = _entry_exit(system, nic, c)
            parts.append(_intra_order(system, list(grp), a, b))
            nics.append(nic)
        rings.append(_ring(system, parts, nics, flow=c))
    return _balance(system, rings), False


def _balance(system: NcclSystem, rings: list) -> list:
    """Give every NIC-to-NIC leg the equal-cost fabric path that least loads the links other
    legs use (greedy, in channel order): waypoints pin the path."""
    router = system.router
    load: dict = {}
    out = []
    nic = system.nic_nodes
    legs = [[next((i for i in range(len(st) - 1) if st[i] in nic and st[i + 1] in nic), None)
             for st in rg.stops]
            for rg in rings]
    router.prove_routes([st[k:k + 2] for rg, ks in zip(rings, legs)
                         for st, k in zip(rg.stops, ks) if k is not None])
    for rg, ks in zip(rings, legs):
        stops = []
        for st, k in zip(rg.stops, ks):
            if k is not None:
                paths = router.equal_cost_paths(st[k], st[k + 1], limit=256)
                if len(paths) > 1:
                    def cost(path):
                        on = [load.get(e, 0) for e in zip(path, path[1:])]
                        return (max(on), sum(on))
                    path = min(paths, key=cost)
                    for e in zip(path, path[1:]):
                        load[e] = load.get(e, 0) + 1
                    st = (*st[:k], *path, *st[k + 2:])
            stops.append(st)
        out.append(Ring(rg.order, tuple(stops), rg.flow, rg.nics))
    return out


def _ring(system: NcclSystem, parts, nics, flow: int) -> Ring:
    order = [r for part in parts for r in part]
    stops = []
    bounds = []
    for h, part in enumerate(parts):
        bounds.extend([h] * len(part))
    p = len(order)
    for i in range(p):
        a, b = order[i], order[(i + 1) % p]
        ha, hb = bounds[i], bounds[(i + 1) % p]
        if ha != hb and nics[ha] is not None and nics[hb] is not None:
            stops.append(system.net_stops(a, b, nics[ha], nics[hb]))
        elif system.node_of(a) == system.node_of(b):
            stops.append(system.intra_stops(a, b))
        else:
            stops.append((system.gpu(a), system.gpu(b)))
    return Ring(tuple(order), tuple(stops), flow, tuple(nics))


def channel_rings(system: NcclSystem, channels: int | None = None) -> list:
    """The rings of ``channels`` channels (default: one per distinct ring).

    Raises
    ------
    ConfigError
        If ``channels`` is not an integer in 1..the most the topology carries: NCCL's
        MAXCHANNELS (32) on a switch, else twice the distinct rings (search.cc duplicates each
        ring at most once).
    """
    rings, switch = base_rings(system)
    if channels is None:
        return rings
    most = C.MAX_CHANNELS if switch else min(C.MAX_CHANNELS, 2 * len(rings))
    if isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= most:
        why = ("NCCL's MAXCHANNELS" if switch else
               f"twice the {len(rings)} distinct ring(s) this topology has")
        raise ConfigError(f"channels={channels!r}: this topology carries 1..{most} channels "
                          f"({why})")
    return [rings[c % len(rings)] for c in range(channels)]


def communicator_channels(system: NcclSystem) -> int:
    """The channels NCCL's communicator has on ``system`` (:func:`.pipeline.communicator_channels`
    from the first node's GPU links and NICs); the distinct rings of :func:`base_rings` carry
    them, ``communicator_channels / len(rings)`` NCCL channels each. Kept with the system.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_h100x2"), range(16))
    >>> communicator_channels(s), len(base_rings(s)[0])
    (16, 8)
    """
    return system.kept("nccl_channels", (), lambda: _communicator_channels(system))


def _communicator_channels(system: NcclSystem) -> int:
    rings, _ = base_rings(system)
    G = system.G
    g0 = system.gpu(system.nodes[0][0])
    links = [G.edges[g0, v] for v in G[g0]]
    nv = [d for d in links if _link_class(d) in NVLINK_CLASSES]
    pcie = [d["bandwidth"] * C.PCI_EFFICIENCY for d in links if _link_class(d) == "pcie"]
    if system.intra_hw == "nvlink" and nv:
        if system.nvswitch:
            gpu_bw = sum(d["bandwidth"] * system.usable_fraction(d) for d in nv)
        else:       # a mesh: a channel runs over one NVLink lane at a time
            gpu_bw = max(d["bandwidth"] / max(int(d.get("lanes", 1)), 1)
                         * system.usable_fraction(d) for d in nv)
    else:
        gpu_bw = max(pcie, default=max((d["bandwidth"] for d in links), default=1e9))
    nic_bws = nic_bandwidths(system)
    if system.n_nodes > 1 and nic_bws and pcie:
        gpu_bw = max(pcie)          # between nodes a channel's speed is its GPU-NIC path's
    return pipeline.communicator_channels(
        system.arch, nodes=system.n_nodes, nvswitch=system.nvswitch, gpu_bw=gpu_bw,
        nic_bws=nic_bws if system.n_nodes > 1 else (), distinct=len(rings),
        nvlink=system.intra_hw == "nvlink", unpack=getattr(system, "unpack", False))


def nic_bandwidths(system: NcclSystem) -> list:
    """Bytes/s of each NIC of the first node, as NCCL reads its speed: the NIC's link to the
    fabric (``cluster:...,nic_bw=`` sets it), else its ``bandwidth`` attribute."""
    G = system.G
    out = []
    for nic in system.nics[0] if system.nics else ():
        fabric = [G.edges[nic, v]["bandwidth"] for v in G[nic]
                  if _link_class(G.edges[nic, v]) not in INTRA_CLASSES]
        out.append(max(fabric, default=float(G.nodes[nic].get("bandwidth", 0.0)) or 1e9))
    return out


def channels_for_size(n_ranks: int, algo: str, proto: str, nbytes: int, channels: int) -> int:
    """How many of ``channels`` NCCL runs a Ring or Tree collective of ``nbytes`` on.

    NCCL picks the algorithm and protocol with every channel counted (tuning.cc), then gives
    each channel's threads at least a threshold of bytes: while ``nbytes < channels x threads
    x threshold`` it drops a channel (src/enqueue.cc ``topoGetAlgoInfo``, "Ring/Tree channel
    tuning"; threads and thresholds in :mod:`.constants`). A ring's LL threshold grows with
    the ranks, so on many GPUs LL rings run on few channels: each channel's ring leaves a node
    through its own NIC, so a small message on few channels also crosses few NICs. NVLS and
    the all-to-all keep their channels.

    Parameters
    ----------
    n_ranks : int
        Ranks of the communicator.
    algo, proto : str
        NCCL's names of the chosen algorithm and protocol.
    nbytes : int
        NCCL's ``nBytes``: the message size as nccl-tests counts it (all-gather and
        reduce-scatter: the whole gathered buffer).
    channels : int
        The communicator's channels.

    Returns
    -------
    int
        Channels the collective runs on, 1..``channels``.

    Examples
    --------
    >>> channels_for_size(1024, "Ring", "LL", 8_196_000, 8)     # LL: 8 x 1024 B per thread
    1
    >>> channels_for_size(16, "Ring", "Simple", 1 << 20, 8)
    8
    """
    if algo not in ("Ring", "Tree"):
        return channels
    threshold = C.THREAD_THRESHOLD[proto] * (n_ranks if (algo, proto) == ("Ring", "LL") else 1)
    per_channel = C.MAX_THREADS[proto] * threshold
    nc = channels
    while nc >= 2 and nbytes < nc * per_channel:
        nc -= 1
    return nc


@dataclass(frozen=True)
class Tree:
    """A tree over ranks: ``parent[r]`` (-1 at the root), ``children[r]`` in sending order and
    ``stops[(a, b)]`` the node ids of the hop between a and b (either direction)."""

    root: int
    parent: dict
    children: dict
    stops: dict
    flow: int


def channel_trees(system: NcclSystem, ring: Ring) -> tuple:
    """NCCL's two trees for the channel of ``ring``: a double binary tree over nodes (tree 1
    mirrors tree 0) whose node heads are the GPUs where the ring enters each node, and a chain
    through each node's GPUs in ring order. Kept with the system per ring object."""
    return system.kept("trees", (ring,), lambda: _channel_trees(system, ring))


def _channel_trees(system: NcclSystem, ring: Ring) -> tuple:
    per_node: list = [[] for _ in system.nodes]
    for r in ring.order:                    # one pass: a pass per node was quadratic
        per_node[system.node_of(r)].append(r)
    H = len(per_node)
    # Both trees share the chains through the nodes: made once, copied per tree (a tree
    # replaces a head's entries, never changes a list in place).
    chain_parent, chain_children, chain_stops = {}, {}, {}
    for h, chain in enumerate(per_node):
        for i, r in enumerate(chain):
            chain_parent[r] = chain[i - 1] if i else -1
            chain_children[r] = [chain[i + 1]] if i + 1 < len(chain) else []
            if i:
                chain_stops[(chain[i - 1], r)] = system.intra_stops(chain[i - 1], r)
    out = []
    for parent_h, children_h in textbook_tree.double_btree(H) if H > 1 else [([-1], [[]])] * 2:
        parent, children, stops = dict(chain_parent), dict(chain_children), dict(chain_stops)
        for h in range(H):
            head = per_node[h][0]
            if parent_h[h] >= 0:
                up = per_node[parent_h[h]][0]
                parent[head] = up
                children[up] = children[up] + [head]
                nic_a, nic_b = ring.nics[h], ring.nics[parent_h[h]]
                if nic_a is not None and nic_b is not None:
                    stops[(up, head)] = system.net_stops(up, head, nic_b, nic_a)
                else:
                    stops[(up, head)] = (system.gpu(up), system.gpu(head))
        root = next(r for r in parent if parent[r] < 0 and r in [c[0] for c in per_node])
        out.append(Tree(root, parent, children, stops, ring.flow))
    return tuple(out)
