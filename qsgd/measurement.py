"""Measure what QSGD really sends for a real model: real gradients, real codec, per DDP bucket.

(The module is not named ``qsgd.measure``: importing a submodule of that name would replace the
package attribute ``qsgd.measure``, the function, by the module.)

Each iteration is a real training step on synthetic data (forward, backward, SGD step) with
per-parameter post-accumulate hooks that time when each gradient is ready during backward; then
every bucket's real gradient is laid out as in DDP's bucket buffer and really encoded and decoded
(:func:`qsgd.encode`, :func:`qsgd.decode`), each timed on its own. On CUDA, times come from CUDA
events (the hooks run on the host ahead of the kernels, so host clocks would read too early);
on CPU from ``time.perf_counter``.

The paper's rule (Alistarh et al. 2017, Section 5): parameters with fewer than ``min_numel``
elements are sent as fp32; the rest of a bucket is one QSGD payload. Quantization streams are
``(seed, rank=0, step=iteration, bucket=index)``, so a trace is reproducible up to its timings.

With ``variance_bits``, each bucket's real gradient is also quantized ``variance_samples``
times at every candidate width (:func:`qsgd.variance_ratios`, streams ``(seed + 1, 0,
iteration, sample)``, apart from the codec pass's) and the measured ratio
``E||Q(v)-v||^2 / ||v||^2``, its Lemma 3.1 bound and the squared norms go into
``buckets[i].variance`` (means over the recorded iterations), per bucket and per parameter.

Every trace also carries the model's training step as operators (:func:`qsgd.record_operators`,
recorded on the meta device), which the emulator times on any GPU at any batch and precision.
``device="meta"`` records only that and the bucket layout: no step runs, no weight exists
(a 70-billion-parameter model fits), the payload sizes are the packed codec's exact ones
and every second is 0 (the trace is not ``timed``).
"""
from __future__ import annotations

import platform
import time
from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F

import qsgd
from qsgd.buckets import (DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_MIN_NUMEL,
                          ddp_buckets, ddp_parameters)
from qsgd.config import QSGDConfig
from qsgd.host import measure_host
from qsgd.errors import ConfigError
from qsgd.models import build_model, forward_flops, model_name
from qsgd.operators import record_operators
from qsgd.operators.records import DEFAULT_FAMILIES
from qsgd.stepmemory import check_fits
from qsgd.trace import FP32_BYTES, BucketTiming, PayloadTrace, TraceBucket, TraceIteration
from qsgd.tracevariance import BucketVariance, ParamVariance
from qsgd.variance import DEFAULT_BITS, variance_ratios
from ._checks import is_int

#: bucket order -> how :func:`ddp_buckets` is called (see :mod:`qsgd.buckets`).
BUCKET_ORDERS: dict[str, dict] = {
    "ready": {},  # ready_order filled in from the warm-up iteration
    "reverse": {},
    "find_unused": {"find_unused_parameters": True},
}


class _Clock:
    """Marks on the device's timeline: CUDA events on CUDA, ``perf_counter`` on the host."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, a, b) -> float:
        """Seconds from mark ``a`` to mark ``b`` (after :meth:`sync`)."""
        return max(0.0, a.elapsed_time(b) / 1e3 if self.cuda else b - a)


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; an unavailable CUDA raises ConfigError."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but CUDA is not available here")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return dev


def device_name(device: torch.device) -> str:
    """The processor's marketing name (``/proc/cpuinfo``) or the GPU's (``torch.cuda``)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _default_loss(output: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # Any user module: cross-entropy on the last dimension against random labels when the output
    # looks like logits, else the mean square (a real backward through every parameter).
    if output.is_floating_point() and output.ndim >= 2 and output.shape[-1] > 1:
        target = torch.randint(0, output.shape[-1], output.shape[:-1], generator=generator)
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(),
                               target.reshape(-1).to(output.device))
    return output.float().square().mean()


