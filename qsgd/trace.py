"""PayloadTrace: what QSGD really sent, per DDP bucket and iteration, for a real model.

Written by :func:`qsgd.measure` (``qsgd-emu measure``), read by the emulator's replay. The file is
JSON, ``"format": "qsgd-payload-trace"``, version 3, documented in ``docs/formats.md``: version 3
adds the optional ``operators`` (every kernel of the training step, :mod:`qsgd.operators`, which
the emulator's compute model times on a GPU); version 2 added the per-bucket ``variance``
records of :mod:`qsgd.tracevariance`; versions 1 and 2 are still read. Loading
validates every field and raises :class:`qsgd.TraceError` naming its JSON path
(``iterations[3].buckets[0].payload_bytes``) and the bad value; unknown extra fields are kept in
``extra`` and written back unchanged.

Units: bytes, seconds. Raw (uncompressed) elements are fp32, 4 bytes each: the paper sends
tensors below ``min_numel`` elements unquantized (Alistarh et al. 2017, Section 5).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Mapping

from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError, TraceError
from qsgd.operators.records import Operators
from qsgd.tracevariance import BucketVariance
from ._checks import is_int, is_number

FORMAT = "qsgd-payload-trace"
VERSION = 3
#: versions :meth:`PayloadTrace.load` reads (1: no ``buckets[i].variance``; 1 and 2: no
#: ``operators``)
READ_VERSIONS = (1, 2, 3)
#: bytes per uncompressed gradient element (fp32).
FP32_BYTES = 4
#: which DDP bucket assignment a trace follows (see :mod:`qsgd.buckets`): ``"ready"``, DDP's
#: rebuilt buckets from the measured gradient-ready order (what DDP uses from its second iteration
#: on); ``"reverse"``, the same walk in reverse registration order (the file's default);
#: ``"find_unused"``, DDP's construction-time assignment kept with ``find_unused_parameters=True``.
ASSIGNMENTS = ("ready", "reverse", "find_unused")


# ---------------------------------------------------------------- field checks
def _int(d: Mapping, key: str, path: str, low: int = 0) -> int:
    v = _get(d, key, path)
    if not is_int(v) or v < low:
        raise TraceError(f"{_join(path, key)} must be an int >= {low}, got {v!r}")
    return v


def _seconds(d: Mapping, key: str, path: str) -> float:
    v = _get(d, key, path)
    if not is_number(v) or not math.isfinite(v) or v < 0:
        raise TraceError(f"{_join(path, key)} must be a finite number of seconds >= 0, got {v!r}")
    return float(v)


def _str(d: Mapping, key: str, path: str, *, empty: bool = True) -> str:
    v = _get(d, key, path)
    if not isinstance(v, str) or (not empty and not v):
        raise TraceError(f"{_join(path, key)} must be a {'' if empty else 'non-empty '}string, got {v!r}")
    return v


def _list(d: Mapping, key: str, path: str, *, nonempty: bool = True) -> list:
    v = _get(d, key, path)
    if not isinstance(v, list) or (nonempty and not v):
        raise TraceError(f"{_join(path, key)} must be a {'non-empty ' if nonempty else ''}list, got {v!r}")
    return v


def _obj(v, path: str) -> Mapping:
    if not isinstance(v, Mapping):
        raise TraceError(f"{path or 'trace'} must be an object, got {v!r}")
    return v


def _get(d: Mapping, key: str, path: str):
    if key not in d:
        raise TraceError(f"{_join(path, key)} is missing")
    return d[key]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _extra(d: Mapping, known: tuple[str, ...]) -> dict:
    return {k: v for k, v in d.items() if k not in known}


# ---------------------------------------------------------------- records
@dataclass(frozen=True)
class TraceBucket:
    """One DDP bucket: which parameters it holds and how its elements are sent.

    Parameters
    ----------
    index : int
        Position in DDP's assignment (0 is reduced first).
    numel : int
        Gradient elements in the bucket.
    params : tuple of str
        Parameter names (``model.named_parameters()``) in bucket order.
    compressed_numel, raw_numel : int
        Elements sent as one QSGD payload, and elements of parameters below ``min_numel``
        sent as fp32; they sum to ``numel``.
    variance : BucketVariance or None
        Measured quantization variance per bit width (version 2; None when not measured).
    """

    index: int
    numel: int
    params: tuple[str, ...]
    compressed_numel: int
    raw_numel: int
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    variance: BucketVariance | None = None

    _KEYS = ("index", "numel", "params", "compressed_numel", "raw_numel", "variance")

    @property
    def fp32_bytes(self) -> int:
        """Bytes of the bucket's gradient in fp32 (what an fp32 allreduce sends)."""
        return FP32_BYTES * self.numel

    def to_dict(self) -> dict:
        d = {**self.extra, "index": self.index, "numel": self.numel, "params": list(self.params),
             "compressed_numel": self.compressed_numel, "raw_numel": self.raw_numel}
        if self.variance is not None:
            d["variance"] = self.variance.to_dict()
        return d

    @classmethod
    def from_dict(cls, d, path: str = "bucket") -> "TraceBucket":
        d = _obj(d, path)
        params = _list(d, "params", path)
        for j, name in enumerate(params):
            if not isinstance(name, str) or not name:
                raise TraceError(f"{path}.params[{j}] must be a non-empty string, got {name!r}")
        numel = _int(d, "numel", path, 1)
        comp = _int(d, "compressed_numel", path)
        raw = _int(d, "raw_numel", path)
        if comp + raw != numel:
            raise TraceError(f"{path}.compressed_numel + raw_numel must equal numel={numel}, "
                             f"got {comp} + {raw} = {comp + raw}")
        variance = None
        if d.get("variance") is not None:
            variance = BucketVariance.from_dict(d["variance"], f"{path}.variance")
            names = [p.name for p in variance.params]
            if any(n not in params for n in names):
                raise TraceError(f"{path}.variance.params names {names!r}, not all in {path}.params")
        return cls(_int(d, "index", path), numel, tuple(params), comp, raw, _extra(d, cls._KEYS), variance)


