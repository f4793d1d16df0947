"""Closed forms of the NCCL schedules of :mod:`.builders`, and NCCL's choice among them.

Each function returns the seconds the engine takes for the schedule when every flow that
shares a link starts and ends with the others (the channels of a switch, the hops of one ring
step): a flow's rate is then its bottleneck's bandwidth divided by the flows crossing it
(max-min fairness), and a schedule's time is its longest dependency chain of
``wait + path latency + wire bytes / rate`` (:mod:`emulator.closed_form` explains the chain
for the textbook ring; the NCCL ring is that ring with per-hop latency, wire bytes and rates).
The same functions give NCCL's choice: like ``ncclTopoGetAlgoTime`` (src/graph/tuning.cc), the
model predicts every enabled (algorithm, protocol) and picks the fastest.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .._schedule import split, split_each
from . import constants as C
from . import pipeline
from .builders import RING_OPS, _chunks, hop_latency
from .system import NcclSystem
from .hoptable import hop_table, shared_rates as hoptable_rates
from .treehops import tree_arrays


def efficiency(system: NcclSystem, rings: list, algo: str, proto: str,
               nbytes: int | None = None) -> float:
    """Payload share of the bandwidth ``algo`` gets with ``proto`` (tuning.cc's factors).

    Ring: LL 0.5, LL128 0.92, Simple 1. Tree: 0.92 times LL 1/3.8, LL128 7/9 (one node) or
    120/128 (several), Simple 1. LL is further capped at NCCL's llMaxBw: its bus bandwidth is
    at most that figure, so the share is min(share, llMaxBw / Simple's bus bandwidth). A tree
    moving a message of ``nbytes`` (given) reaches tuning.cc's medium-size correction of that
    (:func:`.constants.tree_correction`).

    Examples
    --------
    >>> import topologies
    >>> from .channels import channel_rings
    >>> s = NcclSystem.of(topologies.from_spec("dgx_a100"), range(8))
    >>> round(float(efficiency(s, channel_rings(s), "Ring", "LL")), 3)  # 87.7 of ~238 GB/s
    0.368
    """
    if algo == "Tree" and nbytes is not None:
        return efficiency(system, rings, algo, proto) * C.tree_correction(proto, nbytes)
    key = ("eff", algo, proto, len(rings))
    cache = system.__dict__.setdefault("_cache", {})
    if key in cache:
        return cache[key]
    if algo == "Tree":
        e = C.TREE_PROTOCOL_EFFICIENCY[proto]
        if proto == "LL128":
            e = e[0] if system.n_nodes == 1 else e[1]
        e *= C.TREE_EFFICIENCY
    elif algo in ("Ring", "P2P"):
        e = C.PROTOCOL_EFFICIENCY[proto]
    else:
        e = 1.0
    if proto == "LL" and algo in ("Ring", "Tree") and len(system.ranks) > 1:
        row = system.arch if system.n_nodes == 1 else "intel"
        cap = C.LL_MAX_BW[row][min(system.n_nodes, 3) - 1]
        simple = efficiency(system, rings, algo, "Simple")
        n = 1 << 30
        p = len(system.ranks)
        if algo == "Ring":
            t = ring_time(system, rings, "allreduce", split(n, p), "Simple", simple)
        else:
            t = tree_time(system, rings, n, "Simple", simple)
        busbw = 2 * (p - 1) / p * n / t
        e = min(e, simple * cap / busbw)
    cache[key] = e
    return e


def _facts(system: NcclSystem, stops: tuple, flow: int, algo: str, proto: str, eff: float):
    hop = system.hop(stops, flow)
    return hop, hop.inflation / eff, hop_latency(system, hop.net, algo, proto)


def shared_rates(system: NcclSystem, hops: list) -> list:
    """Bytes/s of each of ``hops`` when all run at once (bottleneck bandwidth / flows on it).

    Counted over the channels' numbers in arrays (the same divisions and minima as one
    hop at a time: 260,000 tree hops on 8,192 GPUs took seconds in a Counter)."""
    if not hops or any(len(h.ids) != len(h.channels) for h in hops):
        count = Counter(c for h in hops for c in h.channels)
        return [min(bw / count[c] for c, bw in zip(h.channels, h.bandwidths)) for h in hops]
    lens = np.fromiter((len(h.ids) for h in hops), dtype=np.int64, count=len(hops))
    ids = np.fromiter((c for h in hops for c in h.ids), dtype=np.int64, count=int(lens.sum()))
    bws = np.fromiter((b for h in hops for b in h.bandwidths), dtype=float, count=len(ids))
    share = bws / np.bincount(ids)[ids]
    return np.minimum.reduceat(share, np.concatenate(([0], np.cumsum(lens)[:-1]))).tolist()


def _ring_hops(system: NcclSystem, rings: list) -> list:
    """Per channel: each hop's path latency (s), wire bytes per payload byte before the
    protocol's efficiency, whether it crosses the network, and its shared rate (bytes/s) when
    every hop of every channel runs at once. None of it depends on the size or the protocol,
    so a search over sizes computes it once (kept with the rings, which stay alive in it)."""
    return system.kept("ring_hops", tuple(rings), lambda: _make_ring_hops(system, rings))


def _make_ring_hops(system: NcclSystem, rings: list) -> list:
    stops = [st for rg in rings for st in rg.stops]
    flows = [rg.flow for rg in rings for _ in rg.stops]
    t = hop_table(system, stops, flows)
    rates, = hoptable_rates([t])
    infl = t.inflation
    out, k = [], 0
    for rg in rings:
        e = k + len(rg.stops)
        out.append((t.latency[k:e], infl[k:e], t.net[k:e], rates[k:e]))
        k = e
    return out


def ring_latency_scale(system: NcclSystem, op: str, proto: str, nbytes: int,
                       channels: int) -> float:
    """Factor on a ring's latencies (launch and per step): tuning.cc's "plateau effect of
    ring" (:data:`.constants.RING_PLATEAU`) for a Simple allreduce of ``nbytes`` across nodes
    on a communicator of ``channels`` channels, else 1.

    Examples
    --------
    >>> import topologies
    >>> s = NcclSystem.of(topologies.from_spec("cluster:dgx_a100x2"), range(16))
    >>> ring_latency_scale(s, "allreduce", "Simple", 1 << 20, 8)
    1.4
    """
    if op != "allreduce" or proto != "Simple" or system.n_nodes < 2:
        return 1.0
    if nbytes / (channels * len(system.ranks)) < 64:
        return 1.0
    return C.RING_PLATEAU[system.arch]


def ring_waits(system: NcclSystem, rings: list, op: str, proto: str, eff: float, nbytes: int,
               nc: int, lat_scale: float = 1.0) -> list:
    """Per channel of ``rings``, the seconds each hop's steps wait for their handshakes
    (:func:`.pipeline.step_wait`): NCCL runs ``nc`` channels on these rings, each moving
    ``nbytes / nc`` of nccl-tests' ``nbytes`` in loops of chunks; every loop's step on a hop
    pays the link type's per-step latency (:func:`.builders.hop_latency`) times
    ``lat_scale``. ``eff`` is the ring's payload share of its links (kept for the caller's
    key; the waits do not depend on it).

    Examples
    --------
    >>> import topologies
    >>> from .channels import channel_rings
    >>> s = NcclSystem.of(topologies.from_spec("dgx_a100"), range(8))
    >>> rings = channel_rings(s)
    >>> [round(float(ring_waits(s, rings, "allreduce", "Simple", 1.0, n, 24)[0][0]) * 1e6, 1)
    ...  for n in (1 << 20, 1 << 30)]          # 1 loop; 1 GiB / 24 channels: 3 loops
    [3.4, 10.2]
    """
    share = max(int(math.ceil(nbytes / max(nc, 1))), 1)
    chunking = pipeline.ring_chunking(op, proto, share, len(system.ranks), system.buffers)
    wait = np.array([pipeline.step_wait(chunking, hop_latency(system, net, "Ring", proto),
                                        lat_scale) for net in (False, True)])
    return [wait[net.astype(np.int64)] for _, _, net, _ in _ring_hops(system, rings)]


def ring_time(system: NcclSystem, rings: list, op: str, blocks, proto: str,
              eff: float | None = None, lat_scale: float = 1.0, waits=None) -> float:
    """Seconds of :func:`.builders.ring`: the launch latency ``baseLat`` plus, per channel, the
    longer of

    - the longest chain of ``S`` consecutive hops around the ring (a segment's path: it waits
      for its data only), each hop ``wait + latency + ceil(segment x scale) / rate``, and
    - the slowest hop's ``S`` segments back to back after one hop's latency (a slower hop
      throttles the ring to its rate).

    Exact when every hop is alike (the chain is then the longer); a bound otherwise.
    ``lat_scale`` multiplies ``baseLat`` and every per-step wait (:func:`ring_latency_scale`);
    ``waits`` (per channel, per hop; :func:`ring_waits`) replace the per-step waits, which are
    otherwise the link type's whole per-step latency."""
    steps_of = RING_OPS[op][0]
    blocks = np.asarray(blocks, dtype=np.int64)
    seg_of = split_each(blocks, len(rings)).max(axis=1)
    eff = efficiency(system, rings, "Ring", proto) if eff is None else eff
    wait = {net: lat_scale * hop_latency(system, net, "Ring", proto) for net in (False, True)}
    base = lat_scale * C.BASE_LATENCY["Ring"][proto]
    best = 0.0
    for c, (path_lat, inflation, net, rates) in enumerate(_ring_hops(system, rings)):
        p = len(rings[c].order)
        if p < 2:
            continue
        lat = (np.where(net, wait[True], wait[False]) if waits is None else waits[c]) + path_lat
        d = lat + np.ceil(int(seg_of[c]) * (inflation / eff)) / rates
        S = steps_of(p)
        # The chain ending at hop r covers hops r, r-1, ..., r-S+1 (mod p): ``rest`` of them
        # past the whole laps, a window sum of the ring read twice.
        laps, rest = divmod(S, p)
        sums = np.concatenate(([0.0], np.cumsum(np.concatenate((d, d)))))
        window = sums[p + 1:2 * p + 1] - sums[p + 1 - rest:2 * p + 1 - rest]
        chain = laps * d.sum() + float(window.max())
        throttle = S * float((d - lat).max()) + float(lat.max())
        best = max(best, base + max(float(chain), throttle))
    return best