def _check_int(name: str, value, low: int) -> int:
    if not is_int(value) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def measure(model: nn.Module | str, cfg: QSGDConfig, *, iterations: int = 3, batch_size: int = 8,
            device: str | torch.device = "auto", min_numel: int = DEFAULT_MIN_NUMEL, seed: int = 0,
            bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
            first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES, bucket_order: str = "ready",
            warmup: int = 1, input_shape: tuple[int, ...] | None = None, lr: float = 0.01,
            variance_bits: tuple[int, ...] = DEFAULT_BITS, variance_samples: int = 2,
            progress: Callable[[str], None] | None = None, operators: bool = True,
            operator_seconds: bool | None = None,
            families: tuple[str, ...] = DEFAULT_FAMILIES,
            checkpointing: str = "none") -> PayloadTrace:
    """Run real training steps of ``model`` and record QSGD payloads and timings per DDP bucket.

    Parameters
    ----------
    model : torch.nn.Module or str
        A module (moved to ``device`` in place and trained by the steps), or a name / import path
        for :func:`qsgd.build_model` (built with ``torch.manual_seed(seed)``).
    cfg : QSGDConfig
        Quantization and codec.
    iterations : int
        Recorded iterations (several: elias payload sizes vary).
    batch_size : int
        Synthetic samples per iteration.
    device : {"auto", "cpu", "cuda", "cuda:N", "meta"}
        Where to run; ``"auto"`` takes CUDA when available. ``"meta"``: run nothing, record
        the layout and the operators only (module docstring; needs the packed codec).
    min_numel : int
        Parameters with fewer elements are sent as fp32 (the paper's 10,000).
    seed : int
        Seeds the model's initialization (when built here), the synthetic data and the
        quantization streams.
    bucket_cap_bytes, first_bucket_bytes : int
        DDP's bucket caps, bytes.
    bucket_order : {"ready", "reverse", "find_unused"}
        ``"ready"``: DDP's rebuilt buckets from the gradient-ready order of the first warm-up
        iteration (what DDP uses in steady state); ``"reverse"``: reverse registration order;
        ``"find_unused"``: DDP's assignment with ``find_unused_parameters=True``.
    warmup : int
        Unrecorded iterations first (allocator, oneDNN/cuDNN plans, numba compilation, and the
        ready order); at least 1 for ``bucket_order="ready"``.
    input_shape : tuple of int, optional
        One sample's shape, for a model without ``example_input``.
    lr : float
        SGD learning rate of the steps (momentum 0.9).
    variance_bits : tuple of int
        Widths (2..16) whose quantization variance is measured per bucket and parameter
        (``buckets[i].variance``); empty: none.
    variance_samples : int
        Quantizations averaged per width and iteration.
    progress : callable, optional
        Called with a one-line message after each iteration.
    operators : bool
        Record the training step's operators into the trace (:func:`qsgd.record_operators`).
    operator_seconds : bool, optional
        Also time one more real step per operator (:func:`qsgd.operators.measured.time_operators`,
        torch.profiler) into ``operators.measured``; default: on CUDA.
    families : tuple of str
        The operator families recorded (:data:`qsgd.operators.FAMILIES`; default the three
        of the default precisions): fewer is faster, more can be added later
        (:func:`qsgd.add_operators`).
    checkpointing : {"none", "blocks", "blocks_full", "selective"}
        Record the step with activation checkpointing of every block
        (:func:`qsgd.record_operators`); its operators are then modelled, not timed on the
        device (``operator_seconds`` must not be True).

    Returns
    -------
    PayloadTrace
        With ``bucket_assignment`` saying which order was used and ``forward_flops`` (per
        sample) where the model's forward can run on the meta device.

    Raises
    ------
    ConfigError
        A bad argument, named with its value; or a model whose step's weights, gradients and
        momentum do not fit the memory free on ``device`` (:func:`qsgd.stepmemory.check_fits`,
        before the model is built).

    Examples
    --------
    >>> import qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> trace.parameters, trace.num_iterations, trace.buckets[0].numel == 235146
    (235146, 1, True)
    >>> trace.mean_payload_bytes(0) == qsgd.payload_nbytes(trace.buckets[0].compressed_numel,
    ...                                                    trace.config)
    True
    """
    if not isinstance(cfg, QSGDConfig):
        raise ConfigError(f"cfg must be a QSGDConfig, got {type(cfg).__name__}")
    _check_int("iterations", iterations, 1)
    _check_int("batch_size", batch_size, 1)
    _check_int("min_numel", min_numel, 0)
    _check_int("seed", seed, 0)
    _check_int("warmup", warmup, 1 if bucket_order == "ready" else 0)
    _check_int("variance_samples", variance_samples, 1)
    variance_bits = tuple(variance_bits)
    for b in variance_bits:
        if not is_int(b) or not 2 <= b <= 16:
            raise ConfigError(f"variance_bits: each width must be an int in [2, 16], got {b!r}")
    if len(set(variance_bits)) != len(variance_bits):
        raise ConfigError(f"variance_bits: widths must be distinct, got {list(variance_bits)}")
    if bucket_order not in BUCKET_ORDERS:
        raise ConfigError(f"bucket_order must be one of {sorted(BUCKET_ORDERS)}, got {bucket_order!r}")
    if checkpointing != "none" and operator_seconds:
        raise ConfigError(f"operator_seconds=True times a step without activation checkpointing; "
                          f"with checkpointing={checkpointing!r} the operators are modelled "
                          f"(leave it None)")
    meta = device == "meta"
    dev = torch.device("meta") if meta else resolve_device(device)
    if meta and cfg.codec != "packed":
        raise ConfigError(f"device='meta' needs the packed codec (its payload sizes are exact), "
                          f"got codec={cfg.codec!r}")

    if isinstance(model, str):
        name = model
        if not meta:
            # counted on the meta device first: a model whose step cannot fit is refused
            # before its weights are made (building a 7B model alone fills 27 GB)
            try:
                with torch.device("meta"):
                    size = sum(p.numel() for p in build_model(model).parameters())
            except (RuntimeError, NotImplementedError):
                size = 0    # a user's model that cannot be built on meta: not known beforehand
            check_fits(name, size, dev)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if meta:
                with torch.device("meta"):
                    model = build_model(model)
            else:
                model = build_model(model)
    elif isinstance(model, nn.Module):
        name = model_name(model)
        if not meta:
            check_fits(name, sum(p.numel() for p in model.parameters()), dev)
    else:
        raise ConfigError(f"model must be an nn.Module or a model name, got {type(model).__name__}")
    if input_shape is None:
        input_shape = getattr(model, "input_shape", None)
    if not input_shape or any(not is_int(n) or n < 1 for n in input_shape):
        raise ConfigError(f"input_shape must be a tuple of ints >= 1 for model {name!r} "
                          f"(it has no input_shape of its own), got {input_shape!r}")
    input_shape = tuple(input_shape)
    if meta:
        return _layout_trace(model, name, cfg, input_shape, min_numel, seed, bucket_cap_bytes,
                             first_bucket_bytes, bucket_order,
                             dict(families=families, checkpointing=checkpointing))
    model = model.to(dev).train()
    params = ddp_parameters(model)
    if not params:
        raise ConfigError(f"model {name!r} has no trainable parameters")
    # Validate caps now, not after a warm-up iteration of a large model.
    ddp_buckets(model, bucket_cap_bytes, first_bucket_bytes, **BUCKET_ORDERS[bucket_order])

    clock = _Clock(dev)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD([p for _, p in params], lr=lr, momentum=0.9)
    marks: dict[str, object] = {}
    order: list[str] = []

    def on_ready(pname: str):
        def hook(_p):
            marks[pname] = clock.mark()
            order.append(pname)
        return hook

    handles = [p.register_post_accumulate_grad_hook(on_ready(n)) for n, p in params]
    try:
        buckets = None
        if bucket_order != "ready":
            buckets = ddp_buckets(model, bucket_cap_bytes, first_bucket_bytes, **BUCKET_ORDERS[bucket_order])
        records: list[TraceIteration] = []
        sums: dict[int, dict] = {}
        for it in range(warmup + iterations):
            recorded = it >= warmup
            step = _train_step(model, optimizer, batch_size, input_shape, generator, dev, clock, marks, order)
            if buckets is None:  # the first warm-up iteration gives DDP's rebuild order
                buckets = ddp_buckets(model, bucket_cap_bytes, first_bucket_bytes, ready_order=list(order))
            timings = _codec_pass(model, buckets, cfg, min_numel, seed, it - warmup if recorded else 0,
                                  clock, step)
            if recorded and variance_bits:
                _variance_pass(model, buckets, cfg, min_numel, seed, it - warmup, variance_bits,
                               variance_samples, sums)
            if recorded:
                forward_s, backward_s, optimizer_s, _ = step
                records.append(TraceIteration(it - warmup, forward_s, backward_s, optimizer_s, tuple(timings)))
                if progress is not None:
                    sent = sum(t.wire_bytes for t in timings)
                    progress(f"iteration {it - warmup + 1}/{iterations}: forward {forward_s * 1e3:.1f} ms, "
                             f"backward {backward_s * 1e3:.1f} ms, {len(buckets)} buckets, {sent} bytes")
    finally:
        for h in handles:
            h.remove()

    try:
        flops = forward_flops(model, input_shape)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        flops = 0  # a model whose forward cannot run on the meta device: leave the field out
    extra = {"threads": torch.get_num_threads()}
    if flops > 0:
        extra["forward_flops"] = flops
    if dev.type == "cpu":
        # the measuring CPU's achieved rates, kept as a record of where it was measured
        extra["host"] = measure_host()
    return PayloadTrace(
        model=name, parameters=sum(p.numel() for _, p in params), device=str(dev),
        device_name=device_name(dev), torch_version=torch.__version__, batch_size=batch_size,
        input_shape=input_shape, config=cfg, min_numel=min_numel, bucket_cap_bytes=bucket_cap_bytes,
        first_bucket_bytes=first_bucket_bytes, seed=seed,
        buckets=tuple(TraceBucket(b.index, b.numel, b.names, *b.split(min_numel),
                                  _shapes(b, params),
                                  variance=_variance_record(sums.get(b.index), variance_bits,
                                                            variance_samples, iterations))
                      for b in buckets),
        iterations=tuple(records), bucket_assignment=bucket_order, extra=extra,
        operators=_operators(model, input_shape, batch_size, dev, operators, operator_seconds,
                             dict(families=families, checkpointing=checkpointing)),
    )


