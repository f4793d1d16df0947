"""Calibration maths: recover known link parameters; clear errors when the data cannot."""
import networkx as nx
import numpy as np
import pytest

import topologies
from emulator import CalibrationError
from emulator.validation import MeasuredTrace, calibrate
import importlib
calibrate_module = importlib.import_module("emulator.validation.calibrate")
from emulator.validation.calibrate import Calibration, apply_links, link_classes
from emulator.validation.trace import CollectivePoint


def ring_over_star(G, op, algorithm, nbytes):
    """An exact flow model of a ring on a star: every step is the slowest neighbour transfer.

    allreduce: 2(p-1) steps of n/p bytes; allgather: p-1 steps of n/p (n = gathered total).
    """
    ranks = topologies.gpus(G)
    p = len(ranks)
    steps = {"allreduce": 2 * (p - 1), "allgather": p - 1}[op]
    chunk = nbytes / p
    step = 0.0
    for i in range(p):
        a, b = ranks[i], ranks[(i + 1) % p]
        path = nx.shortest_path(G, a, b)
        edges = [G.edges[u, v] for u, v in zip(path, path[1:])]
        step = max(step, sum(e["latency"] for e in edges) + chunk / min(e["bandwidth"] for e in edges))
    return steps * step


@pytest.fixture
def star_predictor(monkeypatch):
    monkeypatch.setitem(calibrate_module.PREDICTORS, "star", ring_over_star)
    return "star"


def _trace(G, sizes, ops=("allreduce", "allgather"), noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    pts = []
    for op in ops:
        for n in sizes:
            t = ring_over_star(G, op, "ring", n) * (1 + noise * rng.standard_normal())
            pts.append(CollectivePoint.make(op, n, t, len(topologies.gpus(G))))
    return MeasuredTrace(environment={"backend": "gloo", "world_size": len(topologies.gpus(G))},
                         collectives=tuple(pts))


def test_recovers_latency_and_bandwidth_exactly(star_predictor):
    truth = topologies.switch(4, bandwidth=25e6, latency=40e-6, link="ethernet")
    start = topologies.switch(4, bandwidth=1e9, latency=1e-6, link="ethernet")
    sizes = [1 << 20, 4 << 20, 16 << 20]
    cal = calibrate(_trace(truth, sizes), start, fit_sizes=[1 << 20, 16 << 20], predictor="star")
    (k, (lat, bw)), = cal.links.items()
    assert k == "ethernet"
    assert lat == pytest.approx(40e-6, rel=1e-4) and bw == pytest.approx(25e6, rel=1e-6)
    assert max(abs(e) for e in cal.fit_rel_errors) < 1e-9
    assert set(cal.fitted_on) == {(op, n) for op in ("allreduce", "allgather")
                                  for n in (1 << 20, 16 << 20)}
    # the calibrated graph predicts a held-out size exactly
    H = cal.apply(start)
    assert ring_over_star(H, "allreduce", "ring", 4 << 20) == pytest.approx(
        ring_over_star(truth, "allreduce", "ring", 4 << 20), rel=1e-9)
    # to_dict has the flat fields of docs/formats.md
    d = cal.to_dict()
    assert d["link"] == "ethernet" and d["bandwidth"] == pytest.approx(25e6)
    assert Calibration.from_dict(d).links == cal.links


def test_noisy_data_fits_in_relative_least_squares(star_predictor):
    truth = topologies.switch(4, bandwidth=125e6, latency=20e-6)
    sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20]
    trace = _trace(truth, sizes, noise=0.03, seed=3)
    cal = calibrate(trace, truth, fit_sizes=sizes, predictor="star")
    (_, (lat, bw)), = cal.links.items()
    assert bw == pytest.approx(125e6, rel=0.05)
    assert np.median(np.abs(cal.fit_rel_errors)) < 0.05


def test_latency_the_data_cannot_resolve_stays_a_valid_link(star_predictor):
    """Times with no latency term at all (bandwidth only): NNLS drives the latency to 0,
    which no topology accepts; the fit floors it and the calibrated graph still simulates."""
    truth = topologies.switch(4, bandwidth=12.5e6, latency=40e-6)
    sizes = [1 << 20, 4 << 20]
    pts = [CollectivePoint.make(op, n, ring_over_star(truth, op, "ring", n)
                                - {"allreduce": 6, "allgather": 3}[op] * 2 * 40e-6, 4)
           for op in ("allreduce", "allgather") for n in sizes]
    trace = MeasuredTrace(environment={"backend": "gloo", "world_size": 4}, collectives=tuple(pts))
    cal = calibrate(trace, truth, predictor="star")
    (_, (lat, bw)), = cal.links.items()
    assert lat == calibrate_module.MIN_LATENCY_S
    assert bw == pytest.approx(12.5e6, rel=1e-3)
    topologies.validate_topology(cal.apply(truth))


