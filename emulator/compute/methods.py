"""The local stages of compression as other projects implement it, timed on a GPU.

The wire plans of :mod:`qsgd.wiremethods` say which stage runs where; this module says what
each stage launches, read off the implementation's source, and times it with the compute
model's own rules (:mod:`~emulator.compute.rules`): an operator costs the host
:data:`~emulator.compute.timeline.HOST_OP_S` to issue (eager PyTorch's figure; TensorFlow 1's
graph executor is taken to cost the same per operator, for want of a published figure) and
its kernel the device ``max(math, memory) + KERNEL_S``; one after the other, an operator
takes the longer of the two (the host runs ahead while kernels are long, the GPU waits for
it while they are short). Operators that run on the host only (``tf.shape``, ``reshape``,
``bitcast``, the Horovod op's enqueue) cost the host's share alone. Nothing here is fitted
to a published run.

- ``powersgd``, PyTorch (``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``):
  error feedback (add, clone), per compressed matrix Gram-Schmidt of Q (``_orthogonalize``:
  per column a norm and a division, and for each later column a product, a column sum, a
  scaling and a subtraction) and the products P = M Q, Q = M^T P, M = P Q^T as float32
  GEMMs; the uncompressed tensors concatenated, divided and copied back one by one.
- ``powersgd``, GRACE (``grace_dl/tensorflow/compressor/powersgd.py``, ``memory/powersgd.py``):
  the residual added, ``tf.linalg.qr`` of Q and of P (Householder: two kernels per column),
  the same three products, the division by the world size, the momentum update (four
  operators) and its sum, the residual memory's second decompression, subtraction and
  assignment.
- GRACE's compressors (``grace_dl/tensorflow/compressor/*.py``, :data:`FAMILIES`): each
  TensorFlow operator of ``compress`` and ``decompress``, per tensor; the memory's
  ``compensate`` and ``update`` (``memory/residual.py``, ``dgc.py``, ``efsignsgd.py``:
  update decompresses once more); the allgather communicator's per-rank slices and
  decompressions, ``add_n`` of the ``p`` results and the division by the world size; the
  allreduce communicator's division and one decompression. ``tf.math.top_k`` over ``n``
  elements is timed as a radix sort of (value, index) pairs: four 8-bit digit passes,
  each reading and writing 8 bytes an element (CUB's ``DeviceRadixSort``, which TensorFlow's
  GPU top-k falls back to for large ``k``); DGC's threshold refinement loop runs a number
  of times only the gradient decides, taken as its first check alone.
"""
from __future__ import annotations

import math

from .devices import Device
from .rules import KERNEL_S, gemm_math_seconds, math_efficiency, memory_seconds
from .timeline import HOST_OP_S

# An operator: (what it runs over, bytes per element moved, kernels launched).
# "n": the tensor's elements; "k": the kept elements; "s": a few scalars (one small kernel);
# "h": host only (no kernel). Bytes count reads and writes: an fp32 unary map is 8.
H = ("h", 0, 0)
S = ("s", 0, 1)


def K(b: float, launches: int = 1) -> tuple:
    """A kernel over the tensor's elements moving ``b`` bytes each."""
    return ("n", b, launches)


def KK(b: float) -> tuple:
    """A kernel over the kept elements moving ``b`` bytes each."""
    return ("k", b, 1)


TOPK = K(4 * 2 * 8, launches=8)     # radix sort of (value, index): 4 passes, 2 kernels each
SCATTER = (K(4), KK(12))            # tf.scatter_nd: zero-fill, then scatter (index, value)