def _operators(model, input_shape, batch_size, dev, operators: bool, seconds: bool | None,
               how: dict):
    """The trace's operator records (``how``: :func:`qsgd.record_operators`' families and
    checkpointing), with one timed step's seconds on a GPU (a step without checkpointing)."""
    if not operators:
        return None
    ops = record_operators(model, input_shape=input_shape, **how)
    if seconds if seconds is not None else (dev.type == "cuda" and how["checkpointing"] == "none"):
        import dataclasses

        from qsgd.operators.measured import time_operators

        ops = dataclasses.replace(ops, measured=time_operators(model, batch_size,
                                                               input_shape=input_shape))
    return ops


def _shapes(bucket, params) -> dict:
    """``{"shapes": [...]}``: each of the bucket's parameters' shape, in bucket order (kept in
    the trace's bucket records for the transports that compress a tensor as a matrix)."""
    shape = {n: list(p.shape) or [1] for n, p in params}
    return {"shapes": [shape[n] for n in bucket.names]}


def _layout_trace(model, name, cfg, input_shape, min_numel, seed, bucket_cap_bytes,
                  first_bucket_bytes, bucket_order, how: dict) -> PayloadTrace:
    """A trace of ``model``'s layout and operators with no step run (``device="meta"``)."""
    params = ddp_parameters(model)
    if not params:
        raise ConfigError(f"model {name!r} has no trainable parameters")
    ops = record_operators(model, input_shape=input_shape, **how)
    if bucket_order == "ready":
        # DDP's rebuilt buckets follow the order the gradients became ready in backward
        # (the same parameters in the same order in every family; fp32's where recorded)
        ready = ops.family("fp32" if "fp32" in ops.families else next(iter(ops.families))).ready
        order = sorted(ready, key=lambda n: ready[n])
        buckets = ddp_buckets(model, bucket_cap_bytes, first_bucket_bytes, ready_order=order)
    else:
        buckets = ddp_buckets(model, bucket_cap_bytes, first_bucket_bytes, **BUCKET_ORDERS[bucket_order])
    timings = []
    for b in buckets:
        comp, raw = b.split(min_numel)
        timings.append(BucketTiming(b.index, 0.0, qsgd.payload_nbytes(comp, cfg) if comp else 0,
                                    FP32_BYTES * raw, 0.0, 0.0))
    return PayloadTrace(
        model=name, parameters=sum(p.numel() for _, p in params), device="meta",
        device_name="meta device (shapes only, nothing run)", torch_version=torch.__version__,
        batch_size=1, input_shape=input_shape, config=cfg, min_numel=min_numel,
        bucket_cap_bytes=bucket_cap_bytes, first_bucket_bytes=first_bucket_bytes, seed=seed,
        buckets=tuple(TraceBucket(b.index, b.numel, b.names, *b.split(min_numel), _shapes(b, params))
                      for b in buckets),
        iterations=(TraceIteration(0, 0.0, 0.0, 0.0, tuple(timings)),),
        bucket_assignment=bucket_order, operators=ops)


