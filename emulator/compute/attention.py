"""Which fused attention kernel a run used, and the share of the math peak each reaches.

A fused attention operator (``kind == "attention"`` in the operator records) does the same
FLOPs whichever library runs it; how fast it does them is the library's. The recorded
operators stay kernel-agnostic, and the compute model takes the kernel as an input, as it
takes the GPU and the precision (:class:`~emulator.compute.ComputeModel`'s ``attention``).

- ``flash2``: FlashAttention-2 (Dao 2023), which PyTorch's ``scaled_dot_product_attention``
  runs as its flash backend on Ampere and later (torch >= 2.2), and the memory-efficient
  kernel it runs before Ampere. The share of the math peak is the compute model's rule since
  issue 28 (docs/gpus.md, section 2.5): 0.60 on Ampere and Ada (the middle of the 50-73 % the
  paper reports on an A100), 0.35 on Hopper and Blackwell (FlashAttention-3's abstract: FA2
  reaches 35 % of an H100), 0.35 before Ampere (no published figure).
- ``flash1``: FlashAttention (Dao et al. 2022; ``flash-attn`` 1.x, and PyTorch 2.0-2.1's
  flash backend). FlashAttention-2 "is around 2x faster" than it, forward and backward alike
  (FA2 paper, section 4.1, A100 80GB SXM4); its abstract puts FlashAttention at 25-40 % of
  the A100's peak, which half of FA2's 0.60 (0.30) sits inside.
- ``triton``: FlashAttention written in Triton (Tillet's tutorial kernel, ``flash-attn``'s
  ``flash_attn_triton.py``, llm-foundry's ``attn_impl: triton``). FlashAttention-2 is "around
  1.3-1.5x faster ... in the forward pass and around 2x faster in the backward pass" (FA2
  paper, section 4.1): FA2's share divided by 1.4 (the middle) forward and by 2 backward.

The ratios were measured on an A100; applying them to other architectures keeps each kernel's
standing against FA2 there, which no source states (docs/gpus.md says so). None of the
figures was chosen against a training run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from emulator.errors import ConfigError

#: FlashAttention-2's achieved share of the math peak, per architecture (module docstring).
FLASH2_EFFICIENCY = {"ampere": 0.60, "ada": 0.60, "hopper": 0.35, "blackwell": 0.35,
                     "volta": 0.35, "turing": 0.35, "kepler": 0.35}
#: The share of an architecture absent from :data:`FLASH2_EFFICIENCY`.
FLASH2_DEFAULT = 0.35


@dataclass(frozen=True)
class AttentionKernel:
    """One fused attention implementation, as FlashAttention-2's speed divided by its own.

    Parameters
    ----------
    name : str
        Key in :data:`ATTENTION_KERNELS`.
    label : str
        What it is, for the output's "assumed" lines.
    forward_slowdown, backward_slowdown : float
        FlashAttention-2's speed over this kernel's, forward and backward (1 for FA2 itself).
    source : str
        Where the ratios come from.
    """

    name: str
    label: str
    forward_slowdown: float
    backward_slowdown: float
    source: str

    def efficiency(self, arch: str, backward: bool) -> float:
        """Share of the math peak this kernel reaches on ``arch``, forward or backward.

        >>> ATTENTION_KERNELS["triton"].efficiency("ampere", backward=True)
        0.3
        """
        base = FLASH2_EFFICIENCY.get(arch, FLASH2_DEFAULT)
        return base / (self.backward_slowdown if backward else self.forward_slowdown)


#: The kernels a run can name (``--attention-kernel``, a published run's ``attention_kernel``).
ATTENTION_KERNELS: Mapping[str, AttentionKernel] = {
    k.name: k for k in (
        AttentionKernel("flash2", "FlashAttention-2 (PyTorch SDPA's flash backend)", 1.0, 1.0,
                        "Dao 2023, abstract; Shah et al. 2024 (FlashAttention-3), abstract"),
        AttentionKernel("flash1", "FlashAttention 1 (flash-attn 1.x)", 2.0, 2.0,
                        "Dao 2023 (FlashAttention-2), section 4.1: FA2 around 2x faster"),
        AttentionKernel("triton", "FlashAttention in Triton", 1.4, 2.0,
                        "Dao 2023 (FlashAttention-2), section 4.1: FA2 1.3-1.5x faster forward, "
                        "around 2x backward"),
    )}
#: The kernel a prediction assumes unless told: what PyTorch's SDPA runs today.
DEFAULT_ATTENTION = "flash2"


def attention_kernel(name: str) -> AttentionKernel:
    """The kernel called ``name``; a one-line error naming the value and the choices.

    >>> attention_kernel("flash1").forward_slowdown
    2.0
    >>> attention_kernel("cudnn")
    Traceback (most recent call last):
    ...
    emulator.errors.ConfigError: attention kernel must be one of ['flash1', 'flash2', 'triton'], got 'cudnn'
    """
    try:
        return ATTENTION_KERNELS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"attention kernel must be one of {sorted(ATTENTION_KERNELS)}, "
                          f"got {name!r}") from None
