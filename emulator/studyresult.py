"""What a study returns: typed rows, the timelines it simulated, and the configuration it picks.

:class:`StudyRow` is one (topology, world size, bits, transport) cell; its fields are the
columns of ``study.csv`` and of the rows of ``study.json`` (format ``qsgd-study``, version 3,
docs/formats.md), and every reader (the terminal table, the report, the dashboard) reads
these fields. :class:`Study` holds the rows in a fixed order with the replayed
:class:`~emulator.Prediction` of each, and picks the configuration to show by one rule
(:meth:`Study.best`).

Version 1 files (rows only, without ``topology_name``, ``speedup_vs_fp16`` and ``bound``) and
version 2 files (without ``precision``) are still read: the missing fields are derived from
the rows themselves (an older row's precision reads ``"as measured"``).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
from dataclasses import dataclass, field, fields

from emulator._checks import integer, number, required, save_json, text
from emulator.errors import ConfigError, TraceError
from emulator.replaying import TRANSPORTS, Prediction

__all__ = ["StudyRow", "Study", "COLUMNS", "FORMAT", "VERSION", "read_study", "write_csv",
           "write_json", "summary_table", "conclusions", "LEGEND"]

FORMAT = "qsgd-study"
VERSION = 3
#: versions :func:`read_study` reads
READ_VERSIONS = (1, 2, 3)

#: An iteration counts as communication-bound when more than this share of it is exposed
#: communication (time the stream adds after compute ends).
COMM_BOUND_SHARE = 0.5


@dataclass(frozen=True)
class StudyRow:
    """One configuration of a study and what the emulator predicts for it.

    Attributes
    ----------
    topology : str
        The study's topology spec (may hold ``{N}``/``{n}``).
    topology_name : str
        The graph it expanded to at this world size (``cluster:dgx_a100x8,fabric=leaf_spine``).
    world_size, bits : int
        GPUs training; bits per gradient coordinate on the wire (32 fp32, 16 fp16 or QSGD).
    transport : str
        Key of :data:`emulator.TRANSPORTS`.
    iteration_s : float
        Predicted seconds of one training iteration.
    throughput_samples_s : float
        Samples per second over all GPUs: ``world_size * batch_size / iteration_s``.
    speedup_vs_fp32, speedup_vs_fp16 : float or None
        The fp32 (fp16) iteration at the same topology and size over this one; None when the
        study did not run that transport.
    scaling_efficiency : float
        ``compute_s / iteration_s``: the share of the iteration that is computation.
    bytes_per_gpu : float
        Bytes each GPU sends per iteration.
    compute_s, exposed_comm_s, encode_decode_s : float
        Seconds of forward+backward+optimizer, of communication not hidden behind compute,
        and of QSGD encoding and decoding (hidden or not).
    bound : str
        ``"communication"`` when exposed communication is more than half the iteration,
        else ``"compute"``.
    model : str
    batch_size : int
        Samples per GPU per iteration (the compute model's, else the trace's).
    device, precision, algorithm, source : str
        The compute model's device and training precision, the dense transports' allreduce
        algorithm, and where the payload sizes and compute times come from.
    parallelism : str
        The data-parallel strategy (a key of :data:`qsgd.STRATEGIES`; ``"ddp"`` in files
        written before strategies existed).
    memory_per_gpu : float or None
        Bytes one GPU needs under it (model states and activations, :mod:`emulator.memory`);
        None where the compute was not timed from operator records.
    comm_method : str
        How the seconds of the row's collectives were made (:meth:`emulator.Network.method`):
        ``"engine"`` (simulated, or read off lines checked against it), or NCCL's closed form
        calibrated by the engine on a smaller cluster for those whose engine run would take
        too long (approximate studies of thousands of GPUs), with its measured error bound.
        ``"engine"`` in files written before it existed.
    """

    topology: str
    topology_name: str
    world_size: int
    bits: int
    transport: str
    iteration_s: float
    throughput_samples_s: float
    speedup_vs_fp32: float | None
    speedup_vs_fp16: float | None
    scaling_efficiency: float
    bytes_per_gpu: float
    compute_s: float
    exposed_comm_s: float
    encode_decode_s: float
    bound: str
    model: str
    batch_size: int
    device: str
    precision: str
    algorithm: str
    source: str
    parallelism: str = "ddp"
    memory_per_gpu: float | None = None
    comm_method: str = "engine"

    @property
    def key(self) -> tuple:
        """(topology, world_size, bits, transport): what identifies the row in a study."""
        return (self.topology, self.world_size, self.bits, self.transport)

    @property
    def label(self) -> str:
        """``fp32``, ``fp16`` or ``qsgd_allgather 4-bit``: the configuration in words."""
        return self.transport if not TRANSPORTS[self.transport].compressed \
            else f"{self.transport} {self.bits}-bit"

    @property
    def compressed(self) -> bool:
        return TRANSPORTS[self.transport].compressed

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "row") -> "StudyRow":
        """A row from its dict, every field checked (``where`` names it in errors)."""
        if not isinstance(d, dict):
            raise TraceError(f"{where}: {d!r} is not an object")
        values = {}
        for f in fields(cls):
            if f.name in _OPTIONAL and f.name not in d:   # rows written before they existed
                values[f.name] = f.default
                continue
            v = required(d, f.name, f"{where}.")
            path = f"{where}.{f.name}"
            if f.type == "int":
                values[f.name] = integer(v, path)
            elif f.type == "float":
                values[f.name] = number(v, path)
            elif f.type == "float | None":
                values[f.name] = None if v is None else number(v, path)
            else:
                values[f.name] = text(v, path)
        if values["transport"] not in TRANSPORTS:
            raise TraceError(f"{where}.transport: {values['transport']!r} is not one of "
                             f"{sorted(TRANSPORTS)}")
        return cls(**values)


#: Columns a row may lack (files written before them), taking their defaults.
_OPTIONAL = ("parallelism", "memory_per_gpu", "comm_method")

#: CSV and JSON columns: the fields of :class:`StudyRow`, in order.
COLUMNS = tuple(f.name for f in fields(StudyRow))


def _key(topology: str, world_size: int, bits: int, transport: str) -> str:
    return f"{topology}|{world_size}|{bits}|{transport}"


@dataclass(frozen=True)
class Study:
    """The rows of a study in a fixed order, with the timeline each one was predicted from.

    Attributes
    ----------
    rows : tuple of StudyRow
        Ordered by topology, world size, then the grid's (bits, transport) order.
    predictions : dict
        ``StudyRow.key`` -> :class:`~emulator.Prediction` (the per-bucket timeline); empty for
        a study read back from a file, which keeps only :attr:`best`'s.
    config : dict
        The grid (``StudyConfig.to_dict()``), or None.
    """

    rows: tuple
    predictions: dict = field(default_factory=dict, compare=False, repr=False)
    config: dict | None = None

    def __post_init__(self):
        rows = tuple(self.rows)
        if not rows:
            raise ConfigError("Study: rows must not be empty")
        for r in rows:
            if not isinstance(r, StudyRow):
                raise ConfigError(f"Study: {r!r} is not a StudyRow")
        object.__setattr__(self, "rows", rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    @property
    def topologies(self) -> list[str]:
        return list(dict.fromkeys(r.topology for r in self.rows))

    def world_sizes(self, topology: str | None = None) -> list[int]:
        return sorted({r.world_size for r in self.rows if topology in (None, r.topology)})

    def cell(self, topology: str, world_size: int) -> list[StudyRow]:
        """The rows of one (topology, world size)."""
        return [r for r in self.rows if r.topology == topology and r.world_size == world_size]

    def fastest(self, topology: str, world_size: int, *, compressed: bool | None = None) -> StudyRow:
        """The row with the shortest iteration of one (topology, world size); with
        ``compressed`` True (False) among the QSGD (dense) rows only. Ties go to the row that
        comes first."""
        cands = [r for r in self.cell(topology, world_size)
                 if compressed is None or r.compressed == compressed]
        if not cands:
            raise ConfigError(f"Study: no {'QSGD ' if compressed else ''}row at "
                              f"{topology} x {world_size}")
        return min(cands, key=lambda r: r.iteration_s)

    def best(self) -> StudyRow:
        """The configuration a study shows in detail (its timeline), by one rule:
        the fastest QSGD row at the largest world size of the first topology, or the fastest
        row there when the grid has no QSGD transport."""
        top = self.topologies[0]
        big = self.world_sizes(top)[-1]
        cell = self.cell(top, big)
        return self.fastest(top, big, compressed=True if any(r.compressed for r in cell) else None)

    def prediction(self, row: StudyRow) -> Prediction | None:
        """The replayed timeline of ``row``, or None when the study did not keep it."""
        return self.predictions.get(row.key)

    # The file and text forms; each is one function of this module.
    def save_csv(self, path) -> None:
        write_csv(self, path)

    def save_json(self, path) -> None:
        write_json(self, path)

    @classmethod
    def load(cls, path) -> "Study":
        return read_study(path)

    def table(self) -> str:
        return summary_table(self)

    def conclusions(self) -> list[str]:
        return conclusions(self)


# ---------------------------------------------------------------- files
def write_csv(study: Study, path: str | os.PathLike) -> None:
    """Write the rows as CSV with :data:`COLUMNS` (floats with full precision, None empty)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        for r in study.rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else "" if v is None else v)
                        for k, v in r.to_dict().items()})


