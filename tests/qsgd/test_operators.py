"""Operator records: FLOPs and products against hand counts, the batch fit, autocast's casts,
layouts, gradient-ready positions, the trace's version 3 and the meta-device measurement."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qsgd
from qsgd.operators import record, record_operators
from qsgd.operators.kinds import attention_flops


def _ops(opset, phase=None, kind=None):
    return [o for o in opset.ops if (phase is None or o.phase == phase) and (kind is None or o.kind == kind)]


def test_linear_forward_and_backward_products_are_the_hand_counts():
    ops = record_operators(nn.Linear(64, 32), input_shape=(64,), families=("fp32",)).family("fp32")
    (fwd,) = _ops(ops, "forward", "gemm")
    for b in (1, 7, 256):
        assert fwd.gemms_at(b) == [(1, b, 32, 64)]
        assert fwd.flops_at(b) == 2 * b * 32 * 64
    # backward: only the weight's gradient (the input needs none): (32 x b) @ (b x 64)
    (wgrad,) = _ops(ops, "backward", "gemm")
    assert wgrad.gemms_at(9) == [(1, 32, 64, 9)] and wgrad.flops_at(9) == 2 * 32 * 64 * 9
    # bytes of the forward product: input, weight, bias read, output written (fp32)
    assert fwd.bytes_at(5) == 4 * (5 * 64 + 32 * 64 + 32 + 5 * 32)


def test_a_hidden_layer_gets_both_gradient_products():
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    ops = record_operators(model, input_shape=(16,), families=("fp32",)).family("fp32")
    bwd = _ops(ops, "backward", "gemm")
    products = sorted(tuple(g) for o in bwd for g in o.gemms_at(3))
    # the second layer: data gradient (3 x 4) @ (4 x 8) and weight gradient (4 x 3) @ (3 x 8);
    # the first layer: weight gradient only
    assert products == sorted([(1, 3, 8, 4), (1, 4, 8, 3), (1, 8, 16, 3)])


def test_convolution_is_an_implicit_gemm_of_the_hand_counted_size():
    conv = nn.Conv2d(3, 8, 3, padding=1)
    ops = record_operators(conv, input_shape=(3, 10, 12), families=("fp32",)).family("fp32")
    (fwd,) = _ops(ops, "forward", "conv")
    b = 4
    assert fwd.gemms_at(b) == [(1, b * 10 * 12, 8, 3 * 3 * 3)]
    assert fwd.flops_at(b) == 2 * b * 10 * 12 * 8 * 27
    (bwd,) = _ops(ops, "backward", "conv")
    # the input needs no gradient: the weight gradient alone, reduced over every output pixel
    assert bwd.gemms_at(b) == [(1, 8, 27, b * 120)]
    assert bwd.flops_at(b) == 2 * 8 * 27 * b * 120


def test_grouped_convolution_counts_per_group():
    conv = nn.Sequential(nn.Conv2d(4, 8, 1), nn.Conv2d(8, 8, 3, padding=1, groups=4))
    ops = record_operators(conv, input_shape=(4, 6, 6), families=("fp32",)).family("fp32")
    grouped = _ops(ops, "forward", "conv")[1]
    assert grouped.gemms_at(2) == [(4, 2 * 36, 2, 2 * 9)]
    assert grouped.flops_at(2) == 2 * 4 * (2 * 36) * 2 * 18
    data_grad, weight_grad = _ops(ops, "backward", "conv")[0].gemms_at(2)
    assert data_grad == (4, 2 * 36, 2, 2 * 9) and weight_grad == (4, 2, 18, 2 * 36)


def test_convolutions_carry_their_kernel_stride_dilation_groups_and_sizes():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),                  # 10x12 -> 10x12
                        nn.Conv2d(8, 16, 3, stride=2, padding=1),       # -> 5x6
                        nn.Conv2d(16, 16, 1),                           # 1x1
                        nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4))
    ops = record_operators(net, input_shape=(3, 10, 12), families=("fp32",)).family("fp32")
    want = [((3, 3), (1, 1), (1, 1), 1, ((10, 12), (10, 12))),
            ((3, 3), (2, 2), (1, 1), 1, ((10, 12), (5, 6))),
            ((1, 1), (1, 1), (1, 1), 1, ((5, 6), (5, 6))),
            ((3, 3), (1, 1), (2, 2), 4, ((5, 6), (5, 6)))]
    geometry = [(o.kernel, o.stride, o.dilation, o.groups, o.spatial)
                for o in _ops(ops, "forward", "conv")]
    assert geometry == want
    # backward runs the layers in reverse, each with its forward's geometry
    assert [(o.kernel, o.stride, o.dilation, o.groups, o.spatial)
            for o in _ops(ops, "backward", "conv")] == want[::-1]
    # written to JSON and read back; a record without them (an older trace) still loads
    from qsgd.operators.records import Operator
    first = _ops(ops, "forward", "conv")[0]
    d = first.to_dict()
    assert d["kernel"] == [3, 3] and d["stride"] == [1, 1] and d["groups"] == 1
    assert d["spatial"] == [[10, 12], [10, 12]]
    assert Operator.from_dict(d, "op") == first
    old = {k: v for k, v in d.items() if k not in ("kernel", "stride", "dilation", "groups", "spatial")}
    legacy = Operator.from_dict(old, "op")
    assert not legacy.has_geometry and legacy.gemms == first.gemms
    with pytest.raises(qsgd.TraceError, match=r"op\.stride is missing"):
        Operator.from_dict({k: v for k, v in d.items() if k != "stride"}, "op")
    with pytest.raises(qsgd.TraceError, match=r"op\.stride must have one entry per kernel"):
        Operator.from_dict({**d, "stride": [1]}, "op")


class _Attn(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.proj = nn.Linear(16, 3 * 16)

    def forward(self, x):                       # x: (b, s, 16), 2 heads of 8
        b, s, _ = x.shape
        q, k, v = self.proj(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).sum(dim=1)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_one_fused_kernel_each_way_with_its_flops(causal):
    ops = record_operators(_Attn(causal), input_shape=(12, 16), families=("fp32",)).family("fp32")
    (fwd,) = _ops(ops, "forward", "attention")
    (bwd,) = _ops(ops, "backward", "attention")
    b = 5
    pairs = 12 * 13 // 2 if causal else 12 * 12
    assert fwd.flops_at(b) == 2 * 2 * (b * 2) * pairs * 8          # QK^T and PV
    assert bwd.flops_at(b) == 5 * fwd.flops_at(b) // 2                 # FlashAttention-2: 2.5x
    assert fwd.causal is causal and fwd.gemms_at(b) == [(b * 2, 12, 12, 8)]
    # no math-path kernels: no softmax or batched product of the scores
    assert not _ops(ops, None, "softmax") and all(o.gemms_at(1)[0][0] == 1 for o in _ops(ops, None, "gemm"))
    assert attention_flops(b * 2, 12, 12, 8, causal, False) == fwd.flops_at(b)


def test_counts_are_affine_in_the_batch(monkeypatch):
    """Recorded at (2, 3), every count at batch 7 equals a recording at (7, 9)."""
    model = qsgd.build_model("resnet20")
    base = record_operators(model, families=("fp32",)).family("fp32")
    monkeypatch.setattr(record, "BATCHES", (7, 9))
    other = record_operators(model, families=("fp32",)).family("fp32")
    assert [o.op for o in base.ops] == [o.op for o in other.ops]
    for a, b in zip(base.ops, other.ops):
        assert (a.flops_at(7), a.bytes_at(7), a.gemms_at(7)) == (b.flops_at(7), b.bytes_at(7), b.gemms_at(7))


def test_autocast_runs_products_in_half_and_casts_weights_once():
    model = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 10))
    amp = record_operators(model, input_shape=(32,), families=("amp",)).family("amp")
    fwd = _ops(amp, "forward")
    assert {o.dtype for o in fwd if o.kind == "gemm"} == {"float16"}
    # layer_norm is on autocast's float32 list
    assert {o.dtype for o in fwd if o.kind == "norm"} == {"float32"}
    casts = [o for o in fwd if o.op == "aten._to_copy.default"]
    # 2 weights + 2 biases to fp16, the input and the layer norm's output to fp16, the norm's
    # input back to fp32, and the output to fp32 for the loss
    assert len(casts) == 8
    # the fp16 scaler's unscale is recorded in the optimizer phase
    assert [o.kind for o in _ops(amp, "optimizer")].count("scaler") == 1


def test_bf16_parameters_run_everything_in_bf16():
    ops = record_operators(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), input_shape=(8,),
                           families=("bf16",)).family("bf16")
    # the products, the activation and the optimizer; the loss reads the output in fp32
    assert {o.dtype for o in ops.ops if o.kind in ("gemm", "optimizer")} == {"bfloat16"}
    assert [o.dtype for o in _ops(ops, "forward", "elementwise")][0] == "bfloat16"


def test_batch_norm_reads_twice_and_nchw_convolutions_carry_their_activations():
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    nchw = record_operators(model, input_shape=(4, 6, 6), families=("fp32",)).family("fp32")
    (bn,) = _ops(nchw, "forward", "norm")
    assert bn.reread[1] == 4 * 8 * 36            # the input once more per sample
    (conv,) = _ops(nchw, "forward", "conv")
    assert conv.nchw[1] == 4 * (4 * 36 + 8 * 36)  # input and output per sample
    last = record_operators(model, input_shape=(4, 6, 6), families=("fp32",),
                            channels_last=True).family("fp32")
    assert all(o.nchw == (0, 0) for o in last.ops)


def test_gradients_are_ready_in_reverse_layer_order_inside_backward():
    ops = record_operators(qsgd.build_model("mlp"), families=("fp32",)).family("fp32")
    names = [n for n, _ in qsgd.build_model("mlp").named_parameters()]
    assert set(ops.ready) == set(names)
    first, end = ops.phase_span("backward")
    assert all(first < ops.ready[n] <= end for n in names)
    assert ops.ready[names[-1]] < ops.ready[names[0]]      # the last layer's first


def test_transformer_recipes_give_adamw_and_a_training_batch():
    ops = qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta").operators
    assert ops.training_batch_size == 12
    assert {f.optimizer for f in ops.families.values()} == {"adamw"}
    assert _ops(ops.family("amp"), "forward", "attention")[0].causal


@pytest.mark.parametrize("kwargs, needle", [
    ({"model": "mlp"}, "must be a torch.nn.Module"),
    ({"families": ("fp64",)}, "families"),
    ({"optimizer": "lion"}, "optimizer must be one of"),
])
def test_bad_input_is_named(kwargs, needle):
    args = {"model": qsgd.build_model("mlp"), **kwargs}
    with pytest.raises(qsgd.ModelError, match=needle):
        record_operators(args.pop("model"), **args)


def test_a_module_without_input_shape_is_refused():
    with pytest.raises(qsgd.ModelError, match="input_shape is needed for Linear"):
        record_operators(nn.Linear(2, 2))


# ---------------------------------------------------------------- in the trace
def test_a_half_model_steps_float32_master_weights_between_two_copies():
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4))
    ops = record_operators(model, input_shape=(16,), families=("amp", "half"))
    half, amp = ops.family("half"), ops.family("amp")
    n = sum(p.numel() for p in model.parameters())
    # the layers in float16 as model.half() runs them, layer_norm too; of autocast's eight
    # casts only the output's to float32 for the loss is left
    assert {o.dtype for o in half.ops if o.kind in ("gemm", "norm")} == {"float16"}
    assert len([o for o in _ops(half, "forward") if o.op == "aten._to_copy.default"]) == 1
    opt = _ops(half, "optimizer")
    # gradients into the masters (2 bytes read, 4 written an element), masters back (4 + 2)
    for copy in (opt[0], opt[-1]):
        assert copy.op == "aten._foreach_copy_.default" and copy.tensors == 6    # parameters
        assert copy.bytes == (6 * n, 0)
    # between them the optimizer autocast's float32 parameters run, kernel for kernel
    plain = [o for o in _ops(amp, "optimizer") if o.kind != "scaler"]
    assert [(o.op, o.dtype, o.bytes) for o in opt[1:-1]] == [(o.op, o.dtype, o.bytes) for o in plain]


def test_bertadam_steps_parameter_by_parameter_after_a_norm_read_on_the_host():
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4))
    ops = record_operators(model, input_shape=(16,), families=("fp32",),
                           optimizer="bertadam").family("fp32")
    opt = _ops(ops, "optimizer")
    # one multi-tensor norm of every gradient, reduced to one number (DeepLearningExamples'
    # multi_tensor_l2norm, read with .item())
    assert [o.op for o in opt[:3]] == ["aten._foreach_norm.Scalar", "aten.stack.default",
                                       "aten.linalg_vector_norm.default"]
    # then per parameter: two moments (4), the update (3), the step (3), and on the two
    # weights (not the biases or the norm's) the decay (2): one kernel per tensor each
    assert len(opt) == 3 + 6 * 10 + 2 * 2 and all(o.tensors == 1 for o in opt[3:])
    assert ops.host_sync
    assert not record_operators(model, input_shape=(16,), families=("fp32",),
                                optimizer="adamw").family("fp32").host_sync


def test_meta_measurement_records_layout_and_operators_without_running(tmp_path):
    cfg = qsgd.QSGDConfig.from_bits(4)
    trace = qsgd.measure("resnet50", cfg, device="meta")
    assert not trace.timed and trace.device == "meta" and trace.parameters == 25_557_032
    for b, t in zip(trace.buckets, trace.iterations[0].buckets):
        assert t.payload_bytes == (qsgd.payload_nbytes(b.compressed_numel, cfg) if b.compressed_numel else 0)
        assert t.encode_s == t.decode_s == t.ready_s == 0.0
    path = tmp_path / "t.json"
    trace.save(path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 3 and set(doc["operators"]["families"]) == {"fp32", "amp", "bf16"}
    back = qsgd.PayloadTrace.load(path)
    assert back.operators == trace.operators and back == trace
    # one family asked for: the same buckets (DDP's ready order is every family's)
    amp = qsgd.measure("resnet50", cfg, device="meta", families=("amp",))
    assert set(amp.operators.families) == {"amp"} and amp.buckets == trace.buckets
    assert amp.operators.family("amp") == trace.operators.family("amp")
    with pytest.raises(qsgd.ConfigError, match="packed codec"):
        qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4, codec="elias"), device="meta")


def test_a_real_measurement_carries_operators_of_the_same_model():
    trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
                         device="cpu", seed=0)
    meta = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    assert trace.timed and trace.operators == meta.operators


def test_trace_operators_are_validated_and_older_versions_still_read(tmp_path):
    trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    doc = trace.to_dict()
    bad = json.loads(json.dumps(doc))
    bad["operators"]["families"]["fp32"]["ops"][0]["flops"] = [0, -1]
    with pytest.raises(qsgd.TraceError, match=r"operators\.families\.fp32\.ops\[0\]\.flops"):
        qsgd.PayloadTrace.from_dict(bad)
    bad = json.loads(json.dumps(doc))
    bad["operators"]["families"]["fp32"]["ready"]["nope.weight"] = 3
    with pytest.raises(qsgd.TraceError, match="'nope.weight'"):
        qsgd.PayloadTrace.from_dict(bad)
    bad = json.loads(json.dumps(doc))
    bad["version"] = 2
    with pytest.raises(qsgd.TraceError, match="operators needs version 3"):
        qsgd.PayloadTrace.from_dict(bad)
    old = {k: v for k, v in doc.items() if k != "operators"}
    old["version"] = 2
    v2 = qsgd.PayloadTrace.from_dict(old)
    assert v2.operators is None
    assert qsgd.add_operators(v2).operators == trace.operators
    # the fp16 precision's family is recorded when asked for, beside the others, which stay
    assert "half" not in trace.operators.families and qsgd.add_operators(trace) is trace
    more = qsgd.add_operators(trace, families=("half", "fp32")).operators
    assert {k: v for k, v in more.families.items() if k != "half"} == dict(trace.operators.families)
    assert more.family("half") == qsgd.record_operators(qsgd.build_model("mlp"),
                                                        families=("half",)).family("half")
    with pytest.raises(qsgd.TraceError, match=r"family 'half' was not recorded; have \['amp', "
                                              r"'bf16', 'fp32'\] \(qsgd.add_operators"):
        trace.operators.family("half")
    # with the optimizer the others were recorded with, not the model's usual one
    adamw = qsgd.record_operators(qsgd.build_model("mlp"), families=("fp32",), optimizer="adamw")
    mixed = qsgd.add_operators(dataclasses.replace(trace, operators=adamw), families=("half",))
    assert mixed.operators.family("half").optimizer == "adamw"


def test_add_operators_records_the_transients_a_trace_from_before_them_lacks():
    trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    ops = trace.operators
    assert ops.without_transients == ()
    older = dataclasses.replace(trace, operators=dataclasses.replace(ops, families={
        f: dataclasses.replace(o, transient=(0, 0)) for f, o in ops.families.items()}))
    assert older.operators.without_transients == tuple(ops.families)
    # only where asked for (a report of memory): otherwise the trace is used as it is
    assert qsgd.add_operators(older) is older
    again = qsgd.add_operators(older, transients=True)
    assert again.operators.families == ops.families and again.operators.without_transients == ()
    assert qsgd.add_operators(trace, transients=True) is trace


def test_add_operators_names_a_model_it_cannot_build():
    trace = dataclasses.replace(qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta"),
                                operators=None, model="nosuch.module:Net")
    with pytest.raises(qsgd.TraceError, match="nosuch.module:Net"):
        qsgd.add_operators(trace)


def test_first_use_places_each_parameter_in_forward_in_layer_order():
    model = qsgd.build_model("mlp")
    names = [n for n, _ in model.named_parameters()]
    for family in ("fp32", "amp"):
        ops = record_operators(model, families=(family,)).family(family)
        fwd = [ops.first_use[n][0] for n in names]
        first, end = ops.phase_span("forward")
        assert fwd == sorted(fwd) and all(first <= k < end for k in fwd)
        # every weight is read by the kernel its first use points at (a product)
        assert all(ops.ops[ops.first_use[n][0]].kind in ("gemm", "copy") for n in names)


def test_saved_bytes_are_the_activations_autograd_keeps_without_the_weights():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    ops = record_operators(model, input_shape=(64,))
    # fp32: the input (for the first weight's gradient), the ReLU's output (saved by the ReLU
    # and by the second layer: once) and the output the loss squares, per sample
    assert ops.family("fp32").saved == (0, 4 * (64 + 32 + 8))
    # autocast: the input's bf16 copy, the bf16 hidden activation, the output cast back to fp32
    # for the loss; the weights' bf16 copies are parameters, not activations
    assert ops.family("amp").saved == (0, 2 * 64 + 2 * 32 + 4 * 8)
    assert ops.parameters == {"0.weight": 2048, "0.bias": 32, "2.weight": 256, "2.bias": 8}
    back = qsgd.Operators.from_dict(json.loads(json.dumps(ops.to_dict())))
    assert back.family("fp32").saved == ops.family("fp32").saved and back.parameters == ops.parameters
    old = ops.to_dict()
    del old["parameters"], old["families"]["fp32"]["saved"]
    assert qsgd.Operators.from_dict(old).family("fp32").saved == (0, 0)
