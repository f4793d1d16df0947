"""The wire plan of one gradient bucket: the collectives a transport issues, in order, with their bytes.

The one owner of how a bucket uses the wire. :func:`qsgd.qsgd_hook` executes these plans (it
checks every collective it hands the process group against its bucket's plan),
:func:`emulator.replay` times them on a simulated network, and the validation's prediction and
the testbench's byte counts read them.

A plan is an ordered tuple of steps, each a :class:`Collective` or a :class:`Stage` (local work:
quantize and encode, decode and average). Every step names the step it waits for (``after``,
an index into the plan; None: it starts when the hook is called). Collectives go out one at a
time in plan order (the next once the one before is done, as on NCCL's one stream), and
buckets in the order DDP hands them over, because gloo and NCCL match collectives across ranks
by their order; so a bucket's collectives also queue behind the previous bucket's. Stages run in one of two places (``runs_in``):

``"hook"``
    In the hook itself, i.e. in the thread that runs backward (the autograd thread; on CUDA the
    compute stream): it delays the rest of backward by its duration.
``"callback"``
    Once the collective before it is done, on the hook's callback thread: beside backward (as
    PyTorch's PowerSGD hook decompresses its factors in ``Future.then`` callbacks), one
    callback stage at a time.

Transports (:data:`TRANSPORTS`), for ``p`` ranks and a bucket of ``n`` compressed and ``r`` raw
elements (raw: fewer than ``min_numel`` elements per tensor, sent uncompressed, Alistarh et al.
2017, Section 5):

``fp32`` / ``fp16`` / ``bf16``
    One allreduce of the whole bucket at 4 / 2 / 2 bytes per element (DDP's default hook, its
    ``fp16_compress_hook``, and DDP's default hook on bfloat16 parameters).
``allgather``
    encode (hook) -> [size all_gather, elias codec only] -> payload all_gather of each rank's
    payload with the raw tensors in front -> decode ``p`` payloads and average (callback).
``scatter_reduce_allgather``
    [small-tensor allreduce of the raw tensors, issued on entry so that the encode hides it] ->
    encode ``p`` chunks (hook) -> [chunk size all_to_all, elias] -> chunk all_to_all -> decode the
    ``p`` payloads of the owned chunk, average, re-encode (callback) -> [mean chunk size
    all_gather, elias] -> mean chunk all_gather -> decode ``p`` chunks (callback).

Packed payload sizes are exact (:func:`qsgd.payload_nbytes`); the elias codec's depend on the
data, so its plans take measured sizes and every rank pads to the largest (``exact=False``).

Example
-------
>>> import qsgd
>>> cfg = qsgd.QSGDConfig.from_bits(4)
>>> layout = qsgd.BucketLayout.by_size((1_000_000, 1000), min_numel=10_000)
>>> plan = qsgd.wire_plan("allgather", layout, 4, cfg)
>>> [(c.name, c.op, c.nbytes) for c in plan.collectives]
[('payload all_gather', 'allgather', 511852)]
>>> [s.name for s in plan.stages]
['encode', 'decode']
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from qsgd.codec import payload_nbytes
from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError
from qsgd.wire import overhead_nbytes

__all__ = ["BucketLayout", "Collective", "Stage", "WirePlan", "wire_plan", "wire_bytes", "TRANSPORTS",
           "OPS"]

#: Collective ops a plan uses (the emulator's op names; ``reduce_scatter`` in the sharded
#: plans of :mod:`qsgd.shardplan`).
OPS = ("allreduce", "allgather", "alltoall", "reduce_scatter")
#: bytes per element of the dtypes a plan hands the process group
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "uint8": 1, "int64": 8}
#: the two int64 (payload bytes, elements) each rank contributes to an elias size all_gather
SIZE_META_BYTES = 16
RUNS_IN = ("hook", "callback")


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}: expected an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class BucketLayout:
    """The tensors of one gradient bucket and which of them travel uncompressed.

    Parameters
    ----------
    numels : tuple of int
        Elements of each tensor, in the bucket buffer's order (each >= 1).
    raw : tuple of bool
        Per tensor, whether it is sent uncompressed (at ``element_size`` bytes per element).
    element_size : int
        Bytes per element of the bucket buffer (4 for fp32).
    shapes : tuple of tuple of int, optional
        Each tensor's shape (its elements multiply to ``numels[i]``): the transports that
        compress a tensor as a matrix (PowerSGD, :mod:`qsgd.wiremethods`) need them.
    """

    numels: tuple[int, ...]
    raw: tuple[bool, ...]
    element_size: int = 4
    shapes: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.numels, tuple) or not self.numels:
            raise ConfigError(f"numels: expected a non-empty tuple of ints, got {self.numels!r}")
        for i, n in enumerate(self.numels):
            _int(f"numels[{i}]", n, 1)
        if not isinstance(self.raw, tuple) or len(self.raw) != len(self.numels) \
                or not all(isinstance(r, bool) for r in self.raw):
            raise ConfigError(f"raw: expected a tuple of {len(self.numels)} bools, got {self.raw!r}")
        if self.element_size not in (2, 4, 8):
            raise ConfigError(f"element_size: expected 2, 4 or 8 bytes, got {self.element_size!r}")
        if self.shapes is not None:
            if not isinstance(self.shapes, tuple) or len(self.shapes) != len(self.numels):
                raise ConfigError(f"shapes: expected one shape per tensor ({len(self.numels)}), "
                                  f"got {self.shapes!r}")
            for i, (shape, n) in enumerate(zip(self.shapes, self.numels)):
                if not isinstance(shape, tuple) or not shape or \
                        any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape) \
                        or math.prod(shape) != n:
                    raise ConfigError(f"shapes[{i}]: expected a tuple of positive ints whose "
                                      f"product is numels[{i}]={n}, got {shape!r}")

    @classmethod
    def by_size(cls, numels: Sequence[int], min_numel: int, element_size: int = 4) -> "BucketLayout":
        """The paper's rule: tensors with fewer than ``min_numel`` elements travel raw."""
        _int("min_numel", min_numel, 0)
        numels = tuple(numels)
        return cls(numels, tuple(isinstance(n, int) and n < min_numel for n in numels), element_size)

    @classmethod
    def of(cls, compressed_numel: int, raw_numel: int, element_size: int = 4) -> "BucketLayout":
        """A bucket known only by its totals (a :class:`qsgd.PayloadTrace` bucket)."""
        _int("compressed_numel", compressed_numel, 0)
        _int("raw_numel", raw_numel, 0)
        parts = [(n, r) for n, r in ((compressed_numel, False), (raw_numel, True)) if n]
        if not parts:
            raise ConfigError("compressed_numel + raw_numel: a bucket needs at least one element")
        return cls(tuple(n for n, _ in parts), tuple(r for _, r in parts), element_size)

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def compressed_numel(self) -> int:
        """Elements quantized into the bucket's one QSGD payload."""
        return sum(n for n, r in zip(self.numels, self.raw) if not r)

    @property
    def raw_numel(self) -> int:
        return self.numel - self.compressed_numel

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the uncompressed tensors."""
        return self.raw_numel * self.element_size


@dataclass(frozen=True)
class Collective:
    """One collective of a bucket.

    Parameters
    ----------
    name : str
        What it moves ("payload all_gather", "chunk all_to_all", ...).
    op : {"allreduce", "allgather", "alltoall", "reduce_scatter"}
    dtype : str
        Element type of the tensor handed to the process group (a :data:`DTYPE_BYTES` key).
    nbytes : int
        Bytes each rank hands the process group: the tensor reduced (allreduce, and the whole
        input of a reduce_scatter), contributed (allgather) or sent to all ranks together,
        itself included (alltoall).
    wire_bytes : int
        Bytes one rank sends to the others: ``(p-1) nbytes`` for an allgather (every peer gets
        it), ``(p-1)/p nbytes`` for an alltoall or a reduce_scatter, ``2 (p-1)/p nbytes`` for a
        ring allreduce
        (Patarasuk & Yuan 2009), rounded.
    after : int or None
        Index of the plan step it waits for; None: issued when the hook is called.
    exact : bool
        False when ``nbytes`` rests on measured (elias) payload sizes.
    """

    name: str
    op: str
    dtype: str
    nbytes: int
    wire_bytes: int
    after: int | None
    exact: bool = True

    kind = "collective"

    @property
    def numel(self) -> int:
        """Elements of the tensor handed to the process group."""
        return self.nbytes // DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "op": self.op, "dtype": self.dtype,
                "nbytes": self.nbytes, "wire_bytes": self.wire_bytes, "after": self.after,
                "exact": self.exact}


@dataclass(frozen=True)
class Stage:
    """Local work of a bucket: quantize and encode, decode and average.

    Parameters
    ----------
    name : {"encode", "reduce", "decode"}
    runs_in : {"hook", "callback"}
        In the hook (delays backward) or in the previous collective's completion callback.
    encode_numel : int
        Elements quantized and encoded.
    decode_numel : int
        Elements decoded, over all payloads decoded.
    payloads : int
        Payloads decoded.
    after : int or None
        Index of the plan step it waits for; None: it starts when the hook is called.
    """

    name: str
    runs_in: str
    encode_numel: int = 0
    decode_numel: int = 0
    payloads: int = 0
    after: int | None = None

    kind = "stage"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "runs_in": self.runs_in,
                "encode_numel": self.encode_numel, "decode_numel": self.decode_numel,
                "payloads": self.payloads, "after": self.after}


@dataclass(frozen=True)
class WirePlan:
    """The ordered steps of one bucket under one transport (see the module docstring)."""

    transport: str
    world_size: int
    layout: BucketLayout
    config: object | None
    steps: tuple

    @property
    def collectives(self) -> tuple[Collective, ...]:
        """The collectives, in the order they are issued."""
        return tuple(s for s in self.steps if isinstance(s, Collective))

    @property
    def stages(self) -> tuple[Stage, ...]:
        return tuple(s for s in self.steps if isinstance(s, Stage))

    @property
    def wire_bytes(self) -> int:
        """Bytes one rank sends to the others for this bucket."""
        return sum(c.wire_bytes for c in self.collectives)

    @property
    def exact(self) -> bool:
        return all(c.exact for c in self.collectives)

    def to_dict(self) -> dict:
        return {"transport": self.transport, "world_size": self.world_size,
                "numels": list(self.layout.numels), "raw": list(self.layout.raw),
                "element_size": self.layout.element_size,
                "config": None if self.config is None else self.config.to_dict(),
                "steps": [s.to_dict() for s in self.steps],
                **({} if self.layout.shapes is None else
                   {"shapes": [list(s) for s in self.layout.shapes]})}


# ---------------------------------------------------------------- byte accounting
def wire_bytes(op: str, nbytes: int, p: int) -> int:
    """Bytes one of ``p`` ranks sends to the others when it hands ``nbytes`` to collective ``op``
    (see :class:`Collective`)."""
    if op not in OPS:
        raise ConfigError(f"op: expected one of {list(OPS)}, got {op!r}")
    if p == 1:
        return 0
    if op == "allgather":
        return (p - 1) * nbytes
    if op in ("alltoall", "reduce_scatter"):
        # a ring reduce-scatter of an ``nbytes`` input passes on (p-1) of its p segments
        return round((p - 1) * nbytes / p)
    return round(2 * (p - 1) * nbytes / p)


def _coll(name, op, dtype, nbytes, p, after, exact=True) -> Collective:
    return Collective(name, op, dtype, int(nbytes), wire_bytes(op, int(nbytes), p), after, exact)


def chunk_numels(numel: int, p: int) -> list[int]:
    """Elements of the ``p`` chunks ``torch.tensor_split`` cuts ``numel`` elements into."""
    base, extra = divmod(numel, p)
    return [base + (1 if j < extra else 0) for j in range(p)]


def _payload(numel: int, whole: int, cfg: QSGDConfig, measured) -> int:
    """Payload bytes of ``numel`` of the bucket's ``whole`` compressed elements: exact for the
    packed codec; for elias the measured body pro rata plus one header and CRC."""
    if cfg.codec == "packed":
        return payload_nbytes(numel, cfg)
    over = overhead_nbytes(1)
    return over + math.ceil(max(0, measured - over) * numel / whole) if whole else over


def _measured(cfg: QSGDConfig, payload_bytes, p: int) -> int | None:
    """The largest rank's payload (every rank pads to it); None for the packed codec."""
    if cfg.codec == "packed":
        return None
    if payload_bytes is None:
        raise ConfigError(f"payload_bytes: the {cfg.codec} codec's payload size depends on the "
                          "data; pass the measured bytes (one int, or one per rank)")
    sizes = [payload_bytes] if isinstance(payload_bytes, (int, float)) else list(payload_bytes)
    if not sizes or (len(sizes) != 1 and len(sizes) != p):
        raise ConfigError(f"payload_bytes: expected one size or {p} (one per rank), got {payload_bytes!r}")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise ConfigError(f"payload_bytes: expected sizes >= 0 bytes, got {payload_bytes!r}")
    return math.ceil(max(sizes))


