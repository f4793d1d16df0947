"""Activation checkpointing as the operator recorder emulates it (qsgd/operators/checkpoint.py),
held to torch.utils.checkpoint itself."""
from __future__ import annotations

import collections
import functools
import json

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import emulator
import qsgd
from emulator.memory import memory_per_gpu
from qsgd.operators import record as R
from qsgd.operators.checkpoint import Checkpointing, block_names


class _Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class _Net(nn.Module):
    """Pre-norm residual MLP blocks between an input and an output layer."""

    input_shape = (8, 16)

    def __init__(self, blocks: int = 3):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(_Block(32) for _ in range(blocks))
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def _recorded(model, device: str, how: str | None, full: bool = False):
    """(kernel records as (op, phase) of forward and backward, saved bytes, kept bytes) of one
    fp32 step at batch 2: ``how`` "real" wraps each block in torch.utils.checkpoint (reentrant
    where ``full``) and runs it on the CPU, "emulated" records it on the meta device through
    :class:`Checkpointing`."""
    rec, ck = R._Recorder(), None
    if how == "real":
        for b in model.blocks:
            b.forward = functools.partial(checkpoint, b.forward, use_reentrant=full)
    elif how == "emulated":
        ck = Checkpointing(model, rec, full=full)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    R._step(model, opt, "fp32", 2, _Net.input_shape, rec, {}, device=device)
    rows = [(r["op"], r["phase"]) for r in rec.rows if r["phase"] != "optimizer"]
    return rows, rec.saved_bytes, ck.kept_bytes() if ck else 0


def test_the_emulated_step_issues_the_kernels_torch_checkpoint_runs():
    real, real_saved, _ = _recorded(_Net(), "cpu", "real")
    emulated, saved, kept = _recorded(R._to_meta(_Net()), "meta", "emulated")
    plain, _, _ = _recorded(_Net(), "cpu", None)
    # the same kernels in the same order, recomputation and its early stop included
    assert emulated == real
    # each block runs its norm, first product and GELU again (their outputs are saved for
    # backward); the second product and the residual addition are not (nothing saves theirs)
    assert len(real) - len(plain) == 3 * 3
    assert sum(1 for op, ph in real if ph == "backward" and "gelu.default" in op) == 3
    # outside the blocks the same tensors are kept as torch's own pack hooks see them
    assert saved == real_saved
    # by hand, float32 at batch 2: the step keeps the input layer's input (2x8x16), the output
    # layer's input and the loss's (2x8x32, 2x8x4), the three blocks' inputs (2x8x32 each),
    # and during a block's backward what it saves: LayerNorm's mean and rstd (2x8 each), the
    # first product's input (2x8x32), GELU's input and the second product's (2x8x128 each)
    outside = 4 * (2 * 8 * 16 + 2 * 8 * 32 + 2 * 8 * 4)
    inputs = 3 * 4 * 2 * 8 * 32
    block = 4 * (2 * 2 * 8 + 2 * 8 * 32 + 2 * 2 * 8 * 128)
    assert (saved, kept) == (outside + inputs, block)


def test_the_whole_forward_again_is_what_reentrant_checkpointing_runs():
    real, _, _ = _recorded(_Net(), "cpu", "real", full=True)
    emulated, saved, kept = _recorded(R._to_meta(_Net()), "meta", "emulated", full=True)
    plain, _, _ = _recorded(_Net(), "cpu", None)
    assert emulated == real
    assert len(real) - len(plain) == 3 * 5          # norm, product, GELU, product, addition
    _, saved_early, kept_early = _recorded(R._to_meta(_Net()), "meta", "emulated")
    assert (saved, kept) == (saved_early, kept_early)  # the same tensors are kept


def test_bad_checkpointing_is_refused_in_one_line():
    with pytest.raises(qsgd.ModelError) as info:
        qsgd.record_operators(_Net(), checkpointing="layers")
    msg = str(info.value)
    assert ("checkpointing must be one of ['none', 'blocks', 'blocks_full', 'selective'], "
            "got 'layers'") == msg
    with pytest.raises(qsgd.ModelError) as info:
        qsgd.record_operators(nn.Linear(4, 2), input_shape=(4,), checkpointing="blocks")
    assert "Linear has no blocks to checkpoint" in str(info.value) and "\n" not in str(info.value)


