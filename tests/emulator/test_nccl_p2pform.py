"""NCCL's all-to-all from per-machine aggregates (emulator/collectives/nccl/p2pform.py): the
per-pair closed form's seconds on regular clusters, refused where a cluster is not regular,
and what p2p.time takes beyond TABLE_MAX ranks."""
import numpy as np
import pytest

import topologies
from emulator.collectives.nccl import NcclSystem, p2p, plan
from emulator.collectives.nccl import p2pform

#: Non-blocking fabrics: the NICs and the PXN links bind, which the aggregate counts exactly.
REGULAR = ["cluster:dgx_a100x4,fabric=rail", "cluster:dgx_h100x16,fabric=leaf_spine",
           "cluster:dgx_h100x16,fabric=rail", "cluster:p4dx4", "cluster:dgx_a100x32"]


@pytest.mark.parametrize("spec", REGULAR)
@pytest.mark.parametrize("per_peer", [1, 4096, 1 << 20, 1 << 24])
def test_aggregate_equals_every_pair_on_regular_clusters(spec, per_peer):
    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    s = NcclSystem.of(G, range(n))
    assert p2pform.regular(s) is not None
    sizes = p2p.uniform(s, np.full(n, per_peer))
    for proto in ("LL", "Simple"):
        table = p2p.time(s, sizes, proto, form="table")
        assert p2p.time(s, sizes, proto, form="aggregate") == pytest.approx(table, rel=1e-9)


@pytest.mark.parametrize("spec,most", [("cluster:dgx_a100x6,fabric=fat_tree", 0.24),
                                       ("cluster:dgx_h100x16,fabric=fat_tree", 0.05)])
def test_a_fat_tree_leaves_out_hash_collisions(spec, most):
    """The router's hash puts more sends on some of a fat tree's links than the average the
    aggregate counts: faster than the per-pair form, by at most ``most`` here."""
    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    s = NcclSystem.of(G, range(n))
    sizes = p2p.uniform(s, np.full(n, 1 << 20))
    table = p2p.time(s, sizes, form="table")
    agg = p2p.time(s, sizes, form="aggregate")
    assert table * (1 - most) <= agg <= table


def test_unequal_receivers_take_the_largest():
    G = topologies.from_spec("cluster:dgx_h100x4,fabric=rail")
    s = NcclSystem.of(G, range(32))
    per = np.arange(32) * 1000 + 10**6
    agg = p2p.time(s, p2p.uniform(s, per), form="aggregate")
    table = p2p.time(s, p2p.uniform(s, per), form="table")
    assert agg >= table
    assert agg == pytest.approx(table, rel=0.05)


@pytest.mark.parametrize("spec,ranks", [("dgx_a100", 8), ("cluster:dgx_h100x4", 20),
                                        ("pcie_box", 8), ("switch:4", 4)])
def test_not_regular(spec, ranks):
    G = topologies.from_spec(spec)
    s = NcclSystem.of(G, range(ranks))
    assert p2pform.regular(s) is None
    with pytest.raises(ValueError, match="regular"):
        p2p.time(s, p2p.uniform(s, np.ones(ranks, dtype=np.int64)), form="aggregate")


def test_two_kinds_of_machines_are_not_regular():
    G = topologies.from_spec("cluster:dgx_h100x4,fabric=rail")
    G.edges["n2.gpu3", "n2.nvswitch"]["latency"] = 2e-6
    assert p2pform.regular(NcclSystem.of(G, range(32))) is None


def test_beyond_table_max_the_plan_takes_the_aggregate(monkeypatch):
    G = topologies.from_spec("cluster:dgx_h100x8,fabric=rail")
    s = NcclSystem.of(G, range(64))
    exact = plan(G, "alltoall", 1 << 26, system=s).predicted_s
    monkeypatch.setattr(p2p, "TABLE_MAX", 16)
    monkeypatch.setattr(p2p, "table", lambda system: pytest.fail("the per-pair table"))
    assert p2p.aggregated(s)
    s2 = NcclSystem._analyse(G, tuple(range(64)))
    assert plan(G, "alltoall", 1 << 26, system=s2).predicted_s == pytest.approx(exact, rel=1e-9)
