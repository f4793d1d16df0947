"""The zoo's transformers: GPT-2, BERT, ViT-B/16 and Llama (shapes, meta builds, real tiny runs)."""
from __future__ import annotations

import inspect
import math
import time

import pytest
import torch
import torch.nn.functional as F

import qsgd
from qsgd.models import MODELS, count_parameters, forward_flops, model_name
from qsgd.models.llama import PRESETS, llama_ffn_dim
from qsgd.models.transformer import apply_rotary, rotary_tables

# Tiny shapes of each family for real CPU runs (a few thousand parameters, milliseconds).
TINY = {
    "gpt2": dict(seq_len=12, n_layer=2, n_embd=32, n_head=4, vocab_size=61),
    "bert-base": dict(seq_len=12, n_layer=2, n_embd=32, n_head=4, ffn_dim=64, vocab_size=61),
    "vit-b16": dict(image_size=16, patch_size=4, n_layer=2, n_embd=32, n_head=4, ffn_dim=64, num_classes=7),
    "llama": dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=61, seq_len=12),
}


def _tiny(name, **overrides):
    torch.manual_seed(0)
    return qsgd.build_model(name, **{**TINY[name], **overrides})


def _meta(name, **kwargs):
    with torch.device("meta"):
        return MODELS[name](**kwargs)


@pytest.mark.parametrize("name,exact", [
    ("gpt2", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080),
    ("gpt2-xl", 1_557_611_200), ("bert-base", 110_106_428), ("bert-large", 336_226_108),
    ("vit-b16", 86_567_656), ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320),
    ("llama2-70b", 68_976_648_192), ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496)])
def test_exact_counts_are_stated_and_near_the_published_figure(name, exact):
    model = _meta(name)
    assert count_parameters(model) == exact
    doc = inspect.getdoc(type(model))
    assert f"{exact:,}" in doc and f"{model.published_parameters:,}" in doc
    assert abs(exact - model.published_parameters) <= model.parameter_tolerance * model.published_parameters
    assert model_name(model) == name


def test_llama_shapes_follow_metas_params_json():
    # The SwiGLU widths of Hugging Face's configs (intermediate_size) from Meta's rule.
    widths = {"llama2-7b": 11008, "llama2-13b": 13824, "llama2-70b": 28672, "llama3-8b": 14336,
              "llama3-70b": 28672}
    for name, width in widths.items():
        p = PRESETS[name]
        assert llama_ffn_dim(p["dim"], p["multiple_of"], p["ffn_dim_multiplier"]) == width
        model = _meta(name)
        layer = model.layers[0]
        kv = p["n_kv_heads"] * p["dim"] // p["n_heads"]
        assert layer.mlp.gate.weight.shape == (width, p["dim"])
        assert layer.attn.k.weight.shape == layer.attn.v.weight.shape == (kv, p["dim"])
        assert len(model.layers) == p["n_layers"] and model.embed.weight.shape == (p["vocab_size"], p["dim"])
        assert model.head.weight is not model.embed.weight  # untied
        assert not any(n.endswith("bias") for n, _ in model.named_parameters())
    assert _meta("llama").config == "llama2-7b"  # the plain constructor is Llama 2 7B


