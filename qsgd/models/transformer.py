"""Building blocks shared by the zoo's transformers (GPT-2, BERT, ViT, Llama).

Attention always goes through ``torch.nn.functional.scaled_dot_product_attention`` (SDPA): on a
GPU PyTorch runs it as one fused kernel (flash or memory-efficient attention), and a recorder
that watches torch functions sees one call per layer. Causal attention passes ``is_causal=True``
and no mask tensor (an explicit mask would rule out the flash kernel); grouped-query attention
passes ``enable_gqa=True`` instead of repeating keys and values in memory.

Everything here is shape-generic and does no arithmetic at construction beyond what
``nn.Linear`` and friends do, so building under ``with torch.device("meta"):`` is free.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qsgd.errors import ConfigError


class SelfAttention(nn.Module):
    """Multi-head self-attention with ``n_heads`` query heads and ``n_kv_heads`` key/value heads.

    Parameters
    ----------
    dim : int
        Model width; ``dim = n_heads * head_dim``.
    n_heads : int
        Query heads.
    n_kv_heads : int, optional
        Key/value heads (grouped-query attention when fewer than ``n_heads``; must divide it).
    bias : bool
        Biases on the projections (GPT-2, BERT, ViT) or none (Llama).
    fused_qkv : bool
        One ``qkv`` projection (GPT-2's ``c_attn``, ViT's ``in_proj``) or three (``q``, ``k``,
        ``v``: BERT, Llama). The parameter tensors, hence DDP's buckets, follow the original.
    causal : bool
        Each position attends to itself and earlier ones only.
    dropout : float
        Dropout on the attention weights while training.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int | None = None, *, bias: bool = True,
                 fused_qkv: bool = True, causal: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if dim % n_heads:
            raise ConfigError(f"dim must be a multiple of n_heads={n_heads}, got {dim}")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ConfigError(f"n_kv_heads must divide n_heads={n_heads}, got {n_kv_heads}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.causal, self.dropout = causal, dropout
        kv_dim = n_kv_heads * self.head_dim
        self.fused_qkv = fused_qkv
        if fused_qkv:
            self.qkv = nn.Linear(dim, dim + 2 * kv_dim, bias=bias)
        else:
            self.q = nn.Linear(dim, dim, bias=bias)
            self.k = nn.Linear(dim, kv_dim, bias=bias)
            self.v = nn.Linear(dim, kv_dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        batch, length, dim = x.shape
        kv_dim = self.n_kv_heads * self.head_dim
        if self.fused_qkv:
            q, k, v = self.qkv(x).split((dim, kv_dim, kv_dim), dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        # (batch, heads, length, head_dim): the layout SDPA takes
        q = q.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal,
            enable_gqa=self.n_kv_heads != self.n_heads)
        return self.proj(out.transpose(1, 2).reshape(batch, length, dim))


class GeluMLP(nn.Module):
    """``dim -> ffn_dim -> dim`` with GELU between (``approximate="tanh"`` for GPT-2)."""

    def __init__(self, dim: int, ffn_dim: int, *, approximate: str = "none") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class Block(nn.Module):
    """A LayerNorm transformer layer: attention, then the GELU MLP, each with a residual.

    ``norm_first=True`` is the pre-LN layer of GPT-2 and ViT (``x + f(norm(x))``);
    ``False`` the post-LN layer of BERT and the original Transformer (``norm(x + f(x))``).
    Dropout (``dropout``) follows each sub-layer and the attention weights, as in the originals.
    """

    def __init__(self, dim: int, n_heads: int, ffn_dim: int, *, norm_first: bool, eps: float,
                 causal: bool = False, fused_qkv: bool = True, dropout: float = 0.0,
                 gelu: str = "none") -> None:
        super().__init__()
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(dim, n_heads, fused_qkv=fused_qkv, causal=causal, dropout=dropout)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = GeluMLP(dim, ffn_dim, approximate=gelu)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop(self.attn(self.norm1(x)))
            return x + self.drop(self.mlp(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x)))
        return self.norm2(x + self.drop(self.mlp(x)))


def rotary_tables(length: int, head_dim: int, theta: float, *, device=None,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines ``(length, head_dim)`` of rotary position embeddings (Su et al. 2021).

    Pair ``i`` of a head rotates by ``position * theta ** (-2 i / head_dim)``. Computed in fp32
    in each forward pass (a few thousand elements, as Hugging Face's Llama does), so a model built
    on the meta device carries no table that would need filling in later.

    Examples
    --------
    >>> cos, sin = rotary_tables(4, 8, 10000.0)
    >>> cos.shape, bool(cos[0].eq(1).all()), bool(sin[0].eq(0).all())
    (torch.Size([4, 8]), True, True)
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # the "rotate half" layout: pair i is (i, i + d/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(..., length, head_dim)`` by the tables of :func:`rotary_tables`.

    Examples
    --------
    >>> x = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    >>> y = apply_rotary(x, *rotary_tables(5, 8, 10000.0))
    >>> torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation keeps lengths
    True
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
