"""Losses the zoo's models train with, beside torch's own.

:func:`fused_cross_entropy` is a language model's cross-entropy as one fused kernel forward and
one backward, as llm-foundry's MPT trains (``loss_fn: fused_crossentropy``, the default of
``ComposerMPTCausalLM``: flash-attn's ``CrossEntropyLoss``, ``flash_attn/losses/
cross_entropy.py``). Its forward reads the logits in their own precision and writes one
float32 loss and log-sum-exp per row; it keeps the logits, the labels and the log-sum-exp for
backward; its backward writes the logits' gradient once, in their precision
(``torch.empty_like(logits)``). torch's ``F.cross_entropy`` of the logits cast to float32
makes float32 log-probabilities, keeps them, and in backward makes two more float32 tensors
of that size (:mod:`qsgd.operators.liveness`): for a large vocabulary the difference is
gigabytes a GPU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function_variadic

__all__ = ["fused_cross_entropy"]


def fused_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``(N, V)`` against labels ``(N,)``, as the fused
    kernels compute it (module docstring).

    On a device it is ``F.cross_entropy`` (the same value; this project ships no fused
    kernel). It is a torch function of its own, so the operator recorder
    (:mod:`qsgd.operators.functions`) records it as the fused kernels do their work.

    Examples
    --------
    >>> logits, target = torch.zeros(4, 10), torch.tensor([1, 2, 3, 4])
    >>> round(float(fused_cross_entropy(logits, target)), 4)     # log(10)
    2.3026
    """
    if has_torch_function_variadic(logits, target):
        return handle_torch_function(fused_cross_entropy, (logits, target), logits, target)
    return F.cross_entropy(logits, target)
