"""Collective seconds on a topology, as a replayed iteration needs them: one cached call per (op, bytes).

A training iteration sends many buckets of a few distinct sizes; :class:`Network` builds each
distinct collective's schedule once, simulates it on the graph (:func:`emulator.simulate`)
and keeps its time and the payload bytes each GPU sent.

The default model is NCCL's (``algorithm="nccl"``): each collective runs as NCCL would run it
on the graph (channels over NVLinks and rail-aligned NICs, NCCL's choice of algorithm and
protocol for the size, :mod:`emulator.collectives.nccl`), and the QSGD transports move their
payloads on the same channels (``nccl_qsgd_*``). A textbook algorithm name (``"ring"``,
``"tree"``, ...) gives the textbook model instead, for every collective of the iteration.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

from emulator.collectives import ALGORITHMS, NCCL_ALGORITHMS, build_schedule
from emulator.engine import simulate
from emulator.errors import ConfigError
from ._checks import is_int

__all__ = ["Network", "DEFAULT_ALGORITHM"]

#: The model replay, studies and the demo use unless told otherwise.
DEFAULT_ALGORITHM = "nccl"


class Network:
    """Collective seconds and bytes on graph ``G`` over ranks ``0..world_size-1``, cached.

    Parameters
    ----------
    G : networkx.Graph
        Topology (see :mod:`topologies`).
    world_size : int or None
        GPUs taking part (the first ``world_size`` ranks); None: all GPUs of ``G``.
    algorithm : str
        The allreduce of fp32/fp16 buckets: ``"nccl"`` (NCCL's model, the default), an NCCL
        algorithm (``"nccl_ring"``, ...) or a textbook one (``"ring"``, ``"tree"``, ...).
        With an NCCL algorithm the compressed transports run on NCCL's channels too.
    on_simulated : callable, optional
        ``on_simulated(op, nbytes, wall_s)`` after each collective simulated (not on cache
        hits): how long work on a big graph has come, for progress reports.

    Examples
    --------
    >>> import topologies
    >>> net = Network(topologies.from_spec("dgx_a100"))
    >>> s, sent = net.collective("allreduce", net.algorithm, 64 << 20)
    >>> round(64 * 2**20 * 2 * 7 / 8 / s / 1e9)      # busbw, GB/s
    212
    """

    def __init__(self, G, world_size: int | None = None, algorithm: str = DEFAULT_ALGORITHM,
                 on_simulated: Callable[[str, int, float], None] | None = None):
        import topologies

        n = len(topologies.gpus(G))
        if world_size is None:
            world_size = n
        if not is_int(world_size) or not 1 <= world_size <= n:
            raise ConfigError(f"world_size must be an int in [1, {n}] (GPUs of the topology), "
                              f"got {world_size!r}")
        if not isinstance(algorithm, str) or not algorithm:
            raise ConfigError(f"algorithm must be a non-empty string, got {algorithm!r}")
        if ("allreduce", algorithm) not in ALGORITHMS:
            known = sorted(a for o, a in ALGORITHMS if o == "allreduce" and not a.startswith(
                ("qsgd", "nccl_qsgd")))
            raise ConfigError(f"algorithm={algorithm!r} is not an allreduce algorithm; known: "
                              f"{', '.join(known)}")
        self.G, self.world_size, self.algorithm = G, world_size, algorithm
        self.name = str(G.graph.get("name", "custom"))
        self._cache: dict = {}
        self.on_simulated = on_simulated

    @property
    def nccl(self) -> bool:
        """Whether collectives run as NCCL runs them."""
        return ("allreduce", self.algorithm) in NCCL_ALGORITHMS

    def resolve(self, op: str, algorithm: str) -> str:
        """The algorithm that runs ``algorithm`` under this network's model: with NCCL, the
        QSGD transports move on NCCL's channels (``qsgd_allgather`` -> ``nccl_qsgd_allgather``)."""
        if self.nccl and algorithm.startswith("qsgd_") and (op, "nccl_" + algorithm) in ALGORITHMS:
            return "nccl_" + algorithm
        return algorithm

    def collective(self, op: str, algorithm: str, nbytes: int, payload_bytes=None) -> tuple[float, float]:
        """``(seconds, mean payload bytes sent per GPU)`` of one collective (0, 0 on one rank).

        The bytes count what the collective moves for the application: NCCL's protocol flags
        and the share of a link NCCL cannot use are in the seconds, not in the bytes.
        """
        if self.world_size == 1 or nbytes == 0:
            return 0.0, 0.0
        algorithm = self.resolve(op, algorithm)
        key = (op, algorithm, int(nbytes), None if payload_bytes is None else tuple(payload_bytes))
        hit = self._cache.get(key)
        if hit is None:
            t0 = time.perf_counter()
            sched = build_schedule(op, algorithm, list(range(self.world_size)), int(nbytes),
                                   graph=self.G, payload_bytes=payload_bytes)
            res = simulate(self.G, sched)
            sent = sched.detail.get("payload_bytes", sched.total_bytes)
            hit = self._cache[key] = (float(res.time_s), float(sent) / self.world_size)
            if self.on_simulated is not None:
                self.on_simulated(op, int(nbytes), time.perf_counter() - t0)
        return hit

    def prefetch(self, requests: Iterable[tuple[str, str, int]], workers: int = 1) -> int:
        """Simulate the collectives of ``requests`` that are not cached yet, on ``workers``
        local processes, and cache them; returns how many were simulated.

        The distinct sizes of a study or a search are independent simulations: on a big graph
        each costs seconds, so spreading them over processes divides the wall time (each
        process routes the graph once, a few seconds at 512 GPUs). Largest first, so the
        longest ones do not finish last.

        Parameters
        ----------
        requests : iterable of (op, algorithm, bytes)
            As :meth:`collective` takes them (``payload_bytes`` left out).
        workers : int
            Local processes; 1 simulates here, one after the other.

        Examples
        --------
        >>> import topologies
        >>> net = Network(topologies.from_spec("ring:4"))
        >>> net.prefetch([("allreduce", "ring", 1 << 20), ("allreduce", "ring", 1 << 20)])
        1
        >>> net.prefetch([("allreduce", "ring", 1 << 20)])   # cached now
        0
        """
        if not is_int(workers) or workers < 1:
            raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
        if self.world_size == 1:
            return 0
        todo: dict = {}
        for op, algorithm, nbytes in requests:
            if not is_int(nbytes) or nbytes < 0:
                raise ConfigError(f"prefetch: bytes must be an int >= 0, got {nbytes!r}")
            algorithm = self.resolve(op, algorithm)
            key = (op, algorithm, int(nbytes), None)
            if nbytes and key not in self._cache:
                todo[key] = (op, algorithm, int(nbytes))
        order = sorted(todo.values(), key=lambda r: -r[2])
        if workers == 1 or len(order) < 2:
            for op, algorithm, nbytes in order:
                self.collective(op, algorithm, nbytes)
            return len(order)
        import concurrent.futures as cf
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # no forked torch/numba thread pools
        with cf.ProcessPoolExecutor(max_workers=min(workers, len(order)), mp_context=ctx,
                                    initializer=_worker_init,
                                    initargs=(self.G, self.world_size, self.algorithm)) as pool:
            futs = {pool.submit(_worker_collective, *r): r for r in order}
            for f in cf.as_completed(futs):
                op, algorithm, nbytes = futs[f]
                seconds, sent, wall_s = f.result()
                self._cache[(op, algorithm, nbytes, None)] = (seconds, sent)
                if self.on_simulated is not None:
                    self.on_simulated(op, nbytes, wall_s)
        return len(order)

    def op_of(self, algorithm: str) -> str:
        """The op under which the emulator registers ``algorithm`` (compressed transports)."""
        ops = sorted({op for op, alg in ALGORITHMS if alg == algorithm})
        if not ops:
            raise ConfigError(f"the emulator has no algorithm {algorithm!r}")
        return "allreduce" if "allreduce" in ops else ops[0]


#: The worker process's Network (:meth:`Network.prefetch`): one per process, routes kept.
_WORKER: dict = {}


def _worker_init(G, world_size: int, algorithm: str) -> None:
    _WORKER["net"] = Network(G, world_size, algorithm)


def _worker_collective(op: str, algorithm: str, nbytes: int) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    seconds, sent = _WORKER["net"].collective(op, algorithm, nbytes)
    return seconds, sent, time.perf_counter() - t0