def broadcast_time(system: NcclSystem, rings: list, nbytes: int, proto: str) -> float:
    """Pipelined chain per channel (Pjesivac-Grbovic et al. 2007): the first chunk crosses
    every hop with its wait, the other chunks follow one after another on the slowest hop."""
    eff = efficiency(system, rings, "Ring", proto)
    facts = [[_facts(system, st, rg.flow, "Ring", proto, eff) for st in rg.stops[:-1]]
             for rg in rings]
    rates = shared_rates(system, [f[0] for fs in facts for f in fs])
    base = C.BASE_LATENCY["Ring"][proto]
    best, k = 0.0, 0
    for c, (rg, share) in enumerate(zip(rings, split(nbytes, len(rings)))):
        sizes = [int(x) for x in split(int(share), _chunks(int(share), proto))]
        mine = rates[k:k + len(facts[c])]
        k += len(facts[c])
        if not facts[c]:
            continue

        def d(i, size):
            hop, scale, _ = facts[c][i]
            return hop.latency + math.ceil(size * scale) / mine[i]

        first = sum(facts[c][i][2] + d(i, sizes[0]) for i in range(len(facts[c])))
        rest = sum(max(d(i, x) for i in range(len(facts[c]))) for x in sizes[1:])
        best = max(best, base + first + rest)
    return best


