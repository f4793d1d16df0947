"""The incremental max-min allocator (emulator.maxmin) against the reference progressive
filling (emulator.engine.max_min_rates), by hand and on thousands of random flow sets.

Units: capacities and rates in bytes/s (any positive scale works the same).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from emulator import ConfigError
from emulator.engine import max_min_rates
from emulator.maxmin import Allocator, max_min


def _reference(paths, mult, cap):
    """Per-flow rates of the active paths by the reference, each flow listed mult times."""
    flows = [p for p in range(len(paths)) for _ in range(mult[p])]
    ef = np.array([i for i, p in enumerate(flows) for _ in paths[p]], dtype=np.int64)
    ec = np.array([c for p in flows for c in paths[p]], dtype=np.int64)
    return flows, max_min_rates(ef, ec, np.asarray(cap, dtype=float), len(flows))


def _allocator(paths, cap, compiled=True):
    ptr = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
    chan = np.array([c for p in paths for c in p], dtype=np.int64)
    return Allocator(ptr, chan, cap, compiled=compiled)


def _random_run(seed: int, steps: int = 20):
    """A random instance and a random sequence of joins and leaves; yields after each solve
    (allocator, paths, multiplicities, capacities)."""
    rng = np.random.default_rng(seed)
    n_ch, n_p = int(rng.integers(1, 10)), int(rng.integers(1, 15))
    cap = rng.uniform(1.0, 10.0, n_ch) * 10.0 ** rng.integers(0, 10)
    # Random routes; a route may cross a channel twice (it then uses it twice).
    paths = [rng.choice(n_ch, size=int(rng.integers(1, n_ch + 1))).tolist() for _ in range(n_p)]
    alloc = _allocator(paths, cap)
    mult = np.zeros(n_p, dtype=np.int64)
    for step in range(steps):
        for _ in range(int(rng.integers(1, 4))):
            p = int(rng.integers(n_p))
            d = max(int(rng.integers(-2, 3)), -int(mult[p]))
            if d:
                alloc.change(p, d, float(step))
                mult[p] += d
        alloc.solve(float(step))
        yield alloc, paths, mult, cap


# -- by hand -------------------------------------------------------------------------------
def test_paths_with_several_flows_share_as_that_many_flows():
    # c0 = 6 carries path 0 (3 flows) and path 1 (1 flow): 1.5 each. c1 = 10 carries path 1
    # and path 2 (2 flows): path 1 froze at 1.5, path 2 gets (10 - 1.5) / 2 = 4.25.
    a = _allocator([[0], [0, 1], [1]], [6.0, 10.0])
    for p, m in ((0, 3), (1, 1), (2, 2)):
        a.change(p, m)
    a.solve()
    assert a.rates() == pytest.approx([1.5, 1.5, 4.25], rel=1e-15)


def test_a_leaving_flow_speeds_up_its_peers_only():
    # Two separate channels; in c0 paths 0 and 1, in c1 path 2. Path 1 leaves: path 0 gets
    # all of c0; path 2 is in another component and is not re-solved.
    a = _allocator([[0], [0], [1]], [2.0, 5.0])
    for p in range(3):
        a.change(p, 1)
    a.solve()
    assert a.rates() == pytest.approx([1.0, 1.0, 5.0])
    a.change(1, -1, 1.0)
    assert a.solve(1.0).tolist() == [0]
    assert a.rates() == pytest.approx([2.0, 0.0, 5.0])


def test_flows_slower_than_the_change_keep_their_rates_without_a_re_solve():
    # Parking lot: path 0 crosses c0 (cap 1) and c1 (cap 10); path 1 crosses c1 only.
    # Path 0 is held to 1 by c0, path 1 gets 9. Path 1's second flow joins: 10 - 1 = 9 left
    # for two flows on c1, 4.5 each; path 0 is slower than the new flows' lower bound
    # (10 / 3) and is not re-solved, and keeps 1.
    a = _allocator([[0, 1], [1]], [1.0, 10.0])
    a.change(0, 1)
    a.change(1, 1)
    a.solve()
    assert a.rates() == pytest.approx([1.0, 9.0])
    a.change(1, 1, 2.0)
    assert a.solve(2.0).tolist() == [1]
    assert a.rates() == pytest.approx([1.0, 4.5])


def test_max_min_of_entries_matches_the_reference():
    f = [0, 0, 1, 2, 2, 3]
    c = [0, 1, 1, 1, 2, 2]
    cap = [3.0, 4.0, 10.0]
    ref = max_min_rates(np.array(f), np.array(c), np.array(cap), 4)
    assert max_min(f, c, cap, 4) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("args, words", [
    (([0, 2], [0, 5], [1.0]), "channel ids must be in 0..0"),
    (([0, 1], [0, 0], [1.0]), "ptr must be a CSR pointer"),
    (([0, 1], [0], [0.0]), "capacities must be finite and > 0"),
    (([0, 1], [0], [np.inf]), "capacities must be finite and > 0"),
])
def test_bad_paths(args, words):
    with pytest.raises(ConfigError, match=words):
        Allocator(*args, compiled=False)


def test_bad_changes():
    a = Allocator([0, 1], [0], [1.0], compiled=False)
    with pytest.raises(ConfigError, match="path=3 must be in 0..0"):
        a.change(3, 1)
    with pytest.raises(ConfigError, match="path 0 has 0 flows; cannot remove 1"):
        a.change(0, -1)


# -- random flow sets: thousands of seeds -----------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("first", range(0, 3000, 500))
def test_incremental_equals_progressive_filling_on_random_flow_sets(first):
    # 500 seeds per case, 20 random batches of joins and leaves each: after every solve the
    # incremental allocator's rates equal a from-scratch progressive filling to 1e-9.
    worst = 0.0
    for seed in range(first, first + 500):
        for alloc, paths, mult, cap in _random_run(seed):
            if not mult.any():
                continue
            flows, ref = _reference(paths, mult, cap)
            got = alloc.rates()[flows]
            err = float(np.max(np.abs(got - ref) / ref))
            assert err <= 1e-9, (seed, paths, mult.tolist(), cap.tolist(), got, ref)
            worst = max(worst, err)
    assert worst < 1e-12          # in practice the two agree to rounding


def test_random_flow_sets_quick():
    # The same check on 100 seeds, in the unmarked suite.
    for seed in range(100):
        for alloc, paths, mult, cap in _random_run(seed, steps=10):
            if mult.any():
                flows, ref = _reference(paths, mult, cap)
                assert alloc.rates()[flows] == pytest.approx(ref, rel=1e-9)


def test_big_random_instances_from_scratch():
    # Larger instances in one solve: 40 channels, 300 flows with random routes.
    rng = np.random.default_rng(7)
    for _ in range(20):
        n_ch, n_f = 40, 300
        cap = rng.uniform(1.0, 100.0, n_ch)
        f = np.repeat(np.arange(n_f), rng.integers(1, 6, n_f))
        c = rng.integers(0, n_ch, len(f))
        assert max_min(f, c, cap, n_f) == pytest.approx(max_min_rates(f, c, cap, n_f),
                                                        rel=1e-9)


_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from tests.emulator.test_maxmin import _random_run
out = []
for seed in range(40):
    for alloc, paths, mult, cap in _random_run(seed, steps=8):
        out.append(alloc.rates().tolist())
from emulator import _jit
print(json.dumps([_jit.compiled(), out]))
"""


def test_interpreted_and_compiled_kernels_agree():
    # The kernels are one source run two ways (emulator._jit): interpreted in a process that
    # never compiles, compiled here. Same rates, bit for bit.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, QSGD_EMU_JIT="never")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=root)], env=env,
                          capture_output=True, text=True, check=True)
    was_compiled, interpreted = json.loads(proc.stdout)
    assert was_compiled is False
    compiled = [alloc.rates().tolist() for seed in range(40)
                for alloc, *_ in _random_run(seed, steps=8)]
    assert interpreted == compiled
