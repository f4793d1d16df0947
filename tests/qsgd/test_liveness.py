"""Backward's transient bytes, followed tensor by tensor on the meta device."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qsgd
from qsgd.operators import record_operators
from qsgd.operators.liveness import LiveBytes

T, V, D = 16, 4096, 32          # tokens a sample, vocabulary, width


class TinyLM(nn.Module):
    """An embedding and a head: the loss's float32 logits dwarf everything else."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, D), nn.Linear(D, V, bias=False)

    def forward(self, ids):
        return self.head(self.emb(ids))

    def example_input(self, batch, *, generator=None, device=None):
        return torch.randint(0, V, (batch, T), generator=generator).to(device)

    def example_target(self, batch, *, generator=None, device=None):
        return self.example_input(batch, generator=generator, device=device)

    def loss(self, out, target):
        # torchtitan's loss (train.py at 9dec370): the logits cast to float32 first
        return F.cross_entropy(out.flatten(0, 1).float(), target.flatten(0, 1))


class FusedTinyLM(TinyLM):
    def loss(self, out, target):
        # llm-foundry's MPT: flash-attn's fused kernels on the logits as they come
        return qsgd.models.losses.fused_cross_entropy(out.flatten(0, 1), target.flatten(0, 1))


def test_the_loss_backward_holds_two_float32_copies_of_the_logits_at_once():
    ops = record_operators(TinyLM(), families=("fp32", "amp"))
    logits = T * V * 4                  # float32 bytes a sample
    # forward keeps log_softmax's float32 output (among the activations); backward makes the
    # gradient of it (nll_loss_backward) and of the logits (_log_softmax_backward_data) before
    # it lets go of either: two copies above the end of forward, in both precisions (autocast's
    # bfloat16 logits are cast up before the loss)
    for family in ("fp32", "amp"):
        assert ops.family(family).transient == (0, 2 * logits), family
        assert ops.family(family).saved[1] >= logits


def test_a_freed_tensor_leaves_the_level_and_gradients_are_left_out():
    live = LiveBytes()
    a = torch.empty(100, device="meta")           # 400 B alive at the end of forward
    live.made([a, a.view(10, 10)])                # a view adds nothing
    live.end_of_forward()
    b = torch.empty(300, device="meta")
    live.made([b])                                # 1,600 B: the highest
    del a                                         # its storage is freed: the level drops
    c = torch.empty(150, device="meta")
    live.made([c])                                # 400 + 1,200 - 400 + 600: the highest
    assert live.excess([]) == 1400
    assert live.excess([b]) == 200                # b as a gradient: 400 -> 0 -> 600
    assert [n for _, n in live.events] == [400, 1200, -400, 600]


def test_memory_counts_the_transient_on_top_of_the_activations():
    import emulator
    import qsgd

    trace = qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta")
    ops = trace.operators.family("amp")
    m = emulator.memory_per_gpu(trace, "fsdp", 8, precision="amp-bf16", batch_size=12)
    assert m.transient == ops.transient[0] + 12 * ops.transient[1]
    # GPT-2's 50,257 words at 1,024 tokens: two float32 copies of a sample's logits
    assert ops.transient[1] == 2 * 1024 * 50257 * 4
    assert m.total == m.parameters + m.gradients + m.optimizer + m.activations + m.buffers \
        + m.transient
    assert "backward's transients 4.9 GB" in m.describe()


def test_the_fused_loss_keeps_the_logits_and_makes_one_gradient_in_their_precision():
    ops = record_operators(FusedTinyLM(), families=("fp32", "amp"))
    for family, width in (("fp32", 4), ("amp", 2)):
        o = ops.family(family)
        names = [x.op for x in o.ops if "cross_entropy" in x.op]
        assert names == ["fused_cross_entropy", "fused_cross_entropy_backward"]
        fwd, bwd = (x for x in o.ops if "cross_entropy" in x.op)
        # forward: the logits read, a float32 loss and log-sum-exp written per row; backward:
        # the logits read and their gradient written
        assert fwd.bytes == (0, T * V * width + 8 * T) and bwd.bytes == (0, 2 * T * V * width + 8 * T)
        # backward's rise: the logits' gradient, once, in their precision, give or take a
        # hidden activation (autocast's bfloat16 copies freed meanwhile, the rows' gradients):
        # not the two float32 copies of torch's cross-entropy
        rise = o.transient[0] + 3 * o.transient[1]                    # at batch 3
        assert abs(rise - 3 * T * V * width) <= 3 * 4 * T * D
        # kept for backward: the logits in their precision, the labels, the log-sum-exp
        assert o.saved[1] >= T * V * width + 8 * T + 4 * T


def test_the_fused_loss_on_a_device_is_torchs_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 11, generator=g, requires_grad=True)
    target = torch.randint(0, 11, (6,), generator=g)
    fused = qsgd.models.losses.fused_cross_entropy(logits, target)
    (g1,) = torch.autograd.grad(fused, logits)
    plain = F.cross_entropy(logits, target)
    (g2,) = torch.autograd.grad(plain, logits)
    assert torch.equal(fused, plain) and torch.equal(g1, g2)
    with pytest.raises(qsgd.ConfigError, match="fused_loss must be True or False, got 'yes'"):
        qsgd.build_model("gpt2", n_layer=1, n_embd=8, n_head=2, vocab_size=10, seq_len=4,
                         fused_loss="yes")


def test_an_output_on_an_inputs_storage_makes_no_memory():
    # a parameter first seen in backward as a view's output (a convolution's weight) was
    # counted there as made: the whole of ResNet-50's weights, 102 MB, as a transient
    weight = torch.empty(1000, device="meta")
    live = LiveBytes()
    live.end_of_forward()
    live.made([weight.view(10, 100)], [weight])           # a view
    live.made([weight.add_(1)], [weight])                 # in place
    fresh = torch.empty(10, device="meta")
    live.made([fresh], [weight])
    assert live.excess([]) == 40 and [n for _, n in live.events] == [40]


def test_a_cnns_transient_is_its_activations_gradients_not_its_weights():
    ops = record_operators(qsgd.build_model("resnet50"), families=("fp32",))
    c, s = ops.family("fp32").transient
    weights = 4 * sum(p.numel() for p in qsgd.build_model("resnet50").parameters())
    # a sample's gradients at the head of backward (the last stage's 2,048 x 7 x 7 float32
    # activations, 0.4 MB, and the like), nothing the size of the weights (102 MB)
    assert c == 0 and 2048 * 49 * 4 <= s < 2e6 < weights
