"""``qsgd-emu recommend`` end to end on a small measured trace: text, --json, --out, bad budgets."""
from __future__ import annotations

import json

import pytest

import qsgd
from tests.qsgd_emu.cli_run import run_cli


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "trace.json"
    qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2, device="cpu", seed=0,
                 min_numel=1000, bucket_cap_bytes=300_000, first_bucket_bytes=100_000,
                 variance_bits=(2, 4, 8), variance_samples=1).save(path)
    return str(path)


# a generic switch names no GPU: the MLP's operators timed on an A100
BASE = ["--topology", "switch:{n},bw=1Gbit", "--world-sizes", "4,8", "--device", "A100"]


def test_text_json_and_out(trace_path, tmp_path):
    out = tmp_path / "sub" / "rec.json"
    code, text, err = run_cli(["recommend", "--trace", trace_path, *BASE, "--variance-as-bits", "4",
                               "--out", str(out)])
    assert code == 0, err
    assert text.count("candidates predicted (greedy+local)") == 2
    assert "Pareto front" in text and "qsgd.QSGDState(" in text and "bit_policy=" in text
    doc = json.loads(out.read_text())
    recs = doc["recommendations"]
    assert [r["world_size"] for r in recs] == [4, 8]
    for r in recs:
        u4 = [u for u in r["uniform"] if u["transport"] == "qsgd_allgather" and u["bits"][0] == 4][0]
        assert r["best"]["iteration_s"] <= u4["iteration_s"]
        assert r["best"]["variance"] <= r["budget"]["variance"] * (1 + 1e-12)
        assert r["evaluated"] >= len(r["uniform"]) + 2
        assert r["speedup_fp32"] == pytest.approx(r["fp32_s"] / r["best"]["iteration_s"])
    code, text, _ = run_cli(["recommend", "--trace", trace_path, *BASE, "--max-bits-per-element", "3",
                             "--json", "--transports", "qsgd_allgather"])
    assert code == 0
    recs = json.loads(text)["recommendations"]
    assert all(r["best"]["bits_per_element"] <= 3 and r["best"]["transport"] == "qsgd_allgather" for r in recs)


@pytest.mark.parametrize("args, message", [
    (["--max-variance", "-1"], "budget variance must be a finite number >= 0, got -1.0"),
    (["--max-variance", "nan"], "budget variance must be a finite number >= 0, got nan"),
    (["--max-variance", "1e-12"], "budget variance=1e-12 is impossible"),
    (["--max-bits-per-element", "1.5"], "budget bits_per_element must be a finite number >= 2, got 1.5"),
    (["--variance-as-bits", "3"], "--variance-as-bits 3: the trace has variance at bits [2, 4, 8]"),
])
def test_bad_budgets_are_one_line_errors(trace_path, args, message):
    code, text, err = run_cli(["recommend", "--trace", trace_path, *BASE, *args])
    assert code == 2 and text == ""
    assert message in err and err.count("\n") == 1


def test_workers_auto_takes_the_cores_from_64_gpus(monkeypatch):
    from qsgd_emu.commands import recommend

    monkeypatch.setattr(recommend.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert recommend.workers_for("auto", recommend.AUTO_FROM_GPUS - 1) == 1
    assert recommend.workers_for("auto", recommend.AUTO_FROM_GPUS) == 3
    assert recommend.workers_for(2, 8) == 2


@pytest.mark.parametrize("value", ["0", "x", "-2"])
def test_bad_workers_is_a_one_line_error(trace_path, value):
    code, text, err = run_cli(["recommend", "--trace", trace_path, *BASE, "--variance-as-bits", "4",
                               "--workers", value])
    assert code == 2 and text == ""
    assert f"{value!r} is not 'auto' or an integer >= 1" in err


def test_a_model_recorded_on_the_meta_device_gets_a_strategy_not_widths():
    """``--measure-device meta`` records a model of any size without running it: enough to
    pick a strategy; per-bucket widths need variance records and are refused in one line."""
    args = ["recommend", "--model", "mlp", "--measure-device", "meta", *BASE[:2],
            "--world-sizes", "8", "--device", "A100"]
    code, text, err = run_cli([*args, "--max-variance", "0.1"])
    assert code == 2 and text == ""
    assert "mlp's trace has no variance records" in err and "--measure-device cpu" in err
    assert err.count("\n") == 2      # the recording's progress line, then the error
    code, text, err = run_cli([*args, "--max-bits-per-element", "8", "--parallelism", "ddp,fsdp",
                               "--json"])
    assert code == 0, err
    choice = json.loads(text)["strategies"][0]
    assert choice["best"]["strategy"] in ("ddp", "fsdp") and choice["world_size"] == 8