def tree_time(system: NcclSystem, rings: list, nbytes: int, proto: str,
              eff: float | None = None) -> float:
    """Double binary trees, pipelined in chunks: the launch latency, the first chunk up the
    deepest leaf-to-root path and back down (a link shared by the trees that cross it in the
    same phase), then the other chunks on the slowest edge with the up and down flows of every
    tree sharing links. Exact for one chunk on trees that cross links alike (one node); the
    steady-state term is a bound (the engine overlaps phases partly)."""
    eff = efficiency(system, rings, "Tree", proto, nbytes) if eff is None else eff
    trees = [(arrays, int(half))
             for ring_trees, share in zip(tree_arrays(system, rings), split(nbytes, len(rings)))
             for arrays, half in zip(ring_trees, split(int(share), 2))]
    wait = np.array([hop_latency(system, net, "Tree", proto) for net in (False, True)])
    best = 0.0
    for (parent, levels, leaves, up, down), half in trees:
        sizes = split(half, _chunks(half, proto))
        first = int(sizes[0])
        if not len(parent):
            best = max(best, C.BASE_LATENCY["Tree"][proto])
            continue

        def edge(lat, inflation, net, r_first, r_both):
            """(the first chunk's seconds with the per-step wait, a later chunk's)."""
            wire = np.ceil(first * (inflation / eff))
            return wait[net.astype(np.int64)] + lat + wire / r_first, lat + wire / r_both

        up_first, up_rest = edge(*up)
        down_first, down_rest = edge(*down)
        # The first chunk's round trip to the root, per rank, level by level from the root;
        # the deepest leaf's is the chain, the slowest edge paces the other chunks.
        trip = np.zeros(len(parent) + 1)
        for idx in levels:
            trip[idx + 1] = trip[parent[idx]] + up_first[idx] + down_first[idx]
        slow = max(float(up_rest.max()), float(down_rest.max()))
        worst = float(trip[leaves].max())
        best = max(best, C.BASE_LATENCY["Tree"][proto] + worst + (len(sizes) - 1) * slow)
    return best


