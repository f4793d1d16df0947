"""The compute model: devices, precisions, the kernel rules (monotone, quantised, bounded by
the peaks), the eager host/device pipeline, ComputeModel's defaults and what DDP sends per
precision, reproducibility on a busy machine, the codec on a target, and bad input."""
from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import subprocess
import sys
from types import SimpleNamespace

import pytest

import emulator
import qsgd
import topologies
from emulator.compute import (DEVICES, PRECISIONS, ComputeModel, codec_seconds, device, device_of,
                              kernel_seconds, precision, step_times)
from emulator.compute import rules
from emulator.compute.timeline import HOST_OP_S

CFG = qsgd.QSGDConfig.from_bits(4)


@pytest.fixture(scope="module")
def resnet():
    return qsgd.measure("resnet50", CFG, device="meta")


@pytest.fixture(scope="module")
def mlp():
    return qsgd.measure("mlp", CFG, device="meta")


def _op(kind="elementwise", flops=(0, 0), nbytes=(0, 0), gemms=(), **kw):
    base = dict(kind=kind, flops=flops, bytes=nbytes, gemms=gemms, tensors=1, reread=(0, 0),
                nchw=(0, 0), dtype="float32", phase="forward", op=kind, causal=False)
    return SimpleNamespace(**{**base, **kw})


# ---------------------------------------------------------------- devices and precisions
def test_device_figures_are_the_datasheets_dense_ones():
    assert DEVICES["A100-80GB"].flops("bf16") == 312e12 and DEVICES["A100-40GB"].mem_bandwidth == 1555e9
    assert DEVICES["H100-SXM"].flops("fp8") == 1978.9e12 and DEVICES["H200"].mem_bandwidth == 4.8e12
    assert DEVICES["V100"].flops("fp16") == 125e12 and not DEVICES["V100"].has("bf16")
    # GeForce: the FP32-accumulate tensor rate, half the FP16-accumulate one
    assert DEVICES["RTX4090"].flops("fp16") == 165.2e12
    assert device("A100") is DEVICES["A100-80GB"] and device("H100-SXM5") is DEVICES["H100-SXM"]
    for d in DEVICES.values():   # dense tensor peaks at least the SIMT one, as the units go
        assert all(d.peak[m] >= d.peak["fp32"] for m in d.peak)


def test_every_preset_names_a_gpu_the_model_knows():
    for name in topologies.PRESETS:
        G = topologies.from_spec(name)
        assert device_of(G) is not None, name
    assert device_of(topologies.from_spec("p2_16xlarge")).name == "K80"
    assert device_of(topologies.from_spec("p4d")).name == "A100-40GB"
    assert device_of(topologies.from_spec("pcie_box:gpus=4,gpu=RTX4090")).name == "RTX4090"
    assert device_of(topologies.from_spec("fat_tree:k=4")) is None


def test_precision_math_modes_follow_pytorch_defaults():
    a100, v100 = device("A100"), device("V100")
    fp32 = precision("fp32")
    assert fp32.mode("conv", "float32", a100) == "tf32"    # cudnn.allow_tf32 defaults to True
    assert fp32.mode("gemm", "float32", a100) == "fp32"    # matmul.allow_tf32 defaults to False
    assert fp32.mode("conv", "float32", v100) == "fp32"    # no TF32 units before Ampere
    assert precision("tf32").mode("gemm", "float32", a100) == "tf32"
    assert precision("amp-fp16").mode("gemm", "float16", a100) == "fp16"
    assert precision("amp-bf16").mode("gemm", "float16", a100) == "bf16"
    fp8 = precision("fp8")
    h100 = device("H100")
    assert fp8.mode("gemm", "float16", h100) == "fp8" and fp8.mode("conv", "float16", h100) == "bf16"
    assert [PRECISIONS[p].grad_bytes for p in ("fp32", "amp-bf16", "bf16", "fp16")] == [4, 4, 2, 2]
    assert precision("fp16").mode("gemm", "float16", v100) == "fp16"


