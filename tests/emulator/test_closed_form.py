"""emulator.closed_form against the engine: equal to 1e-9 wherever no two flows share a channel.

Topologies and their (alpha, beta) per GPU pair, links of B bytes/s and L seconds:

- ``ring(p)``: neighbours are one link apart: alpha = L, beta = 1/B. Ring algorithms only send
  to the next position, one message at a time per connection, so nothing is shared.
- ``switch(p)``: every pair is two links apart (GPU - switch - GPU): alpha = 2L, beta = 1/B.
  Exact for schedules where a GPU sends one message and receives one at a time (ring, chain
  and binomial broadcast, rhd, the ring all-gather of payloads).
- ``fully_connected(p)``: a link per pair: alpha = L, beta = 1/B; exact for everything that
  never sends two messages over the same GPU pair at once (the direct algorithms too).
- a rail cluster of boxes whose GPUs each have their own NIC: intra-box pairs cross GPU -
  switch - GPU (alpha = 2 * 0.3 us, beta = 1/300e9), rail pairs GPU - NIC - leaf - NIC - GPU
  (alpha = 2 * 0.5 us + 2 * 1 us, beta = 1/25e9, the NIC line rate), for ``hierarchical``.

Sizes run from 8 B to 4 GiB, odd ones included so that ``split`` leaves remainders.

``emulator.simulate`` answers schedules whose flows never meet by a critical-path pass
(:mod:`emulator.critical_path`); every comparison here also runs the event engine itself
(``_force_events=True``), whose rules the closed forms write down.
"""
import math

import networkx as nx
import pytest

import emulator
import topologies
from emulator import ConfigError, build_schedule, closed_form, run_collective, simulate
from emulator.closed_form import MODELS
from emulator.collectives import TEXTBOOK_ALGORITHMS

B = 12.5e9                  # bytes/s per link
L = 1e-6                    # s per link
SIZES = [8, 1001, 2 ** 20 + 7, 4 * 2 ** 30]     # bytes
CHUNKS = [1, 3]


def _payloads(p: int, n: int, spread: int) -> list:
    """Uneven per-rank payload bytes: a base of about n/p plus up to ``spread`` bytes."""
    base = max(n // p, 1)
    return [base + (spread * j) // max(p - 1, 1) for j in range(p)][::-1] if p > 1 else [base]


def _agree(G, op, alg, alpha, beta, sizes=SIZES, chunks=CHUNKS, payload_spread=None,
           events=True, **kw):
    """simulate (and the event engine unless ``events`` is False) == closed_form to 1e-9."""
    p = len(topologies.gpus(G))
    for n in sizes:
        for c in chunks:
            pb = _payloads(p, n, payload_spread(n)) if payload_spread else None
            sched = build_schedule(op, alg, p, n, chunks=c, graph=G, payload_bytes=pb)
            cf = closed_form(op, alg, p, n, alpha, beta, chunks=c, payload_bytes=pb, **kw)
            why = (G.graph["name"], op, alg, n, c, pb)
            assert simulate(G, sched).time_s == pytest.approx(cf, rel=1e-9), why
            if events:
                assert simulate(G, sched, _force_events=True).time_s == \
                    pytest.approx(cf, rel=1e-9), why


# The ring all-gather of payloads is exact however uneven they are (a single ring pass).
WILD = lambda n: 3 * max(n, 8)                       # noqa: E731 - payloads up to 4x apart
# The scatter-reduce-allgather needs owners' sizes within alpha/beta bytes (module docstring
# of emulator.closed_form): alpha/beta = L * B = 12 500 bytes on fully_connected.
MILD = lambda n: 6000                                # noqa: E731

RING_KEYS = [("allreduce", "ring"), ("reduce_scatter", "ring"), ("allgather", "ring"),
             ("broadcast", "ring"), ("allreduce", "qsgd_allgather")]
SWITCH_KEYS = RING_KEYS + [("broadcast", "tree"), ("allreduce", "rhd")]
FULL_KEYS = [("allreduce", "direct"), ("reduce_scatter", "direct"), ("allgather", "direct"),
             ("alltoall", "direct"), ("allreduce", "parameter_server"), ("allreduce", "rhd"),
             ("allreduce", "qsgd_scatter_reduce_allgather"), ("allreduce", "ring")]


def _spread(alg):
    return {"qsgd_allgather": WILD, "qsgd_scatter_reduce_allgather": MILD}.get(alg)


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13])
@pytest.mark.parametrize("op, alg", RING_KEYS)
def test_ring_algorithms_on_a_ring(op, alg, p):
    _agree(topologies.ring(p, bandwidth=B, latency=L), op, alg, L, 1 / B,
           payload_spread=_spread(alg))


