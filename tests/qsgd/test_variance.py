"""Measured quantization variance against Lemma 3.1 and its exact expectation; the trace's
version 2 variance records (version 1 still read)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import qsgd
from qsgd.variance import lemma31_bound, variance_ratios
from tests.qsgd.test_trace import _doc


def _vectors():
    g = torch.Generator().manual_seed(7)
    yield "gaussian", torch.randn(20_000, generator=g)
    # heavy tails: a few large coordinates per scale bucket, where the sqrt(d)/s branch binds
    yield "heavy-tailed", \
        torch.randn(20_000, generator=g) / torch.rand(20_000, generator=g).clamp_min(1e-3)
    yield "sparse", torch.where(torch.rand(20_000, generator=g) < 0.01,
                                torch.randn(20_000, generator=g), torch.zeros(20_000))


def _exact_max_norm(v: torch.Tensor, d: int, s: int) -> float:
    """E||Q(v)-v||^2 / ||v||^2 in closed form for the max norm: per coordinate
    (S/s)^2 p (1-p) with a = |v| s / S and p = a - floor(a)."""
    v = v.double()
    n = v.numel()
    total = 0.0
    for start in range(0, n, d):
        b = v[start:start + d]
        S = b.abs().max()
        if S == 0:
            continue
        a = b.abs() * s / S
        p = a - a.floor()
        total += float(((S / s) ** 2 * p * (1 - p)).sum())
    return total / float(v.square().sum())


@pytest.mark.parametrize("norm", ["max", "l2"])
@pytest.mark.parametrize("bucket_size", [64, 512])
def test_measured_ratio_is_within_lemma31_bound(norm, bucket_size):
    for name, v in _vectors():
        cfg = qsgd.QSGDConfig.from_bits(4, bucket_size=bucket_size, norm=norm)
        got = variance_ratios(v, cfg, bits=(2, 3, 4, 6, 8), samples=4, seed=3)
        for b, r in got.items():
            s = 2 ** (b - 1) - 1
            assert r.bound == pytest.approx(lemma31_bound(v.numel(), bucket_size, s))
            assert 0 < r.ratio <= r.bound, (name, b, r)
        ratios = [got[b].ratio for b in (2, 3, 4, 6, 8)]
        assert ratios == sorted(ratios, reverse=True), (name, ratios)   # more bits, less variance


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_measured_ratio_matches_the_exact_expectation(bits):
    # 20,000 independent roundings per sample: the relative standard error of the sampled
    # error is ~1%; 6 standard errors is a tolerance a wrong quantizer or estimator exceeds.
    g = torch.Generator().manual_seed(11)
    v = torch.randn(20_000, generator=g)
    cfg = qsgd.QSGDConfig.from_bits(bits, bucket_size=128, norm="max")
    got = variance_ratios(v, cfg, bits=(bits,), samples=8, seed=5)[bits].ratio
    want = _exact_max_norm(v, 128, cfg.levels)
    assert got == pytest.approx(want, rel=0.06)


def test_segments_split_the_error():
    v = torch.randn(3000, generator=torch.Generator().manual_seed(1))
    r = variance_ratios(v, qsgd.QSGDConfig.from_bits(3), bits=(3,), samples=2, segments=[1000, 2000])[3]
    assert len(r.segments) == 2 and sum(r.segments) == pytest.approx(r.ratio * float(v.double().square().sum()))
    with pytest.raises(qsgd.ConfigError, match=r"segments: expected lengths >= 1 summing to 3000, got \[1000\]"):
        variance_ratios(v, qsgd.QSGDConfig.from_bits(3), segments=[1000])


def _variance_record(bits=(2, 4)):
    return {"bits": list(bits), "samples": 2, "norm_sq": 1.5, "raw_norm_sq": 0.01,
            "ratio": [2.0, 0.1], "bound": [22.6, 3.2],
            "params": [{"name": "fc.weight", "norm_sq": 1.5, "ratio": [2.0, 0.1]}]}


def test_version_1_is_read_and_version_2_round_trips():
    v1 = qsgd.PayloadTrace.from_dict(_doc())
    assert all(b.variance is None for b in v1.buckets)
    assert v1.to_dict()["version"] == 3     # written at the current version
    doc = _doc()
    doc["version"] = 2
    doc["buckets"][0]["variance"] = _variance_record()
    t = qsgd.PayloadTrace.from_dict(doc)
    var = t.buckets[0].variance
    assert var.ratio_at(4) == 0.1 and var.error_sq(2) == pytest.approx(3.0)
    assert qsgd.PayloadTrace.from_dict(t.to_dict()).buckets[0].variance == var
    with pytest.raises(qsgd.TraceError, match=r"bits=3 was not measured; the trace has bits \[2, 4\]"):
        var.ratio_at(3)


@pytest.mark.parametrize("key, value, message", [
    ("ratio", [2.0], r"buckets\[0\].variance.ratio must be a list of 2 numbers"),
    ("ratio", [2.0, math.nan], r"buckets\[0\].variance.ratio\[1\] must be a finite number >= 0, got nan"),
    ("bits", [2, 2], r"buckets\[0\].variance.bits must be a non-empty list of distinct ints"),
    ("samples", 0, r"buckets\[0\].variance.samples must be an int >= 1, got 0"),
])
def test_bad_variance_records_name_the_field(key, value, message):
    doc = _doc()
    doc["version"] = 2
    rec = _variance_record()
    rec[key] = value
    doc["buckets"][0]["variance"] = rec
    with pytest.raises(qsgd.TraceError, match=message):
        qsgd.PayloadTrace.from_dict(doc)
    old = _doc()
    old["buckets"][0]["variance"] = _variance_record()
    with pytest.raises(qsgd.TraceError, match=r"variance needs version 2, got version 1"):
        qsgd.PayloadTrace.from_dict(old)


def test_measure_records_variance_per_bucket_and_parameter():
    trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=2, batch_size=2, device="cpu",
                         seed=0, min_numel=1000, bucket_cap_bytes=400_000, first_bucket_bytes=100_000,
                         variance_bits=(2, 4, 8), variance_samples=1)
    assert trace.num_buckets >= 2
    for b in trace.buckets:
        var = b.variance
        assert var.bits == (2, 4, 8) and var.samples == 1
        if b.compressed_numel:
            assert var.norm_sq > 0 and var.ratio[0] > var.ratio[1] > var.ratio[2] > 0
            assert all(r <= bd for r, bd in zip(var.ratio, var.bound))
            # the parameters' errors add up to the bucket's
            for j in range(3):
                assert sum(p.ratio[j] * p.norm_sq for p in var.params) == pytest.approx(
                    var.ratio[j] * var.norm_sq, rel=1e-6)
            assert var.params and all(p.name in b.params for p in var.params)
    back = qsgd.PayloadTrace.from_dict(copy.deepcopy(trace.to_dict()))
    assert [b.variance for b in back.buckets] == [b.variance for b in trace.buckets]
    none = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2, device="cpu",
                        variance_bits=())
    assert all(b.variance is None for b in none.buckets)
    assert trace.has_variance and back.has_variance and not none.has_variance
    with pytest.raises(qsgd.ConfigError, match=r"variance_bits: each width must be an int in \[2, 16\], got 1"):
        qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), variance_bits=(1,), device="cpu")