def test_an_optimizer_that_reads_the_device_waits_for_backward_then_launches_each_kernel():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ops = qsgd.record_operators(model, input_shape=(512,), families=("fp32",),
                                optimizer="bertadam").family("fp32")
    a100, fp32 = device("A100"), precision("fp32")
    synced = step_times(ops, 4096, a100, fp32)
    free = step_times(dataclasses.replace(ops, optimizer="sgd"), 4096, a100, fp32)
    n = sum(o.phase == "optimizer" for o in ops.ops)
    # the host reads the norm once backward's kernels are done, then issues every kernel:
    # each of these small kernels is shorter than its launch
    assert synced.optimizer_s >= n * HOST_OP_S
    assert synced.forward_s == free.forward_s and synced.backward_s == free.backward_s
    assert synced.optimizer_s > free.optimizer_s        # no launch overlaps backward any more


def test_a_float16_model_moves_fewer_bytes_than_autocast_and_runs_faster():
    import torch

    with torch.device("meta"):
        m = qsgd.build_model("bert-base", seq_len=128)
    ops = qsgd.record_operators(m, families=("amp", "half"), fused_attention=False)
    amp, half = ops.family("amp"), ops.family("half")
    nbytes = lambda fam, phase: sum(o.bytes[0] + 32 * o.bytes[1] for o in fam.ops  # noqa: E731
                                    if o.phase == phase)
    # no weight casts, softmax and layer norm in half: less memory traffic at batch 32
    for phase in ("forward", "backward"):
        assert nbytes(half, phase) < nbytes(amp, phase)
    # the same products (FLOPs), run in float16 either way
    flops = lambda fam: sum(o.flops[0] + 32 * o.flops[1] for o in fam.ops if o.kind == "gemm")  # noqa: E731
    assert flops(half) == flops(amp)
    v100 = device("V100")
    t_half = step_times(half, 32, v100, precision("fp16"))
    t_amp = step_times(amp, 32, v100, precision("amp-fp16"))
    assert t_half.forward_s < t_amp.forward_s and t_half.backward_s < t_amp.backward_s


@pytest.mark.parametrize("dev, prec, needle", [
    ("V100", "amp-bf16", "needs bf16 units, which V100 does not have"),
    ("A100", "fp8", "needs fp8 units, which A100-80GB does not have"),
    ("T4", "tf32", "needs tf32 units, which T4 does not have"),
    ("K80", "amp-fp16", "needs fp16 units, which K80 does not have"),
    ("K80", "fp16", "needs fp16 units, which K80 does not have"),
])
def test_a_precision_the_device_has_no_units_for_is_refused(resnet, dev, prec, needle):
    with pytest.raises(emulator.ConfigError, match=needle):
        ComputeModel.for_device(dev, resnet, precision=prec)


@pytest.mark.parametrize("kwargs, needle", [
    ({"target": "TPUv5"}, "device must be one of"),
    ({"precision": "fp4"}, "precision must be one of"),
    ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
    ({"batch_size": 2.5}, "batch_size must be a positive int, got 2.5"),
])
def test_bad_input_is_named(resnet, kwargs, needle):
    args = {"target": "A100", **kwargs}
    with pytest.raises(emulator.ConfigError, match=needle):
        ComputeModel.for_device(args.pop("target"), resnet, **args)


def test_a_trace_without_operators_is_refused_with_how_to_fix(resnet):
    old = dataclasses.replace(resnet, operators=None)
    with pytest.raises(emulator.ConfigError, match="no operator records.*qsgd-emu measure"):
        ComputeModel.for_device("A100", old)


# ---------------------------------------------------------------- kernel rules
def test_large_products_run_at_the_cited_efficiency_and_never_above_peak():
    a100 = device("A100")
    m = n = 108 * 256
    op = _op("gemm", flops=(2 * m * n * 4096, 0), gemms=(((1, 0), (m, 0), (n, 0), (4096, 0)),),
             nbytes=(2 * (m * 4096 * 2 + n * m), 0))
    t = kernel_seconds(op, 1, a100, "bf16")
    achieved = op.flops[0] / t
    assert achieved == pytest.approx(312e12 * rules.TENSOR_EFFICIENCY["ampere"], rel=0.01)
    for dev in DEVICES.values():
        for mode in dev.peak:
            assert op.flops[0] / kernel_seconds(op, 1, dev, mode) <= dev.peak[mode]


