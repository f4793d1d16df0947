"""NCCL's analysis of a cluster, once per kind of machine: the same facts, hops and choices as
the analysis that asks the graph's router about every pair, on every preset."""
import networkx as nx
import pytest

import topologies
from emulator.collectives.nccl import NcclSystem, channel_rings, channel_trees, hosts, plan
from emulator.collectives.nccl import system as system_mod

SPECS = ([p for p in topologies.PRESETS]
         + [f"cluster:{p}x3,fabric={f}" for p in topologies.PRESETS
            for f in ("leaf_spine", "rail") if p not in ("pcie_box", "p2_16xlarge") or f == "leaf_spine"]
         + ["cluster:dgx_a100x5,fabric=fat_tree", "cluster:dgx1_v100x2,fabric=rail"])


def _routed(monkeypatch):
    """The analysis as it was: every machine answered by the graph's router, no templates."""
    monkeypatch.setattr(hosts, "_local", lambda *a, **k: None)
    monkeypatch.setattr(system_mod.NcclSystem, "_in_machine", lambda self, a, b: None)


def _facts(s):
    return (s.nodes, s.nics, s.near, s.intra_hw, s.nvswitch, s.sm, s.net_protocol,
            s.ll_over_net, {(n, s.gpu(r)): s.latency(n, s.gpu(r)) for n in s.near
                            for r in s.near[n]})


def _hops(s):
    out = []
    for rg in channel_rings(s):
        out.extend(s.hop(st, rg.flow) for st in rg.stops)
        for tree in channel_trees(s, rg):
            out.extend(s.hop(st, tree.flow) for st in tree.stops.values())
    if len(s.ranks) <= 24:
        out.extend(s.hop(s.p2p_stops(x, y)[0], s.p2p_stops(x, y)[1]) for x in s.ranks
                   for y in s.ranks if x != y)
    return out


@pytest.mark.parametrize("spec", SPECS)
def test_per_machine_analysis_equals_the_routed_one(spec, monkeypatch):
    G = topologies.from_spec(spec)
    ranks = tuple(range(len(topologies.gpus(G))))
    new = NcclSystem._analyse(G, ranks)
    facts, hops = _facts(new), _hops(new)
    choice = plan(G, "allreduce", 1 << 22, system=new).to_dict()
    with monkeypatch.context() as m:
        _routed(m)
        old = NcclSystem._analyse(nx.Graph(G), ranks)     # another graph: nothing shared
        assert _facts(old) == facts
        assert _hops(old) == hops
        assert plan(old.G, "allreduce", 1 << 22, system=old).to_dict() == choice


def test_a_partial_communicator_and_a_changed_machine():
    G = topologies.from_spec("cluster:dgx_h100x4")
    G.edges["n2.nic5", "n2.pcie2"]["latency"] = 3e-6         # machine 2 is another kind now
    s = NcclSystem._analyse(G, tuple(range(3, 29)))
    kinds = {k[0] for k in s._place.values()}
    assert len(kinds) == 2
    r = topologies.Router(G)
    for n, near in s.near.items():
        assert near == tuple(sorted(near, key=lambda x: (r.latency(n, s.gpu(x)), x)))
        assert set(near) == set(next(g for g in s.nodes if set(near) <= set(g)))


def test_analysis_of_a_big_cluster_is_per_kind():
    # 2,048 GPUs: one kind of machine, analysed once, its facts on every copy.
    G = topologies.from_spec("cluster:dgx_h100x256,fabric=rail")
    s = NcclSystem.of(G, range(2048))
    assert len({k[0] for k in s._place.values()}) == 1
    assert s.near["n200.nic3"] == tuple(1600 + k for k in s.near["n0.nic3"])
    r = topologies.Router(G)
    for n in ("n0.nic3", "n255.nic6"):
        assert s.near[n] == tuple(sorted(s.near[n], key=lambda x: (r.latency(n, s.gpu(x)), x)))
