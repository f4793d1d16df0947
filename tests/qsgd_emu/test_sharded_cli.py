"""``--parallelism`` on the command line: a sharded study's table, recommend's pick, refusals."""
from __future__ import annotations

import json

import pytest

import qsgd
from tests.qsgd_emu.cli_run import run_cli


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharded") / "gpt2.json"
    qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta").save(path)
    return str(path)


BASE = ["--topology", "cluster:dgx_h100x{N}", "--batch-size", "8"]


def test_a_sharded_study_prints_the_strategy_and_the_memory(trace_path, tmp_path):
    code, text, err = run_cli(["study", "--trace", trace_path, *BASE, "--world-sizes", "8,16",
                               "--bits", "32,4", "--parallelism", "hsdp", "--weight-bits", "8",
                               "--out", str(tmp_path / "s")])
    assert code == 0, err
    assert "strategy" in text and "GB/GPU" in text and text.count(" hsdp ") == 4
    rows = json.loads((tmp_path / "s" / "study.json").read_text())["rows"]
    assert [r["transport"] for r in rows] == ["fp32", "qsgd_scatter_reduce_allgather"] * 2
    assert all(r["parallelism"] == "hsdp" and r["memory_per_gpu"] > 0 for r in rows)


@pytest.mark.parametrize("args, message", [
    (["--world-sizes", "12", "--parallelism", "hsdp"],
     "a shard group of 8 GPUs does not divide world_size=12"),
    (["--world-sizes", "8", "--parallelism", "fsdp", "--batch-size", "2048"],
     "parallelism='fsdp': gpt2 at batch 2048 per GPU needs"),
    (["--world-sizes", "8", "--parallelism", "fsdp", "--transports", "fp32,qsgd_allgather"],
     "'qsgd_allgather' does not reduce-scatter"),
    (["--world-sizes", "8", "--weight-bits", "8"], "parameters are gathered only by a sharded"),
])
def test_study_refusals_are_one_line(trace_path, tmp_path, args, message):
    code, text, err = run_cli(["study", "--trace", trace_path, *BASE, "--bits", "32,4",
                               "--out", str(tmp_path / "s"), *args])
    # the refusal is one line (after what the study says up front), before any task runs
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert code == 2 and message in line and "study" not in text, err


def test_activation_checkpointing_is_asked_for_and_said(trace_path, tmp_path):
    # a batch whose activations do not fit an H100 fits with every block checkpointed, at the
    # price of a second forward of each block in backward
    args = ["study", "--trace", trace_path, *BASE, "--world-sizes", "8", "--bits", "32",
            "--parallelism", "fsdp", "--batch-size", "96", "--precision", "amp-bf16"]
    code, _, err = run_cli([*args, "--out", str(tmp_path / "a")])
    assert code == 2 and "gpt2 at batch 96 per GPU needs" in err
    code, text, err = run_cli([*args, "--activation-checkpointing", "blocks",
                               "--out", str(tmp_path / "b")])
    assert code == 0, err
    assert "recording the operators of gpt2 with activation checkpointing 'blocks'" in err
    assert f"activation checkpointing: {qsgd.CHECKPOINTING['blocks']}" in err
    (row,) = json.loads((tmp_path / "b" / "study.json").read_text())["rows"]
    assert row["memory_per_gpu"] < 80e9
    code, _, err = run_cli([*args, "--activation-checkpointing", "blocks", "--device", "measured",
                            "--out", str(tmp_path / "c")])
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert code == 2 and "--device measured replays the trace's own seconds" in line


def test_the_attention_kernel_is_asked_for_and_said(trace_path, tmp_path):
    args = ["study", "--trace", trace_path, *BASE, "--world-sizes", "8", "--bits", "32"]
    times = {}
    for kernel in ("flash2", "flash1"):
        code, _, err = run_cli([*args, "--attention-kernel", kernel, "--out", str(tmp_path / kernel)])
        assert code == 0, err
        study = json.loads((tmp_path / kernel / "study.json").read_text())
        (row,) = study["rows"]
        times[kernel] = row["iteration_s"]
        assert study["config"]["attention"] == kernel
    assert "attention: FlashAttention 1 (flash-attn 1.x)" in err
    assert times["flash1"] > times["flash2"]
    code, _, err = run_cli([*args, "--attention-kernel", "flash9", "--out", str(tmp_path / "x")])
    assert code == 2 and "invalid choice: 'flash9'" in err


def test_recommend_picks_a_strategy(trace_path):
    code, text, err = run_cli(["recommend", "--trace", trace_path, *BASE, "--world-sizes", "16",
                               "--max-bits-per-element", "8", "--parallelism", "ddp,fsdp,zero2",
                               "--bits", "4", "--json"])
    assert code == 0, err
    (choice,) = json.loads(text)["strategies"]
    assert {o["strategy"] for o in choice["options"]} == {"ddp", "fsdp", "zero2"}
    assert choice["best"]["iteration_s"] == min(o["iteration_s"] for o in choice["options"])


def test_a_trace_without_the_precisions_operators_gets_them_recorded(tmp_path):
    # a measured trace carries the default families; fp16's is recorded when asked for
    trace = qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta")
    assert "half" not in trace.operators.families
    older = tmp_path / "older.json"
    trace.save(older)
    runs = {}
    for prec in ("fp16", "amp-fp16"):
        code, _, err = run_cli(["study", "--trace", str(older), *BASE, "--world-sizes", "16",
                                "--bits", "32", "--precision", prec, "--out", str(tmp_path / prec)])
        assert code == 0, err
        runs[prec] = json.loads((tmp_path / prec / "study.json").read_text())["rows"][0]
        assert ("no 'half' operator records (fp16); recording them" in err) == (prec == "fp16")
    assert runs["fp16"]["precision"] == "fp16"
    # a float16 model all-reduces float16 gradients: half the bytes of autocast's float32 ones
    assert runs["fp16"]["bytes_per_gpu"] == pytest.approx(runs["amp-fp16"]["bytes_per_gpu"] / 2)


def test_a_trace_from_before_the_transients_is_recorded_again_where_memory_is_reported(
        trace_path, tmp_path):
    doc = json.loads(open(trace_path).read())
    for fam in doc["operators"]["families"].values():
        assert fam.pop("transient")[1] > 0
    older = tmp_path / "older.json"
    older.write_text(json.dumps(doc))
    args = ["study", "--trace", str(older), *BASE, "--world-sizes", "8", "--bits", "32"]
    code, _, err = run_cli([*args, "--parallelism", "fsdp", "--out", str(tmp_path / "a")])
    assert code == 0 and "recorded before backward's transient memory was" in err, err
    mem = json.loads((tmp_path / "a" / "study.json").read_text())["rows"][0]["memory_per_gpu"]
    code, _, err = run_cli([*args, "--parallelism", "fsdp", "--out", str(tmp_path / "b"),
                            "--trace", trace_path])
    assert json.loads((tmp_path / "b" / "study.json").read_text())["rows"][0][
        "memory_per_gpu"] == mem
    # a DDP study reports no memory: the trace is used as it is
    code, _, err = run_cli([*args, "--out", str(tmp_path / "c")])
    assert code == 0 and "transient" not in err, err