def test_default_sequence_lengths_are_the_trained_ones():
    assert [_meta(n).input_shape for n in ("gpt2", "bert-base", "llama2-70b", "llama3-8b")] == \
        [(1024,), (128,), (4096,), (8192,)]
    assert _meta("vit-b16").input_shape == (3, 224, 224)
    assert _meta("gpt2", seq_len=32, n_layer=2).input_shape == (32,)


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b", "llama3-70b"])
def test_large_llamas_build_and_train_on_meta_at_batch_one(name):
    t0 = time.perf_counter()
    model = _meta(name)
    g = torch.Generator().manual_seed(0)
    x = model.example_input(1, generator=g, device="meta")
    y = model.example_target(1, generator=g, device="meta")
    assert x.shape == (1, model.seq_len) and x.dtype == torch.int64 and x.is_meta
    logits = model(x)
    assert logits.shape == (1, model.seq_len, model.vocab_size)
    loss = model.loss(logits, y)
    loss.backward()
    assert loss.is_meta and loss.shape == ()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    # shapes only: a 70B model in seconds (generous bound for a loaded two-core machine)
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("name", ["gpt2-xl", "bert-large", "vit-b16", "llama3-8b"])
def test_other_transformers_train_on_meta(name):
    g = torch.Generator().manual_seed(0)
    with torch.device("meta"):  # as a recorder runs them: everything, batches too, inside the block
        model = MODELS[name]()
        model.loss(model(model.example_input(1, generator=g, device="meta")),
                   model.example_target(1, generator=g, device="meta")).backward()
    assert all(p.grad is not None and p.grad.is_meta and p.grad.shape == p.shape for p in model.parameters())


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_models_train_for_real_on_cpu(name):
    model = _tiny(name)
    g = torch.Generator().manual_seed(1)
    loss = model.loss(model(model.example_input(3, generator=g)), model.example_target(3, generator=g))
    loss.backward()
    assert loss.shape == () and torch.isfinite(loss)
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
        assert p.grad.abs().sum() > 0, n  # every parameter is used by the loss


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_few_sgd_steps_on_one_batch_lower_the_loss(name):
    # without dropout, so that the same batch gives the same loss surface at every step
    model = _tiny(name, **({"dropout": 0.0} if name in ("gpt2", "bert-base") else {}))
    g = torch.Generator().manual_seed(2)
    x, y = model.example_input(4, generator=g), model.example_target(4, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = model.loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoders_are_causal_exactly(name):
    model = _tiny(name).eval()
    x = model.example_input(2, generator=torch.Generator().manual_seed(3))
    t = 7
    changed = x.clone()
    changed[:, t] = (changed[:, t] + 1) % model.vocab_size
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[:, :t], b[:, :t])  # no position sees a later token
    assert not torch.equal(a[:, t:], b[:, t:])


def test_bert_attends_both_ways():
    model = _tiny("bert-base", dropout=0.0).eval()
    x = model.example_input(2, generator=torch.Generator().manual_seed(3))
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % model.vocab_size
    with torch.no_grad():
        (a, _), (b, _) = model(x), model(changed)
    assert not torch.allclose(a[:, 0], b[:, 0])  # the first token sees the last


def test_grouped_query_attention_shares_each_kv_head_among_its_query_group():
    model = _tiny("llama").eval()
    attn = model.layers[0].attn
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (4, 2, 8)
    assert attn.q.weight.shape == (32, 32) and attn.k.weight.shape == attn.v.weight.shape == (16, 32)
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(4))
    rope = rotary_tables(12, 8, model.rope_theta)
    with torch.no_grad():
        got = attn(x, rope)
        # by hand: query heads 0-1 use KV head 0, heads 2-3 KV head 1 (repeat_interleave)
        q = apply_rotary(attn.q(x).view(2, 12, 4, 8).transpose(1, 2), *rope)
        k = apply_rotary(attn.k(x).view(2, 12, 2, 8).transpose(1, 2), *rope).repeat_interleave(2, dim=1)
        v = attn.v(x).view(2, 12, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
        want = attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 12, 32))
    assert torch.allclose(got, want, atol=1e-5)
    assert model(model.example_input(3)).shape == (3, 12, 61)


def test_gpt2_ties_its_output_projection_to_the_token_embedding():
    model = _tiny("gpt2")
    assert model.head.weight is model.tok_embed.weight
    names = [n for n, _ in model.named_parameters()]
    assert "tok_embed.weight" in names and "head.weight" not in names  # registered once, as in DDP
    bert = _tiny("bert-base")
    assert bert.mlm_decoder.weight is bert.word_embed.weight and bert.mlm_decoder.bias.shape == (61,)


def test_bert_targets_mask_fifteen_percent_and_the_loss_adds_both_tasks():
    model = _tiny("bert-base", seq_len=40)
    mlm_labels, nsp_labels = model.example_target(5, generator=torch.Generator().manual_seed(5))
    assert mlm_labels.shape == (5, 40) and nsp_labels.shape == (5,)
    assert ((mlm_labels != -100).sum(dim=1) == 6).all()  # round(0.15 * 40)
    assert ((mlm_labels == -100) | ((mlm_labels >= 0) & (mlm_labels < 61))).all()
    mlm, nsp = model(model.example_input(5))
    want = (F.cross_entropy(mlm[mlm_labels != -100], mlm_labels[mlm_labels != -100])
            + F.cross_entropy(nsp, nsp_labels))
    assert torch.allclose(model.loss((mlm, nsp), (mlm_labels, nsp_labels)), want)


