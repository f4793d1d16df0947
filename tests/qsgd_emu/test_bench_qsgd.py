"""`qsgd-emu bench qsgd`: runs end to end on a small gradient and reports consistent figures."""
import json

import pytest

from qsgd_emu import cli
from qsgd import QSGDConfig, payload_nbytes
from qsgd_emu.bench import qsgd as bench


def test_bench_qsgd_json(capsys):
    assert cli.main(["bench", "qsgd", "--numel", "20000", "--repeats", "1", "--bucket-size", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "qsgd-bench" and out["numel"] == 20000 and out["clone_s"] > 0
    names = [r["name"] for r in out["rows"]]
    assert names == ["packed 2-bit", "packed 4-bit", "packed 8-bit", "elias s=1", "elias s=3", "elias s=7",
                     "elias s=11"]
    for r in out["rows"]:
        assert r["encode_s"] > 0 and r["decode_s"] > 0
        assert r["compression"] == pytest.approx(80000 / r["payload_bytes"])
        if r["codec"] == "packed":
            assert r["payload_bytes"] == payload_nbytes(20000, QSGDConfig.from_bits(r["bits"], bucket_size=128))
        if r["levels"] <= 127:
            assert r["speedup_vs_naive_encode"] > 0


def test_bench_table_and_errors(capsys):
    assert cli.main(["bench", "qsgd", "--numel", "3000", "--repeats", "1"]) == 0
    text = capsys.readouterr().out
    assert "x.clone()" in text and "packed 4-bit" in text and "elias s=22" in text
    assert cli.main(["bench", "qsgd", "--numel", "0"]) == 2
    assert "--numel must be >= 1, got 0" in capsys.readouterr().err


def test_naive_baseline_is_a_real_qsgd():
    import torch

    x = torch.randn(1000)
    levels, norm = bench.naive_encode(x, 7, 100)
    y = bench.naive_decode(levels, norm, 7, 1000)
    assert levels.dtype == torch.int8 and int(levels.abs().max()) <= 7
    assert bool(((y - x).abs() <= norm.repeat_interleave(100) / 7 + 1e-6).all())