#: Per GRACE family: (compress, decompress, components gathered per tensor, aggregate's
#: operators beyond ``add_n``), each the TensorFlow operators of its source in order.
FAMILIES: dict[str, tuple] = {
    "none": ((), (), 1, ()),
    # shape, reshape, norm, reshape, |g|, qnum/norm, *|g|, floor, uniform, -, <, cast, +,
    # cast (identity), sign, *, cast to int8/int16
    "qsgd": ((H, H, K(4), H, K(8), S, K(8), K(8), K(4), K(12), K(9), K(5), K(12), H, K(8),
              K(12), K(6)),
             (K(6), S, K(8), H), 2, ()),
    # shape, reshape, |g|, max, /, sign, |.|, find_bins (searchsorted, clip, cast), cast,
    # reshape, cast sign, *
    "8bit": ((H, H, K(8), K(4), K(8), K(8), K(8), K(8), K(8), K(8), K(5), H, K(5), K(3)),
             (K(5), K(8), K(8), K(8), H, K(8), K(8), K(12), H), 2, ()),
    # shape, reshape, bitcast, three ands, uniform, >, +, where, clip, two shifts, -, |, cast
    "natural": ((H, H, H, K(8), K(8), K(8), K(4), K(9), K(8), K(13), K(8), K(8), K(8), K(8),
                 K(12), K(5)),
                (K(2), K(2), K(2), K(5), K(8), H, K(8), K(13), K(2), K(5), K(12), H), 1, ()),
    # shape, reshape, mean, -, square, mean, sqrt, two scalings, clip, |.|, max, zeros,
    # |.|, sign, uniform, <, sign*scale, where, sign, reshape, cast
    "terngrad": ((H, H, K(4), K(8), K(8), K(4), S, S, S, K(8), K(8), K(4), K(4), K(8), K(8),
                  K(4), K(9), K(8), K(13), K(8), H, K(5)),
                 (K(5), K(8), H), 2, ()),
    "signsgd": ((H, H, K(5)), (K(5), K(8), K(8), H), 1, (K(5), K(5), K(8), K(8))),
    "efsignsgd": ((H, H, K(5), K(8), K(4)), (K(5), K(8), K(8), K(8), H), 2, (K(8),)),
    # less, boolean_mask (mask scan, compaction), sum, cast, sum, where, /; the same for the
    # other sign; reshapes, concat
    "onebit": ((H, H, K(5), K(5, 2), K(4), K(5), K(4), S, S, K(2), K(5, 2), K(4), K(5), K(4),
                S, S, H, H, S),
               (S, K(5), K(8), K(8), K(8), K(12), H), 2, ()),
    # shape, reshape, |g|, top_k, gather, cast, bitcast, concat
    "topk": ((H, H, K(8), TOPK, KK(12), KK(8), H, KK(16)),
             (KK(16), H, H, *SCATTER, H), 1, ()),
    # sample (uniform, gather, top_k of 1 %), min, |g| > thr, cast, sum, loop checks, final
    # mask, where (nonzero), gather, bitcast, cast, concat
    "dgc": ((H, H, S, S, S, S, K(8), K(5), K(5), K(4), S, S, S, K(8), K(5), K(5, 2), KK(12),
             H, KK(8), KK(16)),
            (KK(16), H, S, H, *SCATTER, H), 1, ()),
    "randomk": ((H, H, KK(4), KK(12)), (S, H, *SCATTER, H), 1, ()),
}
#: The memories' operators per tensor: (compensate, update besides its decompression).
MEMORIES = {
    "residual": ((K(8), K(8), K(12)), (K(12), K(8))),
    "dgc": ((K(8), K(12), K(8), K(12), K(8), K(4), K(12)),
            (K(2), K(5), H, K(12), K(8), K(12), K(8))),
    "efsignsgd": ((K(8), K(12)), (K(12), K(8))),
}
MEMORY_OF = {"dgc": "dgc", "efsignsgd": "efsignsgd"}


def _ops_seconds(ops, n: int, kept: int, device: Device) -> float:
    """Seconds of ``ops`` on a tensor of ``n`` elements (``kept`` of them sent)."""
    total = 0.0
    for base, nbytes, launches in ops:
        if base == "h":
            total += HOST_OP_S
            continue
        count = {"n": n, "k": kept, "s": 1}[base]
        dev = memory_seconds(nbytes * count, device) + launches * KERNEL_S
        total += max(HOST_OP_S, dev)
    return total


def _grace_stage(plan, step, device: Device) -> float:
    cfg, p = plan.config, plan.world_size
    compress, decompress, parts, aggregate = FAMILIES[cfg.family]
    memory = MEMORIES[MEMORY_OF.get(cfg.family, "residual")] if cfg.error_feedback else None
    gathered = cfg.compressor.collective == "allgather"
    total = 0.0
    for n in plan.layout.numels:
        k = cfg.kept(n)
        if step.name == "encode":
            ops = list(compress)
            if memory is not None:
                ops = [*memory[0], *ops, *decompress, *memory[1]]
            # the Horovod op of each component (the collective itself is timed on the wire)
            ops += [H, H, H, H] * parts if gathered else [H] * parts
            total += _ops_seconds(ops, n, k, device)
        elif gathered and p > 1:
            # per rank: a slice (a copy) and a reshape of each component, one decompression;
            # then add_n of the p tensors, the aggregate's extra operators, the division
            part = k * (cfg.value_bytes + cfg.compressor.index_bytes)
            slices = p * (_op(memory_seconds(2 * part, device) + KERNEL_S) + HOST_OP_S
                          + (parts - 1) * (_op(KERNEL_S) + HOST_OP_S))
            total += slices + p * _ops_seconds(decompress, n, k, device) + \
                _ops_seconds((K(4 * (p + 1)), *aggregate, K(8)), n, k, device)
        else:
            # allreduce communicator (or one rank): the division of what was summed, one
            # decompression
            total += _ops_seconds(((("k" if cfg.compressor.kept == "ratio" else "n"), 8, 1),
                                   *decompress), n, k, device)
    return total


def _gemm_seconds(m: int, n: int, k: int, device: Device) -> float:
    """One float32 product ``(m x k) @ (k x n)`` (PyTorch leaves TF32 off for matmuls)."""
    rate = device.flops("fp32") * math_efficiency("fp32", device)
    math_s = gemm_math_seconds(1, m, n, k, rate, device.sms)
    return max(math_s, memory_seconds(4 * (m * k + k * n + m * n), device)) + KERNEL_S