@dataclass(frozen=True)
class BucketTiming:
    """One bucket in one iteration: when it was ready and what it cost to send.

    Parameters
    ----------
    index : int
        The bucket (``PayloadTrace.buckets[index]``).
    ready_s : float
        Seconds from the start of backward until the bucket's last gradient was ready.
    payload_bytes : int
        Bytes of the QSGD payload of the compressed elements (0 when there are none).
    raw_bytes : int
        Bytes of the fp32 elements (``4 * raw_numel``).
    encode_s, decode_s : float
        Seconds to encode and to decode the payload.
    """

    index: int
    ready_s: float
    payload_bytes: int
    raw_bytes: int
    encode_s: float
    decode_s: float
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    _KEYS = ("index", "ready_s", "payload_bytes", "raw_bytes", "encode_s", "decode_s")

    @property
    def wire_bytes(self) -> int:
        """Bytes the bucket sends per rank with QSGD: payload plus fp32 raw elements."""
        return self.payload_bytes + self.raw_bytes

    def to_dict(self) -> dict:
        return {**self.extra, "index": self.index, "ready_s": self.ready_s,
                "payload_bytes": self.payload_bytes, "raw_bytes": self.raw_bytes,
                "encode_s": self.encode_s, "decode_s": self.decode_s}

    @classmethod
    def from_dict(cls, d, path: str = "bucket") -> "BucketTiming":
        d = _obj(d, path)
        return cls(_int(d, "index", path), _seconds(d, "ready_s", path), _int(d, "payload_bytes", path),
                   _int(d, "raw_bytes", path), _seconds(d, "encode_s", path),
                   _seconds(d, "decode_s", path), _extra(d, cls._KEYS))