@pytest.mark.parametrize("p", [2, 3, 6, 8, 13])
@pytest.mark.parametrize("op, alg", SWITCH_KEYS)
def test_one_port_algorithms_on_a_switch(op, alg, p):
    _agree(topologies.switch(p, bandwidth=B, latency=L), op, alg, 2 * L, 1 / B,
           payload_spread=_spread(alg))


@pytest.mark.parametrize("p", [2, 3, 5, 8, 12])
@pytest.mark.parametrize("op, alg", FULL_KEYS)
def test_everything_on_fully_connected(op, alg, p):
    _agree(topologies.fully_connected(p, bandwidth=B, latency=L), op, alg, L, 1 / B,
           payload_spread=_spread(alg))


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 11, 16])
def test_double_binary_tree_on_fully_connected(p):
    # The two trees share a few GPU pairs; they stay apart in time for c = 1 and, from
    # p = 4, for c <= ceil(log2 p) (module docstring of emulator.closed_form).
    H = math.ceil(math.log2(p))
    chunks = [1] if p < 4 else sorted({1, 2, H})
    _agree(topologies.fully_connected(p, bandwidth=B, latency=L), "allreduce", "tree", L, 1 / B,
           chunks=chunks)


@pytest.mark.parametrize("p", [9, 10, 12])
def test_rhd_at_negligible_latency(p):
    # rhd never uses one GPU pair twice at once, so on fully_connected it is exact for any
    # alpha. At alpha = 1e-15 s and a few bytes, sending the result to an excluded rank costs
    # less than the bytes the path gives up to end at an active rank b < p - q: the longest
    # path then ends inside the allgather (the max() in emulator.closed_form._rhd).
    lat = 1e-15
    _agree(topologies.fully_connected(p, bandwidth=1e9, latency=lat), "allreduce", "rhd", lat,
           1e-9, sizes=[1, 2, 3, 5, 16, 17], chunks=[1, 2])


def _box(g: int) -> nx.Graph:
    G = nx.Graph(name=f"box{g}")
    G.add_node("nvs", kind="switch")
    for j in range(g):
        G.add_node(f"gpu{j}", kind="gpu", rank=j)
        G.add_node(f"nic{j}", kind="nic", bandwidth=25e9, protocol="ib")
        G.add_edge(f"gpu{j}", "nvs", bandwidth=300e9, latency=0.3e-6, link="nvlink")
        G.add_edge(f"gpu{j}", f"nic{j}", bandwidth=31.5e9, latency=0.5e-6, link="pcie")
    return G


@pytest.mark.parametrize("g, H", [(1, 3), (2, 1), (2, 2), (3, 4), (4, 3), (8, 2)])
def test_hierarchical_on_a_rail_cluster(g, H):
    G = topologies.cluster(_box(g), nodes=H, fabric="rail", latency=1e-6)
    _agree(G, "allreduce", "hierarchical", 0.6e-6, 1 / 300e9, gpus_per_node=g,
           alpha_inter=2 * 0.5e-6 + 2 * 1e-6, beta_inter=1 / 25e9)


