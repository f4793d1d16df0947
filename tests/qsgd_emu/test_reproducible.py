"""One trace, the same arguments, the same rows: the compute side comes from its operators."""
import json

import pytest

import qsgd
from emulator import read_study
from tests.qsgd_emu.cli_run import run_cli


def test_a_study_twice_gives_identical_rows(tmp_path):
    """The compute side comes from the trace's operators timed on the GPU: the same trace gives
    the same rows run after run, and the measuring machine's own rates (kept in the trace as a
    record) do not enter them."""
    trace = tmp_path / "trace.json"
    code, _, err = run_cli(["measure", "--model", "mlp", "--bits", "4", "--device", "cpu",
                            "--iterations", "1", "--batch-size", "2", "--out", str(trace)])
    assert code == 0, err
    host = qsgd.PayloadTrace.load(trace).host
    assert host["matmul_flops"] > 0 and host["copy_bandwidth"] > 0 and "matmul" in host["method"]
    rows = []
    for run in ("a", "b"):
        code, _, err = run_cli(["study", "--trace", str(trace), "--world-sizes", "8,16",
                                "--bits", "32,4", "--device", "A100", "--out", str(tmp_path / run)])
        assert code == 0, err
        rows.append([r.to_dict() for r in read_study(tmp_path / run / "study.json").rows])
    assert rows[0] == rows[1]
    assert all("per-operator roofline" in r["source"] for r in rows[0])
    # a trace measured on a machine twice as fast predicts the same GPU
    doc = json.loads(trace.read_text())
    doc["host"]["matmul_flops"] *= 2
    for it in doc["iterations"]:
        it["forward_s"] /= 2
        it["backward_s"] /= 2
        for b in it["buckets"]:
            b["ready_s"] /= 2
    trace.write_text(json.dumps(doc))
    code, _, err = run_cli(["study", "--trace", str(trace), "--world-sizes", "8,16",
                            "--bits", "32,4", "--device", "A100", "--out", str(tmp_path / "c")])
    assert code == 0, err
    other = read_study(tmp_path / "c" / "study.json").rows
    assert [r.to_dict() for r in other] == rows[0]