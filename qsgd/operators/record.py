"""Record a model's training step as operators, on the meta device: shapes, no arithmetic.

:func:`record_operators` runs one forward (with the loss), backward and optimizer step of a
copy of the model on the meta device under two modes: a :class:`~qsgd.operators.functions.Functions`
torch-function mode (autocast, fused attention) above autograd, and a dispatch mode below it
that sees every kernel-launching ATen operator and records its class, dtype, FLOPs (torch's
``flop_counter`` formulas), bytes and matrix products. A parameter's post-accumulate-grad hook
marks how many operators were issued when its gradient was ready, which places each DDP
bucket in backward. The step runs at two batch sizes; the counts of every operator are fitted
as ``c + s * batch`` (:mod:`qsgd.operators.records`), so one recording serves any batch.

Nothing is allocated: a 70-billion-parameter layout records on a laptop. The optimizer is
recorded at its second step (the first creates its state); the fp16 flavour of autocast adds
``GradScaler``'s unscale (kind ``"scaler"``), which the bf16 flavour leaves out when timed.
The ``half`` family is a float16 model whose optimizer steps float32 master copies
(:class:`_MasterWeights`, as apex amp O2 and DeepSpeed's fp16 optimizer do).
"""
from __future__ import annotations

import contextlib
import copy

import torch

from qsgd.errors import ModelError
from .checkpoint import Checkpointing, check_checkpointing
from .functions import Functions
from .liveness import LiveBytes, rising
from .optimizers import OPTIMIZERS
from .recorder import _Recorder
from .records import DEFAULT_FAMILIES, FAMILIES, Operator, Operators, OperatorSet, affine_fit

#: Batch sizes the step is recorded at (two points fix an affine count; 2 is the smallest
#: batch a BatchNorm in training mode accepts after global pooling).
BATCHES = (2, 3)


#: How a family runs: the parameters' dtype and autocast's lower precision.
_FAMILY = {"fp32": (torch.float32, None), "amp": (torch.float32, torch.float16),
           "bf16": (torch.bfloat16, None), "half": (torch.float16, None)}


class _MasterWeights:
    """The optimizer of a float16 model trained through float32 master weights.

    apex amp O2 (``apex/amp/_process_optimizer.py``: the model's gradients are unscaled into
    the masters' by one ``multi_tensor_scale`` kernel, and the stepped masters copied back by
    another) and DeepSpeed's ``FP16_Optimizer`` run a step as: float16 gradients into float32
    master gradients (reads 2 bytes and writes 4 an element; the loss scale's division and the
    overflow check ride in the same kernel), the optimizer on the masters, the masters back
    into the model (reads 4, writes 2). Each copy is recorded as one multi-tensor
    ``_foreach_copy_`` over every parameter: the same bytes and launches.
    """

    def __init__(self, build, params):
        self.params = list(params)
        self.masters = [torch.nn.Parameter(p.detach().float()) for p in self.params]
        self.inner = build(self.masters)

    def step(self) -> None:
        pairs = [(p, m) for p, m in zip(self.params, self.masters) if p.grad is not None]
        for _, m in pairs:
            if m.grad is None:          # the first (unrecorded) step makes the master gradients
                m.grad = torch.empty_like(m)
        if not pairs:
            return
        torch._foreach_copy_([m.grad for _, m in pairs], [p.grad for p, _ in pairs])
        self.inner.step()
        torch._foreach_copy_([p.detach() for p, _ in pairs], [m.detach() for _, m in pairs])


def _optimizer(family: str, name: str, params: list):
    """The optimizer ``name`` over ``params`` as ``family`` runs it: through float32 master
    weights for ``half``, on the parameters themselves otherwise."""
    build = OPTIMIZERS[name]
    return _MasterWeights(build, params) if family == "half" else build(params)