def _train_step(model, optimizer, batch_size, input_shape, generator, dev, clock, marks, order):
    """One real step; returns (forward_s, backward_s, optimizer_s, {name: ready_s})."""
    optimizer.zero_grad(set_to_none=True)
    if hasattr(model, "example_input"):
        x = model.example_input(batch_size, generator=generator, device=dev)
    else:
        x = torch.randn((batch_size, *input_shape), generator=generator).to(dev)
    target = (model.example_target(batch_size, generator=generator, device=dev)
              if hasattr(model, "example_target") and hasattr(model, "loss") else None)
    marks.clear()
    order.clear()
    clock.sync()
    t0 = clock.mark()
    out = model(x)
    loss = model.loss(out, target) if target is not None else _default_loss(out, generator)
    t1 = clock.mark()
    loss.backward()
    t2 = clock.mark()
    optimizer.step()
    t3 = clock.mark()
    clock.sync()
    ready = {n: clock.seconds(t1, m) for n, m in marks.items()}
    return clock.seconds(t0, t1), clock.seconds(t1, t2), clock.seconds(t2, t3), ready


@torch.no_grad()
def _codec_pass(model, buckets, cfg, min_numel, seed, step, clock, train_step) -> list[BucketTiming]:
    """Encode and decode each bucket's compressed gradients; one timing record per bucket."""
    _, backward_s, _, ready = train_step
    grads = {}
    for n, p in model.named_parameters():
        if p.requires_grad:
            grads[n] = p.grad if p.grad is not None else torch.zeros_like(p)  # unused: DDP sends zeros
    out = []
    for b in buckets:
        # A parameter that got no gradient is ready when backward ends, as DDP marks it then.
        ready_s = min(backward_s, max(ready.get(n, backward_s) for n in b.names))
        comp, raw = b.split(min_numel)
        payload_bytes, encode_s, decode_s, extra = 0, 0.0, 0.0, {}
        if comp:
            # The compressed part of DDP's flat bucket buffer, in the bucket's order.
            flat = torch.cat([grads[n].reshape(-1) for n in b.compressed_names(min_numel)])
            clock.sync()
            t0 = clock.mark()
            payload = qsgd.encode(flat, cfg, seed, step=step, bucket=b.index)
            t1 = clock.mark()
            decoded = qsgd.decode(payload)
            t2 = clock.mark()
            clock.sync()
            encode_s, decode_s = clock.seconds(t0, t1), clock.seconds(t1, t2)
            payload_bytes = int(payload.numel())
            norm = float(flat.float().norm())
            extra["rel_error"] = float((decoded.float() - flat.float()).norm()) / norm if norm > 0 else 0.0
        out.append(BucketTiming(b.index, ready_s, payload_bytes, FP32_BYTES * raw, encode_s, decode_s, extra))
    return out