def test_products_are_monotone_and_wave_quantised():
    sms, rate = 108, 100e12
    times = [rules.gemm_math_seconds(1, m, 1024, 1024, rate, sms) for m in range(128, 20000, 333)]
    assert all(a <= b for a, b in zip(times, times[1:]))
    for k in (64, 512, 4096):
        ks = [rules.gemm_math_seconds(1, 4096, 4096, kk, rate, sms) for kk in (k, 2 * k)]
        assert ks[0] <= ks[1]
    # one row past a full wave of 256x128 tiles: a second wave of them (2x), or three waves of
    # half-size 128x128 tiles (1.5x), which is what is taken
    full = rules.gemm_math_seconds(1, 256 * 108, 128, 2048, rate, sms)
    assert rules.gemm_math_seconds(1, 256 * 108 + 1, 128, 2048, rate, sms) == pytest.approx(1.5 * full)


def test_a_skinny_product_runs_a_tile_of_its_own_size():
    """A one-row product (batch 1 through a 784x256 layer) takes microseconds, not a 256-row
    tile's worth of work on two SMs."""
    a100 = device("A100")
    rate = a100.flops("fp32") * rules.SIMT_EFFICIENCY[False]
    t = rules.gemm_math_seconds(1, 1, 256, 784, rate, a100.sms)
    assert t < 10e-6
    assert t >= 2 * 256 * 784 / rate      # never faster than the ideal
    # rounding to the tensor cores' 16 rows: 1 and 16 rows cost the same
    assert t == rules.gemm_math_seconds(1, 16, 256, 784, rate, a100.sms)


def test_split_k_fills_the_gpu_when_tiles_are_few():
    sms, rate = 108, 100e12
    few = rules.gemm_math_seconds(1, 256, 256, 1 << 20, rate, sms)    # 2 tiles, a huge reduction
    ideal = 2 * 256 * 256 * (1 << 20) / rate
    assert few < 3 * ideal           # without split-K it would be 54x the ideal
    assert rules.split_k_bytes(1, 256, 256, 1 << 20, sms) > 0
    assert rules.split_k_bytes(1, 1 << 15, 1 << 15, 512, sms) == 0


def test_memory_bound_kernels_scale_with_bytes_and_bandwidth():
    op = _op(nbytes=(0, 1_000_000))
    a100 = device("A100")
    t = [kernel_seconds(op, b, a100, "fp32") - rules.KERNEL_S for b in (100, 200, 400)]
    assert t[1] == pytest.approx(2 * t[0]) and t[2] == pytest.approx(4 * t[0])
    assert t[0] == pytest.approx(1e8 / (a100.mem_bandwidth * rules.MEMORY_EFFICIENCY[True]))
    assert kernel_seconds(op, 100, device("H200"), "fp32") < kernel_seconds(op, 100, device("H100"), "fp32")
    # a second pass reads again
    twice = _op(nbytes=(0, 1_000_000), reread=(0, 1_000_000))
    assert kernel_seconds(twice, 100, a100, "fp32") - rules.KERNEL_S == pytest.approx(2 * t[0])


def test_nchw_convolutions_pay_layout_kernels_on_tensor_cores_only():
    a100 = device("A100")
    kw = dict(flops=(2 * 4096 * 64 * 576, 0), gemms=(((1, 0), (4096, 0), (64, 0), (576, 0)),),
              nbytes=(10**7, 0))
    nchw, nhwc = _op("conv", nchw=(10**7, 0), **kw), _op("conv", **kw)
    for mode in ("tf32", "fp16", "bf16"):
        extra = kernel_seconds(nchw, 1, a100, mode) - kernel_seconds(nhwc, 1, a100, mode)
        assert extra == pytest.approx(rules.memory_seconds(2 * 10**7, a100) + 2 * rules.KERNEL_S)
    assert kernel_seconds(nchw, 1, a100, "fp32") == kernel_seconds(nhwc, 1, a100, "fp32")


def test_causal_attention_halves_the_math():
    kw = dict(gemms=(((64, 0), (4096, 0), (4096, 0), (128, 0)),))
    full = _op("attention", flops=(qsgd.operators.kinds.attention_flops(64, 4096, 4096, 128, False, False), 0), **kw)
    half = _op("attention", flops=(qsgd.operators.kinds.attention_flops(64, 4096, 4096, 128, True, False), 0), **kw)
    tf, th = (kernel_seconds(o, 1, device("A100"), "bf16") for o in (full, half))
    assert th == pytest.approx(tf / 2, rel=0.01)


