"""The studies' approximate mode: sizes read off checked lines between simulated ones."""
import dataclasses

import numpy as np
import pytest

import emulator
import qsgd
import topologies
from emulator.errors import ConfigError
from emulator.interpolation import Interpolation
from emulator.network import Network
from emulator.study import StudyConfig, run_study


def _run(interp, f, transfers=lambda n: 4):
    """Drive ``interp`` with ``f(n) -> seconds`` (sent = 2 n); the sizes simulated."""
    calls = []
    while interp.wanted():
        for n in interp.wanted():
            calls.append(n)
            interp.feed(n, seconds=f(n), sent=2.0 * n, transfers=transfers(n))
    return calls


def test_an_affine_function_is_simulated_at_four_sizes_and_read_exactly():
    sizes = list(range(100, 2100, 100))
    it = Interpolation(sizes, rtol=1e-3)
    calls = _run(it, lambda n: 3e-6 + 1e-9 * n)
    # the ends, the one nearest the middle (tie: the lower), the middle of the wider half
    assert sorted(calls) == [100, 1000, 1500, 2000]
    res = it.results()
    assert set(res) == set(sizes)
    for n in sizes:
        assert res[n][0] == pytest.approx(3e-6 + 1e-9 * n, rel=1e-12)
        assert res[n][1] == pytest.approx(2.0 * n, rel=1e-12)


def test_a_kink_splits_the_range_and_each_piece_is_read_off_its_own_line():
    # two affine pieces meeting at 1000 bytes: a line across the kink misses the middle
    f = lambda n: 1e-6 + (1e-9 * n if n <= 1000 else 1e-6 + 1e-10 * (n - 1000))  # noqa: E731
    sizes = list(range(100, 4100, 100))
    it = Interpolation(sizes, rtol=1e-3)
    calls = _run(it, f)
    assert 3 < len(calls) < len(sizes)
    res = it.results()
    err = max(abs(res[n][0] / f(n) - 1) for n in sizes)
    # only a segment that holds the kink between its checked points can be off
    assert err < 0.05
    exact_pieces = [n for n in sizes if n not in it.simulated and
                    abs(res[n][0] / f(n) - 1) > 1e-9]
    for n in exact_pieces:      # every such size lies in the one segment that straddles 1000
        lo = max(m for m in it.simulated if m < n)
        hi = min(m for m in it.simulated if m > n)
        assert lo < 1000 < hi


def test_a_jitter_that_spares_the_middle_is_still_caught():
    # on the line at the ends and the middle, 1 % off everywhere else (NCCL's LL all-gathers
    # jitter like this from size to size): nothing may be read off a line
    sizes = list(range(100, 2100, 100))
    line = lambda n: 3e-6 + 1e-9 * n       # noqa: E731
    f = lambda n: line(n) * (1.0 if n in (100, 1000, 2000) else 1.01)   # noqa: E731
    it = Interpolation(sizes, rtol=1e-3)
    _run(it, f)
    assert all(it.results()[n][0] == f(n) for n in sizes)


def test_a_change_of_transfer_count_is_never_interpolated_across():
    sizes = list(range(1, 21))
    it = Interpolation(sizes, rtol=0.1)
    # perfectly affine times, but the schedule changes shape at 11: no line may span it
    calls = _run(it, lambda n: float(n), transfers=lambda n: 8 if n <= 10 else 16)
    assert len(calls) > 3
    sim = sorted(it.simulated)
    for lo, hi in zip(sim, sim[1:]):
        if hi - lo > 1:     # a line was (or could have been) used between lo and hi
            assert (lo <= 10) == (hi <= 10)


@pytest.mark.parametrize("sizes,expected", [([7], [7]), ([7, 9], [7, 9]), ([9, 7, 9], [7, 9])])
def test_one_or_two_sizes_are_simulated_as_they_are(sizes, expected):
    it = Interpolation(sizes)
    assert sorted(_run(it, float)) == expected
    assert sorted(it.results()) == expected


@pytest.mark.parametrize("rtol", [0, -1e-3, 0.5, float("nan"), True, "1e-3", None])
def test_bad_tolerance_names_the_value(rtol):
    with pytest.raises(ConfigError, match="rtol="):
        Interpolation([1, 2, 3], rtol=rtol)


def test_feeding_an_unwanted_size_or_reading_early_is_refused():
    it = Interpolation([1, 2, 3, 4])
    with pytest.raises(ConfigError, match="size 2 was not wanted"):
        it.feed(2, 1.0, 1.0, 1)
    with pytest.raises(ConfigError, match="not simulated yet"):
        it.results()


# -- the Network and the study -------------------------------------------------------------------
@pytest.fixture(scope="module")
def dgx2():
    return topologies.from_spec("cluster:dgx_a100x2")