# ---------------------------------------------------------------- transports
def _dense(bytes_per_element: int, dtype: str):
    def plan(layout: BucketLayout, p: int, cfg, payload_bytes) -> tuple:
        if p == 1:
            return ()
        return (_coll("allreduce", "allreduce", dtype, bytes_per_element * layout.numel, p, None),)
    return plan


def _raw_allreduce(layout: BucketLayout, p: int) -> list:
    dtype = {2: "float16", 4: "float32", 8: "float64"}[layout.element_size]
    return [_coll("small-tensor allreduce", "allreduce", dtype, layout.raw_nbytes, p, None)]


def _allgather(layout: BucketLayout, p: int, cfg: QSGDConfig, payload_bytes) -> tuple:
    n = layout.compressed_numel
    if not n:
        return tuple(_raw_allreduce(layout, p)) if p > 1 else ()
    steps: list = [Stage("encode", "hook", encode_numel=n)]
    if p == 1:
        steps.append(Stage("decode", "hook", decode_numel=n, payloads=1, after=0))
        return tuple(steps)
    measured = _measured(cfg, payload_bytes, p)
    size = payload_nbytes(n, cfg) if measured is None else measured
    if measured is not None:
        steps.append(_coll("size all_gather", "allgather", "int64", SIZE_META_BYTES, p, len(steps) - 1))
    # the raw tensors ride in front of the payload: one round trip per bucket, not two
    steps.append(_coll("payload all_gather", "allgather", "uint8", layout.raw_nbytes + size, p,
                       len(steps) - 1, measured is None))
    steps.append(Stage("decode", "callback", decode_numel=p * n, payloads=p, after=len(steps) - 1))
    return tuple(steps)