def test_default_fit_points_are_smallest_and_largest(star_predictor):
    truth = topologies.switch(3, bandwidth=1e8, latency=1e-5)
    cal = calibrate(_trace(truth, [1 << 20, 2 << 20, 8 << 20], ops=("allreduce",)), truth,
                    predictor="star")
    assert cal.fitted_on == (("allreduce", 1 << 20), ("allreduce", 8 << 20))


def test_two_link_classes_fit_what_the_data_determine(star_predictor):
    # rank 0 behind a slow link: every ring step waits for it, so the fast class's bandwidth
    # is not observable. It keeps its figure (reported as kept) while the slow link is fitted.
    truth = topologies.switch(4, bandwidth=1e8, latency=1e-5, link="fast")
    truth.edges["sw0", "gpu0"]["link"] = "slow"
    truth.edges["sw0", "gpu0"]["bandwidth"] = 2e7
    start = truth.copy()
    start.edges["sw0", "gpu0"]["bandwidth"] = 5e6             # the figure we got wrong
    assert link_classes(start) == ["fast", "slow"]
    trace = _trace(truth, [1 << 20, 2 << 20, 4 << 20, 8 << 20])
    cal = calibrate(trace, start, fit_sizes=[1 << 20, 2 << 20, 4 << 20, 8 << 20],
                    predictor="star")
    assert "bandwidth" in cal.fitted["slow"] and "bandwidth" in cal.kept["fast"]
    assert cal.links["slow"][1] == pytest.approx(2e7, rel=1e-6)
    assert cal.links["fast"][1] == 1e8
    assert max(abs(e) for e in cal.fit_rel_errors) < 1e-6
    d = cal.to_dict()
    assert d["kept"]["fast"] == ["bandwidth"] or "bandwidth" in d["kept"]["fast"]
    back = Calibration.from_dict(d)
    H = back.apply(start)
    assert H.edges["sw0", "gpu0"]["bandwidth"] == pytest.approx(2e7, rel=1e-6)
    assert H.edges["sw0", "gpu1"]["bandwidth"] == 1e8


def test_one_point_fits_one_figure_and_keeps_the_other(star_predictor):
    G = topologies.switch(4, bandwidth=1e8, latency=1e-5)
    trace = _trace(topologies.switch(4, bandwidth=5e7, latency=1e-5), [1 << 20, 4 << 20])
    cal = calibrate(trace, G, fit_sizes=[4 << 20], ops=("allreduce",), predictor="star")
    (k,) = cal.links
    assert sorted(cal.fitted[k] + cal.kept[k]) == ["bandwidth", "latency"]
    assert len(cal.fitted[k]) == 1 and abs(cal.fit_rel_errors[0]) < 1e-6


def test_errors_name_what_is_wrong(star_predictor):
    G = topologies.switch(4, bandwidth=1e8, latency=1e-5)
    trace = _trace(G, [1 << 20, 4 << 20])
    with pytest.raises(CalibrationError, match=r"fit_sizes: \[12345\]"):
        calibrate(trace, G, fit_sizes=[12345], predictor="star")
    with pytest.raises(CalibrationError, match="world_size 4"):
        calibrate(trace, topologies.switch(8), predictor="star")
    with pytest.raises(CalibrationError, match="predictor 'oracle'"):
        calibrate(trace, G, predictor="oracle")
    with pytest.raises(CalibrationError, match="ops"):
        calibrate(trace, G, ops=("broadcast",), predictor="star")


def test_apply_links_copies_and_keeps_other_classes():
    G = topologies.switch(2, bandwidth=1e8, latency=1e-5, link="a")
    G.edges["sw0", "gpu1"]["link"] = "b"
    H = apply_links(G, {"a": (3e-6, 5e7)})
    assert H.edges["sw0", "gpu0"]["bandwidth"] == 5e7 and H.edges["sw0", "gpu0"]["latency"] == 3e-6
    assert H.edges["sw0", "gpu1"]["bandwidth"] == 1e8
    assert G.edges["sw0", "gpu0"]["bandwidth"] == 1e8