def test_medium_rings():
    G = topologies.ring(64, bandwidth=B, latency=L)
    for op, alg in RING_KEYS:
        _agree(G, op, alg, L, 1 / B, sizes=[2 ** 20 + 7], payload_spread=_spread(alg))
    S = topologies.switch(100, bandwidth=B, latency=L)     # rhd with 36 extra ranks
    _agree(S, "allreduce", "rhd", 2 * L, 1 / B, sizes=[10 ** 6 + 1])


@pytest.mark.slow
@pytest.mark.parametrize("op", ["allreduce", "allgather"])
def test_512_ranks_on_a_ring(op):
    # Sizes that p does not divide desynchronise the positions at c = 1 (every flow then
    # starts and ends at its own instant: ~1.5 event-engine steps per transfer, a minute at
    # 512 ranks), and so do uneven payloads at any c: those run on simulate's critical-path
    # pass only; the event engine gets the sizes where the chains stay in step.
    G = topologies.ring(512, bandwidth=B, latency=L)
    _agree(G, op, "ring", L, 1 / B, sizes=[4 * 2 ** 30], chunks=[1, 2])
    _agree(G, op, "ring", L, 1 / B, sizes=[4 * 2 ** 30 + 3], chunks=[2])
    _agree(G, op, "ring", L, 1 / B, sizes=[4 * 2 ** 30 + 3], chunks=[1], events=False)
    _agree(G, "allreduce", "qsgd_allgather", L, 1 / B, sizes=[2 ** 20], chunks=[1, 2],
           payload_spread=WILD, events=False)


@pytest.mark.slow
@pytest.mark.parametrize("op, alg", [("allreduce", "rhd"), ("broadcast", "tree"),
                                     ("broadcast", "ring")])
def test_512_ranks_on_a_switch(op, alg):
    _agree(topologies.switch(512, bandwidth=B, latency=L), op, alg, 2 * L, 1 / B,
           sizes=[8, 4 * 2 ** 30 + 3], chunks=[1, 4])


@pytest.mark.slow
def test_48_ranks_direct_on_fully_connected():
    G = topologies.fully_connected(48, bandwidth=B, latency=L)
    for op, alg in FULL_KEYS:
        _agree(G, op, alg, L, 1 / B, sizes=[4 * 2 ** 30 + 3], chunks=[2],
               payload_spread=_spread(alg))


# -- the formulas of the literature, where sizes divide evenly ----------------------------------
@pytest.mark.parametrize("p, c", [(2, 1), (8, 1), (8, 4), (13, 2)])
def test_textbook_forms(p, c):
    a, b = 3e-6, 1e-10
    n = p * c * 2 ** 16                           # p*c divides n
    # Ring allreduce 2(p-1)(c a + n/p b); reduce-scatter and allgather half of it
    # (Patarasuk & Yuan 2009; Thakur et al. 2005 with c = 1).
    assert closed_form("allreduce", "ring", p, n, a, b, chunks=c) == \
        pytest.approx(2 * (p - 1) * (c * a + n / p * b), rel=1e-12)
    assert closed_form("allgather", "ring", p, n, a, b, chunks=c) == \
        pytest.approx((p - 1) * (c * a + n / p * b), rel=1e-12)
    # Pipelined chain broadcast: (p + c - 2)(a + n/c b).
    assert closed_form("broadcast", "ring", p, n, a, b, chunks=c) == \
        pytest.approx((p + c - 2) * (a + n / c * b), rel=1e-12)
    # Binomial broadcast: ceil(log2 p)(a + n b) per chunk set.
    assert closed_form("broadcast", "tree", p, n, a, b, chunks=c) == \
        pytest.approx(math.ceil(math.log2(p)) * (c * a + n * b), rel=1e-12)
    # Compressed all-gather with equal payloads C: (p-1)(c a + C b) (docs/collectives.md).
    assert closed_form("allreduce", "qsgd_allgather", p, n, a, b, chunks=c,
                       payload_bytes=c * 1000) == \
        pytest.approx((p - 1) * (c * a + c * 1000 * b), rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 16, 64])