def _op(dev_s: float) -> float:
    return max(HOST_OP_S, dev_s)


def _stream(nbytes: float, device: Device) -> float:
    return _op(memory_seconds(nbytes, device) + KERNEL_S)


def _gram_schmidt(rows: int, cols: int, device: Device) -> float:
    """``_orthogonalize`` of a ``rows x cols`` matrix in PyTorch's hook."""
    total = 0.0
    for i in range(cols):
        total += _stream(4 * rows, device) + _stream(8 * rows, device)
        if i + 1 < cols:
            rest = cols - i - 1
            total += (_stream(4 * rows * (rest + 1) + 4 * rows * rest, device)
                      + _stream(4 * rows * rest + 4 * rest, device)
                      + _stream(8 * rows * rest, device) + _stream(12 * rows * rest, device))
    return total


def _qr(rows: int, cols: int, device: Device) -> float:
    """``tf.linalg.qr`` of a thin ``rows x cols`` matrix: two kernels per Householder column."""
    return sum(2 * _stream(8 * rows * cols, device) for _ in range(cols)) + HOST_OP_S


def _powersgd_stage(plan, step, device: Device) -> float:
    cfg, p = plan.config, plan.world_size
    mats, raw = cfg.split(plan.layout)
    total_n = plan.layout.numel
    torch = cfg.implementation == "torch"
    t = 0.0
    if step.name == "encode":
        if torch:
            if cfg.error_feedback:
                t += _stream(12 * total_n, device) + _stream(8 * total_n, device)
            t += _stream(8 * raw, device) if raw else 0.0
            t += sum(_gram_schmidt(m, r, device) + _op(_gemm_seconds(n, r, m, device))
                     for n, m, r in mats)
        else:
            t += sum(_stream(12 * n * m, device) + 2 * HOST_OP_S + _qr(m, r, device)
                     + _op(_gemm_seconds(n, r, m, device)) for n, m, r in mats)
    elif step.name == "unpack":
        t += _stream(8 * raw, device) + sum(
            _stream(8 * e, device) for e, shape in zip(plan.layout.numels, plan.layout.shapes)
            if len(shape) <= 1 or not _compressed(shape, mats))
    elif step.name == "reduce":
        for n, m, r in mats:
            if torch:
                t += _gram_schmidt(n, r, device) + _op(_gemm_seconds(m, r, n, device))
            else:
                t += (_stream(8 * n * r, device) + _qr(n, r, device)
                      + _op(_gemm_seconds(m, r, n, device)) + _stream(8 * m * r, device)
                      + _stream(8 * m * r, device))
    elif step.name == "decode":
        qs = sum(m * r for _, m, r in mats)
        if torch:
            t += _stream(8 * qs, device) + sum(_op(_gemm_seconds(n, m, r, device))
                                               for n, m, r in mats)
            t += _stream(12 * total_n, device) if cfg.error_feedback else 0.0
        else:
            # decompress (product, momentum's four operators and its sum), then the memory's
            # second decompression, subtraction and assignment; the vectors' division
            one = lambda n, m, r: (_op(_gemm_seconds(n, m, r, device)) + HOST_OP_S
                                   + 4 * _stream(12 * n * m, device) + _stream(12 * n * m, device))
            t += sum(2 * one(n, m, r) + _stream(12 * n * m, device) + _stream(8 * n * m, device)
                     for n, m, r in mats)
            t += _stream(8 * raw, device) if raw else 0.0
    return t


def _compressed(shape, mats) -> bool:
    return any(shape[0] == n and math.prod(shape[1:]) == m for n, m, _ in mats)


#: The wire plan transport -> its stages' timing.
STAGES = {"powersgd": _powersgd_stage, "grace_allgather": _grace_stage,
          "grace_allreduce": _grace_stage}


def stage_seconds(plan, step, device: Device) -> float:
    """Seconds of plan ``plan``'s local stage ``step`` on ``device`` (module docstring).

    Parameters
    ----------
    plan : qsgd.WirePlan
        Of a transport in :data:`STAGES`.
    step : qsgd.Stage
        One of its stages.
    device : Device

    Examples
    --------
    PyTorch's PowerSGD hook, rank 1, on a bucket of one 2048 x 4608 matrix on a V100:
    error feedback's passes over the bucket (add, clone; the new error) outweigh the three
    GEMV-shaped products:

    >>> import qsgd
    >>> from emulator.compute import device
    >>> layout = qsgd.BucketLayout((2048 * 4608,), (False,), shapes=((2048, 4608),))
    >>> plan = qsgd.wire_plan("powersgd", layout, 8, qsgd.PowerSGDConfig())
    >>> [(s.name, round(stage_seconds(plan, s, device("V100")) * 1e6)) for s in plan.stages]
    [('encode', 311), ('reduce', 67), ('decode', 205)]
    """
    if plan.transport not in STAGES:
        raise ValueError(f"no stage model for transport {plan.transport!r}; known: {sorted(STAGES)}")
    return STAGES[plan.transport](plan, step, device)
