"""One trace, the same arguments, the same rows: a CPU trace carries its host's rates."""
import json

import pytest

import qsgd
from emulator import read_study
from tests.qsgd_emu.cli_run import run_cli


def test_a_study_twice_gives_identical_rows(tmp_path):
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
    assert all("host measured with the trace" in r["source"] for r in rows[0])
    # and a trace measured elsewhere is scaled by that machine's rates, not this one's
    doc = json.loads(trace.read_text())
    doc["host"]["matmul_flops"] *= 2
    trace.write_text(json.dumps(doc))
    code, _, err = run_cli(["study", "--trace", str(trace), "--world-sizes", "8,16",
                            "--bits", "32,4", "--device", "A100", "--out", str(tmp_path / "c")])
    assert code == 0, err
    other = read_study(tmp_path / "c" / "study.json").rows
    assert [r.compute_s for r in other] == pytest.approx([2 * r["compute_s"] for r in rows[0]],
                                                         rel=1e-12)