def test_rabenseifner_power_of_two(p):
    # 2 log2(p) a + 2 (p-1)/p n b (Thakur et al. 2005, section 4.4) when p divides n.
    a, b, n = 2e-6, 1e-10, p * 1000
    assert closed_form("allreduce", "rhd", p, n, a, b) == \
        pytest.approx(2 * math.log2(p) * a + 2 * (p - 1) / p * n * b, rel=1e-12)


def test_ring_critical_path_carries_ceilings():
    # p = 3, n = 7: segments 3, 2, 2. At c = 1 a path can follow segment 0 around the ring
    # (the next position forwards the same segment), so every one of the 2(p-1) = 4 steps
    # costs a + 3 b, not a + 7/3 b.
    a, b = 1e-6, 1e-9
    assert closed_form("allreduce", "ring", 3, 7, a, b) == pytest.approx(4 * (a + 3 * b))
    # With 2 chunks a chain is the longest path: 8 chunk latencies and the bytes of the four
    # segments it sends, 2n - 2 (the two it skips are 2 and 2 bytes).
    assert closed_form("allreduce", "ring", 3, 7, a, b, chunks=2) == \
        pytest.approx(8 * a + (2 * 7 - 4) * b)


def test_hierarchical_textbook_form():
    # g H c | n: 2(g-1)(c a + n/g b) + 2(H-1)(c a' + n/(g H) b').
    g, H, c, n = 4, 3, 2, 4 * 3 * 2 * 1000
    a, b, ai, bi = 1e-6, 1e-11, 5e-6, 1e-10
    got = closed_form("allreduce", "hierarchical", g * H, n, a, b, chunks=c, gpus_per_node=g,
                      alpha_inter=ai, beta_inter=bi)
    want = 2 * (g - 1) * (c * a + n / g * b) + 2 * (H - 1) * (c * ai + n / (g * H) * bi)
    assert got == pytest.approx(want, rel=1e-12)


def test_single_rank_takes_no_time():
    for op, alg in TEXTBOOK_ALGORITHMS:
        kw = {"payload_bytes": [100]} if alg.startswith("qsgd") else {}
        if alg == "hierarchical":
            kw["gpus_per_node"] = 1
        assert closed_form(op, alg, 1, 1000, L, 1 / B, **kw) == 0.0
    assert run_collective(topologies.switch(1), "allreduce", "ring", 1000).time_s == 0.0


def test_every_algorithm_has_a_model():
    assert set(MODELS) == set(TEXTBOOK_ALGORITHMS)
    assert emulator.closed_form is closed_form


def test_calibration_predictor_uses_it():
    # emulator.validation.calibrate calls closed_form(op, alg, p, nbytes, alpha, beta) with the
    # rank 0 -> 1 route's alpha and beta: on a ring that is the simulated time itself.
    from emulator.validation.calibrate import PREDICTORS
    G = topologies.ring(6, bandwidth=B, latency=L)
    n = 6 * 2 ** 20
    assert PREDICTORS["closed_form"](G, "allreduce", "ring", n) == \
        pytest.approx(PREDICTORS["simulate"](G, "allreduce", "ring", n), rel=1e-9)


