"""The largest what-ifs by NCCL's closed forms, and how long the engine would take instead.

The engine moves every transfer of a schedule: a 8,192-GPU NVLS-tree allreduce of 1 GB is 1.2
million transfers, a ring allreduce on 65,536 GPUs 68 billion. NCCL's own cost model
(:mod:`emulator.collectives.nccl.cost`, the closed forms it chooses its algorithm with) gives
a collective's time from the hops of its channels and trees, each at the rate its bottleneck
link leaves when every hop that crosses that link runs at once (congestion from link loads):
work in proportion to the GPUs, not to the transfers. :func:`closed_form_collective` returns
that time as a :class:`FastResult` that names its method and its measured error against the
engine (:data:`ERROR_BOUND`, benchmarks/RESULTS.md "Clusters of 8k to 64k GPUs").

:func:`transfers` counts a schedule's transfers from NCCL's choice without building it, and
:func:`engine_seconds` / :func:`analysis_seconds` turn counts into wall seconds on this
machine, so a command can choose the engine or the closed form, refuse a time limit up front
and say how long it will take.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = ["FastResult", "closed_form_collective", "calibrated_collective", "smaller_cluster",
           "calibration_cluster", "CALIBRATION_S",
           "scaled_bytes", "transfers", "engine_seconds", "analysis_seconds", "ERROR_BOUND",
           "CALIBRATED_BOUND", "METHOD"]

#: How the fast path's times are made, as outputs name it.
METHOD = "closed form (NCCL's cost model with link loads)"

#: Largest relative error of the closed form against the engine, per NCCL algorithm, measured
#: by ``benchmarks/fastpath_error.py`` on DGX H100 and A100 clusters of 16..2,048 GPUs, leaf-
#: spine and rail fabrics, allreduce of 1 MB..1 GB (benchmarks/RESULTS.md, "Clusters of 8k to
#: 64k GPUs"): NCCL's model leaves out the NVLS-tree's pipeline fill (the engine is up to 39 %
#: slower at 1 GB) and overstates LL128 rings and trees at mid sizes (up to 30 %). NVLS (one
#: machine) and all-to-all were not measured: their entry is the largest of the others.
ERROR_BOUND = {"Ring": 0.29, "Tree": 0.31, "NVLSTree": 0.40}

#: Wall seconds per transfer to build and simulate a schedule, per NCCL algorithm, and per GPU
#: to analyse a cluster and choose (system, channels, closed forms), measured on this 2-core
#: machine (benchmarks/RESULTS.md): an estimate for choosing and for progress, not a promise.
SECONDS_PER_TRANSFER = {"Ring": 6e-6, "Tree": 20e-6, "NVLS": 20e-6, "NVLSTree": 40e-6,
                        "P2P": 15e-6, None: 10e-6}
#: Per GPU: 8,192-GPU clusters answer in 8-10 s, 65,536 in 45-50 s on a busy machine
#: (RESULTS.md, 2026-12-06); 2.5 ms before the analysis was made per kind of machine.
SECONDS_PER_GPU = 1.0e-3
#: Fixed costs: importing the engine's kernels, building the graph.
SECONDS_FIXED = 1.5


@dataclass(frozen=True)
class FastResult:
    """A collective's time from the closed form (no transfers simulated).

    Attributes
    ----------
    op, algorithm : str
    nbytes : int
        Size in bytes (nccl-tests convention).
    ranks : int
        Participating GPUs.
    time_s : float
        Predicted seconds.
    error : float
        The method's largest relative error against the engine where both ran
        (:data:`ERROR_BOUND`).
    method : str
    nccl : dict
        NCCL's choice (:meth:`emulator.NcclPlan.to_dict`).
    """

    op: str
    algorithm: str
    nbytes: int
    ranks: int
    time_s: float
    error: float
    method: str = METHOD
    nccl: dict = field(default_factory=dict)

    @property
    def algbw(self) -> float:
        """nccl-tests' algorithm bandwidth, bytes/s."""
        return self.nbytes / self.time_s if self.time_s > 0 else 0.0

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth, bytes/s."""
        from .collectives import busbw_factor

        return self.algbw * busbw_factor(self.op, self.ranks)

    def to_dict(self) -> dict:
        return {"op": self.op, "algorithm": self.algorithm, "nbytes": self.nbytes,
                "ranks": self.ranks, "time_s": self.time_s, "algbw": self.algbw,
                "busbw": self.busbw, "method": self.method, "error_bound": self.error,
                "nccl": self.nccl}


def _names():
    from .collectives.nccl import NAMES

    return NAMES


def closed_form_collective(G, op: str, algorithm: str, nbytes: int, *, ranks=None,
                           protocol=None, channels=None, system=None) -> FastResult:
    """``op`` of ``nbytes`` on ``G`` by NCCL's closed form for its choice (or the NCCL
    algorithm named), without building or simulating a schedule.

    Parameters
    ----------
    G : networkx.Graph
    op : str
        ``allreduce``, ``allgather``, ``reduce_scatter``, ``broadcast`` or ``alltoall``.
    algorithm : str
        An NCCL algorithm of :data:`emulator.NCCL_ALGORITHMS` (``nccl``, ``nccl_ring``, ...).
    nbytes : int
        Bytes, nccl-tests convention.
    ranks : int, optional
        GPUs 0..ranks-1 (default every GPU).
    protocol, channels
        As :func:`emulator.build_schedule` takes them.
    system : emulator.NcclSystem, optional
        ``G``'s analysis for these ranks when the caller holds it: looking it up again
        checks the whole graph for changes (0.3 s on 8,192 GPUs, 1.7 s on 65,536).

    Returns
    -------
    FastResult

    Examples
    --------
    >>> import topologies
    >>> G = topologies.from_spec("cluster:dgx_h100x2")
    >>> r = closed_form_collective(G, "allreduce", "nccl", 1 << 20)
    >>> r.nccl["algorithm"], r.time_s == r.nccl["predicted_s"], r.error
    ('NVLSTree', True, 0.4)
    """
    from .collectives.nccl import plan

    names = _names()
    if algorithm not in names:
        raise ConfigError(f"algorithm={algorithm!r}: the closed form covers NCCL's algorithms "
                          f"({', '.join(names)}); simulate the others")
    import topologies

    n = len(topologies.gpus(G)) if ranks is None else int(ranks)
    p = plan(G, op, nbytes, range(n), algo=names[algorithm], proto=protocol,
             channels=channels, system=system)
    return FastResult(op, algorithm, int(nbytes), n, p.predicted_s,
                      ERROR_BOUND.get(p.algorithm, max(ERROR_BOUND.values())), nccl=p.to_dict())


#: NCCL algorithm -> the emulator's name that forces it.
FORCE = {"Ring": "nccl_ring", "Tree": "nccl_tree", "NVLS": "nccl_nvls",
         "NVLSTree": "nccl_nvls_tree", "P2P": "nccl_p2p"}

#: Largest relative error of the calibrated closed form (:func:`calibrated_collective`)
#: against the engine, measured by ``benchmarks/fastpath_error.py --calibrate`` (RESULTS.md).
CALIBRATED_BOUND = {"Ring": 0.05, "Tree": 0.07, "NVLSTree": 0.07}


def scaled_bytes(op: str, nbytes: int, ranks: int, small: int) -> int:
    """The size on ``small`` ranks that moves the same bytes per rank (and per pair) as
    ``nbytes`` on ``ranks``: nccl-tests sizes allreduce and broadcast per rank, the others in
    total."""
    if op in ("allreduce", "broadcast"):
        return int(nbytes)
    return max(1, int(round(nbytes * small / ranks)))


def calibrated_collective(G, op: str, algorithm: str, nbytes: int, small, *, ranks=None,
                          protocol=None, channels=None, system=None) -> FastResult:
    """The closed form on ``G`` times the engine's time over the closed form's on ``small``,
    a smaller cluster of the same machines and fabric, for NCCL's choice on ``G`` forced on
    both: what NCCL's model leaves out (pipeline fill between NVLS and tree stages, ECMP
    collisions, links shared unevenly) is measured where the engine runs in seconds, and
    carried to the cluster where it does not. Measured within :data:`CALIBRATED_BOUND`.

    Parameters
    ----------
    G, op, algorithm, nbytes, ranks, protocol, channels, system
        As :func:`closed_form_collective`.
    small : networkx.Graph
        The smaller cluster (every GPU takes part).

    Examples
    --------
    >>> import topologies
    >>> big = topologies.from_spec("cluster:dgx_h100x8")
    >>> r = calibrated_collective(big, "allreduce", "nccl", 1 << 20,
    ...                           topologies.from_spec("cluster:dgx_h100x4"))
    >>> r.method.startswith("closed form x engine"), r.time_s != r.nccl["predicted_s"]
    (True, True)
    """
    import topologies

    from .collectives import build_schedule
    from .engine import simulate

    fast = closed_form_collective(G, op, algorithm, nbytes, ranks=ranks, protocol=protocol,
                                  channels=channels, system=system)
    a, proto = fast.nccl["algorithm"], fast.nccl["protocol"]
    p = len(topologies.gpus(small))
    nb = scaled_bytes(op, nbytes, fast.ranks, p)
    sched = build_schedule(op, FORCE[a], p, nb, graph=small, protocol=proto,
                           channels=channels)
    ratio = simulate(small, sched).time_s / _small_form(
        G, small, fast, nb, proto, p, sched.detail["nccl"]["predicted_s"], system)
    return FastResult(op, algorithm, fast.nbytes, fast.ranks, fast.time_s * ratio,
                      CALIBRATED_BOUND.get(a, max(CALIBRATED_BOUND.values())),
                      method=f"closed form x engine/closed form on {p} GPUs ({ratio:.3f})",
                      nccl=fast.nccl)


def _small_form(G, small, fast: FastResult, nbytes: int, proto: str, p: int,
                predicted: float, big=None) -> float:
    """The closed form on ``small`` in the form ``G``'s was made (``predicted``, the plan's,
    but for this): an all-to-all beyond
    :data:`~emulator.collectives.nccl.p2p.TABLE_MAX` ranks is the aggregate one
    (:mod:`emulator.collectives.nccl.p2pform`), so the calibration measures that form's
    error, not the per-pair table's."""
    from .collectives.nccl import NcclSystem, _a2a_sizes
    from .collectives.nccl import p2p, p2pform

    if fast.nccl["algorithm"] != "P2P":
        return predicted
    if big is None:
        big = NcclSystem.of(G, range(fast.ranks))
    if p2p.aggregated(big):
        system = NcclSystem.of(small, range(p))
        if p2pform.regular(system) is not None:
            return p2p.time(system, _a2a_sizes(system, nbytes), proto, form="aggregate")
    return predicted