def write_json(study: Study, path: str | os.PathLike) -> None:
    """Write ``{"format": "qsgd-study", "version": 3, "config", "rows", "best", "timeline"}``.

    ``best`` is the index of :meth:`Study.best` in ``rows`` and ``timeline`` its
    ``Prediction.to_dict()`` (None when the study did not keep it).
    """
    best = study.best()
    pred = study.prediction(best)
    doc = {"format": FORMAT, "version": VERSION, "config": study.config,
           "rows": [r.to_dict() for r in study.rows], "best": study.rows.index(best),
           "timeline": None if pred is None else pred.to_dict()}
    save_json(doc, path)


def _upgrade_v1(rows: list) -> list:
    """Version 1 rows lack ``topology_name``, ``speedup_vs_fp16`` and ``bound``."""
    fp16 = {(r.get("topology"), r.get("world_size")): r.get("iteration_s") for r in rows
            if isinstance(r, dict) and r.get("transport") == "fp16"}
    out = []
    for r in rows:
        if not isinstance(r, dict):
            out.append(r)
            continue
        r = dict(r)
        r.setdefault("topology_name", r.get("topology"))
        base = fp16.get((r.get("topology"), r.get("world_size")))
        it = r.get("iteration_s")
        r.setdefault("speedup_vs_fp16", base / it if base and isinstance(it, (int, float)) and it > 0
                     else None)
        exposed, it = r.get("exposed_comm_s"), r.get("iteration_s")
        if isinstance(exposed, (int, float)) and isinstance(it, (int, float)) and it > 0:
            r.setdefault("bound", "communication" if exposed > COMM_BOUND_SHARE * it else "compute")
        out.append(r)
    return out


