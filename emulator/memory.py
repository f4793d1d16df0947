"""The memory one GPU needs under each data-parallel strategy: model states and activations.

Model states, for ``P`` parameters sharded over ``p`` ranks (Rajbhandari et al., "ZeRO",
SC 2020, Section 3.1 and Figure 1: with mixed-precision Adam a parameter costs 2 bytes of
16-bit weight, 2 of 16-bit gradient and K = 12 of optimizer state, the float32 master weight
and the two moments):

- **PyTorch** (``ddp``, ``fsdp``, ``fsdp_grad_op``, ``hsdp``): parameters and gradients in the
  parameters' dtype (float32 under autocast, bfloat16 in pure bf16, float16 in ``fp16``), the
  optimizer's state in it too (AdamW: two moments; SGD: the momentum), except that an
  ``fp16`` model's optimizer keeps a float32 master copy and float32 moments (apex amp O2).
  DDP adds its gradient buckets, as large as
  the gradients (``gradient_as_bucket_view=False``, its default: PyTorch's
  ``DistributedDataParallel`` documentation), and autocast's bfloat16 copies of the weights,
  which autograd keeps for backward. FSDP keeps parameters, gradients and state as shards
  (``P / p`` each) and holds gathered 16-bit units: the root unit from forward to the end of
  backward, the unit computing and the one prefetched (two units, Zhao et al., "PyTorch
  FSDP", VLDB 2023, Section 4.1, the rate limiter), and the unsharded gradient of the unit
  being reduced; ``SHARD_GRAD_OP`` keeps every gathered unit from forward to backward.
- **DeepSpeed** (``zero1``-``zero3``): 16-bit parameters and gradients, a float32 master copy
  in the optimizer's state (K = 4 + 4 per moment) under the mixed precisions; stage 1 shards
  the state, stage 2 the gradients too, stage 3 the parameters too (ZeRO, Section 5.1), each
  with its gradient bucket of up to ``reduce_bucket_size`` elements (5e8 by default); stage 3
  gathers units as FSDP does.

Activations: the bytes autograd keeps from forward to backward at the batch, as the trace's
operators recorded them (:attr:`qsgd.operators.OperatorSet.saved`), whatever the strategy.
Transient: what backward's own tensors add above that at their highest, the start of
backward, where the loss's gradients are made (:attr:`qsgd.operators.OperatorSet.transient`,
recorded tensor by tensor, :mod:`qsgd.operators.liveness`: two float32 copies of the logits
for a language model, 8.4 GB each for Llama 3 8B at 2 x 8,192 tokens). So the peak is the
start of backward, with every activation still held. Not counted: the CUDA context, NCCL's
buffers, the caching allocator's rounding and fragmentation, and kernels' workspaces; a trace
recorded before transients were (``(0, 0)``) counts none.
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.compute import precision as precision_named
from emulator.errors import ConfigError

__all__ = ["Memory", "memory_per_gpu", "check_fits"]

#: Optimizer moments per parameter (AdamW: first and second; SGD: the momentum).
MOMENTS = {"adamw": 2, "sgd": 1, "bertadam": 2}
#: Strategies whose model states follow DeepSpeed's mixed precision (16-bit model, float32
#: master copy in the optimizer).
DEEPSPEED = ("zero1", "zero2", "zero3")


@dataclass(frozen=True)
class Memory:
    """Bytes one GPU holds at its peak (the start of backward), by what holds them."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    strategy: str = "ddp"
    device_bytes: float | None = None
    transient: float = 0.0

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer + self.activations
                + self.transient + self.buffers)

    @property
    def fits(self) -> bool | None:
        """Whether it fits the GPU's memory (None when the GPU is not known)."""
        return None if self.device_bytes is None else self.total <= self.device_bytes

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "parameters": self.parameters,
                "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "transient": self.transient,
                "buffers": self.buffers, "total": self.total,
                "device_bytes": self.device_bytes}

    def describe(self) -> str:
        gb = lambda v: f"{v / 1e9:.1f} GB"  # noqa: E731
        return (f"{gb(self.total)} (parameters {gb(self.parameters)}, gradients "
                f"{gb(self.gradients)}, optimizer {gb(self.optimizer)}, activations "
                f"{gb(self.activations)}, backward's transients {gb(self.transient)}, "
                f"gathered units and buffers {gb(self.buffers)})")


