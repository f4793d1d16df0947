"""cuDNN's convolution algorithms in the compute model (emulator.compute.convolution): Winograd
where cuDNN offers it and it is faster, implicit GEMM everywhere else, older records as before."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import qsgd
from emulator.compute import device, kernel_seconds, precision, step_times
from emulator.compute import rules
from emulator.compute.convolution import (ALGORITHMS, WINOGRAD_TILE, Product, algorithms, choose,
                                          products)

V100 = device("V100")


def _convs(net, shape, batch=32, family="fp32"):
    ops = qsgd.record_operators(net, input_shape=shape, families=(family,)).family(family)
    return [o for o in ops.ops if o.kind == "conv"]


def _timings(p, dev=V100, mode="fp32"):
    return {name: f(p, dev, mode) for name, f in ALGORITHMS.items()}


def test_winograd_wins_where_products_dominate_and_loses_where_transforms_do():
    b, hw = 64, 56
    tiles = b * (hw // WINOGRAD_TILE) ** 2
    for c, winner in ((256, "winograd"), (2, "implicit_gemm")):
        p = Product("forward", (1, b * hw * hw, c, 9 * c), c, c, tiles, True)
        t = _timings(p)
        if winner == "winograd":
            assert t["winograd"].seconds < t["implicit_gemm"].seconds
            # F(4x4, 3x3): 36 multiplications per 16 outputs against 144, a quarter of the math
            assert t["winograd"].math_s == pytest.approx(t["implicit_gemm"].math_s / 4, rel=0.02)
        else:   # 2 channels: the transformed tiles' traffic costs more than the products save
            assert t["winograd"].seconds > t["implicit_gemm"].seconds
            assert t["winograd"].serial_s > t["implicit_gemm"].math_s
        assert choose(p, V100, "fp32").algorithm == winner


def test_winograd_is_offered_only_for_3x3_stride_1_undilated_ungrouped_convolutions():
    c, shape = 64, (64, 28, 28)
    nets = {"3x3": nn.Conv2d(c, c, 3, padding=1), "stride 2": nn.Conv2d(c, c, 3, stride=2, padding=1),
            "1x1": nn.Conv2d(c, c, 1), "grouped": nn.Conv2d(c, c, 3, padding=1, groups=2),
            "depthwise": nn.Conv2d(c, c, 3, padding=1, groups=c),
            "dilated": nn.Conv2d(c, c, 3, padding=2, dilation=2), "5x5": nn.Conv2d(c, c, 5, padding=2)}
    for name, conv in nets.items():
        net = nn.Sequential(nn.Conv2d(c, c, 1), conv)       # the layer under test gets both gradients
        convs = _convs(net, shape)
        layer = ([o for o in convs if o.phase == "forward"][1],     # backward runs in reverse
                 [o for o in convs if o.phase == "backward"][0])
        assert all(tuple(o.kernel) == conv.kernel_size and o.groups == conv.groups for o in layer)
        ps = [p for o in layer for p in products(o, 32)]
        assert {p.role for p in ps} == {"forward", "data", "weight"}
        offered = [ALGORITHMS["winograd"](p, V100, "fp32") is not None for p in ps]
        assert all(offered) if name == "3x3" else not any(offered), name


def test_winograd_runs_in_fp32_and_fp16_never_in_bf16():
    conv = _convs(nn.Conv2d(256, 256, 3, padding=1, bias=False), (256, 14, 14))[0]
    (p,) = products(conv, 64)
    a100, rtx = device("A100"), device("RTX3090")
    assert ALGORITHMS["winograd"](p, a100, "bf16") is None
    # TF32 allowed: cuDNN may still run its FP32 (SIMT) Winograd
    assert ALGORITHMS["winograd"](p, a100, "tf32").mode == "fp32"
    # FP16: the non-fused Winograd is one of cuDNN's tensor-core algorithms
    assert ALGORITHMS["winograd"](p, V100, "fp16").mode == "fp16"
    # where TF32 tensor cores are 8x the FP32 units (A100) implicit GEMM wins; where they run
    # at the FP32 rate (RTX 3090's FP32-accumulate TF32) Winograd's quarter of the products wins
    assert algorithms(conv, 64, a100, "tf32") == ["implicit_gemm"]
    assert algorithms(conv, 64, rtx, "tf32") == ["winograd"]


def test_fp32_winograd_needs_no_nchw_transposes_around_it():
    """A convolution whose products all run FP32 Winograd on the SIMT units pays no layout
    kernels, even under TF32; one on tensor cores still does."""
    net = nn.Sequential(nn.Conv2d(256, 256, 1), nn.Conv2d(256, 256, 3, padding=1, bias=False))
    conv = _convs(net, (256, 14, 14))[1]
    assert any(conv.nchw)
    rtx, a100 = device("RTX3090"), device("A100")
    nhwc = dataclasses.replace(conv, nchw=(0, 0))
    assert algorithms(conv, 64, rtx, "tf32") == ["winograd"]
    assert kernel_seconds(conv, 64, rtx, "tf32") == kernel_seconds(nhwc, 64, rtx, "tf32")
    assert algorithms(conv, 64, a100, "tf32") == ["implicit_gemm"]
    assert kernel_seconds(conv, 64, a100, "tf32") > kernel_seconds(nhwc, 64, a100, "tf32")


def _legacy(op):
    """The record as an older trace has it: no geometry."""
    d = op.to_dict()
    for key in ("kernel", "stride", "dilation", "groups", "spatial"):
        d.pop(key, None)
    return type(op).from_dict(d, "op")


def test_a_record_without_geometry_times_as_before():
    net = nn.Sequential(nn.Conv2d(64, 256, 1), nn.Conv2d(256, 256, 3, padding=1))
    for conv in _convs(net, (64, 28, 28)):
        old = _legacy(conv)
        assert not old.has_geometry
        dims = old.gemms_at(32)
        rate = V100.flops("fp32") * rules.math_efficiency("fp32", V100)
        # the rule before cuDNN's algorithms were modelled: every product as implicit GEMM
        math_s = sum(rules.gemm_math_seconds(*g, rate, V100.sms) for g in dims)
        nbytes = old.bytes_at(32) + sum(rules.split_k_bytes(*g, V100.sms) for g in dims)
        want = max(math_s, rules.memory_seconds(nbytes, V100)) + len(dims) * rules.KERNEL_S
        assert kernel_seconds(old, 32, V100, "fp32") == want
        assert algorithms(old, 32, V100, "fp32") == ["implicit_gemm"] * len(dims)


def test_winograd_makes_fp32_resnet_faster_on_a_v100_and_leaves_bf16_alone():
    with torch.device("meta"):
        model = qsgd.build_model("resnet50")
    ops = qsgd.record_operators(model, families=("fp32", "amp"))
    cases = {("V100", "fp32"): "faster", ("A100", "amp-bf16"): "same"}
    for (dev, prec), how in cases.items():
        fam = ops.family(precision(prec).family)
        legacy = dataclasses.replace(fam, ops=tuple(_legacy(o) if o.kind == "conv" else o
                                                    for o in fam.ops))
        new, old = (step_times(f, 128, device(dev), precision(prec)).step_s for f in (fam, legacy))
        if how == "faster":
            assert new < 0.95 * old
        else:
            assert new == old
