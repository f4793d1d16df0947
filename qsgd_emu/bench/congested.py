"""The congested cases of ``qsgd-emu bench emulator``: schedules whose flows share channels.

Each case is a topology spec and a schedule builder; :func:`run_case` times it in a fresh
process (so that its peak resident memory is its own), exact and approximate, and the naive
SimPy model (:func:`qsgd_emu.bench.emulator.naive_simulate`) where its message count allows.

- ``alltoall-N``: all-to-all by direct sends, 64 MB per rank (1 MB = 1e6 bytes), N ranks of
  ``fat_tree:k=16`` (the 3-level k-ary fat tree of Al-Fares et al., 1024 hosts, ECMP).
- ``ring8-1024``: a ring allreduce of 100 MB in 8 channels (NCCL runs one ring per channel,
  each with 1/8 of the data) on ``cluster:dgx_h100x128,fabric=leaf_spine``. Channel c's ring
  visits the nodes in order and inside a node starts at GPU c and ends at GPU c xor 1, its PCIe
  sibling; its inter-node hop leaves through NIC c xor 1 and enters through NIC c (both on
  that PCIe switch: rail-aligned), hashed over the spines by ECMP with flow label c. The NCCL
  model's own multi-channel builder, when merged, is the one to time here instead.
- ``nccl-a2a-1024``: NCCL's all-to-all (grouped send/recv, PXN routes through the
  destination's rail NIC: :mod:`emulator.collectives.nccl.p2p`), 64 MB per rank, on
  ``cluster:dgx_a100x128`` (1024 GPUs): a million sends over waypoint routes, the routing a
  study's first all-to-all pays on a graph.
- ``qsgd-sra-512``: QSGD's scatter-reduce-allgather of a 100 MB fp32 gradient (25e6
  elements) at 4 bits on ``cluster:dgx_a100x64`` (512 GPUs): owner j's chunk costs
  ``qsgd.payload_nbytes`` of its elements, as the study replays it.
"""
from __future__ import annotations

import concurrent.futures as cf
import gc
import multiprocessing
import resource
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["CASES", "Case", "run_case", "ring_channels"]

MB = 1_000_000


@dataclass(frozen=True)
class Case:
    """One congested case: ``build(G)`` returns its schedule on ``topology``."""
    name: str
    topology: str
    build: Callable
    what: str
    flows_hint: int        # about how many messages: the naive model runs up to a limit


def _alltoall(n: int):
    def build(G):
        import emulator
        return emulator.build_schedule("alltoall", "direct", n, 64 * MB, graph=G)
    return build