@dataclass(frozen=True)
class TraceIteration:
    """One measured training iteration (seconds) and its buckets in assignment order."""

    index: int
    forward_s: float
    backward_s: float
    optimizer_s: float
    buckets: tuple[BucketTiming, ...]
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    _KEYS = ("index", "forward_s", "backward_s", "optimizer_s", "buckets")

    @property
    def compute_s(self) -> float:
        """Forward + backward + optimizer seconds."""
        return self.forward_s + self.backward_s + self.optimizer_s

    def to_dict(self) -> dict:
        return {**self.extra, "index": self.index, "forward_s": self.forward_s,
                "backward_s": self.backward_s, "optimizer_s": self.optimizer_s,
                "buckets": [b.to_dict() for b in self.buckets]}

    @classmethod
    def from_dict(cls, d, path: str = "iteration") -> "TraceIteration":
        d = _obj(d, path)
        raw = _list(d, "buckets", path)
        buckets = tuple(BucketTiming.from_dict(b, f"{path}.buckets[{k}]") for k, b in enumerate(raw))
        return cls(_int(d, "index", path), _seconds(d, "forward_s", path), _seconds(d, "backward_s", path),
                   _seconds(d, "optimizer_s", path), buckets, _extra(d, cls._KEYS))


# ---------------------------------------------------------------- the trace
@dataclass(frozen=True)
class PayloadTrace:
    """Measured QSGD payloads and timings of a real model, per DDP bucket and iteration.

    Parameters
    ----------
    model : str
        Model name or import path.
    parameters : int
        Trainable parameter elements; the sum of ``buckets[i].numel``.
    device, device_name, torch_version : str
        Where it was measured (``"cpu"``/``"cuda"``, the processor's name, ``torch.__version__``).
    batch_size : int
        Samples per iteration.
    input_shape : tuple of int
        Shape of one synthetic sample.
    config : QSGDConfig
        Quantization and codec settings.
    min_numel : int
        Parameters with fewer elements are sent as fp32 (the paper's rule).
    bucket_cap_bytes, first_bucket_bytes : int
        DDP's bucket caps (bytes).
    seed : int
        Seed of the synthetic inputs and of the quantization streams.
    buckets : tuple of TraceBucket
        DDP's bucket assignment, in reduction order.
    iterations : tuple of TraceIteration
        Measured iterations; each lists every bucket in the same order.
    bucket_assignment : {"ready", "reverse", "find_unused"}
        Which DDP assignment ``buckets`` follows (:data:`ASSIGNMENTS`; an optional field of the
        file, ``"reverse"`` when absent).
    operators : qsgd.operators.Operators or None
        Every kernel of the model's training step per precision family (version 3; None when
        not recorded), which the emulator times on a GPU.
    extra : dict
        Unknown top-level fields, kept for writing back.
    """

    model: str
    parameters: int
    device: str
    device_name: str
    torch_version: str
    batch_size: int
    input_shape: tuple[int, ...]
    config: QSGDConfig
    min_numel: int
    bucket_cap_bytes: int
    first_bucket_bytes: int
    seed: int
    buckets: tuple[TraceBucket, ...]
    iterations: tuple[TraceIteration, ...]
    bucket_assignment: str = "reverse"
    operators: Operators | None = field(default=None, compare=False, repr=False)
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    _KEYS = ("format", "version", "model", "parameters", "device", "device_name", "torch_version",
             "batch_size", "input_shape", "config", "min_numel", "bucket_cap_bytes",
             "first_bucket_bytes", "seed", "buckets", "iterations", "bucket_assignment",
             "operators")

    def __post_init__(self) -> None:
        # Run the file's checks on directly built traces too: one definition of "valid".
        for name, kind in (("buckets", TraceBucket), ("iterations", TraceIteration)):
            items = getattr(self, name)
            if not isinstance(items, tuple) or not all(isinstance(x, kind) for x in items):
                raise TraceError(f"{name} must be a tuple of {kind.__name__}, got {items!r}")
        if not isinstance(self.config, QSGDConfig):
            raise TraceError(f"config must be a QSGDConfig, got {self.config!r}")
        if self.operators is not None and not isinstance(self.operators, Operators):
            raise TraceError(f"operators must be a qsgd.operators.Operators, got {self.operators!r}")
        _parse(self.to_dict(operators=False))
        if self.operators is not None:
            _check_operators(self.operators, self.buckets)

    # ------------------------------------------------------------ queries used by replay
    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    @property
    def num_iterations(self) -> int:
        return len(self.iterations)

    @property
    def has_variance(self) -> bool:
        """Whether every bucket has quantization-variance records (a measured step with
        ``variance_bits``; a step recorded on the meta device has none)."""
        return all(b.variance is not None for b in self.buckets)

    def fp32_bytes(self, bucket: int) -> int:
        """Bytes of bucket ``bucket``'s gradient in fp32 (``4 * numel``)."""
        return self.buckets[self._bucket(bucket)].fp32_bytes

    def mean_payload_bytes(self, bucket: int) -> float:
        """Mean over iterations of the QSGD payload bytes of ``bucket`` (raw fp32 part excluded)."""
        return self._mean(bucket, "payload_bytes")

    def mean_wire_bytes(self, bucket: int) -> float:
        """Mean over iterations of what ``bucket`` sends per rank with QSGD: payload + raw bytes."""
        return self._mean(bucket, "wire_bytes")

    def mean_ready_s(self, bucket: int) -> float:
        """Mean seconds from the start of backward until ``bucket`` was ready."""
        return self._mean(bucket, "ready_s")

    def mean_encode_s(self, bucket: int) -> float:
        """Mean seconds to encode ``bucket``."""
        return self._mean(bucket, "encode_s")

    def mean_decode_s(self, bucket: int) -> float:
        """Mean seconds to decode ``bucket`` (one payload)."""
        return self._mean(bucket, "decode_s")

    def mean_iteration(self, name: str) -> float:
        """Mean over iterations of ``forward_s``, ``backward_s``, ``optimizer_s`` or ``compute_s``."""
        if name not in ("forward_s", "backward_s", "optimizer_s", "compute_s"):
            raise TraceError(f"mean_iteration: name must be forward_s, backward_s, optimizer_s or "
                             f"compute_s, got {name!r}")
        return sum(getattr(it, name) for it in self.iterations) / len(self.iterations)

    @property
    def host(self) -> dict | None:
        """The measuring CPU's achieved rates (:func:`qsgd.measure_host`): ``matmul_flops``
        (FLOP/s) and ``copy_bandwidth`` (bytes/s), or None when the trace does not record them."""
        return self.extra.get("host")

    @property
    def forward_flops(self) -> int | None:
        """FLOPs of one sample's forward pass (optional field ``forward_flops``), if recorded."""
        v = self.extra.get("forward_flops")
        return v if is_int(v) and v > 0 else None

    def _bucket(self, bucket: int) -> int:
        if not is_int(bucket) or not 0 <= bucket < len(self.buckets):
            raise TraceError(f"bucket must be an int in [0, {len(self.buckets)}), got {bucket!r}")
        return bucket

    def _mean(self, bucket: int, attr: str) -> float:
        k = self._bucket(bucket)
        return sum(getattr(it.buckets[k], attr) for it in self.iterations) / len(self.iterations)

    # ------------------------------------------------------------ (de)serialization
    @property
    def timed(self) -> bool:
        """Whether the trace holds measured seconds (False for a layout recorded on the meta
        device: its seconds are all 0, and only a compute model can time it)."""
        return self.device != "meta"

    def to_dict(self, *, operators: bool = True) -> dict:
        """The JSON object of ``docs/formats.md`` (unknown fields read from a file included)."""
        ops = {"operators": self.operators.to_dict()} if operators and self.operators is not None else {}
        return {**self.extra, **ops, "format": FORMAT, "version": VERSION, "model": self.model,
                "parameters": self.parameters, "device": self.device, "device_name": self.device_name,
                "torch_version": self.torch_version, "batch_size": self.batch_size,
                "input_shape": list(self.input_shape), "config": self.config.to_dict(),
                "min_numel": self.min_numel, "bucket_cap_bytes": self.bucket_cap_bytes,
                "first_bucket_bytes": self.first_bucket_bytes, "seed": self.seed,
                "bucket_assignment": self.bucket_assignment,
                "buckets": [b.to_dict() for b in self.buckets],
                "iterations": [it.to_dict() for it in self.iterations]}

    @classmethod
    def from_dict(cls, d) -> "PayloadTrace":
        """Validate ``d`` (a parsed JSON object) and build the trace; raises :class:`TraceError`."""
        kwargs = _parse(d)
        if d.get("operators") is not None:
            if d.get("version") != 3:
                raise TraceError(f"operators needs version 3, got version {d.get('version')!r}")
            kwargs["operators"] = Operators.from_dict(d["operators"])
        return cls(**kwargs)

    def save(self, path: str | os.PathLike) -> None:
        """Write the trace as JSON to ``path`` (atomically: a temporary file, then rename),
        making its folder when missing."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.to_dict(), fh, indent=1, allow_nan=False)
                fh.write("\n")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PayloadTrace":
        """Read and validate a trace file; raises :class:`TraceError` naming the bad field."""
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{os.fspath(path)}: not valid JSON: {exc}") from None
        try:
            return cls.from_dict(data)
        except TraceError as exc:
            raise TraceError(f"{os.fspath(path)}: {exc}") from None


def _parse(d) -> dict:
    """Check a trace object field by field; return the constructor's keyword arguments."""
    d = _obj(d, "")
    fmt = _get(d, "format", "")
    if fmt != FORMAT:
        raise TraceError(f"format must be {FORMAT!r}, got {fmt!r}")
    version = _get(d, "version", "")
    if not is_int(version) or version not in READ_VERSIONS:
        raise TraceError(f"version must be one of {list(READ_VERSIONS)}, got {version!r}")
    shape = _list(d, "input_shape", "")
    for j, n in enumerate(shape):
        if not is_int(n) or n < 1:
            raise TraceError(f"input_shape[{j}] must be an int >= 1, got {n!r}")
    config = _config(_obj(_get(d, "config", ""), "config"))
    assignment = d.get("bucket_assignment", "reverse")
    if assignment not in ASSIGNMENTS:
        raise TraceError(f"bucket_assignment must be one of {list(ASSIGNMENTS)}, got {assignment!r}")

    buckets = tuple(TraceBucket.from_dict(b, f"buckets[{i}]")
                    for i, b in enumerate(_list(d, "buckets", "")))
    if version == 1 and any(b.variance is not None for b in buckets):
        raise TraceError("buckets[*].variance needs version 2, got version 1")
    seen: dict[str, int] = {}
    for i, b in enumerate(buckets):
        if b.index != i:
            raise TraceError(f"buckets[{i}].index must be {i}, got {b.index!r}")
        for j, name in enumerate(b.params):
            if name in seen:
                raise TraceError(f"buckets[{i}].params[{j}] {name!r} is also in bucket {seen[name]}")
            seen[name] = i
    parameters = _int(d, "parameters", "")
    total = sum(b.numel for b in buckets)
    if total != parameters:
        raise TraceError(f"parameters must equal the sum of buckets[*].numel = {total}, got {parameters}")
    min_numel = _int(d, "min_numel", "")
    if "forward_flops" in d:  # optional, written by measure; kept in ``extra``
        _int(d, "forward_flops", "", 1)
    if "host" in d:  # optional, written by measure on a CPU; kept in ``extra``
        host = _obj(d["host"], "host")
        for key in ("matmul_flops", "copy_bandwidth"):
            v = _get(host, key, "host")
            if not is_number(v) or not math.isfinite(v) or v <= 0:
                raise TraceError(f"host.{key} must be a finite number > 0, got {v!r}")

    iterations = tuple(TraceIteration.from_dict(it, f"iterations[{j}]")
                       for j, it in enumerate(_list(d, "iterations", "")))
    for j, it in enumerate(iterations):
        path = f"iterations[{j}]"
        if it.index != j:
            raise TraceError(f"{path}.index must be {j}, got {it.index!r}")
        if len(it.buckets) != len(buckets):
            raise TraceError(f"{path}.buckets must list all {len(buckets)} buckets, got {len(it.buckets)}")
        for k, (bt, b) in enumerate(zip(it.buckets, buckets)):
            bpath = f"{path}.buckets[{k}]"
            if bt.index != k:
                raise TraceError(f"{bpath}.index must be {k}, got {bt.index!r}")
            if bt.raw_bytes != FP32_BYTES * b.raw_numel:
                raise TraceError(f"{bpath}.raw_bytes must be 4 * buckets[{k}].raw_numel = "
                                 f"{FP32_BYTES * b.raw_numel}, got {bt.raw_bytes}")
            if (bt.payload_bytes == 0) != (b.compressed_numel == 0):
                raise TraceError(f"{bpath}.payload_bytes must be 0 exactly when buckets[{k}]."
                                 f"compressed_numel is 0 (it is {b.compressed_numel}), got {bt.payload_bytes}")
            if b.compressed_numel:
                _check_payload_size(bt.payload_bytes, b.compressed_numel, config, bpath, k)
            # A bucket is ready during backward; allow float rounding of the two clocks.
            if bt.ready_s > it.backward_s * (1 + 1e-6) + 1e-6:
                raise TraceError(f"{bpath}.ready_s must not exceed {path}.backward_s = "
                                 f"{it.backward_s}, got {bt.ready_s}")

    return dict(
        model=_str(d, "model", "", empty=False), parameters=parameters,
        device=_str(d, "device", "", empty=False), device_name=_str(d, "device_name", ""),
        torch_version=_str(d, "torch_version", ""), batch_size=_int(d, "batch_size", "", 1),
        input_shape=tuple(shape), config=config, min_numel=min_numel,
        bucket_cap_bytes=_int(d, "bucket_cap_bytes", "", 1),
        first_bucket_bytes=_int(d, "first_bucket_bytes", "", 1), seed=_int(d, "seed", ""),
        buckets=buckets, iterations=iterations, bucket_assignment=assignment,
        extra=_extra(d, PayloadTrace._KEYS),
    )