@torch.no_grad()
def _variance_pass(model, buckets, cfg, min_numel, seed, step, bits, samples, sums: dict) -> None:
    """Add one iteration's squared norms and quantization errors per bucket and width to ``sums``."""
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}

    def norm_sq(names):
        return sum(float(grads[n].double().square().sum()) for n in names if n in grads)

    for b in buckets:
        acc = sums.setdefault(b.index, {"norm_sq": 0.0, "raw_norm_sq": 0.0, "err": None, "bound": None,
                                        "params": {}})
        acc["raw_norm_sq"] += norm_sq(b.raw_names(min_numel))
        names = b.compressed_names(min_numel)
        if not names:
            continue
        parts = [grads[n].reshape(-1) if n in grads else torch.zeros(k, device=next(model.parameters()).device)
                 for n, k in zip(b.names, b.numels) if n in names]
        flat = torch.cat(parts).cpu()
        got = variance_ratios(flat, cfg, bits, samples=samples, seed=seed + 1, step=step,
                              segments=[t.numel() for t in parts])
        acc["norm_sq"] += float(flat.double().square().sum())
        err = [sum(got[w].segments) for w in bits]
        acc["err"] = err if acc["err"] is None else [a + e for a, e in zip(acc["err"], err)]
        acc["bound"] = [got[w].bound for w in bits]
        for j, (n, t) in enumerate(zip(names, parts)):
            p = acc["params"].setdefault(n, {"norm_sq": 0.0, "err": [0.0] * len(bits)})
            p["norm_sq"] += float(t.double().square().sum())
            p["err"] = [a + got[w].segments[j] for a, w in zip(p["err"], bits)]


def _variance_record(acc, bits, samples, iterations) -> BucketVariance | None:
    """Means over ``iterations`` of :func:`_variance_pass`'s sums; ratios of the summed errors
    to the summed squared norms (an iteration with a larger gradient weighs more, as in
    the whole-run variance)."""
    if acc is None or not bits:
        return None

    def ratios(err, norm):
        return tuple(e / norm if norm > 0 else 0.0 for e in err) if err is not None else (0.0,) * len(bits)

    params = tuple(ParamVariance(n, p["norm_sq"] / iterations, ratios(p["err"], p["norm_sq"]))
                   for n, p in acc["params"].items())
    bound = tuple(acc["bound"]) if acc["bound"] is not None else (0.0,) * len(bits)
    return BucketVariance(tuple(bits), samples, acc["norm_sq"] / iterations, acc["raw_norm_sq"] / iterations,
                          ratios(acc["err"], acc["norm_sq"]), bound, params)
