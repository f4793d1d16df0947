"""``qsgd-emu measure``: the trace it writes, its table and its one-line errors."""
import json

import pytest

import qsgd
from qsgd_emu import cli


def test_cli_writes_the_trace_and_prints_json(tmp_path, capsys):
    out = tmp_path / "trace.json"
    rc = cli.main(["measure", "--model", "mlp", "--bits", "4", "--bucket-size", "512", "--codec", "packed",
                   "--norm", "max", "--device", "cpu", "--iterations", "2", "--batch-size", "2",
                   "--bucket-cap", "200KB", "--first-bucket", "100KB", "--out", str(out), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    trace = qsgd.PayloadTrace.load(out)
    assert doc["parameters"] == trace.parameters == 235_146
    assert [r["numel"] for r in doc["buckets"]] == [b.numel for b in trace.buckets]
    r0 = doc["buckets"][0]
    assert r0["sent_bytes"] == pytest.approx(trace.mean_wire_bytes(0))
    assert r0["ratio"] == pytest.approx(trace.fp32_bytes(0) / trace.mean_wire_bytes(0))


def test_cli_table_and_errors(capsys):
    rc = cli.main(["measure", "--model", "mlp", "--levels", "3", "--device", "cpu", "--iterations", "1",
                   "--bucket-cap", "200KB", "--first-bucket", "100KB"])
    out = capsys.readouterr().out
    assert rc == 0 and "total" in out and "3-bit (s=3)" in out and "mlp: 235,146 parameters" in out
    assert cli.main(["measure", "--model", "nope", "--device", "cpu"]) == 2
    assert "model 'nope' is not one of" in capsys.readouterr().err
    assert cli.main(["measure", "--model", "mlp", "--bits", "1", "--device", "cpu"]) == 2
    assert "bits must be in [2, 16], got 1" in capsys.readouterr().err
    assert cli.main(["measure", "--model", "mlp", "--bucket-cap", "12XB", "--device", "cpu"]) == 2
    assert cli.main(["measure", "--model", "qsgd.models:MLP", "--input-shape", "3,x", "--device", "cpu"]) == 2
    assert "--input-shape" in capsys.readouterr().err