def ring_channels(G, nodes: int, channels: int, nbytes: int, gpus_per_node: int = 8):
    """The 8-channel ring allreduce of the module docstring as one schedule (channels run
    concurrently; each is :func:`emulator.build_schedule`'s ring over its GPU order)."""
    import numpy as np

    import emulator
    from emulator.collectives import Route, Schedule

    parts, routes, base = [], [Route()], 0
    route_of: dict = {}
    for c in range(channels):
        inner = [c] + [g for g in range(gpus_per_node) if g not in (c, c ^ 1)] + [c ^ 1]
        order = [n * gpus_per_node + g for n in range(nodes) for g in inner]
        s = emulator.build_schedule("allreduce", "ring", order, nbytes // channels)
        node_s, node_d = s.src // gpus_per_node, s.dst // gpus_per_node
        route = np.zeros(len(s), dtype=np.int64)
        for i in np.flatnonzero(node_s != node_d):
            key = (c, int(node_s[i]), int(node_d[i]))
            if key not in route_of:
                route_of[key] = len(routes)
                routes.append(Route(via=(f"n{key[1]}.nic{c ^ 1}", f"n{key[2]}.nic{c}"), flow=c))
            route[i] = route_of[key]
        parts.append((s, route, base))
        base += len(s)
    cat = lambda f: np.concatenate([getattr(s, f) for s, _, _ in parts])   # noqa: E731
    dep_ptr = np.concatenate([[0]] + [s.dep_ptr[1:] + sum(len(p.dep_idx) for p, _, _ in parts[:k])
                                      for k, (s, _, _) in enumerate(parts)])
    dep_idx = np.concatenate([s.dep_idx + b for s, _, b in parts])
    first = parts[0][0]
    return Schedule.from_arrays(
        src=cat("src"), dst=cat("dst"), size=cat("size"), compute_s=cat("compute_s"),
        dep_ptr=dep_ptr, dep_idx=dep_idx, tag_code=cat("tag_code"), tags=first.tags,
        ranks=tuple(range(nodes * gpus_per_node)), op="allreduce",
        algorithm=f"ring x{channels} channels", nbytes=nbytes,
        route=np.concatenate([r for _, r, _ in parts]), routes=tuple(routes))


def _nccl_alltoall(n: int):
    def build(G):
        import emulator
        return emulator.build_schedule("alltoall", "nccl_p2p", n, 64 * MB, graph=G)
    return build


def _ring8(G):
    return ring_channels(G, 128, 8, 100 * MB)


def _qsgd_sra(n: int):
    def build(G):
        import emulator
        import qsgd

        numel = 25 * MB                       # 100 MB of fp32
        cfg = qsgd.QSGDConfig.from_bits(4)
        base, extra = divmod(numel, n)
        sizes = [qsgd.payload_nbytes(base + (1 if j < extra else 0), cfg) for j in range(n)]
        return emulator.build_schedule("allreduce", "qsgd_scatter_reduce_allgather", n,
                                       4 * numel, graph=G, payload_bytes=sizes)
    return build


CASES = {c.name: c for c in (
    Case("alltoall-64", "fat_tree:k=16", _alltoall(64), "all-to-all direct, 64 MB/rank", 4032),
    Case("alltoall-256", "fat_tree:k=16", _alltoall(256), "all-to-all direct, 64 MB/rank",
         65280),
    Case("alltoall-1024", "fat_tree:k=16", _alltoall(1024), "all-to-all direct, 64 MB/rank",
         1047552),
    Case("ring8-1024", "cluster:dgx_h100x128,fabric=leaf_spine", _ring8,
         "ring allreduce 100 MB, 8 channels, ECMP", 8 * 2 * 1023 * 1024),
    Case("nccl-a2a-1024", "cluster:dgx_a100x128", _nccl_alltoall(1024),
         "NCCL all-to-all (p2p, PXN routes), 64 MB/rank", 1047552),
    Case("qsgd-sra-512", "cluster:dgx_a100x64", _qsgd_sra(512),
         "QSGD scatter-reduce-allgather, 100 MB fp32 at 4 bits", 2 * 511 * 512),
)}


def _peak_mb() -> float:
    """This process's peak resident memory (MB): VmHWM, which exec resets (ru_maxrss keeps
    the parent's high-water mark across the exec of a spawned child)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # KiB on Linux


def _timed(fn):
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0
    finally:
        gc.enable()


def _child(name: str, naive: bool, tolerance: float) -> dict:
    """Runs in its own process: warm the compiled kernels, then time the case."""
    import emulator
    import topologies
    from emulator import _jit

    from qsgd_emu.bench.emulator import naive_simulate

    case = CASES[name]
    _jit.compile_kernels()
    warm = topologies.switch(4)
    emulator.simulate(warm, emulator.build_schedule("alltoall", "direct", 4, 4000))
    base_mb = _peak_mb()
    G = topologies.from_spec(case.topology)

    def exact():
        s = case.build(G)
        return s, emulator.simulate(G, s)

    (sched, res), wall = _timed(exact)
    row = {"case": name, "what": case.what, "topology": case.topology,
           "gpus": len(sched.ranks), "flows": res.flows,
           "events": res.events, "engine_s": wall, "engine_time_s": res.time_s,
           "peak_mb": _peak_mb(), "base_mb": base_mb, "approx_s": None,
           "approx_rel_err": None, "approx_events": None, "naive_s": None,
           "naive_time_s": None, "skipped": None}
    G2 = topologies.from_spec(case.topology)       # its routes are not cached yet
    (approx, wall) = _timed(lambda: emulator.simulate(G2, case.build(G2), exact=False,
                                                      tolerance=tolerance))
    row.update(approx_s=wall, approx_events=approx.events,
               approx_rel_err=(approx.time_s - res.time_s) / res.time_s)
    if naive:
        t_naive, wall = _timed(lambda: naive_simulate(G, sched))
        row.update(naive_s=wall, naive_time_s=t_naive)
    return row


def run_case(name: str, *, naive: bool, tolerance: float) -> dict:
    """Row of case ``name``, run in a fresh process; naive only if ``naive``."""
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_child, name, naive, tolerance).result()