# ---------------------------------------------------------------- the step
def test_small_batches_wait_on_the_host_and_large_ones_on_the_gpu(resnet):
    fam, a100, amp = resnet.operators.family("amp"), device("A100"), precision("amp-bf16")
    small, large = step_times(fam, 1, a100, amp), step_times(fam, 256, a100, amp)
    issue = (len(fam.ops) - 1) * HOST_OP_S      # the host issuing every kernel (no scaler for bf16)
    assert issue <= small.step_s < 1.25 * issue           # eager overhead bound
    assert small.host_bound_s > 0
    assert large.step_s > 10 * issue and large.host_bound_s < 0.01 * large.step_s
    per_sample = [step_times(fam, b, a100, amp).step_s / b for b in (1, 8, 64, 256)]
    assert all(a > b for a, b in zip(per_sample, per_sample[1:]))


def test_faster_gpus_and_lower_precisions_are_faster(resnet):
    times = {}
    for dev, prec in (("V100", "fp32"), ("V100", "amp-fp16"), ("A100", "tf32"), ("A100", "amp-bf16"),
                      ("H100", "amp-bf16")):
        m = ComputeModel.for_device(dev, resnet, batch_size=128, precision=prec)
        times[dev, prec] = sum(m.phases(resnet)[:3])
    order = [("V100", "fp32"), ("V100", "amp-fp16"), ("A100", "amp-bf16"), ("H100", "amp-bf16")]
    assert all(times[a] > times[b] for a, b in zip(order, order[1:]))
    assert times["V100", "fp32"] > times["A100", "tf32"] > times["A100", "amp-bf16"]


def test_buckets_are_ready_in_order_inside_backward(resnet):
    m = ComputeModel.for_device("A100", resnet, batch_size=64)
    fwd, bwd, opt, ready = m.phases(resnet)
    assert list(ready) == sorted(ready) and 0 < ready[0] and ready[-1] <= bwd


def test_defaults_are_the_models_batch_and_the_gpus_usual_precision(resnet):
    m = ComputeModel.for_device("A100", resnet)
    assert (m.batch_size, m.precision, m.device) == (256, "amp-bf16", "A100-80GB")
    assert "at batch 256 per GPU (the model's training batch)" in m.source
    assert ComputeModel.for_device("V100", resnet).precision == "amp-fp16"
    assert ComputeModel.for_device("K80", resnet).precision == "fp32"
    assert ComputeModel.for_device("measured", resnet) == ComputeModel()


def test_pure_bf16_halves_what_ddp_sends(mlp):
    G = topologies.from_spec("switch:4,bw=10Gbit")
    preds = {p: emulator.replay(mlp, G, transport="fp32",
                                compute=ComputeModel.for_device("A100", mlp, batch_size=32, precision=p))
             for p in ("amp-bf16", "bf16")}
    assert preds["bf16"].bytes_per_gpu == pytest.approx(preds["amp-bf16"].bytes_per_gpu / 2)
    fp16 = emulator.replay(mlp, G, transport="fp16",
                           compute=ComputeModel.for_device("A100", mlp, batch_size=32, precision="amp-bf16"))
    assert fp16.bytes_per_gpu == pytest.approx(preds["bf16"].bytes_per_gpu)


def test_the_measuring_batch_does_not_move_the_prediction():
    """Traces measured at batch 2 and 8 on this CPU predict the same step at batch 128."""
    steps = []
    for b in (2, 8):
        trace = qsgd.measure("mlp", CFG, iterations=1, batch_size=b, device="cpu", seed=0)
        m = ComputeModel.for_device("H100", trace, batch_size=128, precision="amp-bf16")
        steps.append(m.phases(trace))
    assert steps[0] == steps[1]


_CHILD = """
import json, sys, qsgd, emulator
trace = qsgd.PayloadTrace.load(sys.argv[1])
m = emulator.ComputeModel.for_device("A100", trace, batch_size=96, precision="amp-fp16")
print(json.dumps([m.phases(trace), m.codec(trace, 0, trace.config)]))
"""