def read_study(path: str | os.PathLike) -> Study:
    """The :class:`Study` of a ``study.json`` (version 1, 2 or 3); errors name the bad field.

    Examples
    --------
    >>> import json, os, tempfile, emulator
    >>> path = os.path.join(tempfile.mkdtemp(), "study.json")
    >>> with open(path, "w") as f:
    ...     json.dump({"format": "qsgd-study", "version": 2, "rows": [{"world_size": "8"}]}, f)
    >>> emulator.read_study(path)
    Traceback (most recent call last):
    ...
    emulator.errors.TraceError: rows[0].topology: missing
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{os.fspath(path)}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else doc
        raise TraceError(f"format must be {FORMAT!r}, got {got!r}")
    version = doc.get("version")
    if version not in READ_VERSIONS:
        raise TraceError(f"version must be one of {list(READ_VERSIONS)}, got {version!r}")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise TraceError(f"rows must be a non-empty list, got {rows!r}")
    if version == 1:
        rows = _upgrade_v1(rows)
    if version < 3:
        rows = [dict(r, precision=r.get("precision", "as measured")) if isinstance(r, dict) else r
                for r in rows]
    study = Study(tuple(StudyRow.from_dict(r, f"rows[{i}]") for i, r in enumerate(rows)),
                  config=doc.get("config"))
    if version >= 2:
        best, want = doc.get("best"), study.rows.index(study.best())
        if best != want or isinstance(best, bool):
            raise TraceError(f"best: {best!r} is not the index of the study's best row ({want})")
    return study


# ---------------------------------------------------------------- text
#: What the terminal table's columns mean.
LEGEND = (
    "iter ms: predicted time of one training iteration; samples/s: over all GPUs; "
    "speedup: fp32 iteration / this one; eff: scaling efficiency = compute / iteration; "
    "MB/GPU: bytes each GPU sends per iteration (1 MB = 1e6 bytes); exposed ms: what "
    "communication adds to the step (not hidden behind compute, or compute slowed beside it: "
    "NCCL's kernels hold SMs); codec ms: QSGD encode + decode (partly hidden); GB/GPU (sharded "
    "studies): memory one GPU needs at the start of backward, model states, activations "
    "saved for backward and backward's transients (1 GB = 1e9 bytes; the allocator's "
    "reserve and kernels' workspaces not counted).")


def summary_table(study: Study) -> str:
    """A fixed-width text table of the rows, then its legend (one line per row)."""
    head = ("topology", "GPUs", "batch/GPU", "bits", "transport", "iter ms", "samples/s",
            "speedup", "eff", "MB/GPU", "exposed ms", "codec ms")
    # a sharded study says its strategy and the memory a GPU needs (a DDP table reads as before)
    sharded = any(r.parallelism != "ddp" for r in study.rows)
    if sharded:
        head += ("strategy", "GB/GPU")
    lines = [head]
    for r in study.rows:
        line = (r.topology_name, str(r.world_size), str(r.batch_size), str(r.bits),
                r.transport, f"{1e3 * r.iteration_s:.2f}", f"{r.throughput_samples_s:.1f}",
                "-" if r.speedup_vs_fp32 is None else f"{r.speedup_vs_fp32:.2f}x",
                f"{r.scaling_efficiency:.2f}", f"{r.bytes_per_gpu / 1e6:.2f}",
                f"{1e3 * r.exposed_comm_s:.2f}", f"{1e3 * r.encode_decode_s:.2f}")
        if sharded:
            line += (r.parallelism, "-" if r.memory_per_gpu is None
                     else f"{r.memory_per_gpu / 1e9:.1f}")
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    table = "\n".join("  ".join(c.rjust(w) if i >= 1 else c.ljust(w)
                                for i, (c, w) in enumerate(zip(line, widths)))
                      for line in lines)
    return table + "\n\n" + LEGEND


def conclusions(study: Study) -> list[str]:
    """One sentence per (topology, world size): the fastest configuration, its speedup over
    fp32 and fp16 when the study ran them, and whether that step is compute- or
    communication-bound; then, per topology with QSGD and dense rows, one sentence on where
    QSGD pays (the headline figure's answer in words)."""
    out = []
    for top in study.topologies:
        for w in study.world_sizes(top):
            r = study.fastest(top, w)
            vs = []
            for name, base in (("fp32", r.speedup_vs_fp32), ("fp16", r.speedup_vs_fp16)):
                if base is not None and r.transport != name:
                    vs.append(f"{base:.2f}x {name}")
            speed = f" ({', '.join(vs)})" if vs else ""
            out.append(f"{r.topology_name}, {w} GPUs: fastest is {r.label} at "
                       f"{1e3 * r.iteration_s:.1f} ms/iteration{speed}; {r.bound}-bound "
                       f"({r.exposed_comm_s / r.iteration_s:.0%} of the step is exposed "
                       f"communication).{_method(study.cell(top, w))}")
    out.extend(filter(None, (_where_qsgd_pays(study, top) for top in study.topologies)))
    return out


def _method(cell: list) -> str:
    """`` Not all by the engine: ...`` naming the rows of one (topology, world size) whose
    collectives took NCCL's calibrated closed form (:attr:`StudyRow.comm_method`), and how
    (the first such row's method); empty when every row was the engine's."""
    fast = [r for r in cell if r.comm_method != "engine"]
    if not fast:
        return ""
    return (f" Not all by the engine: {len(fast)} of {len(cell)} rows took "
            f"{fast[0].comm_method} ({fast[0].label}).")


def _where_qsgd_pays(study: Study, top: str) -> str | None:
    """Where the fastest QSGD row of each size of ``top`` beats fp32 and fp16 (the speedups
    of :class:`StudyRow`), as one sentence; None when the study has no QSGD or no dense row."""
    sizes = [w for w in study.world_sizes(top)
             if any(r.compressed for r in study.cell(top, w))]
    if not sizes:
        return None
    best = {w: study.fastest(top, w, compressed=True) for w in sizes}
    from emulator.figstyle import config_label  # the figures' names for a configuration

    span = f"{sizes[0]}-{sizes[-1]} GPUs" if len(sizes) > 1 else f"{sizes[0]} GPUs"
    parts = []
    for base in ("fp32", "fp16"):
        speed = {w: getattr(r, f"speedup_vs_{base}") for w, r in best.items()}
        if any(v is None for v in speed.values()):
            continue
        w = max(sizes, key=lambda x: speed[x])
        at = f"{speed[w]:.2f}x, {config_label(best[w].transport, best[w].bits)} at {w} GPUs"
        pays = [x for x in sizes if speed[x] > 1.0]
        if not pays:
            parts.append(f"never beats {base} at {span} (at best {at})")
            continue
        where = (f"from {pays[0]} GPUs on" if pays == sizes[sizes.index(pays[0]):] else
                 "at " + ", ".join(map(str, pays)) + " GPUs")
        parts.append(f"beats {base} {where} (up to {at})")
    if not parts:
        return None
    return f"{top}: QSGD " + "; ".join(parts) + "."
