"""MeasuredTrace: real collective timings and real training-step timings (docs/formats.md).

Format ``qsgd-measured-trace`` version 1, written by ``qsgd-emu validate run`` and
``qsgd-emu validate import-nccl-tests``. ``bytes`` follows nccl-tests: the message size per
rank for allreduce, the total gathered bytes for allgather and reduce-scatter; ``algbw`` and
``busbw`` are bytes/s (nccl-tests prints GB/s = 1e9 bytes/s). Loading validates every field
and raises :class:`emulator.TraceError` naming it as a JSON path (``collectives[3].time_s``).
Unknown fields are kept (in ``extra``) and written back.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .._checks import required, integer, number, save_json, seconds_list, text
from ..collectives import BUSBW_OPS
from ..collectives import busbw_factor as collective_busbw
from ..errors import TraceError

__all__ = ["MeasuredTrace", "CollectivePoint", "TrainingPoint", "FORMAT", "VERSION", "OPS",
           "busbw_factor"]

FORMAT = "qsgd-measured-trace"
VERSION = 1

OPS = BUSBW_OPS
TRANSPORTS = ("allreduce", "allgather", "scatter_reduce_allgather")


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``op`` at ``world_size`` ranks
    (:func:`emulator.busbw_factor`), as a :class:`TraceError` for an unknown op."""
    if op not in OPS:
        raise TraceError(f"op {op!r} unknown; expected one of {', '.join(OPS)}")
    return collective_busbw(op, world_size)


@dataclass(frozen=True)
class CollectivePoint:
    """One measured collective size: median ``time_s`` (s) over repetitions ``samples_s``.

    ``algbw`` = bytes / time_s and ``busbw`` = algbw * nccl-tests factor, both bytes/s.
    ``algorithm`` names what the library ran (gloo and NCCL's Simple ring: ``"ring"``).
    """

    op: str
    bytes: int
    time_s: float
    count: int = 0
    dtype: str = "float32"
    samples_s: tuple = ()
    algbw: float = 0.0
    busbw: float = 0.0
    algorithm: str = "ring"
    extra: dict = field(default_factory=dict, compare=False)

    _KNOWN = ("op", "bytes", "count", "dtype", "time_s", "samples_s", "algbw", "busbw", "algorithm")

    def __post_init__(self):
        text(self.op, "op", OPS)
        integer(self.bytes, "bytes", minimum=1)
        number(self.time_s, "time_s", positive=True)

    @classmethod
    def make(cls, op: str, nbytes: int, time_s: float, world_size: int, **kw) -> "CollectivePoint":
        """A point with algbw/busbw derived from bytes, time and world size as nccl-tests does."""
        algbw = nbytes / time_s
        return cls(op=op, bytes=int(nbytes), time_s=float(time_s), algbw=algbw,
                   busbw=algbw * busbw_factor(op, world_size), **kw)

    def to_dict(self) -> dict:
        d = {"op": self.op, "bytes": self.bytes, "count": self.count, "dtype": self.dtype,
             "time_s": self.time_s, "samples_s": list(self.samples_s), "algbw": self.algbw,
             "busbw": self.busbw, "algorithm": self.algorithm}
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d, path: str = "") -> "CollectivePoint":
        if not isinstance(d, dict):
            raise TraceError(f"{path or 'point'}: {d!r} is not an object")
        p = f"{path}." if path else ""
        return cls(
            op=text(required(d, "op", p), f"{p}op", OPS),
            bytes=integer(required(d, "bytes", p), f"{p}bytes", minimum=1),
            time_s=number(required(d, "time_s", p), f"{p}time_s", positive=True),
            count=integer(d.get("count", 0), f"{p}count", minimum=0),
            dtype=text(d.get("dtype", "float32"), f"{p}dtype"),
            samples_s=tuple(seconds_list(d.get("samples_s", []), f"{p}samples_s")),
            algbw=number(d.get("algbw", 0.0), f"{p}algbw", nonneg=True),
            busbw=number(d.get("busbw", 0.0), f"{p}busbw", nonneg=True),
            algorithm=text(d.get("algorithm", "ring"), f"{p}algorithm"),
            extra={k: v for k, v in d.items() if k not in cls._KNOWN},
        )


