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

import contextlib
import gc
import time
from typing import Callable, Iterable

from emulator.collectives import ALGORITHMS, NCCL_ALGORITHMS, build_schedule
from emulator.collectives import nccl
from emulator.interpolation import Interpolation
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
    interpolate : float, optional
        The approximate mode of :meth:`prefetch` (:mod:`emulator.interpolation`): sizes of one
        shape between simulated ones are read off a line checked to this relative tolerance.
        None (the default): every size is simulated.
    engine_budget_s : float, optional
        NCCL collectives whose engine run would take longer (by the estimate) take NCCL's
        closed form calibrated by the engine on a smaller cluster of the graph's spec
        (:meth:`fast`); None (the default): the engine always.

    Examples
    --------
    >>> import topologies
    >>> net = Network(topologies.from_spec("dgx_a100"))
    >>> s, sent = net.collective("allreduce", net.algorithm, 64 << 20)
    >>> round(64 * 2**20 * 2 * 7 / 8 / s / 1e9)      # busbw, GB/s
    212
    """

    def __init__(self, G, world_size: int | None = None, algorithm: str = DEFAULT_ALGORITHM,
                 on_simulated: Callable[[str, int, float], None] | None = None,
                 interpolate: float | None = None, engine_budget_s: float | None = None):
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
        if interpolate is not None:
            Interpolation([], interpolate)          # validates the tolerance
        self._cache: dict = {}
        self._blocks: dict = {}            # (op, bytes, ranks) -> NCCL's blocks (blocks())
        self.on_simulated = on_simulated
        self.interpolate = interpolate
        #: Cache keys whose times were read off a line (:meth:`prefetch`), not simulated.
        self.interpolated: set = set()
        #: NCCL collectives whose engine run should take longer than this (s, by
        #: :func:`emulator.fastpath.engine_seconds`) take the calibrated closed form
        #: (:meth:`fast`); None: always the engine.
        self.engine_budget_s = engine_budget_s
        #: Cache keys whose times came from the closed form (:meth:`fast`), not the engine.
        self.closed_form: set = set()
        #: Closed-form keys -> (GPUs of the calibration cluster or None, error bound).
        self.fast_facts: dict = {}
        #: Cache keys :meth:`collective` was asked for since this set was last cleared.
        self.used: set = set()
        self._system = None

    @property
    def nccl(self) -> bool:
        """Whether collectives run as NCCL runs them."""
        return ("allreduce", self.algorithm) in NCCL_ALGORITHMS

    @property
    def system(self):
        """NCCL's analysis of the graph for this network's ranks
        (:meth:`~emulator.NcclSystem.of`), looked up once: the graph is only read while a
        network uses it, and the lookup checks the whole graph for changes (0.3 s at 8,192
        GPUs), once per collective size it was asked for before."""
        if self._system is None:
            self._system = nccl.NcclSystem.of(self.G, range(self.world_size))
        return self._system

    def resolve(self, op: str, algorithm: str) -> str:
        """The algorithm that runs ``algorithm`` under this network's model: with NCCL, the
        QSGD transports move on NCCL's channels (``qsgd_allgather`` -> ``nccl_qsgd_allgather``)."""
        if self.nccl and algorithm.startswith("qsgd_") and (op, "nccl_" + algorithm) in ALGORITHMS:
            return "nccl_" + algorithm
        return algorithm

    def blocks(self, op: str, algorithm: str, nbytes: int, ranks=None) -> int:
        """Thread blocks the GPU kernel of one collective occupies while it runs: NCCL
        launches one per channel (``ncclLaunchKernel``, src/enqueue.cc: a grid of
        ``nChannels`` blocks) of up to 640 threads at up to 96 registers each (makefiles/
        common.mk's ``-maxrregcount=96``), nearly a whole SM's register file, so no
        matrix-product block shares its SM: while the collective runs, compute has that many
        SMs fewer. The channels are NCCL's plan's for this size (:func:`emulator.collectives.
        nccl.plan`; NVLS's own, few) on this network's ranks, or on ``ranks`` of its graph (a
        communicator of some of them: HSDP's replicate group); 0 for a collective not run as
        NCCL runs it (the textbook algorithms model no kernel) and on one rank.

        >>> import topologies
        >>> Network(topologies.from_spec("cluster:dgx_h100x2")).blocks("allgather", "nccl", 1 << 28)
        16
        """
        group = None if ranks is None else tuple(ranks)
        size = self.world_size if group is None else len(group)
        if size < 2 or nbytes <= 0 or not self.nccl:
            return 0
        base = op
        if op == "allreduce":
            # a QSGD transport asked for as a whole: its kernels are the all-gather's, or
            # the scatter's all-to-all (the larger of its two phases)
            base = {"nccl_qsgd_allgather": "allgather",
                    "nccl_qsgd_scatter_reduce_allgather": "alltoall"}.get(
                self.resolve(op, algorithm), op)
        if base not in nccl.OP_ALGOS:
            return 0
        key = (base, int(nbytes), group)
        hit = self._blocks.get(key)
        if hit is None:
            plan = (nccl.plan(self.G, base, int(nbytes), range(self.world_size), system=self.system)
                    if group is None else nccl.plan(self.G, base, int(nbytes), list(group)))
            hit = self._blocks[key] = int(plan.channels)
        return hit

    def collective(self, op: str, algorithm: str, nbytes: int, payload_bytes=None) -> tuple[float, float]:
        """``(seconds, mean payload bytes sent per GPU)`` of one collective (0, 0 on one rank).

        The bytes count what the collective moves for the application: NCCL's protocol flags
        and the share of a link NCCL cannot use are in the seconds, not in the bytes.
        """
        if self.world_size == 1 or nbytes == 0:
            return 0.0, 0.0
        algorithm = self.resolve(op, algorithm)
        key = (op, algorithm, int(nbytes), None if payload_bytes is None else tuple(payload_bytes))
        self.used.add(key)
        hit = self._cache.get(key)
        if hit is None:
            seconds, sent, _ = self._simulate(op, algorithm, nbytes, payload_bytes)
            hit = self._cache[key] = (seconds, sent)
        return hit

    def _simulate(self, op: str, algorithm: str, nbytes: int, payload_bytes=None) -> tuple:
        """``(seconds, mean payload bytes per GPU, transfers)`` of one collective, simulated,
        or by the calibrated closed form where the engine would take longer than
        :attr:`engine_budget_s` (:meth:`fast`)."""
        t0 = time.perf_counter()
        fast = self.fast(op, algorithm, nbytes) if payload_bytes is None else None
        if fast is not None:
            if self.on_simulated is not None:
                self.on_simulated(op, int(nbytes), time.perf_counter() - t0)
            return fast
        sched = build_schedule(op, algorithm, list(range(self.world_size)), int(nbytes),
                               graph=self.G, payload_bytes=payload_bytes)
        res = simulate(self.G, sched)
        sent = sched.detail.get("payload_bytes", sched.total_bytes)
        if self.on_simulated is not None:
            self.on_simulated(op, int(nbytes), time.perf_counter() - t0)
        return float(res.time_s), float(sent) / self.world_size, len(sched)

    def fast(self, op: str, algorithm: str, nbytes: int):
        """``(seconds, mean payload bytes per GPU, 0)`` of an NCCL collective by the closed
        form calibrated on a smaller cluster of the graph's spec
        (:func:`emulator.fastpath.calibrated_collective`; the plain closed form for a graph
        that is no ``cluster:`` spec), when the engine would take longer than
        :attr:`engine_budget_s` by its estimate; else None. Its key joins :attr:`closed_form`.

        Examples
        --------
        >>> import topologies
        >>> net = Network(topologies.from_spec("cluster:dgx_h100x16"), engine_budget_s=0.0)
        >>> s, _ = net.collective("allreduce", "nccl", 1 << 20)
        >>> ("allreduce", "nccl", 1 << 20, None) in net.closed_form
        True
        """
        from . import fastpath

        if self.engine_budget_s is None or algorithm not in nccl.NAMES:
            return None
        system = self.system
        choice = nccl.plan(self.G, op, int(nbytes), range(self.world_size),
                           algo=nccl.NAMES[algorithm], system=system).to_dict()
        n_tr = fastpath.transfers(system, op, choice, int(nbytes))
        if fastpath.engine_seconds(choice["algorithm"], n_tr) <= self.engine_budget_s:
            return None
        spec = self.name if self.world_size == len(system._gpu) else ""
        small, machines = fastpath.calibration_cluster(spec, system, choice, n_tr)
        if small is not None:
            res = fastpath.calibrated_collective(self.G, op, algorithm, int(nbytes), small,
                                                 system=system)
        else:
            res = fastpath.closed_form_collective(self.G, op, algorithm, int(nbytes),
                                                  ranks=self.world_size, system=system)
        key = (op, algorithm, int(nbytes), None)
        self.closed_form.add(key)
        self.fast_facts[key] = (machines * system.ppn if small is not None else None, res.error)
        from .collectives.nccl import _payload

        sent = _payload(op, choice["algorithm"], self.world_size, int(nbytes))
        return float(res.time_s), float(sent) / self.world_size, 0

    def method(self, keys=None) -> str:
        """How the seconds of the collectives ``keys`` (cache keys; default :attr:`used`)
        were made, in words: ``"engine"``, or how many took NCCL's closed form calibrated by
        the engine on a smaller cluster (:meth:`fast`), on how many GPUs, within what error
        of the engine where both ran.

        Examples
        --------
        >>> import topologies
        >>> net = Network(topologies.from_spec("cluster:dgx_h100x16"), engine_budget_s=0.0)
        >>> _ = net.collective("allreduce", "nccl", 1 << 20)
        >>> net.method()
        "NCCL's closed form calibrated by the engine on 64 GPUs for 1 of 1 collectives (within 7% of the engine where both ran; the engine would take over 0 s each)"
        """
        keys = set(self.used if keys is None else keys)
        fast = [k for k in keys if k in self.closed_form]
        if not fast:
            return "engine"
        facts = [self.fast_facts.get(k, (None, None)) for k in fast]
        gpus = sorted({g for g, _ in facts if g is not None})
        bounds = [b for _, b in facts if b is not None]
        how = ("calibrated by the engine on " + ", ".join(f"{g:,}" for g in gpus) + " GPUs"
               if gpus else "")
        rest = [] if len(fast) == len(keys) else ["the engine for the rest"]
        said = [f"within {max(bounds):.0%} of the engine where both ran"] if bounds else []
        if self.engine_budget_s is not None:
            said.append(f"the engine would take over {self.engine_budget_s:g} s each")
        return (f"NCCL's closed form {how + ' ' if how else ''}for {len(fast)} of {len(keys)} "
                f"collectives{', ' + rest[0] if rest else ''}"
                + (f" ({'; '.join(said)})" if said else ""))

    def shape(self, op: str, algorithm: str, nbytes: int):
        """What fixes the shape of the schedule of ``op`` by ``algorithm`` at ``nbytes``
        (:mod:`emulator.interpolation`): NCCL's plan (algorithm, protocol, channels, a ring
        channel's loops) under NCCL's model, the (op, algorithm) of a textbook one; None where
        the sizes of its parts do not follow the bytes alone (the QSGD transports' payload
        lists).

        Examples
        --------
        >>> import topologies
        >>> net = Network(topologies.from_spec("dgx_a100"))
        >>> net.shape("allgather", "nccl", 1 << 30)
        ('allgather', 'nccl', 'Ring', 'Simple', 24, 3)
        >>> net.shape("allreduce", "ring", 1 << 30)
        ('allreduce', 'ring')
        """
        algorithm = self.resolve(op, algorithm)
        if algorithm in nccl.QSGD or algorithm.startswith("qsgd_"):
            return None
        if algorithm in nccl.NAMES:
            p = nccl.plan(self.G, op, int(nbytes), range(self.world_size),
                          algo=nccl.NAMES[algorithm], system=self.system)
            return op, algorithm, p.algorithm, p.protocol, p.channels, p.loops
        return op, algorithm

    def prefetch(self, requests: Iterable[tuple[str, str, int]], workers: int = 1) -> int:
        """Simulate the collectives of ``requests`` that are not cached yet, on ``workers``
        local processes, and cache them; returns how many were simulated.

        The distinct sizes of a study or a search are independent simulations: on a big graph
        each costs seconds, so spreading them over processes divides the wall time (each
        process routes the graph once, a few seconds at 512 GPUs). Largest first, so the
        longest ones do not finish last. With ``interpolate`` set, the sizes of one
        :meth:`shape` are simulated only as :class:`~emulator.interpolation.Interpolation`
        asks, the others read off its checked lines (their keys in :attr:`interpolated`).

        Parameters
        ----------
        requests : iterable of (op, algorithm, bytes)
            As :meth:`collective` takes them (``payload_bytes`` left out).
        workers : int
            Local processes; 1 simulates here, one after the other.

        Returns
        -------
        int
            How many collectives were simulated.

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
        with contextlib.ExitStack() as stack:
            pool = None
            if workers > 1 and len(todo) > 1:
                import concurrent.futures as cf
                import multiprocessing

                ctx = multiprocessing.get_context("spawn")  # no forked torch/numba thread pools
                pool = stack.enter_context(cf.ProcessPoolExecutor(
                    max_workers=min(workers, len(todo)), mp_context=ctx,
                    initializer=_worker_init,
                    initargs=(self.G, self.world_size, self.algorithm, self.engine_budget_s,
                              gc.get_threshold())))
            if self.interpolate is None:
                self._simulate_all(list(todo.values()), pool)
                return len(todo)
            return self._sweep(list(todo.values()), pool)

    def _sweep(self, requests: list, pool) -> int:
        """:meth:`prefetch` in the approximate mode: sizes grouped by :meth:`shape`, each
        group a :class:`~emulator.interpolation.Interpolation`; returns how many were simulated."""
        groups: dict = {}
        for op, algorithm, nbytes in requests:
            shape = self.shape(op, algorithm, nbytes)
            # no shape: a group of its own
            groups.setdefault((op, algorithm, shape if shape is not None else nbytes),
                              []).append(nbytes)
        sweeps = {k: Interpolation(v, self.interpolate) for k, v in groups.items()}
        simulated = 0
        while True:
            # One round: every sweep's next sizes at once, so that workers share them.
            wanted = [(op, algorithm, n) for (op, algorithm, _), sw in sweeps.items()
                      for n in sw.wanted()]
            if not wanted:
                break
            got = self._simulate_all(wanted, pool)
            simulated += len(wanted)
            for (op, algorithm, _), sw in sweeps.items():
                for n in sw.wanted():
                    sw.feed(n, *got[(op, algorithm, n)])
        for (op, algorithm, _), sw in sweeps.items():
            # a line through closed-form points gives closed-form times, as they are named
            fast = [(op, algorithm, n, None) for n in sw.simulated
                    if (op, algorithm, n, None) in self.closed_form]
            for n, hit in sw.results().items():
                key = (op, algorithm, n, None)
                self._cache[key] = hit
                if n not in sw.simulated:
                    self.interpolated.add(key)
                    if fast:
                        self.closed_form.add(key)
                        self.fast_facts[key] = self.fast_facts.get(fast[0], (None, None))
        return simulated

    def _simulate_all(self, requests: list, pool=None) -> dict:
        """Simulate and cache ``[(op, algorithm, bytes), ...]`` (resolved, not cached yet)
        here or on ``pool``'s processes (each routes the graph once), largest first;
        ``{request: (seconds, sent, transfers)}``."""
        import concurrent.futures as cf

        order = sorted(requests, key=lambda r: -r[2])
        out: dict = {}
        if pool is None or len(order) < 2:
            for r in order:
                out[r] = self._simulate(*r)
        else:
            futs = {pool.submit(_worker_collective, *r): r for r in order}
            for f in cf.as_completed(futs):
                r = futs[f]
                seconds, sent, transfers, wall_s = f.result()
                out[r] = (seconds, sent, transfers)
                if self.on_simulated is not None:
                    self.on_simulated(r[0], r[2], wall_s)
        for (op, algorithm, nbytes), (seconds, sent, transfers) in out.items():
            self._cache[(op, algorithm, nbytes, None)] = (seconds, sent)
            if transfers == 0:                  # a worker's closed form (fast())
                self.closed_form.add((op, algorithm, nbytes, None))
        return out

    def op_of(self, algorithm: str) -> str:
        """The op under which the emulator registers ``algorithm`` (compressed transports)."""
        ops = sorted({op for op, alg in ALGORITHMS if alg == algorithm})
        if not ops:
            raise ConfigError(f"the emulator has no algorithm {algorithm!r}")
        return "allreduce" if "allreduce" in ops else ops[0]


#: The worker process's Network (:meth:`Network.prefetch`): one per process, routes kept.
_WORKER: dict = {}


def _worker_init(G, world_size: int, algorithm: str, engine_budget_s=None,
                 gc_thresholds=None) -> None:
    from ._malloc import prepare_worker

    # a worker simulates one big collective after another, collecting as its parent does
    prepare_worker(gc_thresholds or gc.get_threshold())
    _WORKER["net"] = Network(G, world_size, algorithm, engine_budget_s=engine_budget_s)


def _worker_collective(op: str, algorithm: str, nbytes: int) -> tuple:
    t0 = time.perf_counter()
    seconds, sent, transfers = _WORKER["net"]._simulate(op, algorithm, nbytes)
    return seconds, sent, transfers, time.perf_counter() - t0
