"""Activation checkpointing of a model's blocks, as the operator recorder sees it.

Training a transformer under FSDP almost always wraps each block in activation checkpointing
(``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``; FSDP's
``apply_activation_checkpointing``, llm-foundry's ``activation_checkpointing: true``): the
forward keeps only the block's inputs, and in backward, when the block's first saved tensor is
needed, the block's forward runs again to make them, just before the block's own backward
("Training Deep Nets with Sublinear Memory Cost", Chen et al. 2016, Section 3; the docstring
of ``torch/utils/checkpoint.py``). So a step costs one forward more of every block, and its
activations are the blocks' inputs plus what one block saves (the one whose backward runs).

On the meta device :class:`Checkpointing` does the same bookkeeping without running anything
twice: the forward runs once as usual, the operators each block issued are noted, and when the
gradient of the block's output is ready (a tensor hook on it: the moment the block's backward
starts) their records are issued again, in the backward phase. A block is what FSDP wraps (the
module at the first numbered name of a parameter, :func:`qsgd.units_of`). The tensors a block
saves count as the block's own, apart from the step's activations; the block's inputs are kept.
PyTorch's recomputation stops where the block's last tensor saved for backward is made again
(``set_checkpoint_early_stop``, on by default; ``torch/utils/checkpoint.py``): the operators
after it (a pre-norm block's second MLP product and residual addition, whose outputs no
backward reads) are not run again, and here neither. Where it stops is counted in records:
an operator's inputs are saved before it runs (autograd's generated ``VariableType``
kernels), its outputs after. Reentrant checkpointing, and the non-reentrant one before torch
2.1 (whose unpack hook reran the whole function), run the block's whole forward again:
``"blocks_full"`` (:data:`CHECKPOINTING`).

Selective checkpointing (``"selective"``) is torchtitan's "op" policy for its transformer
blocks (``_apply_ac_to_transformer_block``, torchtitan/parallelisms/parallelize_llama.py at
9dec370, the commit of its December 2024 Llama 3 benchmarks; torch's
``create_selective_checkpoint_contexts``): inside a checkpointed block the outputs of the
operators in :data:`SAVED_OPS` are kept from forward (``MUST_SAVE``), except every second
matrix product of the block (the 2nd, 4th, ...: a count restarted per block), and only the
other operators run again in backward, up to the same early stop; the kept outputs are held
for the whole step like the blocks' inputs.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["CHECKPOINTING", "SAVED_OPS", "Checkpointing", "block_names", "check_checkpointing"]

#: How a step's activations are checkpointed (``Operators.extra["checkpointing"]``; absent:
#: ``"none"``) -> what that means.
CHECKPOINTING = {
    "none": "every activation kept from forward to backward",
    "blocks": "every block checkpointed, its forward run again in backward up to where "
              "torch.utils.checkpoint's early stop ends it (non-reentrant, torch >= 2.1)",
    "blocks_full": "every block checkpointed, its whole forward run again in backward "
                   "(reentrant checkpointing; non-reentrant before torch 2.1)",
    "selective": "every block checkpointed with torchtitan's selective op policy: the outputs "
                 "of fused attention and of every other matrix product kept, the block's "
                 "other operators run again in backward up to the early stop",
}

#: Operators whose outputs selective checkpointing keeps (torchtitan's ``_save_list`` at
#: 9dec370: ``aten.mm``, the flash and memory-efficient ``scaled_dot_product_attention``
#: kernels, which the recorder writes as one ``attention`` record, ``aten.abs``, ``aten.max``;
#: its ``reduce_scatter_tensor`` is no kernel of a one-GPU step). :data:`ALTERNATE`'s are kept
#: every second one only.
SAVED_OPS = frozenset({"aten.mm.default", "attention", "aten.abs.default", "aten.max.default"})
ALTERNATE = "aten.mm.default"


def check_checkpointing(value) -> str:
    """``value`` if it is a :data:`CHECKPOINTING` key, else a one-line ModelError.

    >>> check_checkpointing("blocks")
    'blocks'
    """
    from qsgd.errors import ModelError

    if value not in CHECKPOINTING:
        raise ModelError(f"checkpointing must be one of {list(CHECKPOINTING)}, got {value!r}")
    return value


def block_names(model: torch.nn.Module) -> list[str]:
    """Names of the modules activation checkpointing wraps: FSDP's units but the root.

    >>> import qsgd
    >>> block_names(qsgd.build_model("gpt2", seq_len=8, n_layer=2, n_embd=32, n_head=4, vocab_size=100))
    ['blocks.0', 'blocks.1']
    """
    from qsgd.shardplan import units_of

    sizes = {n: p.numel() for n, p in model.named_parameters()}
    return [u.name for u in units_of(sizes) if not u.root] if sizes else []


class Checkpointing:
    """Hooks on ``model``'s blocks that make ``recorder`` (the dispatch mode recording a step)
    record the step as activation checkpointing runs it (module docstring); ``full``: each
    block's whole forward again (``"blocks_full"``), not up to the early stop; ``selective``:
    torchtitan's policy (``"selective"``), the outputs it keeps not made again.

    The recorder keeps ``block`` (the block running, None outside any), ``block_saved``
    (bytes each block's operators saved for backward) and ``block_last`` (records issued when
    each block last saved a tensor: where the early stop ends its recomputation);
    :meth:`kept_bytes` is what the step keeps at its peak beyond the recorder's
    ``saved_bytes``.
    """

    def __init__(self, model: torch.nn.Module, recorder, *, full: bool = False,
                 selective: bool = False):
        self.recorder, self.full, self.selective = recorder, full, selective
        self._kept: dict[int, set] = {}         # block -> its records whose outputs are kept
        self._products: dict[int, int] = {}     # block -> matrix products issued so far
        if selective:
            recorder.on_output = self._on_output
        names = block_names(model)
        if not names:
            from qsgd.errors import ModelError

            raise ModelError(f"checkpointing: {type(model).__name__} has no blocks to checkpoint "
                             f"(modules at a numbered name, as FSDP wraps a transformer's "
                             f"blocks); use checkpointing='none'")
        self._handles = []
        self._start: dict[int, int] = {}
        for k, name in enumerate(names):
            block = model.get_submodule(name)
            self._handles.append(block.register_forward_pre_hook(self._enter(k), with_kwargs=True))
            self._handles.append(block.register_forward_hook(self._leave(k), with_kwargs=True))

    def _enter(self, k: int):
        def hook(_module, args, kwargs):
            rec = self.recorder
            if rec.phase != "forward":
                return None
            rec.block = k
            self._start[k] = len(rec.rows)
            self._kept[k], self._products[k] = set(), 0
            # checkpoint keeps the block's inputs (its closure holds them) until its backward
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    rec.keep(t)
            return None
        return hook

    def _leave(self, k: int):
        def hook(_module, _args, _kwargs, output):
            rec = self.recorder
            if rec.phase != "forward" or k not in self._start:
                return None
            rec.block = None
            start = self._start.pop(k)
            # recomputation stops once the last tensor the block saved is made again
            # (torch.utils.checkpoint's early stop): the operators up to that point
            end = len(rec.rows) if self.full else max(start, rec.block_last.get(k, start))
            kept = self._kept.pop(k, ())
            again = [dict(r, phase="backward") for i, r in enumerate(rec.rows[start:end], start)
                     if i not in kept]
            out = next((t for t in tree_leaves(output)
                        if isinstance(t, torch.Tensor) and t.requires_grad), None)
            if out is not None and again:
                # fires when the output's gradient is complete: the block's backward is next
                out.register_hook(lambda _grad: rec.rows.extend(dict(r) for r in again))
            return None
        return hook

    def _on_output(self, index: int, outs, extra: int) -> None:
        """torchtitan's policy for the record ``index`` a block just issued in forward."""
        rec = self.recorder
        k, op = rec.block, rec.rows[index]["op"]
        if op not in SAVED_OPS or k not in self._kept:
            return
        if op == ALTERNATE:
            self._products[k] += 1
            if self._products[k] % 2 == 0:      # every second product is made again
                return
        self._kept[k].add(index)
        for t in outs:
            rec.hold(t, extra)
            extra = 0

    def kept_bytes(self) -> int:
        """Bytes of the block whose operators save the most (the peak is during its backward,
        its forward run again)."""
        return max(self.recorder.block_saved.values(), default=0)

    def remove(self) -> None:
        """Take the hooks off the model."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.selective:
            self.recorder.on_output = None
