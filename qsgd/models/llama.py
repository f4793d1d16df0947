"""Llama-style decoders (Touvron et al. 2023; Meta's Llama 2 and Llama 3) of any size.

A layer is pre-norm with RMSNorm (eps 1e-5), attention with rotary position embeddings and
``n_kv_heads`` key/value heads (grouped-query attention where fewer than ``n_heads``), and a
SwiGLU MLP ``down(silu(gate(x)) * up(x))``; no biases anywhere; the input embedding and the
output projection are separate matrices. The MLP width follows Meta's rule
(:func:`llama_ffn_dim`) unless ``ffn_dim`` is given.

The presets are the ``params.json`` files Meta ships with the weights (Llama 2: 7B and 13B
``dim`` 4096/5120, ``n_layers`` 32/40, ``n_heads`` 32/40, ``multiple_of`` 256; 70B ``dim`` 8192,
80 layers, 64 heads, ``n_kv_heads`` 8, ``multiple_of`` 4096, ``ffn_dim_multiplier`` 1.3;
vocabulary 32000, from the tokenizer. Llama 3: 8B ``dim`` 4096, 32 layers, 32 heads, 8 KV heads,
``multiple_of`` 1024, multiplier 1.3; 70B as Llama 2's 70B; vocabulary 128256; ``rope_theta``
500000) with the context lengths of the model cards (Llama 2: 4k; Llama 3: 8k).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qsgd._checks import is_number
from qsgd.errors import ConfigError
from qsgd.models.base import TokenWorkload, check_int
from qsgd.models.transformer import SelfAttention, rotary_tables

#: name -> shape (Meta's params.json names), context length, and the parameter count the Hugging
#: Face Hub shows for meta-llama/Llama-2-7b-hf, -13b-hf, -70b-hf, Meta-Llama-3-8B and -70B.
PRESETS: dict[str, dict] = {
    "llama2-7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000, multiple_of=256,
                      ffn_dim_multiplier=None, seq_len=4096, rope_theta=10000.0, published=6_740_000_000),
    "llama2-13b": dict(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, vocab_size=32000, multiple_of=256,
                       ffn_dim_multiplier=None, seq_len=4096, rope_theta=10000.0, published=13_000_000_000),
    "llama2-70b": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=32000, multiple_of=4096,
                       ffn_dim_multiplier=1.3, seq_len=4096, rope_theta=10000.0, published=69_000_000_000),
    "llama3-8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, multiple_of=1024,
                      ffn_dim_multiplier=1.3, seq_len=8192, rope_theta=500000.0, published=8_030_000_000),
    "llama3-70b": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256, multiple_of=4096,
                       ffn_dim_multiplier=1.3, seq_len=8192, rope_theta=500000.0, published=70_600_000_000),
}
#: what a preset fixes about the parameters (seq_len and rope_theta change no parameter)
_SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim")


def llama_ffn_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """Meta's SwiGLU width: two thirds of ``4 dim``, times the multiplier, rounded up to ``multiple_of``.

    (Two thirds keeps a three-matrix SwiGLU MLP at the parameter count of a two-matrix ``4 dim``
    one, Shazeer 2020.)

    Examples
    --------
    >>> llama_ffn_dim(4096, 256), llama_ffn_dim(8192, 4096, 1.3), llama_ffn_dim(4096, 1024, 1.3)
    (11008, 28672, 14336)
    """
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, no biases (Shazeer 2020)."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, ffn_dim, bias=False)
        self.up = nn.Linear(dim, ffn_dim, bias=False)
        self.down = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaLayer(nn.Module):
    """RMSNorm -> rotary grouped-query attention -> residual; RMSNorm -> SwiGLU -> residual."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, eps: float) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(dim, eps=eps)
        self.attn = SelfAttention(dim, n_heads, n_kv_heads, bias=False, fused_qkv=False, causal=True)
        self.mlp_norm = nn.RMSNorm(dim, eps=eps)
        self.mlp = SwiGLU(dim, ffn_dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class Llama(TokenWorkload, nn.Module):
    """Llama decoder. Presets: Llama 2 7B 6,738,415,616, 13B 13,015,864,320, 70B 68,976,648,192;
    Llama 3 8B 8,030,261,248, 70B 70,553,706,496 parameters.

    Those are the exact counts of the presets (:data:`PRESETS`); they equal the totals the Hugging
    Face Hub reports for Meta's checkpoints. The published figures this class is held to are
    the Hub's rounded ones for meta-llama/Llama-2-7b-hf, Llama-2-13b-hf, Llama-2-70b-hf,
    Meta-Llama-3-8B and Meta-Llama-3-70B: 6,740,000,000 (6.74B), 13,000,000,000 (13.0B),
    69,000,000,000 (69.0B), 8,030,000,000 (8.03B) and 70,600,000,000 (70.6B); Meta's model cards
    name the sizes 7B, 13B, 70B, 8B and 70B.

    Parameters
    ----------
    preset : str
        A key of :data:`PRESETS` giving every default ("llama2-7b" unless named); the keywords
        below override it.
    dim, n_layers, n_heads, n_kv_heads : int, optional
        Width, layers, query heads, key/value heads (``n_kv_heads`` divides ``n_heads``; when
        ``n_heads`` is given but ``n_kv_heads`` is not, ``n_kv_heads = n_heads``: multi-head
        attention).
    ffn_dim : int, optional
        SwiGLU width; else :func:`llama_ffn_dim` of ``dim``, ``multiple_of`` and
        ``ffn_dim_multiplier``.
    multiple_of : int, optional
    ffn_dim_multiplier : float, optional
        Meta's rounding and scaling of the SwiGLU width.
    vocab_size : int, optional
        Vocabulary (Llama 2: 32000; Llama 3: 128256).
    seq_len : int, optional
        Tokens per sample (the context the preset was trained with: 4096 for Llama 2, 8192 for
        Llama 3).
    rope_theta : float, optional
        Rotary base (10000; Llama 3: 500000).
    norm_eps : float
        RMSNorm epsilon.

    Examples
    --------
    >>> import qsgd
    >>> tiny = qsgd.build_model("llama", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=100,
    ...                         seq_len=16)
    >>> tiny(tiny.example_input(2)).shape, tiny.layers[0].mlp.gate.out_features
    (torch.Size([2, 16, 100]), 256)
    """

    def __init__(self, preset: str = "llama2-7b", *, dim: int | None = None, n_layers: int | None = None,
                 n_heads: int | None = None, n_kv_heads: int | None = None, ffn_dim: int | None = None,
                 multiple_of: int | None = None, ffn_dim_multiplier: float | None = None,
                 vocab_size: int | None = None, seq_len: int | None = None,
                 rope_theta: float | None = None, norm_eps: float = 1e-5) -> None:
        super().__init__()
        if preset not in PRESETS:
            raise ConfigError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
        p = PRESETS[preset]
        pick = lambda name, value: p[name] if value is None else value  # noqa: E731
        dim = check_int("dim", pick("dim", dim))
        n_layers = check_int("n_layers", pick("n_layers", n_layers))
        n_heads = check_int("n_heads", pick("n_heads", n_heads))
        # a query-head count given without a KV-head count means plain multi-head attention
        if n_kv_heads is None and n_heads != p["n_heads"]:
            n_kv_heads = n_heads
        n_kv_heads = check_int("n_kv_heads", pick("n_kv_heads", n_kv_heads))
        multiple_of = check_int("multiple_of", pick("multiple_of", multiple_of))
        multiplier = pick("ffn_dim_multiplier", ffn_dim_multiplier)
        if multiplier is not None and (not is_number(multiplier) or multiplier <= 0):
            raise ConfigError(f"ffn_dim_multiplier must be a number > 0 or None, got {multiplier!r}")
        ffn_dim = check_int("ffn_dim", llama_ffn_dim(dim, multiple_of, multiplier) if ffn_dim is None else ffn_dim)
        vocab_size = check_int("vocab_size", pick("vocab_size", vocab_size))
        seq_len = check_int("seq_len", pick("seq_len", seq_len))
        rope_theta = pick("rope_theta", rope_theta)
        if not is_number(rope_theta) or rope_theta <= 1:
            raise ConfigError(f"rope_theta must be a number > 1, got {rope_theta!r}")
        if not is_number(norm_eps) or norm_eps <= 0:
            raise ConfigError(f"norm_eps must be a number > 0, got {norm_eps!r}")
        if dim % n_heads or (dim // n_heads) % 2:
            raise ConfigError(f"dim must be n_heads={n_heads} times an even head width, got {dim}")
        if n_heads % n_kv_heads:
            raise ConfigError(f"n_kv_heads must divide n_heads={n_heads}, got {n_kv_heads}")

        shape = dict(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                     vocab_size=vocab_size, ffn_dim=ffn_dim)
        # model_name() reports a preset whenever the parameters are that preset's
        self.config = next((name for name, q in PRESETS.items()
                            if all(shape[k] == _preset_shape(q)[k] for k in _SHAPE_KEYS)), None)
        self.published_parameters = PRESETS[self.config]["published"] if self.config else 0
        self.seq_len, self.vocab_size = seq_len, vocab_size
        self.rope_theta, self.head_dim = float(rope_theta), dim // n_heads

        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(LlamaLayer(dim, n_heads, n_kv_heads, ffn_dim, norm_eps)
                                    for _ in range(n_layers))
        self.norm = nn.RMSNorm(dim, eps=norm_eps)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, length, vocab_size)`` of the next token at every position."""
        x = self.embed(tokens)
        # one table per forward pass, shared by the layers (as Hugging Face's LlamaModel does)
        rope = rotary_tables(tokens.shape[1], self.head_dim, self.rope_theta, device=tokens.device,
                             dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, rope)
        return self.head(self.norm(x))


def _preset_shape(p: dict) -> dict:
    return dict(p, ffn_dim=llama_ffn_dim(p["dim"], p["multiple_of"], p["ffn_dim_multiplier"]))
