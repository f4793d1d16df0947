"""The fast path: NCCL's closed form for a collective without its schedule, the count of the
transfers a schedule would have, and the closed form calibrated by the engine on a smaller
cluster of the same machines."""
import pytest

import emulator
import topologies
from emulator import fastpath
from emulator.collectives.nccl import NcclSystem

CASES = [("cluster:dgx_h100x4", "allreduce", 10**6, "nccl", None),
         ("cluster:dgx_h100x3", "allreduce", 10**9, "nccl", None),
         ("cluster:dgx_a100x4", "allreduce", 10**8, "nccl_ring", None),
         ("cluster:dgx_a100x4", "allreduce", 10**6, "nccl_tree", None),
         ("cluster:dgx_a100x4", "allreduce", 3 * 10**5, "nccl_tree", "LL"),
         ("cluster:dgx_a100x4", "allreduce", 10**9, "nccl_tree", "Simple"),
         ("cluster:dgx_a100x4", "allgather", 10**8, "nccl", None),
         ("cluster:dgx_a100x4", "reduce_scatter", 10**7, "nccl", None),
         ("cluster:dgx_a100x3", "broadcast", 10**8, "nccl", None),
         ("cluster:dgx_a100x3", "broadcast", 10**4, "nccl", "LL"),
         ("dgx_h100", "allreduce", 10**8, "nccl", None),
         ("cluster:dgx_a100x4", "alltoall", 10**8, "nccl", None),
         ("dgx1_v100", "allreduce", 10**7, "nccl", None),
         ("cluster:p4dx3", "allreduce", 5 * 10**6, "nccl", None)]


@pytest.mark.parametrize("spec,op,nbytes,algorithm,proto", CASES)
def test_transfers_counts_the_schedule_without_building_it(spec, op, nbytes, algorithm, proto):
    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    sched = emulator.build_schedule(op, algorithm, n, nbytes, graph=G, protocol=proto)
    system = NcclSystem.of(G, range(n))
    assert fastpath.transfers(system, op, sched.detail["nccl"], nbytes) == len(sched)


@pytest.mark.parametrize("spec,op,nbytes,algorithm,proto", CASES[:8])
def test_closed_form_is_the_plans_and_calibrating_on_the_cluster_itself_gives_the_engine(
        spec, op, nbytes, algorithm, proto):
    G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    fast = fastpath.closed_form_collective(G, op, algorithm, nbytes, protocol=proto)
    sched = emulator.build_schedule(op, algorithm, n, nbytes, graph=G, protocol=proto)
    assert fast.nccl == sched.detail["nccl"] and fast.time_s == sched.detail["nccl"]["predicted_s"]
    assert fast.error == fastpath.ERROR_BOUND.get(fast.nccl["algorithm"], max(fastpath.ERROR_BOUND.values()))
    engine = emulator.simulate(G, sched).time_s
    cal = fastpath.calibrated_collective(G, op, algorithm, nbytes, G, protocol=proto)
    assert cal.time_s == pytest.approx(engine, rel=1e-12)
    assert "engine/closed form" in cal.method and cal.nccl == fast.nccl


def test_calibration_on_a_smaller_cluster_forces_the_big_clusters_choice():
    big, small = "cluster:dgx_h100x16,fabric=rail", "cluster:dgx_h100x4,fabric=rail"
    G, S = topologies.from_spec(big), topologies.from_spec(small)
    cal = fastpath.calibrated_collective(G, "allreduce", "nccl", 1 << 28, S)
    fast = fastpath.closed_form_collective(G, "allreduce", "nccl", 1 << 28)
    forced = emulator.build_schedule("allreduce", fastpath.FORCE[fast.nccl["algorithm"]], 32,
                                     1 << 28, graph=S, protocol=fast.nccl["protocol"])
    ratio = emulator.simulate(S, forced).time_s / forced.detail["nccl"]["predicted_s"]
    assert cal.time_s == pytest.approx(fast.time_s * ratio, rel=1e-12)
    assert f"{ratio:.3f}" in cal.method


def test_smaller_cluster_keeps_the_options_and_scaled_bytes_keep_the_per_rank_share():
    G = fastpath.smaller_cluster("cluster:dgx_a100x64,fabric=rail,nodes_per_unit=4", 8)
    assert len(topologies.gpus(G)) == 64 and "su1.rail0" in G
    assert fastpath.smaller_cluster("cluster:dgx_a100x4", 8) is None
    assert fastpath.smaller_cluster("leaf_spine:leaves=4,spines=2,hosts=4", 2) is None
    assert fastpath.scaled_bytes("allreduce", 10**6, 8192, 64) == 10**6
    assert fastpath.scaled_bytes("allgather", 8192 * 100, 8192, 64) == 6400


def test_the_closed_form_refuses_a_textbook_algorithm():
    G = topologies.from_spec("ring:4")
    with pytest.raises(emulator.ConfigError, match="algorithm='ring'.*NCCL"):
        fastpath.closed_form_collective(G, "allreduce", "ring", 1000)


def test_estimates_grow_with_the_work():
    assert fastpath.engine_seconds("NVLSTree", 2_000_000) > fastpath.engine_seconds("Ring", 2_000_000)
    assert fastpath.analysis_seconds(65536) > 8 * (fastpath.analysis_seconds(8192)
                                                   - fastpath.SECONDS_FIXED)


def test_an_all_to_all_beyond_the_table_is_calibrated_in_its_own_form(monkeypatch):
    """Beyond p2p.TABLE_MAX ranks the all-to-all's closed form is the aggregate one; its
    calibration divides the small cluster's engine time by the aggregate form there too."""
    from emulator.collectives.nccl import _a2a_sizes, p2p

    monkeypatch.setattr(p2p, "TABLE_MAX", 32)
    big = topologies.from_spec("cluster:dgx_a100x8,fabric=fat_tree")
    small = topologies.from_spec("cluster:dgx_a100x4,fabric=fat_tree")
    nb = 1 << 24
    r = fastpath.calibrated_collective(big, "alltoall", "nccl", nb, small)
    fast = fastpath.closed_form_collective(big, "alltoall", "nccl", nb)
    s = NcclSystem.of(big, range(64))
    assert fast.time_s == p2p.time(s, _a2a_sizes(s, nb), "Simple", form="aggregate")
    sm = NcclSystem.of(small, range(32))
    sched = emulator.build_schedule("alltoall", "nccl_p2p", 32, nb // 2, graph=small,
                                    protocol="Simple")
    engine = emulator.simulate(small, sched).time_s
    agg = p2p.time(sm, _a2a_sizes(sm, nb // 2), "Simple", form="aggregate")
    assert agg != p2p.time(sm, _a2a_sizes(sm, nb // 2), "Simple", form="table")
    assert r.time_s == pytest.approx(fast.time_s * engine / agg, rel=1e-12)