def memory_per_gpu(trace, strategy: str, world_size: int, *, precision: str, batch_size: int,
                   shard_size: int | None = None, device_bytes: float | None = None) -> Memory:
    """The memory one GPU needs to train ``trace``'s model under ``strategy``.

    Parameters
    ----------
    trace : qsgd.PayloadTrace
        With operator records (parameters, optimizer, saved activations).
    strategy : str
        A key of :data:`qsgd.STRATEGIES`.
    world_size : int
        Ranks training.
    precision : str
        A :data:`emulator.compute.PRECISIONS` key.
    batch_size : int
        Samples per GPU.
    shard_size : int, optional
        HSDP's shard group (default: every rank).
    device_bytes : float, optional
        The GPU's memory, for :attr:`Memory.fits`.

    Examples
    --------
    Llama 2 7B at 2 sequences per GPU in bf16 autocast: DDP holds 16 bytes of model state a
    parameter, FSDP on 64 GPUs a sixty-fourth of that and two gathered blocks:

    >>> import emulator, qsgd
    >>> trace = qsgd.measure("llama2-7b", qsgd.QSGDConfig.from_bits(4), device="meta")
    >>> ddp = memory_per_gpu(trace, "ddp", 64, precision="amp-bf16", batch_size=2)
    >>> fsdp = memory_per_gpu(trace, "fsdp", 64, precision="amp-bf16", batch_size=2)
    >>> round((ddp.parameters + ddp.gradients + ddp.optimizer) / trace.parameters)
    16
    >>> round(fsdp.optimizer * 64 / trace.parameters), fsdp.total < ddp.total
    (8, True)
    """
    import qsgd

    if strategy not in qsgd.STRATEGIES:
        raise ConfigError(f"parallelism: {strategy!r} is not one of {list(qsgd.STRATEGIES)}")
    st = qsgd.STRATEGIES[strategy]
    ops = getattr(trace, "operators", None)
    if ops is None:
        raise ConfigError(f"trace of {trace.model!r} has no operator records: the memory model "
                          f"needs them (measure it again with this version)")
    prec = precision_named(precision)
    opset = ops.family(prec.family)
    n = float(trace.parameters)
    p = world_size if shard_size is None or not st.hybrid else shard_size
    mixed = prec.family != "fp32"
    low = 2 if mixed else 4                       # bytes of a gathered / 16-bit element
    stored = prec.grad_bytes      # the parameters' dtype, which DDP's gradients take
    moments = MOMENTS.get(opset.optimizer, 2)
    # optimizer state a parameter: its moments in the parameters' dtype, or (a float16 model
    # stepped through master weights) a float32 master copy and float32 moments
    state_b = 4 * (moments + 1) if prec.family == "half" else moments * stored
    units = qsgd.units_of(ops.parameters) if ops.parameters else ()
    root = sum(u.numel for u in units if u.root)
    block = max((u.numel for u in units if not u.root), default=0)
    reduce_b = prec.grad_bytes if st.reduce_dtype == "grad" else low
    gathered = low * (root + 2 * block) + reduce_b * block
    bucket = reduce_b * min(n, qsgd.shardplan.ZERO_BUCKET_NUMEL)
    if st.name in DEEPSPEED:
        weight = low
        state = (4 * moments + (4 if mixed else 0))
        params = weight * n / (p if st.params_sharded else 1)
        grads = weight * n / (p if st.grads_sharded else 1)
        optimizer = state * n / p
        buffers = bucket + (gathered if st.params_sharded else 0.0)
    elif st.name == "ddp":
        params, grads, optimizer = stored * n, stored * n, state_b * n
        # DDP's buckets, and autocast's copies of the weights kept for backward
        buffers = stored * n + (2 * n if prec.family == "amp" else 0.0)
    else:
        params, grads, optimizer = stored * n / p, stored * n / p, state_b * n / p
        buffers = low * n + reduce_b * block if not st.reshard else gathered
    activations = float(opset.saved[0] + opset.saved[1] * batch_size)
    transient = float(opset.transient[0] + opset.transient[1] * batch_size)
    return Memory(params, grads, optimizer, activations, buffers, st.name, device_bytes,
                  transient)


def check_fits(trace, strategy: str, world_sizes, *, precision: str, batch_size: int,
               device, shard_size=None) -> dict:
    """``{world size: Memory}``; ConfigError naming the first that does not fit ``device``.

    The refusal names the model, the batch, the need against the GPU's memory and, when a
    larger world size of the list fits, the smallest one that does.
    """
    out = {w: memory_per_gpu(trace, strategy, w, precision=precision, batch_size=batch_size,
                             shard_size=shard_size, device_bytes=device.memory_bytes)
           for w in world_sizes}
    bad = [w for w, m in out.items() if not m.fits]
    if bad:
        w = min(bad)
        fits = sorted(x for x, m in out.items() if m.fits)
        hint = (f"it fits from {fits[0]} GPUs" if fits else
                "no world size of the study fits: lower the batch or shard over more GPUs")
        raise ConfigError(f"parallelism={strategy!r}: {trace.model} at batch {batch_size} per GPU "
                          f"needs {out[w].describe()} per GPU on {w} GPUs, more than the "
                          f"{device.name}'s {device.memory_label}; {hint}")
    return out