def smaller_cluster(spec: str, nodes: int):
    """The graph of ``spec`` (a ``cluster:`` spec) with ``nodes`` machines, or None when the
    spec is not a cluster or already has no more.

    Examples
    --------
    >>> len(smaller_cluster("cluster:dgx_h100x64,fabric=rail", 4).nodes) > 0
    True
    >>> smaller_cluster("fat_tree:k=8", 4) is None
    True
    """
    import topologies

    try:
        family, kw = topologies.parse_spec(spec)
    except (ValueError, TypeError):
        return None
    if family != "cluster" or int(kw.get("nodes", 0)) <= nodes:
        return None
    return _cluster(tuple(sorted(dict(kw, nodes=int(nodes)).items())))


@functools.lru_cache(maxsize=4)
def _cluster(kw: tuple):
    """``topologies.cluster(**dict(kw))``, kept: a study calibrates every size of a collective
    on the same smaller cluster, and NCCL's analysis and the engine's routes are kept with
    the graph (:meth:`~emulator.NcclSystem.of`, :mod:`emulator.netpaths`), so they are worked
    out once, not once per size. Callers only read the graph."""
    import topologies

    return topologies.cluster(**dict(kw))


#: The calibration runs the engine on a smaller cluster for at most this long (s).
CALIBRATION_S = 4.0