def test_network_interpolates_only_between_sizes_of_one_plan(dgx2):
    sizes = [int(x) for x in np.linspace(64 << 20, 512 << 20, 9)]
    exact = Network(dgx2)
    approx = Network(dgx2, interpolate=1e-3)
    reqs = [("allgather", "nccl", n) for n in sizes]
    simulated = approx.prefetch(reqs)
    assert simulated < len(sizes) and approx.interpolated
    assert simulated + len(approx.interpolated) == len(sizes)
    exact.prefetch(reqs)
    for n in sizes:
        key = ("allgather", "nccl", n, None)
        a, e = approx.collective(*key[:3]), exact.collective(*key[:3])
        if key in approx.interpolated:
            assert a[0] == pytest.approx(e[0], rel=2e-3)
            assert a[1] == pytest.approx(e[1], rel=1e-9)
        else:
            assert a == e
    shapes = {approx.shape("allgather", "nccl", n) for n in sizes}
    assert all(s[:2] == ("allgather", "nccl") and s[2] == "Ring" for s in shapes)


def test_network_interpolation_with_two_processes_gives_the_same_cache(dgx2):
    reqs = [("allgather", "nccl", int(n)) for n in np.linspace(64 << 20, 256 << 20, 5)]
    one, two = Network(dgx2, interpolate=1e-3), Network(dgx2, interpolate=1e-3)
    assert one.prefetch(reqs) == two.prefetch(reqs, workers=2)
    assert one._cache == two._cache and one.interpolated == two.interpolated


def test_network_rejects_a_bad_tolerance(dgx2):
    with pytest.raises(ConfigError, match="rtol=0.5"):
        Network(dgx2, interpolate=0.5)


@pytest.fixture(scope="module")
def trace():
    return qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
                        device="cpu", seed=0)


def test_an_approximate_study_matches_the_exact_one(trace):
    cfg = StudyConfig(trace=trace, world_sizes=(16,), bits=(32, 16, 8, 4, 2),
                      topologies=("cluster:dgx_a100x{N},nic_bw=25Gbit",), device="A100")
    approx = run_study(cfg)                     # the approximate mode is the default
    exact = run_study(dataclasses.replace(cfg, exact=True))
    assert approx.config["exact"] is False and exact.config["exact"] is True
    assert [r.key for r in approx.rows] == [r.key for r in exact.rows]
    for a, e in zip(approx.rows, exact.rows):
        assert a.iteration_s == pytest.approx(e.iteration_s, rel=5e-3)
        assert a.bytes_per_gpu == pytest.approx(e.bytes_per_gpu, rel=1e-9)


def test_study_exact_must_be_a_bool(trace):
    with pytest.raises(ConfigError, match="StudyConfig.exact"):
        StudyConfig(trace=trace, exact="no")


def test_study_command_takes_the_mode(tmp_path):
    from qsgd_emu import cli

    parser = cli.build_parser(["study"])
    base = ["study", "--trace", "t.json", "--out", str(tmp_path)]
    assert parser.parse_args(base).exact is False
    assert parser.parse_args(base + ["--approximate"]).exact is False
    assert parser.parse_args(base + ["--exact"]).exact is True
    with pytest.raises(SystemExit):
        parser.parse_args(base + ["--approximate", "--exact"])


def test_emulator_exports_stay_the_same():
    assert "Interpolation" not in emulator.__all__      # an internal of Network and studies


@pytest.mark.parametrize("seed", range(200))
def test_any_function_and_sizes_end_with_every_size_known(seed):
    # random sizes and random piecewise functions with jitter: the planning always finishes,
    # simulated sizes keep their values, and a size read off a line lies between the
    # simulated sizes around it on their straight line
    rng = np.random.default_rng(seed)
    sizes = sorted(set(rng.integers(1, 10_000, size=int(rng.integers(1, 40))).tolist()))
    kinks = np.sort(rng.uniform(0, 10_000, size=int(rng.integers(0, 4))))
    jitter = float(rng.choice([0.0, 1e-4, 1e-2]))
    noise = {n: 1.0 + jitter * rng.standard_normal() for n in sizes}

    def f(n):
        return (1e-6 + 1e-9 * n + sum(3e-10 * max(0.0, n - k) for k in kinks)) * noise[n]

    rtol = float(rng.choice([1e-4, 1e-3, 1e-2]))
    count = lambda n: 8 if n < 5_000 or seed % 3 else 16     # noqa: E731
    it = Interpolation(sizes, rtol=rtol)
    _run(it, f, transfers=count)
    res = it.results()
    assert sorted(res) == sizes
    sim = sorted(it.simulated)
    for n in sizes:
        if n in it.simulated:
            assert res[n][0] == f(n)
            continue

        def on(a, b, x):
            return f(a) + (x - a) / (b - a) * (f(b) - f(a))

        # read off the line through two simulated sizes around it, of one schedule shape,
        # with every simulated size between them on that line within rtol
        assert any(res[n][0] == pytest.approx(on(a, b, n), rel=1e-12) and count(a) == count(b)
                   and all(abs(on(a, b, m) - f(m)) <= rtol * f(m) for m in sim if a < m < b)
                   for a in sim if a < n for b in sim if b > n)
