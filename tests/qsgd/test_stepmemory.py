"""A measured step that cannot fit its device is refused before the model is built."""
from __future__ import annotations

import json

import pytest
import torch

import qsgd
from qsgd.errors import ConfigError
from qsgd.stepmemory import STEP_BYTES_PER_PARAMETER, available_bytes, check_fits
from tests.qsgd_emu.cli_run import run_cli


def test_the_step_needs_weights_gradients_and_momentum():
    cpu = torch.device("cpu")
    n = 1_000_000
    check_fits("m", n, cpu, available=STEP_BYTES_PER_PARAMETER * n)      # exactly fits
    with pytest.raises(ConfigError, match=r"^model 'm' has 1,000,000 parameters: a measured step "
                                          r"on cpu holds at least 0\.0 GB .* more than the 0\.0 GB "
                                          r"free there; record .* meta device"):
        check_fits("m", n, cpu, available=STEP_BYTES_PER_PARAMETER * n - 1)
    check_fits("m", 10**15, torch.device("meta"))     # no memory to read: nothing refused


def test_this_machine_says_what_it_has_free():
    free = available_bytes(torch.device("cpu"))
    # Linux (CI and this machine) reads MemAvailable; elsewhere nothing is known
    assert free is None or 10**8 < free < 10**15


def test_a_model_too_big_for_this_machine_is_refused_before_it_is_built():
    # 69 billion parameters: 828 GB of fp32 weights, gradients and momentum, more than any
    # machine these tests run on; building them would be killed by the kernel, silently
    with pytest.raises(ConfigError) as err:
        qsgd.measure("llama2-70b", qsgd.QSGDConfig.from_bits(4), device="cpu")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("model 'llama2-70b' has 68,976,648,192 parameters: a measured step "
                              "on cpu holds at least 827.7 GB")
    # (what fits instead, the same model on the meta device, tests/qsgd/test_transformers.py)


def test_study_says_so_in_one_line_and_records_on_meta_when_asked(tmp_path):
    args = ["study", "--topology", "cluster:dgx_h100x{N}", "--world-sizes", "8", "--bits", "32"]
    code, _, err = run_cli([*args, "--model", "llama2-70b", "--out", str(tmp_path / "a")])
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert code == 2 and "model 'llama2-70b' has 68,976,648,192 parameters" in line
    code, _, err = run_cli([*args, "--model", "mlp", "--measure-device", "meta",
                            "--out", str(tmp_path / "b")])
    assert code == 0, err
    assert "recording mlp's layout and operators on the meta device" in err
    (row,) = json.loads((tmp_path / "b" / "study.json").read_text())["rows"]
    assert row["device"] == "H100-SXM" and row["iteration_s"] > 0