# -- outside the exact domain it is a lower bound ----------------------------------------------
def test_lower_bound_where_the_schedule_congests_itself():
    F = topologies.fully_connected(2, bandwidth=B, latency=L)
    # p = 2: each tree's reduce 1 -> 0 overlaps the other's broadcast 1 -> 0 once pipelined.
    sim = run_collective(F, "allreduce", "tree", 10 ** 6, chunks=4).time_s
    assert sim > closed_form("allreduce", "tree", 2, 10 ** 6, L, 1 / B, chunks=4) * 1.1
    # Payloads 1 MB apart: an owner's all-gather starts under its own scatter.
    pb = [10 ** 6, 10, 10 ** 6, 10]
    F4 = topologies.fully_connected(4, bandwidth=B, latency=L)
    sim = run_collective(F4, "allreduce", "qsgd_scatter_reduce_allgather", 4 * 10 ** 6,
                         payload_bytes=pb).time_s
    cf = closed_form("allreduce", "qsgd_scatter_reduce_allgather", 4, 4 * 10 ** 6, L, 1 / B,
                     payload_bytes=pb)
    assert sim > cf * (1 + 1e-6)


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, kwargs, words", [
    (("gather", "ring", 4, 8, L, 1e-9), {}, "op='gather' is not known"),
    (("allreduce", "bogus", 4, 8, L, 1e-9), {},
     "algorithm='bogus' is not known for op='allreduce'; known: ['direct'"),
    (("allgather", "tree", 4, 8, L, 1e-9), {}, "algorithm='tree' is not known for op='allgather'"),
    (("allreduce", "ring", 0, 8, L, 1e-9), {}, "p=0 must be an integer >= 1"),
    (("allreduce", "ring", 2.0, 8, L, 1e-9), {}, "p=2.0"),
    (("allreduce", "ring", 4, 0, L, 1e-9), {}, "nbytes=0 must be an integer number of bytes > 0"),
    (("allreduce", "ring", 4, -3, L, 1e-9), {}, "nbytes=-3"),
    (("allreduce", "ring", 4, 8.5, L, 1e-9), {}, "nbytes=8.5"),
    (("allreduce", "ring", 4, True, L, 1e-9), {}, "nbytes=True"),
    (("allreduce", "ring", 4, 8, -1e-6, 1e-9), {}, "alpha=-1e-06 must be a finite number >= 0"),
    (("allreduce", "ring", 4, 8, float("nan"), 1e-9), {}, "alpha=nan"),
    (("allreduce", "ring", 4, 8, L, 0.0), {}, "beta=0.0 must be a finite number > 0 (s/byte)"),
    (("allreduce", "ring", 4, 8, L, float("inf")), {}, "beta=inf"),
    (("allreduce", "ring", 4, 8, L, "1e-9"), {}, "beta='1e-9'"),
    (("allreduce", "ring", 4, 8, L, 1e-9), {"chunks": 0}, "chunks=0 must be an integer >= 1"),
    (("allreduce", "qsgd_allgather", 4, 8, L, 1e-9), {}, "payload_bytes is required"),
    (("allreduce", "qsgd_allgather", 4, 8, L, 1e-9), {"payload_bytes": [1, 2]},
     "payload_bytes has 2 entries, expected one per rank (4)"),
    (("allreduce", "qsgd_scatter_reduce_allgather", 2, 8, L, 1e-9), {"payload_bytes": [1, -2]},
     "payload_bytes=[1, -2] must be integers >= 0"),
    (("allreduce", "hierarchical", 8, 8, L, 1e-9), {}, "gpus_per_node=None"),
    (("allreduce", "hierarchical", 8, 8, L, 1e-9), {"gpus_per_node": 3},
     "gpus_per_node=3 does not divide p=8"),
    (("allreduce", "hierarchical", 8, 8, L, 1e-9), {"gpus_per_node": 0},
     "gpus_per_node=0 must be an integer >= 1"),
    (("allreduce", "hierarchical", 8, 8, L, 1e-9), {"gpus_per_node": 4, "alpha_inter": -1.0},
     "alpha_inter=-1.0"),
    (("allreduce", "hierarchical", 8, 8, L, 1e-9), {"gpus_per_node": 4, "beta_inter": 0},
     "beta_inter=0"),
])
def test_errors(args, kwargs, words):
    with pytest.raises(ConfigError) as e:
        closed_form(*args, **kwargs)
    assert words in str(e.value)
