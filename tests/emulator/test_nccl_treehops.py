"""The Tree closed form's hops in bulk (emulator/collectives/nccl/treehops.py, hoptable.py):
the same arrays, bit for bit, as hop-by-hop objects gave them (the reference below is the
code they replace), on every preset and on clusters with more than one kind of machine."""
import numpy as np
import pytest

import topologies
from emulator.collectives.nccl import NcclSystem, channel_rings, channel_trees, plan
from emulator.collectives.nccl.cost import shared_rates, tree_time
from emulator.collectives.nccl.hoptable import hop_table
from emulator.collectives.nccl import hoptable
from emulator.collectives.nccl.treehops import tree_arrays

SPECS = ([p for p in topologies.PRESETS]
         + [f"cluster:{p}x3,fabric={f}" for p in ("dgx_h100", "dgx_a100", "p4d", "pcie_box")
            for f in ("leaf_spine", "rail") if p != "pcie_box" or f == "leaf_spine"]
         + ["cluster:dgx_a100x5,fabric=fat_tree", "cluster:dgx1_v100x2,fabric=rail",
            "switch:6"])

#: plan(..., algo="Tree") on cluster:dgx_h100x32,fabric=rail at 3024f5c: 1 MiB LL, Simple;
#: 1 GiB LL, Simple.
BASE_TREE_S = [0.0006075959599999998, 0.0003534854933333333, 0.10255439186666665,
               0.012043531026666669]


def _levels(tree):
    depth = {tree.root: 0}
    order = [tree.root]
    for x in order:
        for ch in tree.children.get(x, ()):
            depth[ch] = depth[x] + 1
            order.append(ch)
    height = {}
    for x in reversed(order):
        height[x] = 1 + max((height[ch] for ch in tree.children.get(x, ())), default=-1)
    return depth, height


def _reference(system, rings):
    """The arrays of 3024f5c's cost._make_tree_arrays, one Hop object per tree hop."""
    gpu = system.gpu
    per_ring = [channel_trees(system, rg) for rg in rings]
    info, phase_hops, level = {}, {"up": [], "down": []}, {"up": [], "down": []}
    for ring_trees in per_ring:
        for tree in ring_trees:
            depth, height = _levels(tree)
            for (a, b), stops in tree.stops.items():
                down = stops if stops[0] == gpu(a) else tuple(reversed(stops))
                for phase, st in (("down", down), ("up", tuple(reversed(down)))):
                    hop = system.hop(st, tree.flow)
                    info[(id(tree), st[0], st[-1])] = (hop, phase, len(phase_hops[phase]))
                    phase_hops[phase].append(hop)
                    level[phase].append(depth[a] if phase == "down" else height[b])
    rate = {}
    for ph, hops in phase_hops.items():
        rate[ph] = [0.0] * len(hops)
        by_level = {}
        for i, lv in enumerate(level[ph]):
            by_level.setdefault(lv, []).append(i)
        for idx in by_level.values():
            for i, r in zip(idx, shared_rates(system, [hops[i] for i in idx])):
                rate[ph][i] = r
    both = shared_rates(system, phase_hops["up"] + phase_hops["down"])
    n_up = len(phase_hops["up"])
    out = []
    for ring_trees in per_ring:
        out.append([])
        for tree in ring_trees:
            order = [tree.root]
            for x in order:
                order.extend(tree.children.get(x, ()))
            pos = {r: k for k, r in enumerate(order)}
            edges = order[1:]
            facts = {}
            for name, key in (("up", lambda a, b: (a, b)), ("down", lambda a, b: (b, a))):
                rows = []
                for a in edges:
                    x, y = key(a, tree.parent[a])
                    hop, ph, i = info[(id(tree), gpu(x), gpu(y))]
                    rows.append((hop.latency, hop.inflation, hop.net, rate[ph][i],
                                 both[i + (n_up if ph == "down" else 0)]))
                cols = list(zip(*rows)) if rows else [()] * 5
                facts[name] = tuple(np.asarray(c, dtype=float if k != 2 else bool)
                                    for k, c in enumerate(cols))
            depth = np.zeros(len(order), dtype=np.int64)
            for k, a in enumerate(edges, start=1):
                depth[k] = depth[pos[tree.parent[a]]] + 1
            parent = np.array([pos[tree.parent[a]] for a in edges], dtype=np.int64)
            levels = [np.flatnonzero(depth[1:] == d) for d in range(1, int(depth.max()) + 1)]
            leaves = np.array([not tree.children.get(r) for r in order])
            out[-1].append((parent, levels, leaves, facts["up"], facts["down"]))
    return out