def test_a_transformer_recorded_with_checkpointing_recomputes_and_keeps_less():
    with torch.device("meta"):
        m = qsgd.build_model("gpt2", seq_len=64, n_layer=4, n_embd=128, n_head=4,
                             vocab_size=1000, dropout=0.0)
    plain = qsgd.record_operators(m, families=("amp",)).family("amp")
    ops = qsgd.record_operators(m, families=("amp",), checkpointing="blocks")
    ck = ops.family("amp")
    assert ops.extra == {"checkpointing": "blocks"} and block_names(m) == [f"blocks.{i}" for i in range(4)]

    def flops(s, phase, b=8):
        return sum(o.flops_at(b) for o in s.ops if o.phase == phase)

    fwd = [o for o in plain.ops if o.phase == "forward"]
    assert [o.op for o in ck.ops if o.phase == "forward"] == [o.op for o in fwd]
    extra = flops(ck, "backward") - flops(plain, "backward")
    # more than the four blocks' attention and first MLP products, less than their forward
    attention = sum(o.flops_at(8) for o in fwd if o.kind == "attention")
    assert attention < extra < flops(plain, "forward")
    assert sum(1 for o in ck.ops if o.phase == "backward" and o.kind == "attention") == 4 + 4
    # the same parameters become ready, in the same order, later in the records
    assert list(ck.ready) == list(plain.ready)
    assert all(ck.ready[n] >= plain.ready[n] for n in plain.ready)
    assert all(ck.ready[n] > plain.ready[n] for n in plain.ready if n.startswith("blocks."))
    saved = lambda s, b: s.saved[0] + b * s.saved[1]    # noqa: E731
    assert saved(ck, 8) < 0.6 * saved(plain, 8)


class _GatedBlock(nn.Module):
    """A Llama-style MLP block: three bias-free products (``aten.mm``), two of them side by side."""

    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.w1, self.w3 = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.w2 = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


class _GatedNet(_Net):
    def __init__(self, blocks: int = 3):
        super().__init__(blocks)
        self.blocks = nn.ModuleList(_GatedBlock(32) for _ in range(blocks))