METHOD = ("torch dispatch and function modes on the meta device (qsgd.operators), one step at "
          f"batch {BATCHES[0]} and {BATCHES[1]} fitted as c + s * batch; FLOPs from "
          "torch.utils.flop_counter; autocast per PyTorch's CUDA op lists; attention as one "
          "fused kernel")


def _inputs(model, batch: int, dtype: torch.dtype, input_shape, channels_last: bool = False,
            device: str = "meta"):
    g = torch.Generator().manual_seed(0)
    if hasattr(model, "example_input"):
        x = model.example_input(batch, generator=g, device=device)
    else:
        x = torch.randn((batch, *input_shape), generator=g).to(device)
    if x.is_floating_point():
        x = x.to(dtype)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    target = None
    if hasattr(model, "example_target") and hasattr(model, "loss"):
        target = model.example_target(batch, generator=g, device=device)
    return x, target


def _step(model, optimizer, family: str, batch: int, input_shape, recorder: _Recorder,
          ready: dict, channels_last: bool = False, fused_attention: bool = True,
          device: str = "meta", amp_dtype: torch.dtype | None = None) -> None:
    """One forward, backward and (second) optimizer step, recorded into ``recorder``.

    On a real ``device`` (a measured step) the torch-function mode stays off: the device runs
    its own fused attention kernels, and ``torch.autocast`` with ``amp_dtype`` casts.
    """
    param_dtype, amp = _FAMILY[family]
    if device != "meta" and amp_dtype is not None:
        amp = amp_dtype
    x, target = _inputs(model, batch, param_dtype, input_shape, channels_last, device)
    for p in model.parameters():
        p.grad = None
    if device == "meta":
        functions = Functions(recorder, amp, fused_attention)
    elif amp is not None and family == "amp":
        functions = torch.autocast(device_type=device, dtype=amp)
    else:
        functions = contextlib.nullcontext()
    recorder.rows.clear()
    recorder.first_use.clear()
    recorder.params = {id(p): n for n, p in model.named_parameters()}
    recorder.derived.clear()
    recorder._saved.clear()
    recorder.saved_bytes = 0
    recorder.block_saved.clear()
    recorder.block_last.clear()
    ready.clear()
    # what autograd keeps from forward to backward (the activations' memory)
    saving = torch.autograd.graph.saved_tensors_hooks(recorder.save, lambda t: t)
    with functions, recorder:
        recorder.phase = "forward"
        with saving:
            out = model(x)
            if target is not None:
                loss = model.loss(out, target)
            else:   # any other module: the mean square of its output, a real backward through all
                loss = (out.float() if isinstance(out, torch.Tensor) else out[0].float()).square().mean()
        if device == "meta":
            functions.clear_cache()
    # The model's output is freed before backward, as torchtitan frees it ("need to free to
    # before bwd to avoid peaking memory", train.py) and a loss computed in a function frees
    # it: a language model's logits are gigabytes. What backward needs of it is saved.
    del out
    if recorder.live is not None:
        recorder.live.end_of_forward()
    with recorder:
        recorder.phase = "backward"
        loss.backward()
    if recorder.live is not None:
        recorder.transient = recorder.live.excess(
            [p.grad for p in model.parameters() if p.grad is not None])
    with torch.no_grad():
        optimizer.step()          # the first step creates the optimizer's state: not recorded
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    found, inv = torch.zeros(1, device=device), torch.ones(1, device=device)  # GradScaler's state
    with recorder, torch.no_grad():
        recorder.phase = "optimizer"
        if family == "amp":       # GradScaler.unscale_ of the fp16 flavour (kind "scaler")
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        optimizer.step()


