"""What-if studies: world sizes x bit widths x transports x topologies, as tidy rows.

One task per (topology, world size) builds the graph once and replays every (bits,
transport) on it, so the emulator's per-bucket collective cache is shared within the task;
tasks run in this process, in local processes (``workers``) or on a Dask cluster
(``cluster``, :mod:`emulator.distributed`). Rows are returned in a fixed order whatever ran
them, so the three give identical tables.

Row columns (units): ``iteration_s`` (s), ``throughput_samples_s`` (samples/s over all GPUs),
``speedup_vs_fp32`` (fp32 iteration / this iteration, same topology and world size),
``scaling_efficiency`` (throughput / (world_size x one GPU's throughput without
communication) = compute_s / iteration_s), ``bytes_per_gpu`` (bytes each GPU sends per
iteration), ``compute_s``, ``exposed_comm_s``, ``encode_decode_s`` (s).
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable

from emulator.compute import DEVICES, ComputeModel
from emulator.errors import ConfigError
from emulator.network import DEFAULT_ALGORITHM, Network
from emulator.replaying import TRANSPORTS, replay

FORMAT = "qsgd-study"
VERSION = 1

COLUMNS = ("topology", "world_size", "bits", "transport", "iteration_s", "throughput_samples_s",
           "speedup_vs_fp32", "scaling_efficiency", "bytes_per_gpu", "compute_s", "exposed_comm_s",
           "encode_decode_s", "model", "batch_size", "device", "algorithm", "source")

DENSE_BITS = {"fp32": 32, "fp16": 16}


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
    transports : tuple of str
        Keys of :data:`emulator.TRANSPORTS`.
    topologies : tuple of str
        Topology specs (:func:`topologies.from_spec`); ``{n}`` is replaced by the world size
        (``"switch:{n}"``) and ``{N}`` by the number of nodes a world size needs (e.g.
        ``"cluster:dgx_a100x{N}"``), else the spec must have at least ``max(world_sizes)`` GPUs.
    device : str
        Target device of the compute model (:data:`emulator.DEVICES`).
    algorithm : str
        Allreduce algorithm of the dense transports.
    compute : ComputeModel, optional
        Overrides ``device``; :func:`run_study` resolves ``device`` into one before running so
        that workers do not measure the host again.
    """

    trace: object
    world_sizes: tuple = (8, 64, 512)
    bits: tuple = (32, 16, 8, 4, 2)
    transports: tuple = tuple(TRANSPORTS)
    topologies: tuple = ("cluster:dgx_a100x{N}",)
    device: str = "measured"
    algorithm: str = DEFAULT_ALGORITHM
    compute: ComputeModel | None = field(default=None)

    def __post_init__(self):
        import qsgd

        if not isinstance(self.trace, qsgd.PayloadTrace):
            raise ConfigError(f"StudyConfig.trace must be a qsgd.PayloadTrace, got {type(self.trace).__name__}")
        for name in ("world_sizes", "bits", "transports", "topologies"):
            v = getattr(self, name)
            if isinstance(v, str) or not hasattr(v, "__iter__"):
                raise ConfigError(f"StudyConfig.{name} must be a sequence, got {v!r}")
            v = tuple(v)
            if not v:
                raise ConfigError(f"StudyConfig.{name} must not be empty")
            object.__setattr__(self, name, v)
        for w in self.world_sizes:
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise ConfigError(f"StudyConfig.world_sizes: {w!r} is not an int >= 1")
        for b in self.bits:
            if isinstance(b, bool) or not isinstance(b, int) or not (b == 32 or 2 <= b <= 16):
                raise ConfigError(f"StudyConfig.bits: {b!r} is not 32 or an int in [2, 16]")
        for t in self.transports:
            if t not in TRANSPORTS:
                raise ConfigError(f"StudyConfig.transports: {t!r} is not one of {sorted(TRANSPORTS)}")
        for s in self.topologies:
            if not isinstance(s, str) or not s:
                raise ConfigError(f"StudyConfig.topologies: {s!r} is not a topology spec")
        if self.device not in DEVICES:
            raise ConfigError(f"StudyConfig.device must be one of {sorted(DEVICES)}, got {self.device!r}")
        if self.compute is not None and not isinstance(self.compute, ComputeModel):
            raise ConfigError(f"StudyConfig.compute must be a ComputeModel, got {self.compute!r}")

    def combos(self) -> list[tuple[int, str]]:
        """(bits, transport) pairs of the grid, in row order."""
        out = []
        for b in self.bits:
            for t in self.transports:
                if TRANSPORTS[t].compressed:
                    if b != 32:
                        out.append((b, t))
                elif DENSE_BITS[t] == b:
                    out.append((b, t))
        if not out:
            raise ConfigError(f"StudyConfig: no (bits, transport) pair fits bits={self.bits} "
                              f"transports={self.transports}")
        return out

    def to_dict(self) -> dict:
        return {"model": self.trace.model, "world_sizes": list(self.world_sizes), "bits": list(self.bits),
                "transports": list(self.transports), "topologies": list(self.topologies),
                "device": self.device, "algorithm": self.algorithm,
                "compute": None if self.compute is None else self.compute.to_dict()}


