"""Collective seconds on a topology, as a replayed iteration needs them: one cached call per (op, bytes).

A training iteration sends many buckets of a few distinct sizes; :class:`Network` builds each
distinct collective's schedule once, simulates it on the graph (:func:`emulator.simulate`)
and keeps its time and the bytes each GPU sent.
"""
from __future__ import annotations

from emulator.collectives import ALGORITHMS, build_schedule
from emulator.engine import simulate
from emulator.errors import ConfigError
from ._checks import is_int

__all__ = ["Network"]


class Network:
    """Collective seconds and bytes on graph ``G`` over ranks ``0..world_size-1``, cached.

    Parameters
    ----------
    G : networkx.Graph
        Topology (see :mod:`topologies`).
    world_size : int or None
        GPUs taking part (the first ``world_size`` ranks); None: all GPUs of ``G``.
    algorithm : str
        The emulator's allreduce algorithm for fp32/fp16 ("ring", "tree", ...).
    """

    def __init__(self, G, world_size: int | None = None, algorithm: str = "ring"):
        import topologies

        n = len(topologies.gpus(G))
        if world_size is None:
            world_size = n
        if not is_int(world_size) or not 1 <= world_size <= n:
            raise ConfigError(f"world_size must be an int in [1, {n}] (GPUs of the topology), "
                              f"got {world_size!r}")
        if not isinstance(algorithm, str) or not algorithm:
            raise ConfigError(f"algorithm must be a non-empty string, got {algorithm!r}")
        self.G, self.world_size, self.algorithm = G, world_size, algorithm
        self.name = str(G.graph.get("name", "custom"))
        self._cache: dict = {}

    def collective(self, op: str, algorithm: str, nbytes: int, payload_bytes=None) -> tuple[float, float]:
        """``(seconds, mean bytes sent per GPU)`` of one collective (0, 0 on one rank)."""
        if self.world_size == 1 or nbytes == 0:
            return 0.0, 0.0
        key = (op, algorithm, int(nbytes), None if payload_bytes is None else tuple(payload_bytes))
        hit = self._cache.get(key)
        if hit is None:
            sched = build_schedule(op, algorithm, list(range(self.world_size)), int(nbytes),
                                   graph=self.G, payload_bytes=payload_bytes)
            res = simulate(self.G, sched)
            hit = self._cache[key] = (float(res.time_s), float(sched.total_bytes) / self.world_size)
        return hit

    def op_of(self, algorithm: str) -> str:
        """The op under which the emulator registers ``algorithm`` (compressed transports)."""
        ops = sorted({op for op, alg in ALGORITHMS if alg == algorithm})
        if not ops:
            raise ConfigError(f"the emulator has no algorithm {algorithm!r}")
        return "allreduce" if "allreduce" in ops else ops[0]