def _fit(rows1: list[dict], rows2: list[dict], family: str) -> tuple[Operator, ...]:
    b1, b2 = BATCHES
    if len(rows1) != len(rows2):
        raise ModelError(f"operators ({family}): {len(rows1)} at batch {b1} but {len(rows2)} "
                         f"at batch {b2}; the step must issue the same kernels at any batch")
    ops = []
    for i, (r1, r2) in enumerate(zip(rows1, rows2)):
        same = ("op", "kind", "phase", "dtype", "tensors", "causal")
        if r1.get("geometry", {}).get("kernel") != r2.get("geometry", {}).get("kernel"):
            raise ModelError(f"operators ({family}): operator {i} ({r1['op']}) has another "
                             f"kernel at batch {b1} than at batch {b2}")
        if any(r1[k] != r2[k] for k in same) or len(r1["gemms"]) != len(r2["gemms"]):
            raise ModelError(f"operators ({family}): operator {i} is {r1['op']} at batch {b1} "
                             f"but {r2['op']} at batch {b2}")
        what = f"operators ({family})[{i}] {r1['op']}"
        try:
            gemms = tuple(tuple(affine_fit(a, b, b1, b2, f"{what} product dimension")
                                for a, b in zip(g1, g2)) for g1, g2 in zip(r1["gemms"], r2["gemms"]))
            ops.append(Operator(r1["op"], r1["kind"], r1["phase"], r1["dtype"],
                                affine_fit(r1["flops"], r2["flops"], b1, b2, f"{what} FLOPs"),
                                affine_fit(r1["bytes"], r2["bytes"], b1, b2, f"{what} bytes"),
                                gemms, r1["tensors"], r1["causal"],
                                affine_fit(r1["reread"], r2["reread"], b1, b2, f"{what} reread"),
                                affine_fit(r1["nchw"], r2["nchw"], b1, b2, f"{what} nchw"),
                                **r1.get("geometry", {})))
        except ValueError as exc:
            raise ModelError(str(exc)) from None
    return tuple(ops)