def _scatter_reduce_allgather(layout: BucketLayout, p: int, cfg: QSGDConfig, payload_bytes) -> tuple:
    n = layout.compressed_numel
    steps: list = _raw_allreduce(layout, p) if layout.raw_numel and p > 1 else []
    if not n:
        return tuple(steps)
    chunks = chunk_numels(n, p)
    big = max(chunks)
    steps.append(Stage("encode", "hook", encode_numel=n))
    measured = _measured(cfg, payload_bytes, p) if p > 1 else None
    exact = measured is None
    sizes = [_payload(c, n, cfg, measured) for c in chunks] if p > 1 else []
    if p == 1:
        # one owner of one chunk: still quantized twice, as on p ranks
        steps.append(Stage("reduce", "hook", encode_numel=n, decode_numel=n, payloads=1,
                           after=len(steps) - 1))
        steps.append(Stage("decode", "hook", decode_numel=n, payloads=1, after=len(steps) - 1))
        return tuple(steps)
    if not exact:
        steps.append(_coll("chunk size all_to_all", "alltoall", "int64", 8 * p, p, len(steps) - 1))
    steps.append(_coll("chunk all_to_all", "alltoall", "uint8", sum(sizes), p, len(steps) - 1, exact))
    # the owner of the largest chunk decodes p payloads of it and re-encodes their mean
    steps.append(Stage("reduce", "callback", encode_numel=big, decode_numel=p * big, payloads=p,
                       after=len(steps) - 1))
    if not exact:
        steps.append(_coll("mean chunk size all_gather", "allgather", "int64", SIZE_META_BYTES, p,
                           len(steps) - 1))
    steps.append(_coll("mean chunk all_gather", "allgather", "uint8", max(sizes), p, len(steps) - 1,
                       exact))
    steps.append(Stage("decode", "callback", decode_numel=n, payloads=p, after=len(steps) - 1))
    return tuple(steps)


