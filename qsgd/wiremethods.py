"""Wire plans of gradient compression as other projects implement it.

A published speedup reflects its implementation's transport and codec, not only its idea;
these plans say what each implementation sends, in what order, and which local stages run
where, in the same :class:`~qsgd.wireplan.WirePlan` form as the project's own QSGD, so that
:func:`emulator.replay` times them alike (the stages' seconds come from
``emulator.compute.methods``, which names each stage's kernels from the same sources).

``powersgd`` (:class:`PowerSGDConfig`)
    PyTorch's DDP hook (``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``):
    each bucket's tensors viewed as ``shape[0] x rest`` matrices; those worth compressing
    (``(n + m) r * min_compression_rate < n m``) give rank-``r`` factors P (n x r) and
    Q (m x r), the rest (vectors) travel uncompressed. Order: error feedback and P = M Q
    (hook) -> allreduce of the uncompressed tensors -> unpack them (callback) -> allreduce
    of all Ps -> orthogonalize the Ps and Q = M^T P (callback) -> allreduce of all Qs ->
    M = P Q^T and the new error (callback). ``implementation="grace"`` is GRACE's
    TensorFlow compressor (``grace_dl/tensorflow/compressor/powersgd.py``): every tensor of
    two or more dimensions is compressed, the others are allreduced as they are.
``grace_allgather`` / ``grace_allreduce`` (:class:`CompressorConfig`)
    GRACE's compressors (``grace_dl/tensorflow/compressor/*.py``) through its Horovod
    communicators (``communicator/allgather.py``, ``allreduce.py``): each tensor is
    compressed on its own (error feedback first when the memory is on) into values of a
    fixed width, plus indices for sparsifiers and a few float32 scalars per tensor; the
    allgather communicator gathers every rank's compressed tensors (first the sizes, for
    compressors whose sizes differ across ranks), slices and decompresses each of the ``p``
    and sums them; the allreduce one (random-k, whose ranks pick the same indices, and the
    uncompressed baseline) sums the compressed values and decompresses once. Horovod fuses
    the tensors that are ready together into one collective; a plan's bucket is one such
    fusion. GRACE's wire formats are not bit-packed: a sign is a one-byte bool, a ternary or
    8-bit level one int8, QSGD's level int8 below 128 levels and int16 from 128 on.

Example
-------
>>> import qsgd
>>> layout = qsgd.BucketLayout((2048 * 512, 512), (False, False), shapes=((2048, 512), (512,)))
>>> plan = qsgd.wire_plan("powersgd", layout, 4, PowerSGDConfig(rank=2))
>>> [(c.name, c.nbytes) for c in plan.collectives]
[('uncompressed allreduce', 2048), ('P allreduce', 16384), ('Q allreduce', 4096)]
>>> plan = qsgd.wire_plan("grace_allgather", layout, 4, CompressorConfig("topk", ratio=0.01))
>>> [(c.name, c.nbytes) for c in plan.collectives]
[('payload all_gather', 83920)]
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from qsgd.errors import ConfigError
from qsgd.wireplan import TRANSPORTS, BucketLayout, Stage, _coll

__all__ = ["PowerSGDConfig", "CompressorConfig", "Compressor", "COMPRESSORS", "powersgd_split",
           "tensor_payload_bytes"]

POWERSGD_IMPLEMENTATIONS = ("torch", "grace")


@dataclass(frozen=True)
class PowerSGDConfig:
    """PowerSGD's settings (Vogels et al., NeurIPS 2019) as an implementation runs it.

    Parameters
    ----------
    rank : int
        Rank of the approximation (``matrix_approximation_rank``; PyTorch's default 1).
    min_compression_rate : float
        A matrix is compressed only when it saves this factor (PyTorch's default 2);
        GRACE compresses every matrix (its plans ignore this).
    implementation : {"torch", "grace"}
        PyTorch's DDP hook or GRACE's TensorFlow compressor (module docstring).
    error_feedback : bool
        Whether the compression error is added back (PyTorch's default True; GRACE's
        ``powersgd`` memory).
    """

    rank: int = 1
    min_compression_rate: float = 2.0
    implementation: str = "torch"
    error_feedback: bool = True

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"PowerSGDConfig.rank: expected an int >= 1, got {self.rank!r}")
        r = self.min_compression_rate
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0:
            raise ConfigError(f"PowerSGDConfig.min_compression_rate: expected a number >= 0, got {r!r}")
        if self.implementation not in POWERSGD_IMPLEMENTATIONS:
            raise ConfigError(f"PowerSGDConfig.implementation: expected one of "
                              f"{list(POWERSGD_IMPLEMENTATIONS)}, got {self.implementation!r}")
        if not isinstance(self.error_feedback, bool):
            raise ConfigError(f"PowerSGDConfig.error_feedback: expected True or False, got "
                              f"{self.error_feedback!r}")

    def split(self, layout: BucketLayout) -> tuple[list, int]:
        """:func:`powersgd_split` of ``layout`` under these settings."""
        return powersgd_split(layout, self)

    def to_dict(self) -> dict:
        return {"method": "powersgd", **asdict(self)}


@dataclass(frozen=True)
class Compressor:
    """What one of GRACE's compressors puts on the wire per tensor of ``n`` elements.

    Attributes
    ----------
    collective : {"allgather", "allreduce"}
        The GRACE communicator it runs with (GRACE's benchmark runs pair them so).
    value_bytes : int
        Bytes per value sent (a bool or int8 is 1).
    index_bytes : int
        Bytes per index sent beside each value (sparsifiers: int32).
    scalars : int
        float32 scalars per tensor (norms, scales, means).
    kept : {"all", "ratio"}
        Whether every element is sent or ``max(1, int(n * ratio))`` of them.
    same_size : bool
        Whether every rank's compressed tensor has the same size (else the allgather
        communicator gathers the sizes first: GRACE's ``tensors_size_are_same``).
    source : str
        The GRACE file.
    """

    collective: str
    value_bytes: int
    index_bytes: int = 0
    scalars: int = 0
    kept: str = "all"
    same_size: bool = True
    source: str = ""


_G = "grace_dl/tensorflow/compressor/"
#: GRACE's compressors (sands-lab/grace, TensorFlow), keyed by the family names of its
#: benchmark runs. ``qsgd``'s values are int8 below 128 levels and int16 from 128 on
#: (:func:`tensor_payload_bytes`); ``threshold`` sends the values above a fixed threshold,
#: a count only the gradient's values decide (no plan: :func:`tensor_payload_bytes` refuses).
COMPRESSORS: dict[str, Compressor] = {
    "none": Compressor("allreduce", 4, source=_G + "none.py"),
    "qsgd": Compressor("allgather", 1, scalars=1, source=_G + "qsgd.py"),
    "8bit": Compressor("allgather", 1, scalars=1, source=_G + "u8bit.py"),
    "natural": Compressor("allgather", 1, source=_G + "natural.py"),
    "terngrad": Compressor("allgather", 1, scalars=1, source=_G + "terngrad.py"),
    "signsgd": Compressor("allgather", 1, source=_G + "signsgd.py"),
    "efsignsgd": Compressor("allgather", 1, scalars=1, source=_G + "efsignsgd.py"),
    "onebit": Compressor("allgather", 1, scalars=2, source=_G + "onebit.py"),
    "topk": Compressor("allgather", 4, 4, kept="ratio", source=_G + "topk.py"),
    "dgc": Compressor("allgather", 4, 4, kept="ratio", same_size=False, source=_G + "dgc.py"),
    "threshold": Compressor("allgather", 4, 4, kept="data", same_size=False,
                            source=_G + "threshold.py"),
    "randomk": Compressor("allreduce", 4, kept="ratio", source=_G + "randomk.py"),
}


@dataclass(frozen=True)
class CompressorConfig:
    """One of GRACE's compressors with its settings.

    Parameters
    ----------
    family : str
        A :data:`COMPRESSORS` key.
    ratio : float, optional
        Share of the elements kept (``topk``, ``dgc``, ``randomk``: GRACE's
        ``compress_ratio``), in (0, 1].
    levels : int, optional
        QSGD's ``quantum_num`` (levels per sign), required by ``qsgd``.
    error_feedback : bool
        Whether GRACE's memory (residual, or DGC's momentum correction) is on.
    """

    family: str
    ratio: float | None = None
    levels: int | None = None
    error_feedback: bool = False

    def __post_init__(self):
        if self.family not in COMPRESSORS:
            raise ConfigError(f"CompressorConfig.family: expected one of {sorted(COMPRESSORS)}, "
                              f"got {self.family!r}")
        c = COMPRESSORS[self.family]
        if c.kept == "ratio":
            r = self.ratio
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1:
                raise ConfigError(f"CompressorConfig.ratio: {self.family} needs a share of the "
                                  f"elements in (0, 1], got {r!r}")
        if self.family == "qsgd":
            q = self.levels
            if isinstance(q, bool) or not isinstance(q, int) or q < 1:
                raise ConfigError(f"CompressorConfig.levels: qsgd needs an int >= 1, got {q!r}")
        if not isinstance(self.error_feedback, bool):
            raise ConfigError(f"CompressorConfig.error_feedback: expected True or False, got "
                              f"{self.error_feedback!r}")

    @property
    def compressor(self) -> Compressor:
        return COMPRESSORS[self.family]

    @property
    def value_bytes(self) -> int:
        """Bytes per value on the wire (QSGD: int8 below 128 levels, int16 from 128 on)."""
        if self.family == "qsgd":
            return 1 if self.levels < 128 else 2
        return self.compressor.value_bytes

    def kept(self, n: int) -> int:
        """Elements of an ``n``-element tensor that are sent (GRACE's ``max(1, int(n r))``)."""
        return n if self.compressor.kept == "all" else max(1, int(n * self.ratio))

    def to_dict(self) -> dict:
        return {"method": "grace", **asdict(self)}


def tensor_payload_bytes(n: int, cfg: CompressorConfig) -> int:
    """Bytes GRACE's compressor ``cfg`` sends for one tensor of ``n`` elements.

    >>> tensor_payload_bytes(1000, CompressorConfig("qsgd", levels=64))
    1004
    >>> tensor_payload_bytes(1000, CompressorConfig("topk", ratio=0.01))
    80
    """
    c = cfg.compressor
    if c.kept == "data":
        raise ConfigError(f"CompressorConfig.family: {cfg.family} sends the values above a "
                          f"fixed threshold, a count only the gradient's values decide; its "
                          f"payload cannot be planned from shapes ({c.source})")
    return cfg.kept(n) * (cfg.value_bytes + c.index_bytes) + 4 * c.scalars


def _grace(layout: BucketLayout, p: int, cfg: CompressorConfig, payload_bytes) -> tuple:
    """GRACE's allgather or allreduce communicator on one Horovod fusion (module docstring)."""
    n = layout.numel
    c = cfg.compressor
    steps: list = [Stage("encode", "hook", encode_numel=n)]
    if p == 1:
        steps.append(Stage("decode", "hook", decode_numel=n, payloads=1, after=0))
        return tuple(steps)
    if c.collective == "allreduce":
        kept = sum(cfg.kept(t) for t in layout.numels)
        steps.append(_coll("compressed allreduce", "allreduce", "float32", 4 * kept, p, 0))
        steps.append(Stage("decode", "callback", decode_numel=n, payloads=1, after=1))
        return tuple(steps)
    payload = sum(tensor_payload_bytes(t, cfg) for t in layout.numels)
    if not c.same_size:
        # the sizes first (one int32 per tensor), then the payloads of every rank's size
        steps.append(_coll("size all_gather", "allgather", "int32", 4 * len(layout.numels), p, 0))
    steps.append(_coll("payload all_gather", "allgather", "uint8", payload, p, len(steps) - 1,
                       c.same_size))
    steps.append(Stage("decode", "callback", decode_numel=p * n, payloads=p, after=len(steps) - 1))
    return tuple(steps)


def _grace_checked(collective: str):
    def plan(layout, p, cfg, payload_bytes):
        if cfg.compressor.collective != collective:
            raise ConfigError(f"config: {cfg.family} runs with GRACE's "
                              f"{cfg.compressor.collective} communicator, not grace_{collective}")
        return _grace(layout, p, cfg, payload_bytes)
    return plan


def powersgd_split(layout: BucketLayout, cfg: PowerSGDConfig) -> tuple[list, int]:
    """The bucket's matrices PowerSGD compresses, ``[(n, m, r), ...]``, and the elements it
    sends uncompressed.

    >>> layout = BucketLayout((64 * 27, 64), (False, False), shapes=((64, 3, 3, 3), (64,)))
    >>> powersgd_split(layout, PowerSGDConfig(rank=4))
    ([(64, 27, 4)], 64)
    """
    if layout.shapes is None:
        raise ConfigError("layout.shapes: PowerSGD compresses each tensor as a matrix and needs "
                          "the tensors' shapes (a trace measured by this version records them)")
    mats, raw = [], 0
    for shape in layout.shapes:
        n = shape[0]
        m = math.prod(shape[1:])
        r = min(n, m, cfg.rank)
        if cfg.implementation == "grace":
            worth = len(shape) > 1
        else:  # powerSGD_hook's _should_compress
            worth = (n + m) * r * cfg.min_compression_rate < n * m
        if worth:
            mats.append((n, m, r))
        else:
            raw += n * m
    return mats, raw


def _powersgd(layout: BucketLayout, p: int, cfg: PowerSGDConfig, payload_bytes) -> tuple:
    mats, raw = powersgd_split(layout, cfg)
    n = layout.numel - raw
    steps: list = [Stage("encode", "hook", encode_numel=n)]
    if p == 1:
        if mats:
            steps += [Stage("reduce", "hook", encode_numel=n, after=0),
                      Stage("decode", "hook", decode_numel=n, payloads=1, after=1)]
        return tuple(steps)
    if raw:
        steps.append(_coll("uncompressed allreduce", "allreduce", "float32", 4 * raw, p, 0))
        if cfg.implementation == "torch":
            # the callback copies them back into the bucket before it allreduces the Ps
            steps.append(Stage("unpack", "callback", decode_numel=raw, payloads=1,
                               after=len(steps) - 1))
    if not mats:
        return tuple(steps)
    steps.append(_coll("P allreduce", "allreduce", "float32", 4 * sum(a * r for a, _, r in mats),
                       p, len(steps) - 1))
    steps.append(Stage("reduce", "callback", encode_numel=n, after=len(steps) - 1))
    steps.append(_coll("Q allreduce", "allreduce", "float32", 4 * sum(b * r for _, b, r in mats),
                       p, len(steps) - 1))
    steps.append(Stage("decode", "callback", decode_numel=n, payloads=1, after=len(steps) - 1))
    return tuple(steps)


TRANSPORTS.update({
    "powersgd": (PowerSGDConfig, _powersgd),
    "grace_allgather": (CompressorConfig, _grace_checked("allgather")),
    "grace_allreduce": (CompressorConfig, _grace_checked("allreduce")),
})