def _same(new, old):
    assert len(new) == len(old)
    for ring_new, ring_old in zip(new, old):
        assert len(ring_new) == len(ring_old)
        for (p, lv, lf, up, dn), (p0, lv0, lf0, up0, dn0) in zip(ring_new, ring_old):
            assert p.tolist() == p0.tolist()
            assert [x.tolist() for x in lv] == [x.tolist() for x in lv0]
            assert lf.tolist() == lf0.tolist()
            for a, b in zip(up + dn, up0 + dn0):
                assert a.dtype == b.dtype and a.tolist() == b.tolist()   # bit for bit


@pytest.mark.parametrize("spec", SPECS)
def test_tree_arrays_equal_the_hop_by_hop_ones(spec):
    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    s = NcclSystem.of(G, range(n))
    rings = channel_rings(s)
    new = tree_arrays(s, rings)
    old = _reference(NcclSystem._analyse(G, tuple(range(n))), rings)
    _same(new, old)


def test_two_kinds_of_machines_and_a_partial_communicator():
    G = topologies.from_spec("cluster:dgx_h100x4,fabric=rail")
    G.edges["n2.gpu3", "n2.nvswitch"]["latency"] = 2e-6       # machine 2 is another kind
    ranks = tuple(range(3, 29))
    s = NcclSystem.of(G, ranks)
    assert len({k[0] for k in s._place.values()}) >= 2
    rings = channel_rings(s)
    _same(tree_arrays(s, rings), _reference(NcclSystem._analyse(G, ranks), rings))


def test_hops_without_a_template_take_the_router(monkeypatch):
    """A machine the per-kind proof does not cover: every hop from NcclSystem.hop."""
    G = topologies.from_spec("cluster:dgx_a100x2")
    s = NcclSystem.of(G, range(16))
    monkeypatch.setattr(NcclSystem, "hop_template", lambda self, a, b: None)
    rings = channel_rings(s)
    stops = [st for rg in rings for tree in channel_trees(s, rg) for st in tree.stops.values()]
    t = hop_table(s, stops, [0] * len(stops))
    assert t.latency.tolist() == [s.hop(st).latency for st in stops]
    assert t.ids.tolist() == [c for st in stops for c in s.hop(st).ids]


def test_grouped_rates_count_only_the_group():
    G = topologies.from_spec("cluster:dgx_h100x2")
    s = NcclSystem.of(G, range(16))
    st = (s.gpu(0), s.gpu(8))
    t = hop_table(s, [st, st], [0, 0])
    raw = s.hop(st).bandwidths
    together, = hoptable.shared_rates([t])
    apart, = hoptable.shared_rates([t], [[0, 1]])
    assert apart.tolist() == [min(raw)] * 2
    assert together.tolist() == [min(raw) / 2] * 2


def test_tree_times_equal_the_base_commit_on_a_rail_cluster():
    """NCCL's Tree on 32 DGX H100 (rail): the closed form's seconds as 3024f5c gave them."""
    G = topologies.from_spec("cluster:dgx_h100x32,fabric=rail")
    s = NcclSystem.of(G, range(256))
    rings = channel_rings(s)
    _same(tree_arrays(s, rings), _reference(NcclSystem._analyse(G, tuple(range(256))), rings))
    got = [plan(G, "allreduce", n, algo="Tree", proto=p, system=s).predicted_s
           for n in (1 << 20, 1 << 30) for p in ("LL", "Simple")]
    assert got == pytest.approx(BASE_TREE_S, rel=1e-12)


@pytest.mark.parametrize("spec", SPECS)
def test_ring_hops_equal_the_hop_by_hop_ones(spec):
    """cost._ring_hops through the hop table: 3024f5c's arrays, one Hop per ring hop."""
    from emulator.collectives.nccl.cost import _ring_hops

    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    s = NcclSystem.of(G, range(n))
    rings = channel_rings(s)
    ref = NcclSystem._analyse(G, tuple(range(n)))
    hops = [[ref.hop(st, rg.flow) for st in rg.stops] for rg in rings]
    rates = shared_rates(ref, [h for hs in hops for h in hs])
    k = 0
    for hs, got in zip(hops, _ring_hops(s, rings)):
        want = (np.array([h.latency for h in hs]), np.array([h.inflation for h in hs]),
                np.array([h.net for h in hs], dtype=bool), np.array(rates[k:k + len(hs)]))
        k += len(hs)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.tolist() == b.tolist()


