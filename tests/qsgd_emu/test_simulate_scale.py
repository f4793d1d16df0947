"""``qsgd-emu simulate`` at scale: never a silent wait, a time limit refused up front with how
to ask a smaller question, and the closed form chosen (and named) where the engine would take
too long."""
import io
import json
import time

import pytest

from emulator import fastpath
from qsgd_emu.commands import simulate
from qsgd_emu.progress import Watch
from tests.qsgd_emu.cli_run import run_cli


def test_a_typo_of_two_zeros_is_refused_at_once():
    t0 = time.perf_counter()
    code, out, err = run_cli(["simulate", "--topology", "cluster:dgx_a100x100000", "--bytes",
                              "1MB"])
    assert time.perf_counter() - t0 < 2.0
    assert code != 0 and not out
    assert "800,000 GPUs" in err and "--time-limit" in err and "fewer machines" in err
    assert "cluster spec (this limit fits about" in err


def test_a_time_limit_refuses_the_engine_and_says_what_would_fit(monkeypatch):
    monkeypatch.setitem(fastpath.SECONDS_PER_TRANSFER, "NVLSTree", 1.0)   # a slow machine
    code, out, err = run_cli(["simulate", "--topology", "cluster:dgx_h100x2", "--bytes", "1MB",
                              "--method", "engine", "--time-limit", "3s"])
    assert code != 0 and not out
    assert "NCCL NVLSTree/Simple on 16 GPUs" in err and "transfers to simulate" in err
    assert "--method closed-form" in err


def test_auto_takes_the_closed_form_when_the_engine_would_not_fit_and_names_it(monkeypatch):
    # 10 ms a transfer: 16 machines' 2,272 transfers would take 23 s, over auto's 20 s; the
    # calibration's budget (4 s) fits 2 machines (224 transfers).
    monkeypatch.setitem(fastpath.SECONDS_PER_TRANSFER, "NVLSTree", 1e-2)
    code, out, err = run_cli(["simulate", "--topology", "cluster:dgx_h100x16", "--bytes", "1MB"])
    assert code == 0, err
    assert "method" in out and "closed form x engine/closed form on 16 GPUs" in out
    assert "within" in out and "of the engine where both ran" in out
    code, js, _ = run_cli(["simulate", "--topology", "cluster:dgx_h100x16", "--bytes", "1MB",
                           "--json"])
    res = json.loads(js)
    assert res["method"].startswith("closed form") and res["error_bound"] > 0
    assert res["nccl"]["algorithm"] == "NVLSTree"


def test_the_engine_by_default_when_it_fits_and_the_same_time_as_before():
    code, out, err = run_cli(["simulate", "--topology", "cluster:dgx_h100x4", "--bytes", "1MB",
                              "--json"])
    assert code == 0, err
    res = json.loads(out)
    assert res["method"] == "engine"
    assert res["time_s"] == 0.00010958204000000003      # 4a2f7a5's, to the last bit
    code, out, _ = run_cli(["simulate", "--topology", "cluster:dgx_h100x4", "--bytes", "1MB"])
    assert "engine: every transfer simulated" in out


def test_closed_form_refuses_what_it_does_not_model():
    code, _, err = run_cli(["simulate", "--topology", "ring:4", "--algorithm", "ring",
                            "--bytes", "1MB", "--method", "closed-form"])
    assert code != 0 and "--method closed-form covers NCCL's algorithms" in err
    code, _, err = run_cli(["simulate", "--topology", "cluster:dgx_a100x2", "--bytes", "1MB",
                            "--method", "closed-form", "--straggler", "1,5us"])
    assert code != 0 and "faults" in err
    code, _, err = run_cli(["simulate", "--topology", "ring:4", "--bytes", "1MB",
                            "--time-limit", "soon"])
    assert code != 0 and "--time-limit 'soon'" in err


def test_progress_lines_within_two_seconds_with_an_estimate():
    out = io.StringIO()
    with Watch("simulate", out, every_s=0.2) as w:
        w.stage("simulating 1,000 transfers", 3.0)
        time.sleep(1.8)
        w.fraction(0.5)
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert lines and lines[0].startswith("simulate: 1.") and "about" in lines[0]
    assert any("(50%)" in line for line in lines) and lines[-1].endswith(" s")
    quiet = io.StringIO()
    with Watch("simulate", quiet):
        pass
    assert quiet.getvalue() == ""                       # a quick command prints nothing


def test_simulate_speaks_while_it_works(monkeypatch):
    # The engine's progress reaches the watch (stage and fraction).
    seen = []
    monkeypatch.setattr(simulate, "AUTO_ENGINE_S", 1e9)
    real = Watch.fraction

    def spy(self, done):
        seen.append(done)
        return real(self, done)

    monkeypatch.setattr(Watch, "fraction", spy)
    code, _, err = run_cli(["simulate", "--topology", "cluster:dgx_a100x4", "--op", "alltoall",
                            "--bytes", "64MB"])           # congested: the event loop runs
    assert code == 0, err
    assert seen and seen[-1] == 1.0


def test_a_symmetric_ring_says_it_simulated_one_transfer_per_class():
    args = ["simulate", "--topology", "cluster:dgx_h100x4,fabric=rail", "--op", "allgather",
            "--algorithm", "nccl_ring", "--bytes", "16MB"]
    code, out, err = run_cli(args)
    assert code == 0, err
    assert "one transfer per class of 4 equivalent ones (a shift of 8 ranks" in out
    code, js, _ = run_cli(args + ["--json"])
    res = json.loads(js)
    assert res["copies"] == 4 and res["method"] == "engine"
