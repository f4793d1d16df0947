"""The rank's fluid model (emulator.overlap): rates, waiting, and what it refuses."""
import numpy as np
import pytest

from emulator.errors import SimulationError
from emulator.overlap import Work, run


def test_a_collective_progresses_at_the_idle_and_the_loaded_pace():
    # 2 s alone, 8 s while the rank computes: backward (1 s) does 1/8 of it, the other 7/8
    # take 1.75 s alone
    out = run([Work("bwd", 1.0)], [], [Work("c", 2.0, loaded_s=8.0)])
    assert out["c"] == pytest.approx((0.0, 2.75))
    # waiting for backward's first item: starts at 1 s, never sees the load
    out = run([Work("r", 1.0), Work("rest", 0.0)], [], [Work("c", 2.0, "r", loaded_s=8.0)])
    assert out["c"] == pytest.approx((1.0, 3.0))
    # a callback stage loads it as backward does: 1 s of decode, 1/8 done; 7/8 alone
    out = run([Work("b", 0.0)], [Work("d", 1.0)], [Work("c", 2.0, loaded_s=8.0)])
    assert out["c"] == pytest.approx((0.0, 2.75))


def test_the_threads_share_the_compute_and_go_at_the_pace_beside_a_collective():
    # backward 3 s, decode 2 s, both from 0: half pace each for 4 s, backward's last 1 s alone
    out = run([Work("b", 3.0)], [Work("d", 2.0)], [])
    assert out["d"] == pytest.approx((0.0, 4.0)) and out["b"] == pytest.approx((0.0, 5.0))
    assert out["backward end"] == out["b"]
    # pace 0.5 while a 1 s collective runs: backward alone does 0.5 s of work in it
    out = run([Work("b", 2.0)], [], [Work("c", 1.0)], pace=0.5)
    assert out["b"][1] == pytest.approx(2.5)
    # the callback thread too: a decode beside the same collective after backward
    out = run([Work("b", 0.0)], [Work("d", 1.0)], [Work("c", 1.0)], pace=0.5)
    assert out["d"] == pytest.approx((0.0, 1.5))


def test_each_server_runs_its_items_in_order_once_their_step_is_done():
    bwd = [Work("ready", 1.0), Work("enc", 0.5, "ready"), Work("rest", 2.0)]
    coll = [Work("c1", 1.0, "enc"), Work("c2", 1.0, "ready")]
    cbs = [Work("d1", 0.2, "c1"), Work("d2", 0.2, "c2")]
    out = run(bwd, cbs, coll)
    assert out["c1"] == pytest.approx((1.5, 2.5))
    # c2 waits for the stream, not only for its step: FIFO, as on one NCCL stream
    assert out["c2"] == pytest.approx((2.5, 3.5))
    # d1 from 2.5 beside the rest of backward (1 s of its 2 s done): 0.4 s at half pace;
    # backward then alone to 3.5, where d2 shares the last 0.2 s with it: both end at 3.9
    assert out["d1"] == pytest.approx((2.5, 2.9))
    assert out["d2"] == pytest.approx((3.5, 3.9)) and out["rest"][1] == pytest.approx(3.9)


def test_times_are_continuous_in_a_collectives_seconds():
    # a decode starting just before or just after an encode ends: no jump in the next
    # collective's start (a decode that stopped the encode moved it by the decode's 1 s)
    starts = []
    for secs in np.linspace(0.9, 1.1, 201):
        bwd = [Work("r0", 1.0), Work("e0", 0.1, "r0"), Work("r1", 0.0), Work("e1", 1.0, "r1")]
        coll = [Work("c0", float(secs), "e0"), Work("c1", 0.1, "e1")]
        out = run(bwd, [Work("d0", 1.0, "c0")], coll)
        starts.append(out["c1"][0])
    assert np.abs(np.diff(starts)).max() <= 2 * 0.001 + 1e-12


def test_an_item_waiting_for_nothing_that_runs_is_an_error():
    with pytest.raises(SimulationError, match="never run"):
        run([Work("b", 1.0)], [], [Work("c", 1.0, "missing")])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_duration_that_is_not_a_finite_number_is_named(bad):
    # NaN would never finish: the loop would not end
    with pytest.raises(SimulationError, match=r"'c': seconds=.* must be finite and >= 0"):
        run([Work("b", 1.0)], [], [Work("c", bad)])
    with pytest.raises(SimulationError, match=r"'c': loaded_s=.* must be finite and >= 0"):
        run([Work("b", 1.0)], [], [Work("c", 1.0, loaded_s=bad)])