#: transport -> (the config class it needs or None, plan builder(layout, world_size, config,
#: payload_bytes)). Compression as other projects implement it (PowerSGD, GRACE's
#: compressors) registers here from :mod:`qsgd.wiremethods`.
TRANSPORTS: dict[str, tuple[type | None, Callable[..., tuple]]] = {
    "fp32": (None, _dense(4, "float32")),
    "fp16": (None, _dense(2, "float16")),
    "bf16": (None, _dense(2, "bfloat16")),
    "allgather": (QSGDConfig, _allgather),
    "scatter_reduce_allgather": (QSGDConfig, _scatter_reduce_allgather),
}


def wire_plan(transport: str, layout: BucketLayout, world_size: int, config: QSGDConfig | None = None,
              *, payload_bytes=None) -> WirePlan:
    """The ordered collectives and local stages of one bucket.

    Parameters
    ----------
    transport : str
        A key of :data:`TRANSPORTS`.
    layout : BucketLayout
        The bucket's tensors and which travel raw.
    world_size : int
        Ranks taking part (>= 1).
    config : QSGDConfig or a method's config, optional
        Required by the QSGD transports (a :class:`QSGDConfig`) and by those of
        :mod:`qsgd.wiremethods` (their own config classes).
    payload_bytes : int or sequence of int, optional
        Measured bytes of the bucket's whole QSGD payload (one size, or one per rank): required
        by the elias codec, whose sizes depend on the data; ignored by the packed codec, whose
        sizes are exact.

    Returns
    -------
    WirePlan

    Example
    -------
    >>> import qsgd
    >>> plan = qsgd.wire_plan("fp16", qsgd.BucketLayout.by_size((1000, 10), 100), 4)
    >>> [(c.op, c.nbytes, c.wire_bytes) for c in plan.collectives]
    [('allreduce', 2020, 3030)]
    """
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport: expected one of {sorted(TRANSPORTS)}, got {transport!r}")
    if not isinstance(layout, BucketLayout):
        raise ConfigError(f"layout: expected a BucketLayout, got {type(layout).__name__}")
    _int("world_size", world_size, 1)
    needs, build = TRANSPORTS[transport]
    if needs is not None and not isinstance(config, needs):
        raise ConfigError(f"config: transport {transport!r} needs a {needs.__name__}, got {config!r}")
    if needs is None:
        config = None
    return WirePlan(transport, world_size, layout, config, build(layout, world_size, config, payload_bytes))