def _check_operators(ops: Operators, buckets) -> None:
    """Every parameter whose gradient an operator set marks ready is one of the buckets'."""
    names = {n for b in buckets for n in b.params}
    for family, opset in ops.families.items():
        unknown = sorted(set(opset.ready) - names)
        if unknown:
            raise TraceError(f"operators.families.{family}.ready names {unknown[:3]!r}, which no "
                             f"bucket holds")


def _check_payload_size(nbytes: int, numel: int, cfg: QSGDConfig, path: str, k: int) -> None:
    """A bucket's payload is the size its config makes it: exactly that for the packed codec
    (one flat 1-D payload per bucket), at least the header and the bucket scales for Elias."""
    from qsgd.codec import payload_nbytes
    from qsgd.wire import header_nbytes

    if cfg.codec == "packed":
        want = payload_nbytes(numel, cfg)
        if nbytes != want:
            raise TraceError(f"{path}.payload_bytes must be {want} (a packed payload of "
                             f"buckets[{k}].compressed_numel={numel} elements at {cfg.bits} bits, "
                             f"bucket size {cfg.bucket_size}), got {nbytes}")
        return
    least = header_nbytes(1) + 4 * math.ceil(numel / cfg.bucket_size)
    if nbytes < least:
        raise TraceError(f"{path}.payload_bytes must be at least {least} (header and one 4-byte "
                         f"norm per bucket of {cfg.bucket_size} for buckets[{k}].compressed_numel="
                         f"{numel}), got {nbytes}")


def _config(d: Mapping) -> QSGDConfig:
    kwargs = {}
    for key in ("levels", "bucket_size", "norm", "codec"):
        kwargs[key] = _get(d, key, "config")
    try:
        cfg = QSGDConfig(**kwargs)
    except ConfigError as exc:
        # ConfigError messages start with the field's name.
        raise TraceError(f"config.{exc}") from None
    if "bits" in d and d["bits"] != cfg.bits:
        raise TraceError(f"config.bits must be {cfg.bits} for levels={cfg.levels}, got {d['bits']!r}")
    return cfg
