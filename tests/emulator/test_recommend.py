"""The recommender: the search against the exhaustive optimum on small cases, the budget
checks, the front, and the variance model against the trace's records."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import emulator
import qsgd
import topologies


class Tower(nn.Module):
    """Five linear layers of different sizes: five buckets of different shares of bytes and norm."""

    input_shape = (64,)

    def __init__(self):
        super().__init__()
        sizes = [64, 256, 96, 192, 48, 10]
        self.layers = nn.Sequential(*[nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])])

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


@pytest.fixture(scope="module")
def trace():
    torch.manual_seed(0)
    return qsgd.measure(Tower(), qsgd.QSGDConfig.from_bits(4, bucket_size=128), iterations=1, batch_size=4,
                        device="cpu", seed=0, min_numel=100, bucket_cap_bytes=40_000, first_bucket_bytes=5_000,
                        variance_bits=(2, 3, 4, 8), variance_samples=1)


@pytest.fixture(scope="module")
def net():
    # textbook ring and direct collectives on a slow switch: communication-bound and fast to simulate
    return emulator.Network(topologies.from_spec("switch:8,bw=100Mbit"), 8, "ring")


COMPUTE = emulator.ComputeModel(compute_scale=0.05, codec_scale=0.05)


def test_trace_has_several_groups(trace):
    assert len(emulator.VarianceModel(trace).groups) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("budget", [emulator.Budget(variance=v) for v in (0.02, 0.08, 0.3, 1.0)]
                         + [emulator.Budget(bits_per_element=b) for b in (3.0, 4.5)])
def test_search_returns_the_exhaustive_optimum(trace, net, budget):
    fast = emulator.recommend(trace, budget=budget, network=net, compute=COMPUTE)
    full = emulator.recommend(trace, budget=budget, network=net, compute=COMPUTE, exhaustive=True)
    assert fast.best.iteration_s == pytest.approx(full.best.iteration_s, rel=1e-9)
    assert fast.evaluated < full.evaluated
    groups = len(emulator.VarianceModel(trace).groups)
    assert full.evaluated == 2 * 4 ** groups + 2     # every combination, both transports, fp32, fp16
    within = (fast.best.variance <= budget.variance if budget.variance is not None
              else fast.best.bits_per_element <= budget.bits_per_element)
    assert within


def test_recommendation_beats_uniform_at_its_variance(trace, net):
    vm = emulator.VarianceModel(trace)
    v4 = vm.increase((4,) * trace.num_buckets, "qsgd_allgather", net.world_size)
    rec = emulator.recommend(trace, budget=emulator.Budget(variance=v4), network=net, compute=COMPUTE)
    u4 = next(c for c in rec.uniform if c.transport == "qsgd_allgather" and c.bits[0] == 4)
    assert rec.best.iteration_s <= u4.iteration_s and rec.best.variance <= v4 * (1 + 1e-12)
    # the front: faster points have more variance, and it holds the recommendation's time
    times = [c.iteration_s for c in rec.front]
    variances = [c.variance for c in rec.front]
    assert times == sorted(times) and variances == sorted(variances, reverse=True)
    assert any(c.uniform for c in rec.front) or rec.front
    assert min(c.iteration_s for c in rec.front) <= rec.best.iteration_s
    # the policy gives each compressed parameter its bucket's width
    for b in trace.buckets:
        for p in b.variance.params:
            assert rec.policy[p.name] == rec.best.bits[b.index]
    d = rec.to_dict()
    assert d["evaluated"] == rec.evaluated and "bit_policy=" in d["qsgd_state"]


def test_variance_model_matches_the_records(trace):
    vm = emulator.VarianceModel(trace)
    bits = tuple(2 if k % 2 else 8 for k in range(trace.num_buckets))
    want = sum(b.variance.ratio_at(bits[b.index]) * b.variance.norm_sq for b in trace.buckets) / sum(
        b.variance.norm_sq + b.variance.raw_norm_sq for b in trace.buckets)
    assert vm.increase(bits, "qsgd_allgather", 8) == pytest.approx(want)
    assert vm.increase(bits, "qsgd_scatter_reduce_allgather", 8) == pytest.approx(9 * want)


@pytest.mark.parametrize("kwargs, message", [
    ({"variance": -0.1}, r"budget variance must be a finite number >= 0, got -0.1"),
    ({"variance": math.nan}, r"budget variance must be a finite number >= 0, got nan"),
    ({"bits_per_element": 1.0}, r"budget bits_per_element must be a finite number >= 2, got 1.0"),
    ({}, r"budget: give exactly one of variance or bits_per_element"),
])
def test_bad_budgets_are_one_line_errors(kwargs, message):
    with pytest.raises(emulator.ConfigError, match=message) as info:
        emulator.Budget(**kwargs)
    assert "\n" not in str(info.value)


def test_impossible_budgets_name_the_value(trace, net):
    with pytest.raises(emulator.ConfigError, match=r"budget variance=1e-12 is impossible: the least reachable"):
        emulator.recommend(trace, budget=emulator.Budget(variance=1e-12), network=net, compute=COMPUTE)
    with pytest.raises(emulator.ConfigError, match=r"budget bits_per_element=2.5 is impossible: the "
                                                   r"narrowest allowed width is 3 bits"):
        emulator.recommend(trace, budget=emulator.Budget(bits_per_element=2.5), network=net,
                           compute=COMPUTE, bits=(3, 4))
    with pytest.raises(emulator.ConfigError, match=r"bits: 5 was not measured"):
        emulator.recommend(trace, budget=emulator.Budget(variance=1.0), network=net, bits=(4, 5))


def test_a_trace_without_variance_is_refused():
    t = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2, device="cpu",
                     variance_bits=())
    with pytest.raises(emulator.ConfigError, match=r"buckets \[0\] have no variance records"):
        emulator.VarianceModel(t)


def test_replay_of_mixed_widths_sums_its_buckets(trace, net):
    k = trace.num_buckets
    mixed = tuple(2 if j % 2 else 8 for j in range(k))
    got = emulator.replay(trace, None, transport="qsgd_allgather", network=net, compute=COMPUTE, bits=mixed)
    assert got.bucket_bits == mixed and got.bits == 8
    for j, b in enumerate(got.buckets):
        alone = emulator.replay(trace, None, transport="qsgd_allgather", network=net, compute=COMPUTE,
                                bits=mixed[j])
        assert b.wire_bytes == alone.buckets[j].wire_bytes
    with pytest.raises(emulator.ConfigError, match=rf"bits: expected one width per bucket \({k}\), got 1"):
        emulator.replay(trace, None, transport="qsgd_allgather", network=net, bits=(4,))


def test_a_transport_that_cannot_meet_the_budget_is_skipped(trace, net):
    vm = emulator.VarianceModel(trace)
    sra_least = vm.increase((8,) * trace.num_buckets, "qsgd_scatter_reduce_allgather", net.world_size)
    # 1 + p = 9 times the all-gather's at the same widths: half of it is within reach of one only
    rec = emulator.recommend(trace, budget=emulator.Budget(variance=sra_least / 2), network=net,
                             compute=COMPUTE)
    assert "qsgd_scatter_reduce_allgather" in rec.extra["skipped_transports"]
    assert all(c.transport == "qsgd_allgather" for c in rec.front + rec.uniform)


def test_a_long_search_says_how_far_it_has_come(trace, monkeypatch):
    """Every 25th candidate, and any step slower than PROGRESS_EVERY_S (here: all of them),
    including the collectives the search simulates on a Network of its own."""
    import sys

    monkeypatch.setattr(sys.modules["emulator.recommend"], "PROGRESS_EVERY_S", 0.0)
    heard: list[str] = []
    G = topologies.from_spec("switch:4,bw=100Mbit")
    got = emulator.recommend(trace, G, world_size=4,
                             budget=emulator.Budget(bits_per_element=4.0), compute=COMPUTE,
                             transports=("qsgd_allgather",), progress=heard.append)
    evaluated = [t for t in heard if "candidates evaluated; last qsgd_allgather [" in t]
    assert len(evaluated) >= got.evaluated - 2          # fp32 and fp16 are not candidates
    assert any(t.startswith("simulated a ") and " on 4 GPUs in " in t for t in heard)


def test_requests_are_what_replay_asks_for(trace):
    """After prefetching a transport's requests, its replay simulates nothing more."""
    simulated = []
    net = emulator.Network(topologies.from_spec("switch:8,bw=100Mbit"), 8, "ring",
                           on_simulated=lambda op, n, s: simulated.append((op, n)))
    mixed = ([2, 3, 4, 8] * trace.num_buckets)[:trace.num_buckets]
    for transport, bits in (("fp32", None), ("qsgd_allgather", mixed),
                            ("qsgd_scatter_reduce_allgather", 3)):
        wanted = emulator.collective_requests(trace, net, transport, bits)
        before = len(simulated)
        assert net.prefetch(wanted) == len(simulated) - before > 0
        after = len(simulated)
        emulator.replay(trace, None, transport=transport, bits=bits, network=net)
        assert len(simulated) == after, f"{transport}: the replay simulated what was not requested"