def _torchtitan_policy():
    """torchtitan's "op" policy (parallelize_llama.py at 9dec370) for these blocks: keep every
    odd-numbered matrix product's output, recompute the rest (a fresh count per block)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def context():
        count = {"forward": 0, "recompute": 0}

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                count[mode] += 1
                if count[mode] % 2 == 1:
                    return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return context


def test_selective_checkpointing_issues_the_kernels_torch_runs_under_torchtitans_policy():
    net = _GatedNet()
    real_rec = R._Recorder()
    for b in net.blocks:
        b.forward = functools.partial(checkpoint, b.forward, use_reentrant=False,
                                      context_fn=_torchtitan_policy())
    R._step(net, torch.optim.SGD(net.parameters(), lr=0.1), "fp32", 2, _Net.input_shape,
            real_rec, {}, device="cpu")
    real = [(r["op"], r["phase"]) for r in real_rec.rows if r["phase"] != "optimizer"]
    rec = R._Recorder()
    model = R._to_meta(_GatedNet())
    ck = Checkpointing(model, rec, selective=True)
    R._step(model, torch.optim.SGD(model.parameters(), lr=0.1), "fp32", 2, _Net.input_shape, rec,
            {}, device="meta")
    emulated = [(r["op"], r["phase"]) for r in rec.rows if r["phase"] != "optimizer"]
    # the same kernels in the same order: the kept first and third products are not run again
    assert emulated == real
    plain_rec, plain_net = R._Recorder(), _GatedNet()
    R._step(plain_net, torch.optim.SGD(plain_net.parameters(), lr=0.1), "fp32", 2,
            _Net.input_shape, plain_rec, {}, device="cpu")
    plain = [(r["op"], r["phase"]) for r in plain_rec.rows if r["phase"] != "optimizer"]
    mms = lambda rows, ph: sum(1 for op, p in rows if op == "aten.mm.default" and p == ph)  # noqa: E731
    assert mms(real, "forward") == mms(plain, "forward") == 3 * 3
    assert mms(real, "backward") - mms(plain, "backward") == 3     # w3 again in each block
    # by hand: kept all step besides what "blocks" keeps, each block's w1 (2x8x64) and w2
    # (2x8x32) outputs in float32
    _, saved_blocks, kept_blocks = _recorded(R._to_meta(_GatedNet()), "meta", "emulated")
    held = 3 * 4 * (2 * 8 * 64 + 2 * 8 * 32)
    assert rec.saved_bytes == saved_blocks + held
    # SiLU saves w1's output reshaped (a tensor of its own on the meta device), so one block's
    # saved set still counts it: at most one block's kept outputs twice, at the peak
    assert ck.kept_bytes() == kept_blocks
    ck.remove()
    assert rec.on_output is None


def test_selective_checkpointing_keeps_attention_and_costs_less_than_whole_blocks():
    with torch.device("meta"):
        m = qsgd.build_model("llama", dim=128, n_layers=2, n_heads=4, n_kv_heads=2,
                             vocab_size=1000, seq_len=64)
    rec = {how: qsgd.record_operators(m, families=("amp",), checkpointing=how).family("amp")
           for how in ("none", "blocks", "selective")}

    def count(s, phase, kind):
        return sum(1 for o in s.ops if o.phase == phase and o.kind == kind)

    def flops(s, phase, b=4):
        return sum(o.flops_at(b) for o in s.ops if o.phase == phase)

    # attention runs once forward and once backward per block: its output is kept
    assert count(rec["selective"], "backward", "attention") == \
        count(rec["none"], "backward", "attention") == 2
    assert count(rec["blocks"], "backward", "attention") == 2 + 2
    assert flops(rec["none"], "backward") < flops(rec["selective"], "backward") < \
        flops(rec["blocks"], "backward")
    saved = {k: s.saved[0] + 4 * s.saved[1] for k, s in rec.items()}
    assert saved["blocks"] < saved["selective"] < saved["none"]


def _gpt2():
    """GPT-2's blocks, three of them (the recording's time is per operator)."""
    with torch.device("meta"):
        return qsgd.build_model("gpt2", n_layer=3)


@pytest.fixture(scope="module")
def traces():
    cfg = qsgd.QSGDConfig.from_bits(4)
    plain = qsgd.measure(_gpt2(), cfg, device="meta", families=("amp",))
    ck = qsgd.measure(_gpt2(), cfg, device="meta", families=("amp",), checkpointing="blocks")
    return plain, ck


def test_a_checkpointed_trace_reads_back_adds_families_alike_and_says_so(traces, tmp_path):
    plain, ck = traces
    path = tmp_path / "ck.json"
    ck.save(str(path))
    back = qsgd.PayloadTrace.load(str(path))
    assert back.operators.extra["checkpointing"] == "blocks"
    assert back.operators.family("amp").ops == ck.operators.family("amp").ops
    more = qsgd.add_operators(back, families=("half",), model=_gpt2())
    half = more.operators.family("half")
    fwd = sum(1 for o in half.ops if o.phase == "forward")
    plain_half = qsgd.add_operators(plain, families=("half",), model=_gpt2()).operators.family("half")
    assert sum(1 for o in half.ops if o.phase == "backward") > \
        sum(1 for o in plain_half.ops if o.phase == "backward") and fwd > 0
    a = emulator.ComputeModel.for_device("H100", plain, batch_size=8, precision="amp-bf16")
    b = emulator.ComputeModel.for_device("H100", ck, batch_size=8, precision="amp-bf16")
    assert b.forward_s == a.forward_s and a.backward_s < b.backward_s < a.backward_s + a.forward_s
    assert f"activation checkpointing: {qsgd.CHECKPOINTING['blocks']}" in b.source
    assert "checkpointing" not in a.source


def test_checkpointing_cuts_the_activations_a_sharded_gpu_holds(traces):
    plain, ck = traces
    m = [memory_per_gpu(t, "fsdp", 16, precision="amp-bf16", batch_size=16) for t in traces]
    # three blocks: two blocks' saved tensors fewer (the logits of the head, kept either way,
    # are most of what is left)
    assert m[1].activations < 0.85 * m[0].activations
    assert (m[1].parameters, m[1].optimizer) == (m[0].parameters, m[0].optimizer)


def test_timing_a_checkpointed_step_on_the_device_is_refused_in_one_line():
    with pytest.raises(qsgd.ConfigError) as info:
        qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="cpu", checkpointing="blocks",
                     operator_seconds=True)
    assert "checkpointing" in str(info.value) and "\n" not in str(info.value)


def test_measure_from_the_command_line_records_checkpointing(tmp_path, capsys):
    from qsgd_emu.cli import main

    out = tmp_path / "t.json"
    assert main(["measure", "--model", "gpt2", "--device", "meta", "--activation-checkpointing",
                 "blocks", "--out", str(out)]) == 0
    assert f"activation checkpointing: {qsgd.CHECKPOINTING['blocks']}" in capsys.readouterr().out
    assert json.loads(out.read_text())["operators"]["checkpointing"] == "blocks"


def test_add_operators_records_a_trace_again_the_other_way(traces):
    plain, ck = traces
    only = qsgd.add_operators(plain, families=("bf16",), checkpointing="blocks", model=_gpt2())
    assert sorted(only.operators.families) == ["bf16"]               # the asked, in place
    switched = qsgd.add_operators(plain, checkpointing="blocks", model=_gpt2())
    assert switched.operators.extra["checkpointing"] == "blocks"
    assert sorted(switched.operators.families) == ["amp"]            # all it had
    assert switched.operators.family("amp").ops == ck.operators.family("amp").ops
    back = qsgd.add_operators(switched, checkpointing="none", model=_gpt2())
    assert "checkpointing" not in back.operators.extra
    assert back.operators.family("amp") == plain.operators.family("amp")
    assert qsgd.add_operators(back, checkpointing="none") is back   # nothing to do
    with pytest.raises(qsgd.ModelError, match="checkpointing must be one of"):
        qsgd.add_operators(plain, checkpointing="every")