def calibration_cluster(spec: str, system, choice: dict, n_transfers: int,
                        budget_s: float = CALIBRATION_S) -> tuple:
    """``(graph, machines)``: the largest cluster of ``spec``'s machines and fabric, halving
    the machines (at least 2, fewer than the cluster's), whose engine run of NCCL's
    ``choice`` should take at most ``budget_s``; (None, 0) when none does or ``spec`` is no
    ``cluster:`` spec. Transfers scale with the GPUs (trees), or with their square (rings,
    all-to-all, NVLS).

    Examples
    --------
    >>> import topologies
    >>> from .collectives.nccl import NcclSystem, plan
    >>> spec = "cluster:dgx_h100x64"
    >>> G = topologies.from_spec(spec)
    >>> s = NcclSystem.of(G, range(512))
    >>> c = plan(G, "allreduce", 1 << 20, system=s).to_dict()
    >>> calibration_cluster(spec, s, c, transfers(s, "allreduce", c, 1 << 20))[1]
    32
    """
    p = len(system.ranks)
    per = p // max(1, system.n_nodes)
    square = choice["algorithm"] in ("Ring", "P2P", "NVLS")
    m = system.n_nodes // 2
    while m >= 2:
        est = engine_seconds(choice["algorithm"],
                             n_transfers * (m * per / p) ** (2 if square else 1))
        if est <= budget_s:
            G = smaller_cluster(spec, m)
            return (G, m) if G is not None else (None, 0)
        m //= 2
    return None, 0


