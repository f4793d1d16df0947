"""BERT base and large (Devlin, Chang, Lee & Toutanova, NAACL 2019) with the pretraining heads.

Shapes from Section 3 of the paper (base: 12 layers, width 768, 12 heads; large: 24, 1024, 16;
feed-forward 4x the width) and Google's ``bert_config.json`` files (vocabulary 30522, 512
positions, 2 token types, GELU, LayerNorm eps 1e-12, dropout 0.1). The encoder is post-LayerNorm
(the original Transformer's). The pretraining heads are those of ``BertForPreTraining``: a pooler
(dense + tanh on the first token) feeding the next-sentence classifier, and the masked-LM head
(dense + GELU + LayerNorm, then a decoder whose weight is the word embedding, with its own bias).

``head="squad"`` replaces the pretraining heads with SQuAD's span head (one linear layer giving
each position a start and an end logit, as ``BertForQuestionAnswering``), the fine-tuning task
whose throughput GPU benchmarks publish (at 384 tokens).

The default ``seq_len`` is 128: the paper pretrains at 128 tokens for 90% of the steps and at 512
for the last 10% (Appendix A.2), so phase 1 at 128 is what pretraining throughput is mostly spent
on (NVIDIA's DeepLearningExamples BERT recipe runs its phase 1 at 128 too, with at most 20
predicted tokens); ``seq_len=512`` gives phase 2.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qsgd.errors import ConfigError
from qsgd.models.base import TokenWorkload, check_dropout, check_int
from qsgd.models.transformer import Block

#: name -> (layers, width, heads, feed-forward width, published parameters, tolerance).
#: The paper (Section 3) gives "Total Parameters=110M" and "340M".
VARIANTS: dict[str, tuple[int, int, int, int, int, float]] = {
    "bert-base": (12, 768, 12, 3072, 110_000_000, 0.01),
    # The exact count of BERT-large with its heads is 336.2M, 1.1% under the paper's rounded 340M.
    "bert-large": (24, 1024, 16, 4096, 340_000_000, 0.02),
}
VOCAB_SIZE = 30522
MAX_POSITIONS = 512
TYPE_VOCAB = 2
#: the heads a BERT can carry (module docstring)
HEADS = ("pretraining", "squad")
#: the share of tokens the masked-LM task predicts (Section 3.1 of the paper)
MASKED_SHARE = 0.15


class Bert(TokenWorkload, nn.Module):
    """BERT for pretraining: base 110,106,428 and large 336,226,108 parameters.

    Those are the exact counts with both pretraining heads (the tied decoder weight counted once;
    they equal ``BertForPreTraining``'s). The paper gives 110,000,000 ("110M") for base and
    340,000,000 ("340M") for large.

    The forward pass returns ``(mlm_logits, nsp_logits)``: ``(batch, seq_len, vocab_size)`` and
    ``(batch, 2)``. Like ``BertForPreTraining`` the masked-LM decoder runs at every position.
    Token types are fixed: the first half of each sequence is sentence A, the rest sentence B;
    sequences are full (no padding, so no attention mask).

    The synthetic loss (:meth:`loss`) is the pretraining loss: the masked-LM cross-entropy over
    ``round(0.15 * seq_len)`` random positions per sequence plus the next-sentence cross-entropy;
    :meth:`example_target` gives ``(mlm_labels, nsp_labels)`` with ``-100`` at unpredicted
    positions.

    Parameters
    ----------
    variant : {"bert-base", "bert-large"}
        Size (:data:`VARIANTS`); the keywords below override its shape.
    head : {"pretraining", "squad"}
        The pretraining heads, or SQuAD's span head (the module docstring).
    seq_len : int
        Tokens per sample (128: pretraining phase 1; at most ``max_positions``).
    n_layer, n_embd, n_head, ffn_dim : int, optional
        Layers, width, attention heads and feed-forward width (default: the variant's).
    vocab_size, max_positions : int
        Vocabulary and learned positions.
    dropout : float
        Dropout on embeddings, attention weights and residual branches while training.

    Examples
    --------
    >>> import torch, qsgd
    >>> tiny = qsgd.build_model("bert-base", seq_len=8, n_layer=1, n_embd=32, n_head=2, ffn_dim=64,
    ...                         vocab_size=50)
    >>> mlm, nsp = tiny(tiny.example_input(3))
    >>> mlm.shape, nsp.shape
    (torch.Size([3, 8, 50]), torch.Size([3, 2]))
    """

    def __init__(self, variant: str = "bert-base", *, seq_len: int = 128, n_layer: int | None = None,
                 n_embd: int | None = None, n_head: int | None = None, ffn_dim: int | None = None,
                 vocab_size: int = VOCAB_SIZE, max_positions: int = MAX_POSITIONS, dropout: float = 0.1,
                 head: str = "pretraining") -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ConfigError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
        if head not in HEADS:
            raise ConfigError(f"head must be one of {list(HEADS)}, got {head!r}")
        self.head = head
        layers, width, heads, ffn, published, tolerance = VARIANTS[variant]
        shape = (check_int("n_layer", layers if n_layer is None else n_layer),
                 check_int("n_embd", width if n_embd is None else n_embd),
                 check_int("n_head", heads if n_head is None else n_head),
                 check_int("ffn_dim", ffn if ffn_dim is None else ffn_dim),
                 check_int("vocab_size", vocab_size), check_int("max_positions", max_positions))
        n_layer, n_embd, n_head, ffn_dim, vocab_size, max_positions = shape
        check_int("seq_len", seq_len)
        if seq_len > max_positions:
            raise ConfigError(f"seq_len must be at most max_positions={max_positions}, got {seq_len}")
        dropout = check_dropout(dropout)
        self.config = variant if shape == (layers, width, heads, ffn, VOCAB_SIZE, MAX_POSITIONS) \
            and head == "pretraining" else None
        self.published_parameters = published if self.config else 0
        self.parameter_tolerance = tolerance
        self.seq_len, self.vocab_size = seq_len, vocab_size

        self.word_embed = nn.Embedding(vocab_size, n_embd)
        self.pos_embed = nn.Embedding(max_positions, n_embd)
        self.type_embed = nn.Embedding(TYPE_VOCAB, n_embd)
        self.embed_norm = nn.LayerNorm(n_embd, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(n_embd, n_head, ffn_dim, norm_first=False, eps=1e-12, fused_qkv=False, dropout=dropout)
            for _ in range(n_layer))
        if head == "squad":
            self.qa_outputs = nn.Linear(n_embd, 2)
        else:
            self.pooler = nn.Linear(n_embd, n_embd)
            self.nsp_head = nn.Linear(n_embd, 2)
            self.mlm_dense = nn.Linear(n_embd, n_embd)
            self.mlm_norm = nn.LayerNorm(n_embd, eps=1e-12)
            self.mlm_decoder = nn.Linear(n_embd, vocab_size)
            self.mlm_decoder.weight = self.word_embed.weight  # tied: one parameter
        for m in self.modules():  # BERT's initializer_range 0.02; fills are no-ops on meta
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlm_logits, nsp_logits)`` for token ids ``(batch, length)``."""
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        types = (positions >= length // 2).long()  # sentence A, then sentence B
        x = self.word_embed(tokens) + self.pos_embed(positions) + self.type_embed(types)
        x = self.drop(self.embed_norm(x))
        for block in self.blocks:
            x = block(x)
        if self.head == "squad":
            start, end = self.qa_outputs(x).unbind(dim=-1)
            return start, end
        nsp = self.nsp_head(torch.tanh(self.pooler(x[:, 0])))
        mlm = self.mlm_decoder(self.mlm_norm(F.gelu(self.mlm_dense(x))))
        return mlm, nsp

    def example_target(self, batch_size: int, *, generator: torch.Generator | None = None,
                       device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlm_labels, nsp_labels)``: ``(batch, seq_len)`` ids, -100 where not predicted, and ``(batch,)``.

        ``max(1, round(0.15 * seq_len))`` distinct positions per sequence carry a random token id
        (19 of 128; Google's pretraining data cap them at 20 for 128 tokens).
        """
        if self.head == "squad":   # a random answer span's start and end per sequence
            spans = torch.randint(0, self.seq_len, (2, batch_size), generator=generator, device="cpu")
            spans = spans.sort(dim=0).values
            return tuple(t.to(device) if device is not None else t for t in spans)
        n_masked = max(1, round(MASKED_SHARE * self.seq_len))
        order = torch.rand((batch_size, self.seq_len), generator=generator, device="cpu").argsort(dim=1)
        tokens = torch.randint(0, self.vocab_size, (batch_size, self.seq_len), generator=generator,
                               device="cpu")
        labels = torch.full((batch_size, self.seq_len), -100, dtype=torch.int64, device="cpu")
        picked = order[:, :n_masked]
        labels.scatter_(1, picked, tokens.gather(1, picked))
        nsp = torch.randint(0, 2, (batch_size,), generator=generator, device="cpu")
        if device is not None:
            labels, nsp = labels.to(device), nsp.to(device)
        return labels, nsp

    def loss(self, output: tuple[torch.Tensor, torch.Tensor],
             target: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Masked-LM cross-entropy (mean over predicted positions) plus next-sentence cross-entropy;
        with the SQuAD head, the mean of the start and end positions' cross-entropies."""
        if self.head == "squad":
            (start, end), (s, e) = output, target
            return (F.cross_entropy(start.float(), s) + F.cross_entropy(end.float(), e)) / 2
        (mlm, nsp), (mlm_labels, nsp_labels) = output, target
        mlm_loss = F.cross_entropy(mlm.reshape(-1, mlm.shape[-1]).float(), mlm_labels.reshape(-1),
                                   ignore_index=-100)
        return mlm_loss + F.cross_entropy(nsp.float(), nsp_labels)