# ---------------------------------------------------------------- one task
def topology_for(spec: str, world_size: int):
    """The graph of ``spec`` for ``world_size`` GPUs.

    Placeholders: ``{n}`` is the GPU count itself (``"switch:{n}"``), ``{N}`` the number of
    machines a cluster spec needs for it (``"cluster:dgx_a100x{N}"``).
    """
    import topologies

    spec = spec.replace("{n}", str(world_size))
    if "{N}" in spec:
        per_node = len(topologies.gpus(topologies.from_spec(spec.replace("{N}", "1"))))
        nodes = max(1, math.ceil(world_size / per_node))
        G = topologies.from_spec(spec.replace("{N}", str(nodes)))
    else:
        G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    if n < world_size:
        raise ConfigError(f"topology {spec!r} has {n} GPUs, fewer than world_size={world_size}")
    return G


def run_task(task: tuple) -> list[dict]:
    """Rows of one (topology spec, world size) task. ``task = (config, spec, world_size)``."""
    cfg, spec, world_size = task
    G = topology_for(spec, world_size)
    net = Network(G, world_size, cfg.algorithm)
    compute = cfg.compute or ComputeModel()
    trace = cfg.trace
    base = replay(trace, G, transport="fp32", compute=compute, network=net)
    rows = []
    for bits, transport in cfg.combos():
        pred = base if transport == "fp32" else replay(
            trace, G, transport=transport, compute=compute, network=net,
            bits=bits if TRANSPORTS[transport].compressed else None)
        rows.append({
            "topology": spec, "world_size": world_size, "bits": bits, "transport": transport,
            "iteration_s": pred.iteration_s,
            "throughput_samples_s": world_size * trace.batch_size / pred.iteration_s,
            "speedup_vs_fp32": base.iteration_s / pred.iteration_s,
            "scaling_efficiency": pred.compute_s / pred.iteration_s,
            "bytes_per_gpu": pred.bytes_per_gpu, "compute_s": pred.compute_s,
            "exposed_comm_s": pred.exposed_comm_s, "encode_decode_s": pred.encode_decode_s,
            "model": trace.model, "batch_size": trace.batch_size, "device": compute.device,
            "algorithm": cfg.algorithm, "source": f"{pred.source}; compute: {compute.source}",
        })
    return rows


# ---------------------------------------------------------------- the study
def run_study(config: StudyConfig, *, progress: Callable[[int, int], None] | None = None,
              workers: int = 1, cluster: str | None = None) -> list[dict]:
    """Run every (topology, world size) task of ``config``; rows in a fixed order.

    Parameters
    ----------
    progress : callable, optional
        ``progress(done, total)`` after each task.
    workers : int
        Local processes (1: in this process).
    cluster : str, optional
        Address of a Dask scheduler (``"tcp://host:8786"``); tasks run there.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    if config.compute is None:
        import dataclasses

        compute = ComputeModel.for_device(config.device, config.trace)
        config = dataclasses.replace(config, compute=compute)
    config.combos()
    tasks = [(config, spec, w) for spec in config.topologies for w in config.world_sizes]
    for spec in config.topologies:  # a bad spec fails here, before any work is sent out
        topology_for(spec, min(config.world_sizes) if "{" in spec else max(config.world_sizes))
    total = len(tasks)
    done = 0

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    if cluster is not None:
        from emulator.distributed import map_on_cluster

        results = map_on_cluster(run_task, tasks, cluster, on_done=tick)
    elif workers == 1 or total == 1:
        results = []
        for t in tasks:
            results.append(run_task(t))
            tick()
    else:
        import concurrent.futures as cf
        import multiprocessing

        results = [None] * total
        ctx = multiprocessing.get_context("spawn")  # no forked torch/numba thread pools
        with cf.ProcessPoolExecutor(max_workers=min(workers, total), mp_context=ctx) as pool:
            futs = {pool.submit(run_task, t): i for i, t in enumerate(tasks)}
            for f in cf.as_completed(futs):
                results[futs[f]] = f.result()
                tick()
    return [row for rows in results for row in rows]


# ---------------------------------------------------------------- writers
def write_csv(rows: list[dict], path: str | os.PathLike) -> None:
    """Write rows as CSV with :data:`COLUMNS` (floats with full precision)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})


def write_json(rows: list[dict], path: str | os.PathLike, config: StudyConfig | None = None) -> None:
    """Write ``{"format": "qsgd-study", "version": 1, "config": ..., "rows": [...]}``."""
    doc = {"format": FORMAT, "version": VERSION,
           "config": None if config is None else config.to_dict(), "rows": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a study JSON file written by :func:`write_json`."""
    from emulator.errors import TraceError

    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(f"format must be {FORMAT!r}, got {doc.get('format') if isinstance(doc, dict) else doc!r}")
    if doc.get("version") != VERSION:
        raise TraceError(f"version must be {VERSION}, got {doc.get('version')!r}")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise TraceError(f"rows must be a list, got {rows!r}")
    return rows


def summary_table(rows: list[dict]) -> str:
    """A fixed-width text table of the rows (one line per row)."""
    head = ("topology", "GPUs", "bits", "transport", "iter ms", "samples/s", "speedup", "eff",
            "MB/GPU", "exposed ms", "codec ms")
    lines = [head]
    for r in rows:
        lines.append((r["topology"], str(r["world_size"]), str(r["bits"]), r["transport"],
                      f"{1e3 * r['iteration_s']:.2f}", f"{r['throughput_samples_s']:.1f}",
                      f"{r['speedup_vs_fp32']:.2f}x", f"{r['scaling_efficiency']:.2f}",
                      f"{r['bytes_per_gpu'] / 1e6:.2f}", f"{1e3 * r['exposed_comm_s']:.2f}",
                      f"{1e3 * r['encode_decode_s']:.2f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i >= 1 else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
                     for line in lines)