def record_operators(model: torch.nn.Module, *, input_shape: tuple[int, ...] | None = None,
                     families: tuple[str, ...] = DEFAULT_FAMILIES, optimizer: str | None = None,
                     channels_last: bool = False, fused_attention: bool = True,
                     checkpointing: str = "none") -> Operators:
    """Every kernel of one training step of ``model``, in each precision family.

    Parameters
    ----------
    model : torch.nn.Module
        Any module on any device (copied to the meta device; it is not modified). A built-in
        model (:mod:`qsgd.models`) brings its inputs, loss and optimizer; another module gets
        standard-normal inputs of ``input_shape`` and the mean square of its output as loss.
    input_shape : tuple of int, optional
        One sample's shape, for a module without ``example_input``.
    families : tuple of str
        Which of :data:`~qsgd.operators.records.FAMILIES` to record (default
        :data:`~qsgd.operators.records.DEFAULT_FAMILIES`: all but ``half``).
    optimizer : {"sgd", "adamw", "bertadam"}, optional
        The optimizer (:data:`~qsgd.operators.optimizers.OPTIMIZERS`; default: the model's
        ``training_optimizer``, else ``"sgd"``).
    channels_last : bool
        Lay 4-D activations and weights out channels-last (NHWC, ``torch.channels_last``), as
        ``model.to(memory_format=torch.channels_last)`` does; the default is torch's NCHW.
    fused_attention : bool
        ``scaled_dot_product_attention`` as one fused kernel each way (what PyTorch runs on a
        GPU), or (False) its math decomposition, as hand-written attention runs.
    checkpointing : {"none", "blocks", "blocks_full", "selective"}
        Activation checkpointing of every block (:data:`.checkpoint.CHECKPOINTING`; the
        modules FSDP wraps, :func:`qsgd.units_of`): each block's forward is issued again in
        backward, before the block's backward (``"blocks"``: up to torch's early stop;
        ``"selective"``: but the operators whose outputs torchtitan's policy keeps), and
        the activations kept are the blocks' inputs (and kept outputs) and one block's.

    Returns
    -------
    Operators

    Examples
    --------
    >>> import qsgd
    >>> ops = qsgd.record_operators(qsgd.build_model("mlp"), families=("fp32",))
    >>> fp32 = ops.family("fp32")
    >>> [o.op for o in fp32.ops if o.kind == "gemm"][:2]
    ['aten.addmm.default', 'aten.addmm.default']
    >>> fp32.ops[0].flops_at(10) == 2 * 10 * 784 * 256     # the first layer's product
    True
    """
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_checkpointing(checkpointing)
    for f in families:
        if f not in FAMILIES:
            raise ModelError(f"families: {f!r} is not one of {list(FAMILIES)}")
    optimizer = optimizer or getattr(model, "training_optimizer", "sgd")
    if optimizer not in OPTIMIZERS:
        raise ModelError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
    input_shape = tuple(input_shape or getattr(model, "input_shape", ()) or ())
    if not hasattr(model, "example_input") and not input_shape:
        raise ModelError(f"input_shape is needed for {type(model).__name__} (it has no "
                         f"example_input), got {input_shape!r}")
    base = _to_meta(model)
    out, sizes = {}, {}
    for family in families:
        param_dtype, _ = _FAMILY[family]
        m = copy.deepcopy(base).to(param_dtype).train()
        if channels_last:
            m = m.to(memory_format=torch.channels_last)
        params = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
        ready: dict[str, int] = {}
        recorder = _Recorder(channels_last)

        def mark(name):
            def hook(_param) -> None:
                ready.setdefault(name, len(recorder.rows))
            return hook

        hooks = [p.register_post_accumulate_grad_hook(mark(n)) for n, p in params]
        ckpt = None if checkpointing == "none" else \
            Checkpointing(m, recorder, full=checkpointing == "blocks_full",
                          selective=checkpointing == "selective")
        opt = _optimizer(family, optimizer, [p for _, p in params])
        rows, readies, uses, saved, transient = [], [], [], [], []
        try:
            for b in BATCHES:
                recorder.live = LiveBytes()
                _step(m, opt, family, b, input_shape, recorder, ready, channels_last,
                      fused_attention)
                rows.append(list(recorder.rows))
                readies.append(dict(ready))
                uses.append({k: tuple(v) for k, v in recorder.first_use.items()})
                saved.append(recorder.saved_bytes + (ckpt.kept_bytes() if ckpt else 0))
                transient.append(recorder.transient)
                recorder.live = None
                recorder._saved.clear()
                recorder.derived.clear()
        finally:
            for h in hooks:
                h.remove()
            if ckpt is not None:
                ckpt.remove()
        if readies[0] != readies[1]:
            raise ModelError(f"operators ({family}): gradients become ready at other operators "
                             f"at batch {BATCHES[0]} and {BATCHES[1]}")
        try:
            kept = affine_fit(saved[0], saved[1], *BATCHES, f"operators ({family}) saved bytes")
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        out[family] = OperatorSet(family, _fit(rows[0], rows[1], family), readies[0], optimizer,
                                  uses[0], kept, rising(*transient, *BATCHES))
        sizes = {n: p.numel() for n, p in params}
    tb = getattr(model, "training_batch_size", None)
    extra = {"memory_format": "channels_last"} if channels_last else {}
    if not fused_attention:
        extra["attention"] = "math"
    if checkpointing != "none":
        extra["checkpointing"] = checkpointing
    return Operators(out, METHOD, tb if isinstance(tb, int) and tb > 0 else None, extra=extra,
                     parameters=sizes)


def _to_meta(model: torch.nn.Module) -> torch.nn.Module:
    """A meta-device copy of ``model`` (no weights are copied)."""
    if all(t.device.type == "meta" for t in (*model.parameters(), *model.buffers())):
        return copy.deepcopy(model)
    memo = {id(t): torch.empty_like(t, device="meta") if not isinstance(t, torch.nn.Parameter)
            else torch.nn.Parameter(torch.empty_like(t, device="meta"), t.requires_grad)
            for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)