def transfers(system, op: str, choice: dict, nbytes: int) -> int:
    """How many transfers the engine's schedule of NCCL's ``choice`` (a plan's dict) has,
    counted from the system's shape without building it (tested against built schedules).

    Examples
    --------
    >>> import topologies
    >>> from .collectives.nccl import NcclSystem, plan
    >>> G = topologies.from_spec("cluster:dgx_a100x4")
    >>> s = NcclSystem.of(G, range(32))
    >>> transfers(s, "allreduce", plan(G, "allreduce", 10**8, algo="Ring").to_dict(), 10**8)
    15872
    """
    from .collectives._schedule import split
    from .collectives.nccl.builders import _chunks

    p = len(system.ranks)
    if p < 2:
        return 0
    a, proto, c = choice["algorithm"], choice["protocol"], int(choice["channels"])
    if a in ("Ring", "Tree"):
        # the engine runs NCCL's channels on the searched rings, c mod len(rings): at most
        # one schedule ring each (collectives/nccl: _running)
        from .collectives.nccl import channel_rings

        c = min(c, len(channel_rings(system, None)))
    if a == "Ring":
        if op == "broadcast":
            return c * (p - 1) * _chunks(int(split(nbytes, c)[0]), proto)
        return c * p * (2 * (p - 1) if op == "allreduce" else p - 1)
    if a == "Tree":
        half = int(split(int(split(nbytes, c)[0]), 2)[0])
        return c * 2 * 2 * (p - 1) * _chunks(half, proto)
    if a == "NVLS":
        return p * (p - 1)
    if a == "NVLSTree":
        g, h = system.ppn, system.n_nodes
        chunks = len(split(nbytes, _chunks(math.ceil(nbytes / g), "Simple")))
        return chunks * (h * g * (g - 1) * 2 + g * 2 * 2 * (h - 1))
    return p * (p - 1)


def engine_seconds(algorithm: str | None, n_transfers: int) -> float:
    """Estimated wall seconds to build and simulate ``n_transfers`` of NCCL ``algorithm``
    (None: another schedule) on this machine.

    Examples
    --------
    >>> round(engine_seconds("Ring", 2_000_000), 1)
    12.0
    """
    return SECONDS_PER_TRANSFER.get(algorithm, SECONDS_PER_TRANSFER[None]) * n_transfers


def analysis_seconds(n_gpus: int) -> float:
    """Estimated wall seconds to build a cluster of ``n_gpus``, analyse it as NCCL does and
    choose (the closed form's whole cost) on this machine.

    Examples
    --------
    >>> round(analysis_seconds(8192), 1)
    9.7
    """
    return SECONDS_FIXED + SECONDS_PER_GPU * n_gpus