def test_token_batches_are_seeded_and_the_same_on_meta():
    model = _tiny("gpt2")
    a = model.example_input(4, generator=torch.Generator().manual_seed(7))
    b = model.example_input(4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.dtype == torch.int64 and 0 <= a.min() and a.max() < 61
    assert not torch.equal(a, model.example_input(4, generator=torch.Generator().manual_seed(8)))
    # On meta the same draws are made from the CPU generator: it ends in the same state.
    g_cpu, g_meta = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    model.example_input(4, generator=g_cpu)
    with torch.device("meta"):  # drawing works inside a meta block too
        m = model.example_input(4, generator=g_meta, device="meta")
    assert m.is_meta and m.shape == (4, 12) and m.dtype == torch.int64
    assert torch.equal(torch.randint(0, 1000, (3,), generator=g_cpu), torch.randint(0, 1000, (3,), generator=g_meta))


def test_forward_flops_of_token_models_use_their_own_inputs():
    model = _meta("gpt2")
    state = torch.random.get_rng_state()
    flops = forward_flops(model, model.input_shape)
    assert torch.equal(state, torch.random.get_rng_state())  # a private generator
    # 2 FLOPs per weight and token (the embeddings are lookups, the tied head a product) plus
    # attention's two (L x L x d) products per layer
    n, L, d = count_parameters(model), 1024, 768
    dense = 2 * L * (n - 1024 * d)  # all but the learned positions
    attention = 12 * 2 * 2 * L * L * d
    assert flops == pytest.approx(dense + attention, rel=0.01)
    assert forward_flops(model, model.input_shape, batch_size=2) == 2 * flops


def test_measure_a_tiny_gpt2_on_cpu_covers_every_parameter_once():
    model = _tiny("gpt2")
    caps = dict(bucket_cap_bytes=20_000, first_bucket_bytes=10_000)  # several buckets
    trace = qsgd.measure(model, qsgd.QSGDConfig.from_bits(4), device="cpu", batch_size=1, iterations=1,
                         min_numel=500, variance_bits=(), **caps)
    names = [n for b in trace.buckets for n in b.params]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # each once, tied one too
    assert trace.num_buckets >= 3 and trace.parameters == count_parameters(model)
    assert trace.input_shape == (12,) and trace.extra["forward_flops"] > 0
    assert trace.model == "qsgd.models.gpt2:GPT2"  # not the published gpt2's shape
    for it in trace.iterations:
        assert it.forward_s > 0 and it.backward_s > 0


def test_model_names_follow_the_shape():
    assert model_name(_meta("llama", dim=64, n_layers=2, n_heads=4)) == "llama"
    assert model_name(_meta("llama")) == "llama2-7b"
    assert model_name(_meta("gpt2", seq_len=32)) == "gpt2"  # the sequence changes no parameter
    assert model_name(_meta("gpt2", n_layer=2)) == "qsgd.models.gpt2:GPT2"
    assert _meta("llama", dim=64, n_layers=2, n_heads=4).published_parameters == 0


@pytest.mark.parametrize("name,kwargs,message", [
    ("gpt2", dict(seq_len=1025), "seq_len must be at most n_positions=1024, got 1025"),
    ("gpt2", dict(n_layer=0), "n_layer must be an int >= 1, got 0"),
    ("gpt2", dict(n_embd=30, n_head=4), "dim must be a multiple of n_heads=4, got 30"),
    ("gpt2", dict(dropout=1.0), "dropout must be a number in \\[0, 1\\), got 1.0"),
    ("bert-base", dict(seq_len=513), "seq_len must be at most max_positions=512, got 513"),
    ("vit-b16", dict(patch_size=15), "patch_size must divide image_size=224, got 15"),
    ("llama", dict(preset="llama4"), "preset must be one of .*got 'llama4'"),
    ("llama", dict(n_kv_heads=5), "n_kv_heads must divide n_heads=32, got 5"),
    ("llama", dict(dim=96, n_heads=32), "dim must be n_heads=32 times an even head width, got 96"),
    ("llama", dict(ffn_dim_multiplier=-1.0), "ffn_dim_multiplier must be a number > 0 or None, got -1.0"),
    ("llama", dict(seq_len=True), "seq_len must be an int >= 1, got True"),
])
def test_bad_shapes_are_named(name, kwargs, message):
    with pytest.raises(qsgd.ConfigError, match=message):
        _meta(name, **kwargs)
