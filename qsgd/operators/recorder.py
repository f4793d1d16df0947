"""The recorder's dispatch mode: one raw record per kernel-launching ATen operator.

:class:`_Recorder` sits below autograd while :func:`.record.record_operators` runs a step on the
meta device: per operator its class, dtype, FLOPs (torch's ``flop_counter`` formulas), bytes
and matrix products; the tensors autograd keeps for backward (its pack hook) and the blocks
that kept them (:mod:`.checkpoint`); the fused kernels' records (:mod:`.functions`); and,
where :mod:`.liveness` watches, every storage made in forward and backward.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry

from .functions import attention_record, fused_loss_record
from .kinds import CONV_ACTIVATIONS, GEMMS, NO_KERNEL, REREAD, conv_geometry, kind_of
from .liveness import LiveBytes

__all__ = ["_Recorder"]


def _nbytes(t: torch.Tensor) -> int:
    # each distinct element once: a broadcast (stride 0) dimension is read once
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= int(size)
    return n * t.element_size()


def _dtype(tensors) -> str:
    for t in tensors:
        if t.is_floating_point():
            return str(t.dtype).removeprefix("torch.")
    return "float32"


class _Recorder(TorchDispatchMode):
    """The dispatch mode: one raw record per kernel-launching operator."""

    def __init__(self, channels_last: bool = False):
        super().__init__()
        self.rows: list[dict] = []
        self.phase = "forward"
        self.channels_last = channels_last
        self._pending_read = 0
        self.params: dict[int, str] = {}       # id(parameter) -> name
        #: with a list here, each call runs in a profiler range named by its position, and the
        #: list maps that position to its record (None: no kernel) -- a measured step
        self.calls: list | None = None
        self.first_use: dict[str, list] = {}   # name -> [forward index, backward index]
        self.derived: dict[int, weakref.ref] = {}   # autocast's casts of parameters, by id
        #: id of the base of each tensor kept for backward -> (a weak reference to it, which
        #: tells a live entry from a dead tensor's id used again; the block that saved it,
        #: None: kept outside any block). Weak, as ``derived``: holding them here would keep
        #: them past the moment backward frees them (:class:`.LiveBytes` watches that).
        self._saved: dict[int, tuple] = {}
        self.saved_bytes = 0
        #: under activation checkpointing (:mod:`.checkpoint`): the block running (None:
        #: none), the bytes each block's operators saved, apart from ``saved_bytes``, and how
        #: many records there were when each block last saved a tensor
        self.block: int | None = None
        self.block_saved: dict[int, int] = {}
        self.block_last: dict[int, int] = {}
        #: called with (record index, output tensors, extra bytes) for each record a block
        #: issues in forward (selective checkpointing decides there what it keeps)
        self.on_output = None
        #: the storages made in forward and backward (:mod:`.liveness`; None: not watched),
        #: and what they rose to in backward above the end of forward (bytes)
        self.live: LiveBytes | None = None
        self.transient = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.calls is None:
            out = func(*args, **kwargs)
        else:
            self.calls.append(None)
            with torch.profiler.record_function(f"qsgd.op.{len(self.calls) - 1}"):
                out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if self.channels_last and name in CONV_ACTIVATIONS:
            # cuDNN returns channels-last results for channels-last inputs; meta kernels do not
            out = tree_map(lambda t: t.contiguous(memory_format=torch.channels_last)
                           if isinstance(t, torch.Tensor) and t.dim() == 4 else t, out)
        if self.live is not None and self.phase in ("forward", "backward"):
            self.live.made([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)],
                           [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)])
        if func.namespace != "aten" or func.is_view or name in NO_KERNEL:
            return out
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self._note_uses(ins)
        kind = kind_of(name)
        row = {"op": str(func), "kind": kind, "phase": self.phase, "dtype": _dtype(ins + outs),
               "flops": 0, "bytes": self._bytes(name, ins, outs), "gemms": [], "tensors": 1,
               "causal": False, "reread": 0, "nchw": 0}
        if name in REREAD:
            row["reread"] = sum(_nbytes(args[i]) for i in REREAD[name]
                                if isinstance(args[i], torch.Tensor))
        if name in CONV_ACTIVATIONS:
            # the layout of the convolution's input decides which kernels cuDNN runs
            acts = [args[i] for i in CONV_ACTIVATIONS[name]] + outs[:1]
            x = args[CONV_ACTIVATIONS[name][-1]]
            if x.dim() == 4 and not x.is_contiguous(memory_format=torch.channels_last):
                row["nchw"] = sum(_nbytes(t) for t in acts)
        if kind == "conv":
            # kernel, stride, dilation, groups, spatial sizes: what cuDNN's algorithm choice reads
            row["geometry"] = conv_geometry(name, args, out) or {}
        if kind in ("gemm", "conv", "attention"):
            row["gemms"] = GEMMS[name](args, out) if name in GEMMS else []
            counter = flop_registry.get(func.overloadpacket)
            if counter is not None:
                row["flops"] = int(counter(*args, **kwargs, out_val=out))
        elif kind == "optimizer" and args and isinstance(args[0], (list, tuple)):
            row["tensors"] = max(1, len(args[0]))
        if self.calls is not None:
            self.calls[-1] = len(self.rows)
        self.rows.append(row)
        if self.on_output is not None and self.block is not None and self.phase == "forward":
            self.on_output(len(self.rows) - 1, outs, 0)
        return out

    def _note_uses(self, ins) -> None:
        slot = {"forward": 0, "backward": 1}.get(self.phase)
        if slot is None:
            return
        for t in ins:
            # a parameter, or a view of one (a linear layer reads its weight transposed)
            name = self.params.get(id(t))
            if name is None and t._base is not None:
                name = self.params.get(id(t._base))
            if name is not None:
                uses = self.first_use.setdefault(name, [None, None])
                if uses[slot] is None:
                    uses[slot] = len(self.rows)

    def _bytes(self, name: str, ins, outs) -> int:
        seen, total = set(), self._pending_read
        self._pending_read = 0
        written = {id(t) for t in outs}
        for t in ins:
            # the destination of a copy or fill is written, not read
            if id(t) in seen or (name in ("copy_", "fill_", "zero_") and id(t) in written):
                continue
            seen.add(id(t))
            total += _nbytes(t)
        return total + sum(_nbytes(t) for t in {id(t): t for t in outs}.values())

    def cast_of_parameter(self, t: torch.Tensor) -> None:
        """Note ``t`` as a parameter's autocast copy: not an activation (a sharded step
        gathers the parameters in the lower precision and casts nothing)."""
        self.derived[id(t)] = weakref.ref(t)

    def _is(self, table: dict, key: int, t: torch.Tensor):
        """``table[key]`` when it is an entry of ``t`` itself (not of a dead tensor whose id
        ``t`` has now), else None."""
        entry = table.get(key)
        if entry is None:
            return None
        ref = entry if table is self.derived else entry[0]
        return entry if ref() is t else None

    def save(self, t: torch.Tensor) -> torch.Tensor:
        """The pack hook of :func:`torch.autograd.graph.saved_tensors_hooks`: count the bytes
        of each tensor autograd keeps for backward once (views by their base), parameters,
        views of them and their casts left out."""
        if self.block is not None:
            # operators issued when the block saved its latest tensor (an input is saved
            # before its operator runs, an output after): where recomputation stops
            self.block_last[self.block] = len(self.rows)
        base = t._base if t._base is not None else t
        key = id(base)
        if (key not in self.params and self._is(self.derived, key, base) is None
                and self._is(self._saved, key, base) is None):
            self._saved[key] = (weakref.ref(base), self.block)
            self._count(_nbytes(base))
        return t

    def keep(self, t: torch.Tensor) -> None:
        """Count ``t`` (a checkpointed block's input, which its checkpoint holds until the
        block's backward) in ``saved_bytes``, unless it is counted there already."""
        got = self._not_kept(t)
        if got is not None:
            self._saved[id(got[0])] = (weakref.ref(got[0]), None)
            self.saved_bytes += _nbytes(got[0])

    def _not_kept(self, t: torch.Tensor):
        """``(base of t, its entry of _saved or None)`` while ``t`` is not yet kept for the
        whole step; None once it is, or when it is a parameter, a view or a cast of one."""
        base = t._base if t._base is not None else t
        key = id(base)
        have = self._is(self._saved, key, base)
        if (key in self.params or self._is(self.derived, key, base) is not None
                or (have is not None and have[1] is None)):
            return None
        return base, have

    def hold(self, t: torch.Tensor, extra: int = 0) -> None:
        """Keep ``t`` (and ``extra`` bytes its kernel saved beside it) from forward to backward
        for the whole step, as selective checkpointing keeps an operator's output: counted in
        ``saved_bytes`` once, and out of its block's bytes if the block counted it (the block
        does not make it again). A reshaped copy of ``t`` that autograd saves later (a linear
        layer's product comes out 2-D and is viewed back with ``_unsafe_view``, a tensor of
        its own) still counts in the block's bytes: at most one block's kept outputs are
        counted twice, at the peak of the step."""
        got = self._not_kept(t)
        if got is None:
            return
        base, have = got
        key, n = id(base), _nbytes(base)
        if have is not None:
            self.block_saved[have[1]] -= n
        if extra and self.block is not None:
            self.block_saved[self.block] -= extra
        self._saved[key] = (weakref.ref(base), None)
        self.saved_bytes += n + extra

    def saved_extra(self, nbytes: int) -> None:
        """Bytes a fused kernel keeps for its backward beyond its saved inputs."""
        self._count(int(nbytes))

    def _count(self, nbytes: int) -> None:
        if self.block is None:
            self.saved_bytes += nbytes
        else:
            self.block_saved[self.block] = self.block_saved.get(self.block, 0) + nbytes

    def extra_read(self, t: torch.Tensor) -> None:
        """Add ``t``'s bytes to the next record (an attention mask read by the fused kernel)."""
        self._pending_read += _nbytes(t)

    def attention(self, q, k, v, out, causal: bool, backward: bool) -> None:
        rec = attention_record(q, k, v, out, causal, backward)
        self.rows.append({"op": "attention_backward" if backward else "attention",
                          "kind": "attention", "phase": self.phase, "dtype": _dtype([q]),
                          "flops": rec["flops"], "bytes": rec["bytes"] + self._pending_read,
                          "gemms": rec["gemms"], "tensors": 1, "causal": causal,
                          "reread": 0, "nchw": 0})
        self._pending_read = 0
        if self.on_output is not None and self.block is not None and not backward:
            # FlashAttention's log-sum-exp (one float32 per query row) is kept with the output
            self.on_output(len(self.rows) - 1, [out], out.numel() // out.shape[-1] * 4)

    def fused_loss(self, logits, backward: bool) -> None:
        """A record of the fused cross-entropy's kernel (:func:`.functions.fused_loss_record`)."""
        self.rows.append({"op": "fused_cross_entropy_backward" if backward else
                          "fused_cross_entropy", "kind": "softmax", "phase": self.phase,
                          "dtype": _dtype([logits]), "flops": 0,
                          "bytes": fused_loss_record(logits, backward)["bytes"], "gemms": [],
                          "tensors": 1, "causal": False, "reread": 0, "nchw": 0})