def test_prefetch_on_processes_caches_what_serial_computes(trace):
    G = topologies.from_spec("switch:8,bw=100Mbit")
    serial = emulator.Network(G, 8, "ring")
    pooled = emulator.Network(G, 8, "ring")
    wanted = [r for w in (2, 4, 8) for r in emulator.collective_requests(trace, serial, "qsgd_allgather", w)]
    distinct = {r for r in wanted if r[2]}
    assert len(distinct) >= 4
    assert pooled.prefetch(wanted, workers=2) == len(distinct)
    assert pooled.prefetch(wanted, workers=2) == 0          # all cached now
    for op, alg, nbytes in distinct:
        assert pooled.collective(op, alg, nbytes) == serial.collective(op, alg, nbytes)


def test_recommend_with_workers_agrees(trace):
    G = topologies.from_spec("switch:8,bw=100Mbit")
    budget = emulator.Budget(variance=0.08)
    one = emulator.recommend(trace, budget=budget, network=emulator.Network(G, 8, "ring"), compute=COMPUTE)
    two = emulator.recommend(trace, budget=budget, network=emulator.Network(G, 8, "ring"), compute=COMPUTE,
                             workers=2)
    assert two.best.bits == one.best.bits and two.best.transport == one.best.transport
    assert two.best.iteration_s == one.best.iteration_s
    assert two.evaluated == one.evaluated


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2"])
def test_bad_workers_name_the_value(trace, net, workers):
    with pytest.raises(emulator.ConfigError, match=f"workers must be an int >= 1, got {workers!r}"):
        emulator.recommend(trace, budget=emulator.Budget(variance=0.1), network=net, workers=workers)
    with pytest.raises(emulator.ConfigError, match="workers must be an int >= 1"):
        net.prefetch([], workers=workers)
