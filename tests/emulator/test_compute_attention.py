"""The fused attention kernel a run uses (emulator/compute/attention.py): each kernel's share of
the math peak against FlashAttention-2's as the FA2 paper (section 4.1) states it, the kernel
carried from a study's or a published run's inputs down to every attention operator, bad
names refused in one line; and the kernels against the paper's end-to-end Table 1
(emulator/validation/attention.py, ``qsgd-emu validate attention``)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import emulator
import qsgd
from emulator.compute import (ATTENTION_KERNELS, DEFAULT_ATTENTION, ComputeModel, attention_kernel,
                              device, kernel_seconds, precision, step_times)
from emulator.compute.attention import FLASH2_EFFICIENCY
from emulator.errors import ConfigError, TraceError
from emulator.validation import load_attention_cases, validate_attention
from qsgd.operators.kinds import attention_flops

# one A100 layer's causal attention of GPT-2 small at 8 x 1024 tokens, forward and backward
BH, S, D = 8 * 12, 1024, 64


def _attention(backward: bool):
    return SimpleNamespace(
        kind="attention", op="attention_backward" if backward else "attention",
        phase="backward" if backward else "forward", dtype="bfloat16",
        flops=(attention_flops(BH, S, S, D, True, backward), 0), bytes=(4 * BH * S * D * 2, 0),
        gemms=(((BH, 0), (S, 0), (S, 0), (D, 0)),), tensors=1, reread=(0, 0), nchw=(0, 0),
        causal=True)


@pytest.fixture(scope="module")
def gpt2():
    return qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta")


def test_flash2_is_the_default_and_keeps_the_rule_of_issue_28():
    assert DEFAULT_ATTENTION == "flash2"
    fa2 = ATTENTION_KERNELS["flash2"]
    for arch, share in FLASH2_EFFICIENCY.items():
        assert fa2.efficiency(arch, False) == fa2.efficiency(arch, True) == share
    # 0.60 of an A100's bf16 peak: inside the 50-73 % FA2's paper reports
    assert 0.50 <= FLASH2_EFFICIENCY["ampere"] <= 0.73


@pytest.mark.parametrize("name, forward, backward", [
    ("flash1", 2.0, 2.0),      # FA2 "around 2x faster than FlashAttention"
    ("triton", 1.4, 2.0),      # "1.3-1.5x faster ... forward and around 2x ... backward"
])
def test_each_kernel_is_as_much_slower_than_flash2_as_the_paper_says(name, forward, backward):
    a100 = device("A100")
    fa2 = [kernel_seconds(_attention(b), 1, a100, "bf16") for b in (False, True)]
    this = [kernel_seconds(_attention(b), 1, a100, "bf16", name) for b in (False, True)]
    # the launch cost is the same; the math is slower by the ratio
    assert this[0] - fa2[0] == pytest.approx((fa2[0] - emulator.compute.rules.KERNEL_S) * (forward - 1))
    assert this[1] - fa2[1] == pytest.approx((fa2[1] - emulator.compute.rules.KERNEL_S) * (backward - 1))
    assert 1.3 <= forward <= 2.0 and backward == 2.0


def test_flash1_sits_inside_the_25_to_40_percent_the_paper_gives_it_on_an_a100():
    share = ATTENTION_KERNELS["flash1"].efficiency("ampere", backward=False)
    assert 0.25 <= share <= 0.40


def test_the_kernel_touches_attention_and_nothing_else(gpt2):
    fam, h100, prec = gpt2.operators.family("amp"), device("H100"), precision("amp-bf16")
    base = step_times(fam, 8, h100, prec)
    slow = step_times(fam, 8, h100, prec, attention="triton")
    for (phase, kind), s in base.kernel_s.items():
        if kind == "attention":
            assert slow.kernel_s[phase, kind] > 1.3 * s
        else:
            assert slow.kernel_s[phase, kind] == pytest.approx(s)
    assert slow.forward_s > base.forward_s and slow.backward_s > base.backward_s
    assert slow.optimizer_s == pytest.approx(base.optimizer_s)
    # a model without fused attention (the MLP) does not move
    mlp = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    r = mlp.operators.family("amp")
    assert step_times(r, 64, h100, prec, attention="flash1") == step_times(r, 64, h100, prec)


def test_a_compute_model_carries_the_kernel_says_it_and_shards_with_it(gpt2):
    fa2 = ComputeModel.for_device("H100", gpt2, batch_size=8)
    tri = ComputeModel.for_device("H100", gpt2, batch_size=8, attention="triton")
    assert (fa2.attention, tri.attention) == ("flash2", "triton")
    assert "attention: FlashAttention-2" in fa2.source and "attention: FlashAttention in Triton" in tri.source
    assert tri.backward_s > fa2.backward_s and tri.forward_s > fa2.forward_s
    assert tri.to_dict()["attention"] == "triton"
    units = [u.params for u in qsgd.units_of(gpt2.operators.parameters)]
    assert tri.unit_times(gpt2, units).backward_s > fa2.unit_times(gpt2, units).backward_s
    # a model without attention says nothing about it
    mlp = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    assert "attention" not in ComputeModel.for_device("H100", mlp, batch_size=8).source
    # unless a kernel was asked for: then it says the kernel did not apply
    said = ComputeModel.for_device("H100", mlp, batch_size=8, attention="triton").source
    assert "attention kernel 'triton' not applied: the trace has no fused attention operator" in said
    # nor does a trace's own seconds (the device "measured")
    assert ComputeModel.for_device("measured", mlp).source == "measured seconds"
    assert ComputeModel.for_device("measured", mlp, attention="flash1").source.endswith(
        "attention kernel 'flash1' not applied: the device 'measured' replays the trace's own "
        "seconds")


def test_a_study_times_its_topologies_on_the_kernel_asked_for(gpt2):
    cfg = emulator.StudyConfig(trace=gpt2, world_sizes=(8,), topologies=("cluster:dgx_h100x{N}",),
                               batch_size=8, attention="flash1")
    (model,) = emulator.resolve_compute(cfg).values()
    assert model.attention == "flash1" and cfg.to_dict()["attention"] == "flash1"
    assert "attention" not in dataclasses.replace(cfg, attention=None).to_dict()


@pytest.mark.parametrize("make, message", [
    (lambda t: attention_kernel("cudnn"),
     "attention kernel must be one of ['flash1', 'flash2', 'triton'], got 'cudnn'"),
    (lambda t: ComputeModel(attention="xformers"),
     "ComputeModel.attention must be one of ['flash1', 'flash2', 'triton'], got 'xformers'"),
    (lambda t: ComputeModel.for_device("A100", t, attention="flash3"),
     "attention kernel must be one of ['flash1', 'flash2', 'triton'], got 'flash3'"),
    (lambda t: emulator.StudyConfig(trace=t, attention=2),
     "StudyConfig.attention must be None or one of ['flash1', 'flash2', 'triton'], got 2"),
])
def test_an_unknown_kernel_is_refused_in_one_line(gpt2, make, message):
    with pytest.raises(ConfigError) as info:
        make(gpt2)
    assert str(info.value) == message


# ---------------------------------------------------------------- FlashAttention-2's Table 1


def test_the_published_table_is_kept_with_its_source():
    cases, source = load_attention_cases()
    assert "FlashAttention-2" in source["title"] and "Table 1" in source["table_or_file"]
    rows = {}
    for c in cases:
        rows.setdefault(c.row, {})[c.attention] = c.tflops_per_gpu
    # four models and contexts, each with FlashAttention and FlashAttention-2
    assert len(rows) == 4 and all(set(r) == {"flash1", "flash2"} for r in rows.values())
    assert all(r["flash2"] > r["flash1"] for r in rows.values())


@pytest.mark.slow
def test_the_kernels_reproduce_the_published_end_to_end_speeds():
    """Nothing is fitted to the table: the kernels' ratios come from the paper's kernel
    benchmarks (section 4.1). End to end, each run is within 15 % and each row's FA2 / FA1
    speedup within 0.1 (benchmarks/RESULTS.md has the table)."""
    out = validate_attention()
    assert len(out["rows"]) == 8
    assert all(abs(r["error"]) < 0.15 for r in out["rows"]), out["rows"]
    assert all(abs(s["predicted"] - s["published"]) < 0.1 for s in out["speedups"])
    # at 8k context attention is a larger share of the step: the published and the predicted
    # speedups both grow with the context
    by = {s["row"]: s for s in out["speedups"]}
    for size in ("1.3B", "2.7B"):
        short, long = by[f"GPT3-{size} 2k context"], by[f"GPT3-{size} 8k context"]
        assert long["published"] > short["published"] and long["predicted"] > short["predicted"]


def _table(tmp_path, **edit):
    import json

    doc = json.loads(open(emulator.validation.attention._default_path()).read())
    doc["cases"] = doc["cases"][:2]
    for c in doc["cases"]:       # a two-layer model: the command's plumbing, quickly
        c["zoo"]["args"].update(n_layer=2, n_embd=256, n_head=4, seq_len=512, n_positions=512)
        c.update(edit)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_validate_attention_prints_the_table_and_the_speedups(tmp_path, capsys):
    from qsgd_emu.cli import main

    assert main(["validate", "attention", "--cases", _table(tmp_path),
                 "--out", str(tmp_path / "rows.json")]) == 0
    text = capsys.readouterr().out
    assert "FlashAttention-2" in text and "flash2 / flash1" in text and "2 runs" in text
    assert (tmp_path / "rows.json").exists()


@pytest.mark.parametrize("edit, message", [
    ({"attention": "sdpa"}, r"cases\[0\].attention must be one of \['flash1', 'flash2', 'triton'\], got 'sdpa'"),
    ({"batch_size": 0}, r"cases\[0\].batch_size must be a positive int, got 0"),
    ({"tflops_per_gpu": "fast"}, r"cases\[0\].tflops_per_gpu must be a number > 0, got 'fast'"),
])
def test_a_bad_attention_file_is_refused_in_one_line(tmp_path, edit, message):
    import re

    with pytest.raises(TraceError) as info:
        load_attention_cases(_table(tmp_path, **edit))
    assert "\n" not in str(info.value) and re.search(message, str(info.value)), str(info.value)