def _burn(seconds):
    import time
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def test_a_busy_and_a_quiet_machine_give_identical_seconds(resnet, tmp_path):
    path = tmp_path / "t.json"
    resnet.save(path)

    def child():
        return subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                              text=True, check=True).stdout
    quiet = child()
    burners = [multiprocessing.Process(target=_burn, args=(20,)) for _ in range(2)]
    for p in burners:
        p.start()
    try:
        busy = child()
    finally:
        for p in burners:
            p.terminate()
    assert json.loads(quiet) == json.loads(busy)


# ---------------------------------------------------------------- codec
def test_the_codec_reproduces_its_measurement_and_scales_with_bandwidth():
    n = 2**26
    assert codec_seconds("encode", n, 4, device("H200")) == pytest.approx(8.2e-3, rel=1e-9)
    assert codec_seconds("decode", n, 4, device("H200")) == pytest.approx(6.8e-3, rel=1e-9)
    assert codec_seconds("encode", n, 2, device("H200")) == pytest.approx(6.6e-3, rel=1e-9)
    a100 = codec_seconds("encode", n, 4, device("A100"))
    fixed = 8 * rules.KERNEL_S
    assert (a100 - fixed) / (8.2e-3 - fixed) == pytest.approx(4.8e12 / 2.039e12)
    widths = [codec_seconds("encode", n, b, device("A100")) for b in (2, 3, 4, 6, 8, 12)]
    assert all(a < b for a, b in zip(widths, widths[1:]))
    assert codec_seconds("encode", 0, 4, device("A100")) == 0.0


def test_the_models_codec_times_its_buckets_on_the_target(resnet):
    m = ComputeModel.for_device("A100", resnet)
    b = resnet.buckets[0]
    enc, dec = m.codec(resnet, 0, CFG)
    assert enc == codec_seconds("encode", b.compressed_numel, 4, device("A100"))
    assert dec == codec_seconds("decode", b.compressed_numel, 4, device("A100"))
    assert m.scaled(codec_scale=0.0).codec(resnet, 0, CFG) == (0.0, 0.0)


def test_a_meta_trace_cannot_be_replayed_on_its_own_seconds(mlp):
    with pytest.raises(emulator.ConfigError, match="meta device and holds no seconds"):
        emulator.replay(mlp, topologies.from_spec("switch:4"), transport="fp32")


def test_given_seconds_stretch_the_measured_ready_offsets():
    trace = qsgd.measure("mlp", CFG, iterations=1, batch_size=2, device="cpu", seed=0)
    fwd, bwd, opt, ready = ComputeModel.given(0.5, 0.4, 0.1).phases(trace)
    assert (fwd, bwd, opt) == (0.5, 0.4, 0.1)
    scale = 0.4 / trace.mean_iteration("backward_s")
    assert ready == pytest.approx(tuple(trace.mean_ready_s(k) * scale for k in range(trace.num_buckets)))
    with pytest.raises(emulator.ConfigError, match="ComputeModel.compute_scale"):
        ComputeModel(compute_scale=-1.0)
    assert math.isfinite(sum(ComputeModel().phases(trace)[:3]))


# ---------------------------------------------------------------- measured operator seconds
@pytest.fixture(scope="module")
def timed_trace():
    """An MLP measured on this CPU with one step timed per operator (a CUDA trace carries the
    same record, from the kernels' device time)."""
    return qsgd.measure("mlp", CFG, iterations=1, batch_size=8, device="cpu", seed=0,
                        operator_seconds=True)


def test_a_timed_step_records_every_operator_with_its_seconds(timed_trace, tmp_path):
    m = timed_trace.operators.measured
    fp32 = timed_trace.operators.family("fp32")
    assert [o.op for o in m.operators.ops] == [o.op for o in fp32.ops]
    assert len(m.seconds) == len(fp32.ops) and all(s > 0 for s in m.seconds)
    assert m.batch_size == 8 and all(o.bytes[1] == 0 for o in m.operators.ops)
    assert [o.bytes[0] for o in m.operators.ops] == [o.bytes_at(8) for o in fp32.ops]
    path = tmp_path / "t.json"
    timed_trace.save(path)
    assert qsgd.PayloadTrace.load(path).operators.measured == m


@pytest.mark.parametrize("prec, family, dtype", [("fp16", "half", "float16"),
                                                  ("bf16", "bf16", "bfloat16")])
