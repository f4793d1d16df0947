"""GPT-2 (Radford, Wu, Child, Luan, Amodei & Sutskever, 2019), the four released sizes.

Shapes from Table 2 of the paper (layers and width) and the model configs Hugging Face publishes
for ``gpt2``, ``gpt2-medium``, ``gpt2-large`` and ``gpt2-xl`` (heads; vocabulary 50257; 1024
positions; LayerNorm eps 1e-5; dropout 0.1; GELU with the tanh approximation). Each layer is
pre-LayerNorm (Section 2.3 of the paper moved the norm to each sub-block's input and added one
after the last block); positions are learned; the output projection is the token embedding
itself, one shared parameter, as in the released model and ``GPT2LMHeadModel``. The attention
projection is one fused ``qkv`` matrix, as GPT-2's ``c_attn``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from qsgd.errors import ConfigError
from qsgd.models.base import TokenWorkload, check_dropout, check_int
from qsgd.models.losses import fused_cross_entropy
from qsgd.models.transformer import Block

#: name -> (layers, width, heads, published parameters). The model card of openai/gpt-2 names the
#: sizes 124M, 355M, 774M and 1.5B; the released checkpoints are named 124M, 355M, 774M, 1558M.
#: (The paper's Table 2 gave 117M, 345M, 762M and 1542M; OpenAI later corrected those counts.)
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "gpt2": (12, 768, 12, 124_000_000),
    "gpt2-medium": (24, 1024, 16, 355_000_000),
    "gpt2-large": (36, 1280, 20, 774_000_000),
    "gpt2-xl": (48, 1600, 25, 1_558_000_000),
}
VOCAB_SIZE = 50257
N_POSITIONS = 1024


class GPT2(TokenWorkload, nn.Module):
    """GPT-2 language model: 124,439,808 / 354,823,168 / 774,030,080 / 1,557,611,200 parameters.

    Those are the exact counts of ``gpt2``, ``gpt2-medium``, ``gpt2-large`` and ``gpt2-xl`` (the
    tied output projection counted once; they equal ``GPT2LMHeadModel``'s). The published sizes
    are 124,000,000, 355,000,000, 774,000,000 and 1,558,000,000 (openai/gpt-2 ``model_card.md``:
    "124 million, 355 million, and 774 million" and "1.5 billion"; checkpoint names 124M, 355M,
    774M and 1558M).

    Parameters
    ----------
    variant : {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}
        Size (:data:`VARIANTS`); the keywords below override its shape.
    seq_len : int
        Tokens per sample; 1024, the context GPT-2 was trained with, by default (at most
        ``n_positions``).
    n_layer, n_embd, n_head : int, optional
        Layers, width and attention heads (default: the variant's).
    vocab_size, n_positions : int
        Vocabulary and learned positions.
    dropout : float
        Dropout on embeddings, attention weights and residual branches while training.
    fused_loss : bool
        Train with the fused cross-entropy kernels (:func:`qsgd.models.losses.
        fused_cross_entropy`, llm-foundry's MPT) instead of torch's cross-entropy of float32
        logits (nanoGPT's).

    Examples
    --------
    >>> import torch, qsgd
    >>> tiny = qsgd.build_model("gpt2", seq_len=8, n_layer=2, n_embd=32, n_head=4, vocab_size=100)
    >>> tiny(tiny.example_input(2)).shape
    torch.Size([2, 8, 100])
    >>> tiny.head.weight is tiny.tok_embed.weight
    True
    """

    def __init__(self, variant: str = "gpt2", *, seq_len: int = N_POSITIONS, n_layer: int | None = None,
                 n_embd: int | None = None, n_head: int | None = None, vocab_size: int = VOCAB_SIZE,
                 n_positions: int = N_POSITIONS, dropout: float = 0.1,
                 fused_loss: bool = False) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ConfigError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
        layers, width, heads, published = VARIANTS[variant]
        shape = (check_int("n_layer", layers if n_layer is None else n_layer),
                 check_int("n_embd", width if n_embd is None else n_embd),
                 check_int("n_head", heads if n_head is None else n_head),
                 check_int("vocab_size", vocab_size), check_int("n_positions", n_positions))
        n_layer, n_embd, n_head, vocab_size, n_positions = shape
        check_int("seq_len", seq_len)
        if seq_len > n_positions:
            raise ConfigError(f"seq_len must be at most n_positions={n_positions}, got {seq_len}")
        dropout = check_dropout(dropout)
        # model_name() reports the variant only while the shape is the published one
        self.config = variant if shape == (layers, width, heads, VOCAB_SIZE, N_POSITIONS) else None
        self.published_parameters = published if self.config else 0
        self.seq_len, self.vocab_size = seq_len, vocab_size
        if not isinstance(fused_loss, bool):
            raise ConfigError(f"fused_loss must be True or False, got {fused_loss!r}")
        self.fused_loss = fused_loss

        self.tok_embed = nn.Embedding(vocab_size, n_embd)
        self.pos_embed = nn.Embedding(n_positions, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(n_embd, n_head, 4 * n_embd, norm_first=True, eps=1e-5, causal=True, dropout=dropout,
                  gelu="tanh") for _ in range(n_layer))
        self.norm = nn.LayerNorm(n_embd, eps=1e-5)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_embed.weight  # tied: one parameter, reduced once by DDP
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        # GPT-2's scheme (Section 2.3; GPT-1's N(0, 0.02)): residual-branch output projections
        # scaled by 1/sqrt(number of residual layers). In-place fills: no-ops on meta tensors.
        for name, m in self.named_modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn.proj", "mlp.fc2")) else 0.02
                nn.init.normal_(m.weight, mean=0.0, std=std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the logits against the next tokens (``fused_loss``: the fused
        kernels', on the logits in their own precision)."""
        if self.fused_loss:
            return fused_cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
        return super().loss(output, target)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, length, vocab_size)`` of the next token at every position."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok_embed(tokens) + self.pos_embed(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