@pytest.mark.parametrize("spec", ["cluster:dgx_h100x6,fabric=rail,nodes_per_unit=2",
                                  "cluster:dgx_a100x5,fabric=leaf_spine,hosts_per_leaf=2",
                                  "cluster:dgx_a100x5,fabric=fat_tree"])
def test_hops_across_machines_equal_the_systems_hops(spec):
    """The hops without a template (across machines, in both directions, on several flows)
    leg by leg in bulk: the facts of NcclSystem.hop, bit for bit, and the same links."""
    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    s = NcclSystem.of(G, range(n))
    ref = NcclSystem._analyse(G, tuple(range(n)))
    stops, flows = [], []
    for rg in channel_rings(s):
        for tree in channel_trees(s, rg):
            for st in tree.stops.values():
                stops += [st, st[::-1]]
                flows += [tree.flow, tree.flow + 3]
    t = hop_table(s, stops, flows)
    hops = [ref.hop(st, f) for st, f in zip(stops, flows)]
    assert sum(h.net for h in hops) >= 100                       # there are such hops
    assert t.latency.tolist() == [h.latency for h in hops]
    assert t.raw.tolist() == [h.raw for h in hops]
    assert t.usable.tolist() == [h.usable for h in hops]
    assert t.net.tolist() == [h.net for h in hops]
    assert t.bandwidths.tolist() == [b for h in hops for b in h.bandwidths]
    assert t.lens.tolist() == [len(h.channels) for h in hops]
    # channel numbers: one per directed link, whatever order they were given in
    links = [c for h in hops for c in h.channels]
    number = dict(zip(links, t.ids.tolist()))
    assert len(number) == len(set(number.values()))
    assert [number[c] for c in links] == t.ids.tolist()
    # a builder asking the system for these hops next gets the same Hops (its legs kept)
    def facts(h):
        return h.channels, h.latency, h.raw, h.usable, h.net, h.bandwidths

    again = [s.hop(st, f) for st, f in zip(stops, flows)]
    assert [facts(h) for h in again] == [facts(h) for h in hops]
    assert [h.ids for h in again] == [tuple(number[c] for c in h.channels) for h in again]


@pytest.mark.parametrize("spec", ["cluster:dgx_h100x6,fabric=rail,nodes_per_unit=2",
                                  "cluster:dgx_a100x5,fabric=leaf_spine,hosts_per_leaf=2"])
def test_briefs_kept_by_the_table_are_the_hops_facts(spec, monkeypatch):
    """The (inflation, network) a table keeps for hops across machines (NcclSystem.brief,
    what the schedule builders ask) are those of NcclSystem.hop, bit for bit; and NCCL's
    schedules built with them equal those built with every hop made as a Hop, transfer for
    transfer."""
    from emulator import build_schedule
    from emulator.collectives.nccl import system as sysmod

    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    s = NcclSystem.of(G, range(n))
    tree_arrays(s, channel_rings(s))
    ref = NcclSystem._analyse(G, tuple(range(n)))
    assert len(s._briefs) >= 4 * (len(s.nodes) - 1)
    for (st, f), got in s._briefs.items():
        h = ref.hop(st, f)
        assert got == (h.inflation, h.net)
        assert type(got[0]) is float and type(got[1]) is bool

    def built():
        out = []
        for algo in ("nccl_tree", "nccl_nvls_tree", "nccl_ring"):
            if algo == "nccl_nvls_tree" and "h100" not in spec:
                continue                         # NVLS needs NVSwitch machines of Hopper
            sch = build_schedule("allreduce", algo, n, 1 << 20, graph=G)
            out.append((sch.src.tolist(), sch.dst.tolist(), sch.size.tolist(),
                        sch.compute_s.tolist(), [r for r in sch.routes]))
        return out

    with_briefs = built()
    sysmod._SYSTEMS.pop(G, None)                 # analysed afresh, every hop a Hop
    monkeypatch.setattr(NcclSystem, "brief",
                        lambda self, st, f=0: (self.hop(st, f).inflation, self.hop(st, f).net))
    assert built() == with_briefs