def test_a_two_byte_model_is_timed_in_its_own_dtype(prec, family, dtype):
    from qsgd.operators.measured import time_operators

    model = qsgd.build_model("mlp")
    m = time_operators(model, 4, precision=prec)
    recorded = qsgd.record_operators(qsgd.build_model("mlp"), families=(family,)).family(family)
    # the same kernels the meta recording gives, each timed, on a model now in that dtype
    assert m.operators.family == family and m.precision == prec
    assert [o.op for o in m.operators.ops] == [o.op for o in recorded.ops]
    assert all(s > 0 for s in m.seconds)
    assert {str(p.dtype) for p in model.parameters()} == {f"torch.{dtype}"}


def _as_measured_on(trace, name):
    m = dataclasses.replace(trace.operators.measured, device_name=name)
    return dataclasses.replace(trace, operators=dataclasses.replace(trace.operators, measured=m))


def test_measured_seconds_are_used_as_they_are_on_the_same_gpu(timed_trace):
    trace = _as_measured_on(timed_trace, "NVIDIA A100-SXM4-80GB")
    m = trace.operators.measured
    model = ComputeModel.for_device("A100", trace, batch_size=8, precision="fp32")
    assert "per-operator seconds measured on A100-80GB" in model.source
    want = step_times(m.operators, 8, device("A100"), precision("fp32"), m.seconds)
    assert model.phases(trace)[:3] == (want.forward_s, want.backward_s, want.optimizer_s)
    # at another batch or precision the measurement does not apply: the model times the step
    other = ComputeModel.for_device("A100", trace, batch_size=16, precision="fp32")
    assert "per-operator roofline" in other.source


def test_measured_seconds_scale_per_operator_to_another_gpu(timed_trace):
    trace = _as_measured_on(timed_trace, "NVIDIA A100-SXM4-80GB")
    m = trace.operators.measured
    a100, h100, fp32 = device("A100"), device("H100"), precision("fp32")
    model = ComputeModel.for_device("H100", trace, batch_size=8, precision="fp32")
    assert "scaled by the model's A100-80GB-to-H100-SXM ratio" in model.source
    scaled = [s * kernel_seconds(o, 8, h100, fp32.mode(o.kind, o.dtype, h100))
              / kernel_seconds(o, 8, a100, fp32.mode(o.kind, o.dtype, a100))
              for o, s in zip(m.operators.ops, m.seconds)]
    want = step_times(m.operators, 8, h100, fp32, scaled)
    assert model.phases(trace)[:3] == pytest.approx((want.forward_s, want.backward_s, want.optimizer_s))
    # a CPU's seconds are never a GPU's: the trace as measured here is timed by the model
    assert "roofline" in ComputeModel.for_device("A100", timed_trace, batch_size=8,
                                                 precision="fp32").source


def test_the_consumer_box_preset_times_rtx4090s_with_ddp_through_host_memory(mlp):
    G = topologies.from_spec("cluster:rtx4090_boxx2")
    model = ComputeModel.for_topology(G, mlp)
    assert (model.device, model.precision) == ("RTX4090", "amp-bf16")
    assert all(d.get("p2p") is False for _, d in G.nodes(data=True) if d.get("kind") == "gpu")


def test_the_fused_codec_what_if_times_the_issues_target(resnet):
    """``codec="fused"``: two float32 copies' traffic per element (half the copy bandwidth,
    the GPU-codec issue's target) instead of today's measured codec."""
    today = ComputeModel.for_device("A100", resnet)
    fused = ComputeModel.for_device("A100", resnet, codec="fused")
    b = resnet.buckets[0]
    enc, dec = fused.codec(resnet, 0, CFG)
    a100 = device("A100")
    assert enc == pytest.approx(16 * b.compressed_numel / a100.mem_bandwidth + 8 * rules.KERNEL_S)
    assert dec == pytest.approx(16 * b.compressed_numel / a100.mem_bandwidth + 6 * rules.KERNEL_S)
    assert today.codec(resnet, 0, CFG)[0] > 10 * enc
    assert fused.phases(resnet) == today.phases(resnet)     # compute is untouched
    assert "GPU-codec issue's target" in fused.source
    with pytest.raises(emulator.ConfigError, match="codec must be one of"):
        ComputeModel.for_device("A100", resnet, codec="magic")