def nvls_time(system: NcclSystem, nbytes: int) -> float:
    """All-pairs exchange of ``n (1 + 1/p) / (p - 1)``: one step of the slowest pair."""
    group = list(system.ranks)
    p = len(group)
    if p < 2:
        return 0.0
    pair = math.ceil(nbytes * (1 + 1 / p) / (p - 1))
    eff = C.NVLS_EFFICIENCY[system.arch]
    hops = [system.hop((system.gpu(x), system.gpu(y))) for x in group for y in group if x != y]
    rates = shared_rates(system, hops)
    lat = C.HOP_LATENCY["nvlink"]["NVLS"]["Simple"]
    return max(lat + h.latency + math.ceil(pair * h.inflation / eff) / r
               for h, r in zip(hops, rates))


def nvls_tree_time(system: NcclSystem, rings: list, nbytes: int) -> float:
    """NVLS halves inside nodes and a rail tree between them, pipelined: the launch, one chunk
    through every stage, then the other chunks through the slowest stage (each GPU's shard on
    the NICs :func:`.builders.rail_ring` gives it, both halves at once)."""
    from .builders import rail_ring

    g = system.ppn
    chunks = split(nbytes, _chunks(math.ceil(nbytes / g), "Simple"))
    c0 = int(chunks[0])
    eff = C.NVLS_EFFICIENCY[system.arch]
    grp = list(system.nodes[0])
    intra = 0.0
    if g > 1:
        pair = math.ceil(c0 * (1 + 1 / g) / 2 / (g - 1))
        hops = [system.hop((system.gpu(x), system.gpu(y))) for x in grp for y in grp if x != y]
        rates = shared_rates(system, hops)
        intra = max(h.latency + math.ceil(pair * h.inflation / eff) / r for h, r in zip(hops, rates))
    shard = math.ceil(c0 / g)
    H = system.n_nodes
    facts = []
    for j in range(g):
        for t in range(2):
            rg = rail_ring(system, rings, j, t)
            st = next((st for st in rg.stops if len(st) > 2), None)
            if st is not None:
                facts.append(_facts(system, st, rg.flow, "NVLSTree", "Simple", 1.0))
    if not facts:
        return intra
    # every rail sends up and receives down at once: both directions of its legs
    rates = shared_rates(system, [f[0] for f in facts])
    half = math.ceil(shard / 2)
    inter_one = max(h.latency + math.ceil(half * s) / r for (h, s, _), r in zip(facts, rates))
    wait = max(w for _, _, w in facts)
    depth = max(1, (H - 1).bit_length())
    lat = C.HOP_LATENCY["nvlink"]["NVLSTree"]["Simple"]
    first = lat + 2 * intra + 2 * depth * (wait + inter_one)
    return first + (len(chunks) - 1) * max(intra, inter_one)
