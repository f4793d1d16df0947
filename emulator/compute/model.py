"""How long one training iteration computes on the target GPU (:class:`ComputeModel`).

Three ways to get the seconds the replay needs (forward, backward with each DDP bucket's
ready time, the optimizer step, and each bucket's QSGD encode and decode):

- **operators** (:meth:`ComputeModel.for_device`): the trace's operator records
  (:mod:`qsgd.operators`) timed on a GPU of :data:`~emulator.compute.devices.DEVICES` at a
  per-GPU batch and a precision (:mod:`~emulator.compute.rules`,
  :mod:`~emulator.compute.timeline`), the codec from the bytes its kernels move
  (:mod:`~emulator.compute.codec`). Nothing of the measuring machine enters: the same trace
  gives the same seconds on any machine, busy or quiet.
- **measured** (:meth:`ComputeModel.measured`): the trace's own seconds, for replaying a trace
  on the machine it was measured on (the namespace testbed, a GPU trace as it ran).
- **given** (:meth:`ComputeModel.given`): forward, backward and optimizer seconds from the user.

``compute_scale`` and ``codec_scale`` multiply the result of any of them (0 makes compute or
the codec free, which the replay's limit tests use).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from emulator.errors import ConfigError
from emulator._checks import is_int, is_number
from .attention import ATTENTION_KERNELS, DEFAULT_ATTENTION, attention_kernel
from .codec import CODECS, codec_seconds
from .devices import device as device_named
from .precisions import default_precision, precision as precision_named
from .timeline import step_times


def _measured_seconds(measured, batch: int, dev, prec, attention: str):
    """``(operators, seconds, how)`` from a trace's measured step where it applies (a GPU of the
    catalogue, the same batch and operator family), else None: on the GPU it ran on, its
    seconds as they are; on another, each scaled by the model's ratio for that operator
    between the two GPUs (so a kernel keeps its measured share of its own roofline)."""
    from .devices import device_named_as
    from .rules import kernel_seconds

    if measured is None or measured.batch_size != batch or measured.precision != prec.name:
        return None
    src = device_named_as(measured.device_name)
    if src is None:
        return None
    ops = measured.operators
    if src.name == dev.name:
        return ops, measured.seconds, f"the trace's per-operator seconds measured on {src.name}"
    seconds = []
    for op, s in zip(ops.ops, measured.seconds):
        there = kernel_seconds(op, batch, src, prec.mode(op.kind, op.dtype, src), attention)
        here = kernel_seconds(op, batch, dev, prec.mode(op.kind, op.dtype, dev), attention)
        seconds.append(s * here / there if there > 0 else here)
    return ops, tuple(seconds), (f"the trace's per-operator seconds measured on {src.name}, "
                                 f"each scaled by the model's {src.name}-to-{dev.name} ratio")


def _div(pair: tuple[int, int], k: int) -> tuple[int, int]:
    """An affine count's share of one of ``k`` shards."""
    return -(-pair[0] // k), -(-pair[1] // k)


@dataclass(frozen=True)
class UnitTimes:
    """Where a sharded step's units compute (:meth:`ComputeModel.unit_times`), seconds.

    Attributes
    ----------
    forward_s, backward_s, optimizer_s : float
        The phases (the optimizer on one shard).
    forward_start : tuple of float
        Per unit, from the start of forward until its first operator would start.
    backward_start, ready : tuple of float
        Per unit, from the start of backward until its backward starts and until its last
        gradient is ready.
    """

    forward_s: float
    backward_s: float
    optimizer_s: float
    forward_start: tuple = field(default=())
    backward_start: tuple = field(default=())
    ready: tuple = field(default=())


def _seconds(name: str, value) -> float | None:
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ComputeModel:
    """Compute seconds of one iteration (module docstring).

    Parameters
    ----------
    compute_scale, codec_scale : float
        Multiply the compute seconds (forward, backward, ready times, optimizer) and the
        codec's seconds.
    forward_s, backward_s, optimizer_s : float or None
        Phase seconds; None takes the trace's measured ones.
    ready_s : tuple of float or None
        Per bucket of the trace the model was built for, seconds from the start of backward
        until the bucket is ready; None takes the measured offsets (stretched to
        ``backward_s`` when that is given).
    device : str
        The target GPU (a :data:`~emulator.compute.devices.DEVICES` key), ``"measured"`` or
        ``"custom"``.
    precision : str or None
        The training precision (:data:`~emulator.compute.precisions.PRECISIONS`).
    batch_size : int or None
        Samples per GPU the seconds are for (None: the trace's).
    grad_bytes : int
        Bytes per gradient element DDP all-reduces at this precision (4, or 2 in pure bf16).
    codec_device : str or None
        The GPU whose memory times the codec; None replays the trace's measured codec seconds.
    codec_kind : str
        Which codec that GPU runs (:data:`~emulator.compute.codec.CODECS`: ``"today"``, as
        measured, or ``"fused"``, the GPU-codec issue's single-pass target).
    source : str
        What was assumed, for the study's rows.
    memory_bytes : float or None
        The GPU's memory (bytes) where the part run differs from the catalogue's ``device``
        in it alone (a published run's stated part); None: the catalogue's.
    attention : str
        The fused attention kernel the operators run
        (:data:`~emulator.compute.attention.ATTENTION_KERNELS`; default FlashAttention-2).

    Examples
    --------
    ResNet-50 at batch 256 in bf16 autocast on an A100, from its operator records:

    >>> import emulator, qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="meta", seed=0)
    >>> m = emulator.ComputeModel.for_device("A100", trace, batch_size=256, precision="amp-bf16")
    >>> m.device, m.precision, m.batch_size, m.grad_bytes
    ('A100-80GB', 'amp-bf16', 256, 4)
    >>> fwd, bwd, opt, ready = m.phases(trace)
    >>> 0 < fwd < bwd and len(ready) == trace.num_buckets
    True
    """

    compute_scale: float = 1.0
    codec_scale: float = 1.0
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    ready_s: tuple | None = None
    device: str = "measured"
    precision: str | None = None
    batch_size: int | None = None
    grad_bytes: int = 4
    codec_device: str | None = None
    source: str = "measured seconds"
    codec_kind: str = "today"
    memory_bytes: float | None = None
    attention: str = DEFAULT_ATTENTION

    def __post_init__(self):
        for name in ("compute_scale", "codec_scale"):
            v = getattr(self, name)
            if not is_number(v) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"ComputeModel.{name} must be a finite number >= 0, got {v!r}")
        for name in ("forward_s", "backward_s", "optimizer_s"):
            _seconds(f"ComputeModel.{name}", getattr(self, name))
        if self.ready_s is not None:
            object.__setattr__(self, "ready_s", tuple(
                _seconds(f"ComputeModel.ready_s[{k}]", v) for k, v in enumerate(self.ready_s)))
        if self.batch_size is not None and (not is_int(self.batch_size) or self.batch_size < 1):
            raise ConfigError(f"ComputeModel.batch_size must be a positive int, got {self.batch_size!r}")
        if self.grad_bytes not in (2, 4):
            raise ConfigError(f"ComputeModel.grad_bytes must be 2 or 4, got {self.grad_bytes!r}")
        if self.codec_device is not None:
            device_named(self.codec_device)
        if self.memory_bytes is not None and (not is_number(self.memory_bytes)
                                              or not math.isfinite(self.memory_bytes)
                                              or self.memory_bytes <= 0):
            raise ConfigError(f"ComputeModel.memory_bytes must be a number of bytes > 0, got "
                              f"{self.memory_bytes!r}")
        if self.codec_kind not in CODECS:
            raise ConfigError(f"ComputeModel.codec_kind must be one of {list(CODECS)}, got "
                              f"{self.codec_kind!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise ConfigError(f"ComputeModel.attention must be one of {sorted(ATTENTION_KERNELS)}, "
                              f"got {self.attention!r}")

    # ---------------------------------------------------------------- what replay asks
    @property
    def sms(self) -> int | None:
        """Streaming multiprocessors of the target GPU (its datasheet's); None for measured
        seconds (a CPU's) or a custom device."""
        from .devices import DEVICES

        return DEVICES[self.device].sms if self.device in DEVICES else None

    def sm_share(self, blocks: int) -> float:
        """Share of the target GPU's SMs a collective's kernel of ``blocks`` thread blocks
        takes from the compute while it runs (:meth:`emulator.Network.blocks`: no matrix
        product's block fits beside one of NCCL's on an SM); at most all but one SM, 0
        without a GPU.

        >>> ComputeModel(device="H100-SXM").sm_share(16), ComputeModel().sm_share(16)
        (0.12121212121212122, 0.0)
        """
        sms = self.sms
        return min(int(blocks), sms - 1) / sms if sms else 0.0

    def phases(self, trace) -> tuple[float, float, float, tuple[float, ...]]:
        """``(forward_s, backward_s, optimizer_s, ready_s)`` for ``trace``, ``ready_s`` one
        offset into backward per bucket (seconds)."""
        fwd_m = trace.mean_iteration("forward_s")
        bwd_m = trace.mean_iteration("backward_s")
        opt_m = trace.mean_iteration("optimizer_s")
        fwd = fwd_m if self.forward_s is None else self.forward_s
        opt = opt_m if self.optimizer_s is None else self.optimizer_s
        bwd = bwd_m if self.backward_s is None else self.backward_s
        if self.ready_s is not None:
            if len(self.ready_s) != trace.num_buckets:
                raise ConfigError(f"ComputeModel.ready_s has {len(self.ready_s)} buckets, the "
                                  f"trace {trace.num_buckets}: it was built for another trace")
            ready = self.ready_s
        else:
            stretch = bwd / bwd_m if self.backward_s is not None and bwd_m > 0 else 1.0
            if self.backward_s is not None and bwd_m == 0:
                stretch = 0.0
            ready = tuple(trace.mean_ready_s(k) * stretch for k in range(trace.num_buckets))
        s = self.compute_scale
        return fwd * s, bwd * s, opt * s, tuple(r * s for r in ready)

    def codec(self, trace, k: int, cfg) -> tuple[float, float]:
        """``(encode_s, decode_s)`` of ``trace``'s bucket ``k`` at QSGD config ``cfg`` (one
        payload each way; the compressed elements only)."""
        b = trace.buckets[k]
        if b.compressed_numel == 0:
            return 0.0, 0.0
        if self.codec_device is not None:
            dev = device_named(self.codec_device)
            enc = codec_seconds("encode", b.compressed_numel, cfg.bits, dev, self.codec_kind)
            dec = codec_seconds("decode", b.compressed_numel, cfg.bits, dev, self.codec_kind)
        else:
            import qsgd

            enc, dec = trace.mean_encode_s(k), trace.mean_decode_s(k)
            measured = trace.mean_payload_bytes(k)
            if cfg != trace.config and measured > 0:
                ratio = qsgd.payload_nbytes(b.compressed_numel, cfg) / measured
                enc, dec = enc * ratio, dec * ratio
        return enc * self.codec_scale, dec * self.codec_scale

    def unit_times(self, trace, units, *, shards: int = 1) -> "UnitTimes":
        """Where each unit of a sharded step (lists of parameter names) computes, from the
        trace's operators on this model's GPU, batch and precision.

        A unit's forward starts where the first operator reading one of its parameters would
        start (``first_use``): its gathered parameters must be there by then. In backward a
        unit's gradients are all ready when the last of them is (``ready``), and its backward
        starts when the last gradient of another unit that precedes its first was ready
        (autocast's backward reads the weights' casts, not the parameters, so ``first_use``
        cannot place it). The optimizer step runs on ``1 / shards`` of every parameter (a
        sharded optimizer state): its operators' bytes and FLOPs divided by ``shards``, their
        launches as many.

        Parameters
        ----------
        trace : qsgd.PayloadTrace
            With operator records.
        units : sequence of sequence of str
            Parameter names per unit.
        shards : int
            Ranks the optimizer state is sharded over.

        Returns
        -------
        UnitTimes

        Examples
        --------
        >>> import emulator, qsgd
        >>> trace = qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta")
        >>> m = emulator.ComputeModel.for_device("H100", trace, batch_size=8)
        >>> units = [u.params for u in qsgd.units_of(trace.operators.parameters)]
        >>> t = m.unit_times(trace, units, shards=8)
        >>> t.forward_start[1] < t.forward_start[2] and t.ready[2] < t.ready[1]   # blocks in order
        True
        >>> t.optimizer_s < m.phases(trace)[2]                  # an eighth of the update
        True
        """
        if self.precision is None or self.batch_size is None or self.device in ("measured", "custom"):
            raise ConfigError(f"unit_times needs a model timed from operator records "
                              f"(ComputeModel.for_device), not {self.source!r}")
        if not is_int(shards) or shards < 1:
            raise ConfigError(f"shards must be an int >= 1, got {shards!r}")
        dev = device_named(self.device)
        prec = precision_named(self.precision)
        ops = trace.operators.family(prec.family)
        times = step_times(ops, self.batch_size, dev, prec, attention=self.attention)
        opt_s = times.optimizer_s
        if shards > 1:
            cut = tuple(replace(o, bytes=_div(o.bytes, shards), flops=_div(o.flops, shards))
                        if o.phase == "optimizer" else o for o in ops.ops)
            opt_s = step_times(type(ops)(ops.family, cut, ops.ready, ops.optimizer),
                               self.batch_size, dev, prec, attention=self.attention).optimizer_s
        fwd_end = times.forward_s
        ready_of = {n: times.ready_s.get(n, times.backward_s) for n in ops.ready}
        starts, readies, bwd_starts = [], [], []
        for names in units:
            names = tuple(names)
            firsts = [ops.first_use[n][0] for n in names
                      if n in ops.first_use and ops.first_use[n][0] is not None]
            f = min(firsts, default=0)
            starts.append(times.ends[f - 1] if f > 0 else 0.0)
            own = [ready_of.get(n, times.backward_s) for n in names]
            readies.append(max(own, default=times.backward_s))
            first = min(own, default=0.0)
            before = [r for n, r in ready_of.items() if n not in names and r <= first]
            bwd_starts.append(max(before, default=0.0))
        s = self.compute_scale
        return UnitTimes(fwd_end * s, times.backward_s * s, opt_s * s,
                         tuple(x * s for x in starts), tuple(x * s for x in bwd_starts),
                         tuple(x * s for x in readies))

    def to_dict(self) -> dict:
        return {"device": self.device, "precision": self.precision, "batch_size": self.batch_size,
                "grad_bytes": self.grad_bytes, "source": self.source,
                "compute_scale": self.compute_scale, "codec_scale": self.codec_scale,
                "forward_s": self.forward_s, "backward_s": self.backward_s,
                "optimizer_s": self.optimizer_s, "codec_device": self.codec_device,
                "codec": self.codec_kind, "memory_bytes": self.memory_bytes,
                "attention": self.attention}

    # ---------------------------------------------------------------- constructors
    @classmethod
    def measured(cls) -> "ComputeModel":
        """The trace's seconds as measured."""
        return cls()

    @classmethod
    def given(cls, forward_s: float, backward_s: float, optimizer_s: float = 0.0, *,
              codec_scale: float = 1.0) -> "ComputeModel":
        """User-given compute seconds (encode/decode: measured times times ``codec_scale``)."""
        for name, v in (("forward_s", forward_s), ("backward_s", backward_s), ("optimizer_s", optimizer_s)):
            if v is None:
                raise ConfigError(f"ComputeModel.given: {name} is required, got None")
        return cls(1.0, codec_scale, forward_s, backward_s, optimizer_s, device="custom",
                   source="user-given seconds")

    @classmethod
    def for_device(cls, target: str, trace, *, batch_size: int | None = None,
                   precision: str | None = None, codec: str = "today",
                   attention: str | None = None) -> "ComputeModel":
        """``trace``'s step timed from its operator records on GPU ``target``.

        Parameters
        ----------
        target : str
            A :data:`~emulator.compute.devices.DEVICES` key or alias, or ``"measured"`` (the
            trace's own seconds).
        trace : qsgd.PayloadTrace
            With operator records (``trace.operators``; ``qsgd-emu measure`` records them).
        batch_size : int, optional
            Samples per GPU (default: the model's training batch, else the trace's).
        precision : str, optional
            A :data:`~emulator.compute.precisions.PRECISIONS` key (default: what people train
            with on ``target``, :func:`~emulator.compute.precisions.default_precision`).
        codec : str
            :data:`~emulator.compute.codec.CODECS` key: QSGD's codec on the GPU.
        attention : str, optional
            The fused attention kernel (:data:`~emulator.compute.attention.ATTENTION_KERNELS`;
            default ``flash2``, what PyTorch's SDPA runs).
        """
        kernel = attention_kernel(DEFAULT_ATTENTION if attention is None else attention)
        if target == "measured":
            # the trace's own seconds: no kernel changes them, and a kernel asked for is said so
            return cls() if attention is None else cls(source=(
                f"measured seconds; attention kernel {kernel.name!r} not applied: the device "
                f"'measured' replays the trace's own seconds"))
        dev = device_named(target)
        prec = default_precision(dev) if precision is None else precision_named(precision)
        prec.check(dev)
        ops = getattr(trace, "operators", None)
        if ops is None:
            raise ConfigError(f"trace of {trace.model!r} has no operator records to time on "
                              f"{dev.name}: measure it again with this version (qsgd-emu measure)")
        assumed = "given"
        if batch_size is None:
            batch_size = ops.training_batch_size or trace.batch_size
            assumed = "the model's training batch" if ops.training_batch_size else "the trace's batch"
        if not is_int(batch_size) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        measured = _measured_seconds(ops.measured, batch_size, dev, prec, kernel.name)
        if measured is not None:
            opset, seconds, how = measured
            times = step_times(opset, batch_size, dev, prec, seconds, attention=kernel.name)
        else:
            opset = ops.family(prec.family)
            times = step_times(opset, batch_size, dev, prec, attention=kernel.name)
            how = f"per-operator roofline of the trace's operators ({dev.source})"
        if any(op.kind == "attention" for op in opset.ops):
            how += f"; attention: {kernel.label}"
        elif attention is not None:
            how += (f"; attention kernel {kernel.name!r} not applied: the trace has no fused "
                    f"attention operator")
        if ops.extra.get("checkpointing", "none") != "none":
            from qsgd import CHECKPOINTING

            how += f"; activation checkpointing: {CHECKPOINTING[ops.extra['checkpointing']]}"
        ready = tuple(max((times.ready_s.get(p, times.backward_s) for p in b.params), default=0.0)
                      for b in trace.buckets)
        if codec not in CODECS:
            raise ConfigError(f"codec must be one of {list(CODECS)}, got {codec!r}")
        what = ("today's codec" if codec == "today" else
                "a single-pass codec at half the copy bandwidth (the GPU-codec issue's target)")
        source = (f"{dev.name} {prec.name} at batch {batch_size} per GPU ({assumed}): {how}; "
                  f"{what}, from its bytes at {dev.mem_bandwidth / 1e9:.0f} GB/s")
        return cls(1.0, 1.0, times.forward_s, times.backward_s, times.optimizer_s, ready,
                   device=dev.name, precision=prec.name, batch_size=batch_size,
                   grad_bytes=prec.grad_bytes, codec_device=dev.name, source=source,
                   codec_kind=codec, attention=kernel.name)

    @classmethod
    def for_topology(cls, G, trace, *, device: str = "auto", batch_size: int | None = None,
                     precision: str | None = None, codec: str = "today",
                     attention: str | None = None) -> "ComputeModel":
        """:meth:`for_device` on topology ``G``'s own GPU (``device="auto"``), or on
        ``device`` (a GPU, or ``"measured"``).

        Raises ConfigError when ``G`` names no GPU and none is given.

        >>> import qsgd, topologies
        >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
        >>> ComputeModel.for_topology(topologies.from_spec("cluster:dgx_h100x1"), trace).device
        'H100-SXM'
        """
        from .devices import DEVICES, device_of

        if device == "auto":
            dev = device_of(G)
            if dev is None:
                raise ConfigError(f"topology {G.graph.get('name', '?')!r} does not name its GPU; "
                                  f"give a device (one of {sorted(DEVICES)}) or 'measured'")
            device = dev.name
        return cls.for_device(device, trace, batch_size=batch_size, precision=precision,
                              codec=codec, attention=attention)

    def scaled(self, compute_scale: float = 1.0, codec_scale: float = 1.0) -> "ComputeModel":
        """The same model with other scales."""
        return replace(self, compute_scale=compute_scale, codec_scale=codec_scale)
