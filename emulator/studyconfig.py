"""The grid of a what-if study (:class:`StudyConfig`), checked when it is made.

World sizes x bit widths x transports x topologies, with the compute model's device, batch
and precision and the data-parallel strategy; :func:`emulator.run_study` runs it
(:mod:`emulator.study`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from emulator.compute import ALIASES, ATTENTION_KERNELS, DEVICES, PRECISIONS, ComputeModel
from emulator.errors import ConfigError
from emulator.network import DEFAULT_ALGORITHM
from emulator.replaying import STUDY_DEFAULT, TRANSPORTS
from emulator.sharded import SHARDED_TRANSPORTS
from ._checks import is_int

__all__ = ["StudyConfig"]


@dataclass(frozen=True)
class StudyConfig:
    """A study grid.

    Parameters
    ----------
    trace : qsgd.PayloadTrace
        The measured model (``qsgd-emu measure``).
    world_sizes : tuple of int
        GPUs training.
    bits : tuple of int
        32 means the fp32 transport, 16 the fp16 transport and QSGD at 16 bits, 2..15 QSGD.
    transports : tuple of str, optional
        Keys of :data:`emulator.TRANSPORTS` (default: fp32, fp16 and the two QSGD ones,
        :data:`emulator.replaying.STUDY_DEFAULT`; ``powersgd``, PyTorch's PowerSGD hook at rank
        1, comes as a row of width 32; under a strategy that reduce-scatters, those it takes,
        :data:`emulator.sharded.SHARDED_TRANSPORTS`).
    topologies : tuple of str
        Topology specs (:func:`topologies.from_spec`); ``{n}`` is replaced by the world size
        (``"switch:{n}"``) and ``{N}`` by the number of nodes a world size needs (e.g.
        ``"cluster:dgx_a100x{N}"``), else the spec must have at least ``max(world_sizes)`` GPUs.
    device : str
        The GPU the compute model times the trace's operators on: ``"auto"`` (the default),
        each topology's own GPU (its nodes' ``model``); a :data:`emulator.DEVICES` key for all
        topologies; or ``"measured"``, the trace's measured seconds as they are.
    batch_size : int, optional
        Samples per GPU (default: the model's training batch, else the trace's).
    precision : str, optional
        A training precision (:data:`emulator.compute.PRECISIONS`; default: what people train
        with on the device, :func:`emulator.compute.default_precision`).
    codec : {"today", "fused"}
        The QSGD codec on the GPU: as measured today, or the GPU-codec issue's single-pass
        target (:data:`emulator.compute.codec.CODECS`), a what-if.
    algorithm : str
        Allreduce algorithm of the dense transports.
    compute : ComputeModel or dict, optional
        Overrides ``device``: one model for every topology, or one per topology spec;
        :func:`run_study` resolves ``device`` into them before running, once.
    exact : bool
        True: every distinct collective of a task is simulated. False (the approximate mode,
        the default): a task's sizes of one schedule shape are simulated only where
        :class:`~emulator.interpolation.Interpolation` needs them and read off its checked lines
        elsewhere. Against exact studies of the demo's grid at 8..1024 GPUs every row is
        within 4e-5 (``benchmarks/study_interpolation.py``, benchmarks/RESULTS.md); the
        default stays approximate only while that holds within 0.5 %.
    parallelism : str
        The data-parallel strategy, a key of :data:`qsgd.STRATEGIES`: ``"ddp"`` (the default,
        :func:`emulator.replay`), or ``fsdp``, ``fsdp_grad_op``, ``hsdp``, ``zero1``, ``zero2``,
        ``zero3`` (:func:`emulator.replay_sharded`). Under a sharded one the rows carry the
        memory each GPU needs (:mod:`emulator.memory`) and :func:`run_study` refuses a grid
        whose model does not fit the GPU.
    weight_bits : int, optional
        QSGD width of the parameter all-gathers in the QSGD rows of a sharded strategy (QSDP);
        None keeps them dense.
    shard_size : int, optional
        HSDP's shard group (default: each topology's machine, its GPUs per host).
    max_gpus : dict, optional
        Topology spec -> the largest world size it runs (GPUs); the grid's larger sizes leave
        that topology out (``qsgd-emu demo``: boxes of consumer cards stop at 256 GPUs while
        the DGX cluster goes on to 8,192). Default: every topology runs every size.
    attention : str, optional
        The fused attention kernel the compute model times (a key of
        :data:`emulator.ATTENTION_KERNELS`); None: FlashAttention-2, what PyTorch's SDPA runs.
    """

    trace: object
    world_sizes: tuple = (8, 64, 512)
    bits: tuple = (32, 16, 8, 4, 2)
    transports: tuple | None = None
    topologies: tuple = ("cluster:dgx_a100x{N}",)
    device: str = "auto"
    algorithm: str = DEFAULT_ALGORITHM
    compute: ComputeModel | dict | None = field(default=None)
    exact: bool = False
    batch_size: int | None = None
    precision: str | None = None
    parallelism: str = "ddp"
    codec: str = "today"
    weight_bits: int | None = None
    shard_size: int | None = None
    max_gpus: dict | None = None
    attention: str | None = None

    def __post_init__(self):
        import qsgd

        if not isinstance(self.trace, qsgd.PayloadTrace):
            raise ConfigError(f"StudyConfig.trace must be a qsgd.PayloadTrace, got {type(self.trace).__name__}")
        if self.parallelism not in qsgd.STRATEGIES:
            raise ConfigError(f"StudyConfig.parallelism: {self.parallelism!r} is not one of "
                              f"{list(qsgd.STRATEGIES)}")
        scatter = qsgd.STRATEGIES[self.parallelism].grads == "reduce_scatter"
        if self.transports is None:
            object.__setattr__(self, "transports", SHARDED_TRANSPORTS if scatter
                               else STUDY_DEFAULT)
        for name in ("world_sizes", "bits", "transports", "topologies"):
            v = getattr(self, name)
            if isinstance(v, str) or not hasattr(v, "__iter__"):
                raise ConfigError(f"StudyConfig.{name} must be a sequence, got {v!r}")
            v = tuple(v)
            if not v:
                raise ConfigError(f"StudyConfig.{name} must not be empty")
            object.__setattr__(self, name, v)
        if self.attention is not None and self.attention not in ATTENTION_KERNELS:
            raise ConfigError(f"StudyConfig.attention must be None or one of "
                              f"{sorted(ATTENTION_KERNELS)}, got {self.attention!r}")
        for w in self.world_sizes:
            if not is_int(w) or w < 1:
                raise ConfigError(f"StudyConfig.world_sizes: {w!r} is not an int >= 1")
        for b in self.bits:
            if not is_int(b) or not (b == 32 or 2 <= b <= 16):
                raise ConfigError(f"StudyConfig.bits: {b!r} is not 32 or an int in [2, 16]")
        for t in self.transports:
            if t not in TRANSPORTS or not TRANSPORTS[t].study:
                raise ConfigError(f"StudyConfig.transports: {t!r} is not one of "
                                  f"{sorted(k for k, v in TRANSPORTS.items() if v.study)}")
            if scatter and t not in SHARDED_TRANSPORTS:
                raise ConfigError(f"StudyConfig.transports: {t!r} does not reduce-scatter; with "
                                  f"parallelism={self.parallelism!r} use {list(SHARDED_TRANSPORTS)}")
        if self.weight_bits is not None and (not is_int(self.weight_bits)
                                             or not 2 <= self.weight_bits <= 16):
            raise ConfigError(f"StudyConfig.weight_bits must be None or an int in [2, 16], got "
                              f"{self.weight_bits!r}")
        if self.weight_bits is not None and self.parallelism == "ddp":
            raise ConfigError("StudyConfig.weight_bits: parameters are gathered only by a sharded "
                              "strategy, not by parallelism='ddp'")
        if self.shard_size is not None and (not is_int(self.shard_size) or self.shard_size < 1):
            raise ConfigError(f"StudyConfig.shard_size must be None or an int >= 1, got "
                              f"{self.shard_size!r}")
        for s in self.topologies:
            if not isinstance(s, str) or not s:
                raise ConfigError(f"StudyConfig.topologies: {s!r} is not a topology spec")
        if self.max_gpus is not None:
            if not isinstance(self.max_gpus, dict) or not set(self.max_gpus) <= set(self.topologies):
                raise ConfigError(f"StudyConfig.max_gpus must map some of the topologies "
                                  f"{list(self.topologies)} to GPUs, got {self.max_gpus!r}")
            for s, n in self.max_gpus.items():
                if not is_int(n) or n < 1:
                    raise ConfigError(f"StudyConfig.max_gpus[{s!r}]: {n!r} is not an int >= 1")
                if not self.sizes_of(s):
                    raise ConfigError(f"StudyConfig.max_gpus[{s!r}] = {n}: none of the world "
                                      f"sizes {list(self.world_sizes)} is that small")
        if self.device not in ("auto", "measured") and self.device not in DEVICES \
                and self.device not in ALIASES:
            raise ConfigError(f"StudyConfig.device must be 'auto', 'measured' or one of "
                              f"{sorted(DEVICES)}, got {self.device!r}")
        if not isinstance(self.exact, bool):
            raise ConfigError(f"StudyConfig.exact must be True or False, got {self.exact!r}")
        if self.batch_size is not None and (not is_int(self.batch_size) or self.batch_size < 1):
            raise ConfigError(f"StudyConfig.batch_size must be a positive int, got {self.batch_size!r}")
        from emulator.compute.codec import CODECS

        if self.codec not in CODECS:
            raise ConfigError(f"StudyConfig.codec must be one of {list(CODECS)}, got {self.codec!r}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ConfigError(f"StudyConfig.precision must be one of {list(PRECISIONS)}, got "
                              f"{self.precision!r}")
        models = self.compute.values() if isinstance(self.compute, dict) else [self.compute]
        for m in models:
            if m is not None and not isinstance(m, ComputeModel):
                raise ConfigError(f"StudyConfig.compute must be a ComputeModel or a dict of them "
                                  f"per topology, got {m!r}")
        if isinstance(self.compute, dict) and set(self.compute) != set(self.topologies):
            raise ConfigError(f"StudyConfig.compute: one model per topology {list(self.topologies)}, "
                              f"got {sorted(self.compute)}")

    def sizes_of(self, spec: str) -> tuple:
        """The world sizes topology ``spec`` runs: :attr:`world_sizes` up to its
        :attr:`max_gpus`."""
        top = (self.max_gpus or {}).get(spec)
        return tuple(w for w in self.world_sizes if top is None or w <= top)

    def compute_for(self, spec: str) -> ComputeModel:
        """The compute model of topology ``spec`` (the measured seconds when none is set)."""
        if isinstance(self.compute, dict):
            return self.compute[spec]
        return self.compute or ComputeModel()

    def combos(self) -> list[tuple[int, str]]:
        """(bits, transport) pairs of the grid, in row order."""
        out = []
        for b in self.bits:
            for t in self.transports:
                if TRANSPORTS[t].compressed:
                    if b != 32:
                        out.append((b, t))
                elif TRANSPORTS[t].bits == b:
                    out.append((b, t))
        if not out:
            raise ConfigError(f"StudyConfig: no (bits, transport) pair fits bits={self.bits} "
                              f"transports={self.transports}")
        return out

    def to_dict(self) -> dict:
        compute = None if self.compute is None else (
            {k: v.to_dict() for k, v in self.compute.items()} if isinstance(self.compute, dict)
            else self.compute.to_dict())
        d = {"model": self.trace.model, "world_sizes": list(self.world_sizes), "bits": list(self.bits),
             "transports": list(self.transports), "topologies": list(self.topologies),
             "device": self.device, "batch_size": self.batch_size, "precision": self.precision,
             "codec": self.codec,
             "algorithm": self.algorithm, "exact": self.exact, "compute": compute}
        if self.attention is not None:      # as does one on the default kernel
            d["attention"] = self.attention
        if self.max_gpus:                   # a study without limits reads as it always did
            d["max_gpus"] = dict(self.max_gpus)
        if self.parallelism != "ddp":       # a DDP study's config reads as it always did
            d.update(parallelism=self.parallelism, weight_bits=self.weight_bits,
                     shard_size=self.shard_size)
        return d