@dataclass(frozen=True)
class TrainingPoint:
    """Median seconds of one real DDP training step with a given gradient transport.

    Besides the documented fields, the harness records what the emulator needs to predict the
    same step (all optional): ``compute_s`` (forward+backward+optimizer without communication,
    s), ``numel`` (gradient elements), ``compressed_numel``/``raw_numel`` (QSGD-coded and
    uncompressed elements), ``payload_bytes`` (per-rank QSGD payload, bytes), ``encode_s`` and
    ``decode_s`` (seconds per payload, stand-alone), ``codec``, ``busy_s`` (median over steps
    of the CPU work outside collectives, slowest rank per segment between them, s),
    ``collectives_s`` (median seconds of each of the hook's collectives, last arrival to last
    exit; only when the ranks share a clock), ``overlaps_s`` (per collective, the local work
    done while it was in flight, s), ``local_s`` and ``hook_encode_s``,
    ``hook_decode_s``, ``hook_comm_s`` (the hook's own per-step timings, s), ``batch_size``,
    ``compute_busy_s`` (the compute-alone step beside a collective running all the while, s)
    and ``compute_pace`` (``compute_s / compute_busy_s``, at most 1).
    """

    model: str
    transport: str
    bits: int
    iteration_s: float
    samples_s: tuple = ()
    bytes_per_step: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    _KNOWN = ("model", "transport", "bits", "iteration_s", "samples_s", "bytes_per_step")

    def __post_init__(self):
        text(self.transport, "transport", TRANSPORTS)
        number(self.iteration_s, "iteration_s", positive=True)

    def get(self, key: str, default=None):
        """An extra field recorded by the harness (``compute_s``, ``payload_bytes``, ...)."""
        return self.extra.get(key, default)

    def to_dict(self) -> dict:
        d = {"model": self.model, "transport": self.transport, "bits": self.bits,
             "iteration_s": self.iteration_s, "samples_s": list(self.samples_s),
             "bytes_per_step": self.bytes_per_step}
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d, path: str = "") -> "TrainingPoint":
        if not isinstance(d, dict):
            raise TraceError(f"{path or 'point'}: {d!r} is not an object")
        p = f"{path}." if path else ""
        extra = {k: v for k, v in d.items() if k not in cls._KNOWN}
        for key in ("compute_s", "encode_s", "decode_s", "busy_s", "local_s", "compute_busy_s"):
            if key in extra:
                number(extra[key], f"{p}{key}", nonneg=True)
        if "compute_pace" in extra:
            pace = number(extra["compute_pace"], f"{p}compute_pace", positive=True)
            if pace > 1.0:
                raise TraceError(f"{p}compute_pace: {pace!r} is not in (0, 1]")
        for key in ("collectives_s", "overlaps_s"):
            if key in extra:
                seconds_list(extra[key], f"{p}{key}")
        if "codec" in extra:
            text(extra["codec"], f"{p}codec", ("packed", "elias"))
        for key in ("numel", "compressed_numel", "raw_numel", "payload_bytes", "batch_size"):
            if key in extra:
                integer(extra[key], f"{p}{key}", minimum=0)
        return cls(
            model=text(required(d, "model", p), f"{p}model"),
            transport=text(required(d, "transport", p), f"{p}transport", TRANSPORTS),
            bits=integer(required(d, "bits", p), f"{p}bits", minimum=1),
            iteration_s=number(required(d, "iteration_s", p), f"{p}iteration_s", positive=True),
            samples_s=tuple(seconds_list(d.get("samples_s", []), f"{p}samples_s")),
            bytes_per_step=integer(d.get("bytes_per_step", 0), f"{p}bytes_per_step", minimum=0),
            extra=extra,
        )


@dataclass(frozen=True)
class MeasuredTrace:
    """Real timings on one set-up: ``environment`` + ``collectives`` + ``training``.

    ``environment`` holds at least ``backend``, ``world_size`` and ``source`` ("harness" or
    "nccl-tests"); the harness adds hosts, devices, versions and the testbed topology spec.
    ``loaded`` are collective points measured while every rank computed (the harness's
    :class:`testbench.ComputeLoad`), empty where none were.
    """

    environment: dict
    collectives: tuple = ()
    training: tuple = ()
    extra: dict = field(default_factory=dict, compare=False)
    loaded: tuple = ()

    def __post_init__(self):
        _check_environment(self.environment, "environment")

    @property
    def world_size(self) -> int:
        return int(self.environment["world_size"])

    def points(self, op: str | None = None) -> list[CollectivePoint]:
        """Collective points, optionally of one op, sorted by (op, bytes)."""
        pts = [c for c in self.collectives if op is None or c.op == op]
        return sorted(pts, key=lambda c: (c.op, c.bytes))

    def to_dict(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, "environment": dict(self.environment),
             "collectives": [c.to_dict() for c in self.collectives],
             "training": [t.to_dict() for t in self.training]}
        if self.loaded:
            d["loaded"] = [c.to_dict() for c in self.loaded]
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d) -> "MeasuredTrace":
        if not isinstance(d, dict):
            raise TraceError(f"measured trace: top level {type(d).__name__} is not an object")
        fmt = d.get("format")
        if fmt != FORMAT:
            raise TraceError(f"format: {fmt!r} is not {FORMAT!r}")
        version = d.get("version")
        if version != VERSION:
            raise TraceError(f"version: {version!r} is not supported (expected {VERSION})")
        env = required(d, "environment", "")
        _check_environment(env, "environment")
        cols = d.get("collectives", [])
        if not isinstance(cols, list):
            raise TraceError(f"collectives: {cols!r} is not a list")
        train = d.get("training", [])
        if not isinstance(train, list):
            raise TraceError(f"training: {train!r} is not a list")
        loaded = d.get("loaded", [])
        if not isinstance(loaded, list):
            raise TraceError(f"loaded: {loaded!r} is not a list")
        return cls(
            environment=dict(env),
            collectives=tuple(CollectivePoint.from_dict(c, f"collectives[{i}]") for i, c in enumerate(cols)),
            training=tuple(TrainingPoint.from_dict(t, f"training[{i}]") for i, t in enumerate(train)),
            loaded=tuple(CollectivePoint.from_dict(c, f"loaded[{i}]") for i, c in enumerate(loaded)),
            extra={k: v for k, v in d.items()
                   if k not in ("format", "version", "environment", "collectives", "training",
                                "loaded")},
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON (atomically: a reader never sees half a file)."""
        save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "MeasuredTrace":
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{os.fspath(path)}: not JSON: {exc}") from None
        return cls.from_dict(data)


def _check_environment(env, path: str):
    if not isinstance(env, dict):
        raise TraceError(f"{path}: {env!r} is not an object")
    integer(required(env, "world_size", f"{path}."), f"{path}.world_size", minimum=1)
    text(required(env, "backend", f"{path}."), f"{path}.backend")
    if "source" in env:
        text(env["source"], f"{path}.source")
    if "hosts" in env and not (isinstance(env["hosts"], list)
                               and all(isinstance(h, str) for h in env["hosts"])):
        raise TraceError(f"{path}.hosts: {env['hosts']!r} is not a list of host names")
