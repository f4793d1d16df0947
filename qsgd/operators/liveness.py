"""The bytes a training step holds alive, tensor by tensor: backward's own transients.

The memory a step needs is not only what autograd keeps from forward for backward (the
activations, :attr:`.OperatorSet.saved`): backward makes tensors of its own, and the largest
come first, at the loss. A language model's cross-entropy keeps its float32 log-probabilities
(``log_softmax``'s output); its backward makes the gradient of those (``nll_loss_backward``)
and from it the gradient of the logits (``_log_softmax_backward_data``), each as large, all
three alive at once, before any block's activations are freed (Llama 3 8B at 2 x 8,192
tokens: 8.4 GB each). PyTorch's memory snapshots show that peak at the start of backward
(``torch.cuda.memory._record_memory_history``; the "Understanding GPU Memory" posts of the
PyTorch blog, 2023), and torchtitan frees its model output before backward for it
(``del pred`` in ``train.py``).

:class:`LiveBytes` follows every storage an operator makes during forward and backward on the
meta device: its bytes when made, and when it is freed (a weak reference to the storage:
PyTorch keeps one Python object per storage for as long as the storage lives, so its
callback runs when the last tensor or autograd node holding it lets go). After backward,
:meth:`LiveBytes.excess` is the most those bytes rose above their level at the end of forward,
the parameters' gradients left out (the memory model counts them as gradients).

What it cannot see: kernels' workspaces (cuBLAS, cuDNN, FlashAttention's), the caching
allocator's rounding and fragmentation, and, under activation checkpointing, the block
recomputed in backward (the recorder emulates checkpointing without running it; the memory
model counts that block's activations already).
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["LiveBytes", "rising"]


class LiveBytes:
    """Storages made while recording, as events: ``(serial, +bytes)`` when made,
    ``(serial, -bytes)`` when freed.

    Examples
    --------
    A float32 (4, 8) tensor made and dropped, then one of twice its size kept:

    >>> live = LiveBytes()
    >>> live.made([torch.empty(4, 8, device="meta")])
    >>> live.end_of_forward()
    >>> keep = torch.empty(8, 8, device="meta"); live.made([keep])
    >>> live.excess([]), live.excess([keep])
    (256, 0)
    """

    def __init__(self):
        self._alive: dict[int, int] = {}      # storage address -> serial, while it lives
        self._refs: dict[int, weakref.ref] = {}
        self.events: list[tuple[int, int]] = []
        self._forward = None

    def made(self, tensors, inputs=()) -> None:
        """Note the storages of ``tensors`` (an operator's outputs) not noted yet, leaving
        out those of its ``inputs``: a view, an in-place or ``out=`` result, or
        ``_unsafe_view``'s, makes no memory (and a parameter first seen as a view's output
        would otherwise count as made there)."""
        held = {k for k in map(_address, inputs) if k is not None}
        for t in tensors:
            key = _address(t)
            if key is None or key in self._alive or key in held:
                continue
            st = t.untyped_storage()
            serial, n = len(self._refs), int(st.nbytes())
            self._alive[key] = serial
            self._refs[serial] = weakref.ref(st, lambda _r, k=key, s=serial, b=n:
                                             self._freed(k, s, b))
            self.events.append((serial, n))

    def _freed(self, key: int, serial: int, nbytes: int) -> None:
        if self._alive.get(key) == serial:
            del self._alive[key]
        self.events.append((serial, -nbytes))

    def end_of_forward(self) -> None:
        """Mark the end of forward: :meth:`excess` measures from the level here."""
        self._forward = len(self.events)

    def excess(self, excluded) -> int:
        """Bytes (>= 0): the highest level after :meth:`end_of_forward` less the level there,
        leaving out the storages of the ``excluded`` tensors that are alive now (the
        parameters' gradients)."""
        if self._forward is None:
            raise RuntimeError("end_of_forward() was not called")
        skip = set()
        for t in excluded:
            serial = self._alive.get(_address(t))
            if serial is not None:
                skip.add(serial)
        level = 0
        for serial, n in self.events[:self._forward]:
            if serial not in skip:
                level += n
        start = peak = level
        for serial, n in self.events[self._forward:]:
            if serial not in skip:
                level += n
                peak = max(peak, level)
        return peak - start


def _address(t) -> int | None:
    """The address of ``t``'s storage (None: a tensor without one, sparse or nested)."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def rising(v1: int, v2: int, b1: int, b2: int) -> tuple[int, int]:
    """An affine pair ``(c, s)`` through backward's transient bytes ``v1`` at batch ``b1`` and
    ``v2`` at ``b2``, its slope rounded up (``c + s >= 0``): the highest moment of a step may
    be another operator at another batch, so the two need not lie on one line (each
    operator's own bytes do: :func:`.records.affine_fit`).

    >>> rising(10, 16, 2, 4), rising(10, 17, 2, 4), rising(10, 9, 2, 4)
    ((4, 3), (2, 4), (10, 0))
    """
    s = max(0, -(-(v2 - v1) // (b2 - b1)))
    return max(v1 - s * b1, -s), s
