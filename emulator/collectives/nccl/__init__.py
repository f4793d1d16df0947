"""Collectives as NCCL runs them: channels, rings, trees, NVLS; LL, LL128 and Simple.

:class:`NcclSystem` reads a topology as NCCL's topology detection would; :mod:`.channels`
builds NCCL's rings and trees over it; :mod:`.builders` turns them into schedules with NCCL's
per-hop latencies and protocol overheads (:mod:`.constants`, cited from NCCL's sources),
:mod:`.p2p` the all-to-all's grouped sends; :mod:`.cost` gives their closed forms, and :func:`plan` picks the fastest (algorithm,
protocol) for a size as NCCL's tuner does, unless NCCL_ALGO / NCCL_PROTO style lists say
otherwise.

Names in :data:`emulator.collectives.ALGORITHMS`: ``nccl`` (NCCL's choice), ``nccl_ring``,
``nccl_tree``, ``nccl_nvls``, ``nccl_nvls_tree``, ``nccl_p2p`` (all-to-all), and the QSGD
transports ``nccl_qsgd_allgather``, ``nccl_qsgd_scatter_reduce_allgather``.

>>> import topologies
>>> G = topologies.from_spec("dgx_h100")
>>> p = plan(G, "allreduce", 1 << 30)
>>> p.algorithm, p.protocol
('NVLS', 'Simple')
>>> plan(G, "allreduce", 1 << 30, algo="Ring").describe()
'NCCL Ring/Simple, 24 channels'
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from .._builder import Builder
from .._schedule import check_ranks
from . import builders, constants, cost, p2p, pipeline
from .channels import (base_rings, channel_rings, channel_trees, channels_for_size,
                       communicator_channels, nic_bandwidths)
from .constants import ALGOS, PROTOCOLS
from .system import NcclSystem

__all__ = ["NcclSystem", "Plan", "plan", "build", "parse_list", "OP_ALGOS", "NAMES", "PROTOCOLS",
           "ALGOS", "channel_rings", "channel_trees", "channels_for_size", "base_rings",
           "communicator_channels", "constants", "pipeline"]

#: What NCCL runs for each op (tuning.cc: trees and NVLS only reduce; all-to-all is p2p).
OP_ALGOS = {
    "allreduce": ("Tree", "Ring", "NVLS", "NVLSTree"),
    "allgather": ("Ring",),
    "reduce_scatter": ("Ring",),
    "broadcast": ("Ring",),
    "alltoall": ("P2P",),
}

#: Emulator algorithm name -> NCCL algorithm (None: NCCL's own choice).
NAMES = {"nccl": None, "nccl_ring": "Ring", "nccl_tree": "Tree", "nccl_nvls": "NVLS",
         "nccl_nvls_tree": "NVLSTree", "nccl_p2p": "P2P"}

#: The QSGD transports on NCCL's channels: emulator name -> what moves the payloads.
QSGD = {"nccl_qsgd_allgather": "allgather", "nccl_qsgd_scatter_reduce_allgather": "sra"}


def parse_list(value, allowed, what: str) -> tuple:
    """An NCCL_ALGO / NCCL_PROTO style selection: ``"Ring,Tree"``, ``"^LL"`` (all but LL),
    case-insensitive; a list of names works too. Returns the selected names of ``allowed``.

    Raises
    ------
    ConfigError
        Naming an unknown entry and what is allowed.

    Examples
    --------
    >>> parse_list("^ll", PROTOCOLS, "protocol")
    ('LL128', 'Simple')
    """
    if value is None:
        return tuple(allowed)
    if isinstance(value, str):
        text = value.strip()
        neg = text.startswith("^")
        items = [t.strip() for t in text.lstrip("^").split(",") if t.strip()]
    else:
        neg, items = False, [str(t).strip() for t in value]
    if not items:
        raise ConfigError(f"{what}={value!r} names nothing; allowed: {', '.join(allowed)}")
    lookup = {a.lower(): a for a in allowed}
    chosen = []
    for it in items:
        if it.lower() not in lookup:
            raise ConfigError(f"{what}={value!r}: {it!r} is not one of {', '.join(allowed)}")
        chosen.append(lookup[it.lower()])
    return tuple(a for a in allowed if (a in chosen) != neg)


@dataclass(frozen=True)
class Plan:
    """NCCL's choice for one collective.

    Attributes
    ----------
    op : str
    algorithm, protocol : str
        NCCL's names (``Ring``/``Tree``/``NVLS``/``NVLSTree``/``P2P``; ``LL``/``LL128``/
        ``Simple``).
    channels : int
        NCCL's channels the message runs on: the communicator's, fewer for a small message
        (:func:`channels_for_size`); NVLS's own (:func:`.pipeline.nvls_channels`).
    predicted_s : float
        The closed form's seconds for the choice.
    candidates : tuple of (algorithm, protocol, seconds)
        Every enabled choice and its closed-form seconds.
    loops : int
        A ring channel's loops of chunks (:func:`.pipeline.ring_chunking`); every loop's steps
        pay their handshakes, so the time is affine in the bytes only for one count. 1 for
        the other algorithms.
    """

    op: str
    algorithm: str
    protocol: str
    channels: int
    predicted_s: float
    candidates: tuple
    loops: int = 1

    def describe(self) -> str:
        s = "" if self.channels == 1 else "s"
        return f"NCCL {self.algorithm}/{self.protocol}, {self.channels} channel{s}"

    def to_dict(self) -> dict:
        return {"op": self.op, "algorithm": self.algorithm, "protocol": self.protocol,
                "channels": self.channels, "loops": self.loops, "predicted_s": self.predicted_s,
                "candidates": [{"algorithm": a, "protocol": p, "seconds": t}
                               for a, p, t in self.candidates]}


def _enabled(system: NcclSystem, op: str, algos, protos) -> list:
    out = []
    for a in OP_ALGOS[op]:
        if a not in algos:
            continue
        if a == "NVLS" and not (system.nvls_enabled() and system.n_nodes == 1):
            continue
        if a == "NVLSTree" and not (system.nvls_enabled() and system.n_nodes > 1):
            continue
        for p in PROTOCOLS:
            if p not in protos:
                continue
            if a in ("NVLS", "NVLSTree") and p != "Simple":
                continue
            if a == "P2P" and p == "LL128":
                continue
            if not system.protocol_enabled(p):
                continue
            out.append((a, p))
    return out


def _time(system, rings, op, algo, proto, nbytes, blocks=None, comm=None, nc=None) -> float:
    """Closed-form seconds. ``comm`` is the communicator's NCCL channels (default one per
    ring), ``nc`` the NCCL channels the message runs on (default all): NCCL's plateau test
    counts the communicator's, and each running channel's steps are its share's chunks."""
    comm = comm or len(rings)
    nc = nc or comm
    if algo == "Ring":
        if op == "broadcast":
            return cost.broadcast_time(system, rings, nbytes, proto)
        scale = cost.ring_latency_scale(system, op, proto, nbytes, comm)
        eff = cost.efficiency(system, rings, "Ring", proto)
        waits = cost.ring_waits(system, rings, op, proto, eff, nbytes, nc, scale)
        return cost.ring_time(system, rings, op, blocks, proto, eff, lat_scale=scale,
                              waits=waits)
    if algo == "Tree":
        return cost.tree_time(system, rings, nbytes, proto)
    if algo == "NVLS":
        return cost.nvls_time(system, nbytes)
    if algo == "NVLSTree":
        return cost.nvls_tree_time(system, rings, nbytes)
    return p2p.time(system, _a2a_sizes(system, nbytes), proto)


def _running(rings: list, comm: int, nc: int) -> list:
    """The rings ``nc`` of the communicator's ``comm`` NCCL channels run on: NCCL's channel c
    is ring ``c mod len(rings)`` (connect.cc copies the searched rings after them), so the
    first ``nc`` channels run on the first rings. A ring keeps its links' bandwidth when fewer
    of its copies run (the model gives a channel no rate of its own)."""
    return rings[:max(1, min(len(rings), nc))]


def _blocks(system: NcclSystem, op: str, nbytes: int):
    """Per-rank block bytes of a ring op (nccl-tests sizes: allreduce per rank, allgather and
    reduce-scatter the total)."""
    from .._schedule import split

    return split(nbytes, len(system.ranks))


def _a2a_sizes(system: NcclSystem, nbytes: int) -> np.ndarray:
    """nccl-tests' all-to-all of ``nbytes``: rank j's share of every rank's buffer goes to j
    (the :mod:`.p2p` size matrix)."""
    from .._schedule import split

    return p2p.uniform(system, split(nbytes, len(system.ranks)))


def _check_op(op: str):
    if op not in OP_ALGOS:
        raise ConfigError(f"op={op!r} has no NCCL algorithm; known: {', '.join(OP_ALGOS)}")


def _choose(system, rings, op, nbytes, algo, proto, blocks=None, comm=None):
    """NCCL's choice: ``((algorithm, protocol, seconds), candidates, rings run, NCCL channels
    run)``; ``comm`` is the communicator's channels."""
    _check_op(op)
    algos = parse_list(algo, ALGOS + ("P2P",), "algorithm")
    protos = parse_list(proto, PROTOCOLS, "protocol")
    cands = _enabled(system, op, algos, protos)
    if not cands:
        runs = sorted({a for a, _ in _enabled(system, op, ALGOS + ("P2P",), PROTOCOLS)})
        raise ConfigError(f"algorithm={algo!r}, protocol={proto!r} leave nothing NCCL runs for "
                          f"{op} on this topology; it runs: {', '.join(runs)} with "
                          f"{', '.join(p for p in PROTOCOLS if any(q == p for _, q in _enabled(system, op, ALGOS + ('P2P',), PROTOCOLS)))}")
    if blocks is None:
        blocks = _blocks(system, op, nbytes)
    comm = comm or len(rings)
    timed = [(a, p, _time(system, rings, op, a, p, nbytes, blocks, comm=comm))
             for a, p in cands]
    a, p, t = min(timed, key=lambda t: t[2])
    # NCCL chooses with every channel counted, then runs a small message on fewer
    # (channels_for_size); the choice's time is that of the channels it runs on.
    nc = channels_for_size(len(system.ranks), a, p, nbytes, comm)
    if a in ("NVLS", "NVLSTree"):       # NVLS runs on its own channels (nvls.cc)
        nc = pipeline.nvls_channels(system.arch, system.n_nodes,
                                    min(nic_bandwidths(system), default=0.0))
    run = _running(rings, comm, nc)
    if nc < comm and a in ("Ring", "Tree"):
        t = _time(system, run, op, a, p, nbytes, blocks, comm=comm, nc=nc)
    return (a, p, t), tuple(timed), run, nc


def _loops(system: NcclSystem, op: str, algo: str, proto: str, nbytes: int, nc: int) -> int:
    """A ring channel's loops (:func:`.pipeline.ring_chunking`) for ``nbytes`` on ``nc``
    channels; 1 for other algorithms."""
    if algo != "Ring" or op not in builders.RING_OPS or len(system.ranks) < 2:
        return 1
    share = max(-(-int(nbytes) // max(nc, 1)), 1)
    return pipeline.ring_chunking(op, proto, share, len(system.ranks), system.buffers).loops


def _comm(system: NcclSystem, rings: list, channels) -> int:
    """The communicator's NCCL channels: the ``channels`` asked for, else NCCL's own count."""
    return len(rings) if channels is not None else communicator_channels(system)


def plan(G, op: str, nbytes: int, ranks=None, *, algo=None, proto=None, channels=None,
         system: NcclSystem | None = None) -> Plan:
    """NCCL's (algorithm, protocol) for ``op`` of ``nbytes`` (nccl-tests sizes) on ``G``.

    Parameters
    ----------
    G : networkx.Graph
        Topology.
    op : str
        ``allreduce``, ``allgather``, ``reduce_scatter``, ``broadcast`` or ``alltoall``.
    nbytes : int
        Message size in bytes, > 0.
    ranks : int or sequence of int, optional
        Participating ranks (default every GPU).
    algo, proto : str or sequence, optional
        NCCL_ALGO / NCCL_PROTO style restrictions (``"Ring"``, ``"^NVLS"``, ``"LL,LL128"``).
    channels : int, optional
        The communicator's channels (default NCCL's count, :func:`communicator_channels`,
        carried by the distinct rings); a small message runs on fewer, as NCCL runs it
        (:func:`channels_for_size`).

    Returns
    -------
    Plan

    Examples
    --------
    >>> import topologies
    >>> plan(topologies.from_spec("dgx_a100"), "allreduce", 8).protocol
    'LL'
    """
    if system is None:
        system = NcclSystem.of(G, _ranks(G, ranks))
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes <= 0:
        raise ConfigError(f"nbytes={nbytes!r} must be an integer number of bytes > 0")
    rings = channel_rings(system, channels)
    (a, p, t), timed, run, nc = _choose(system, rings, op, int(nbytes), algo, proto,
                                        comm=_comm(system, rings, channels))
    return Plan(op, a, p, nc, t, timed, _loops(system, op, a, p, int(nbytes), nc))


def _ranks(G, ranks):
    import topologies

    if ranks is None:
        return tuple(range(len(topologies.gpus(G))))
    return check_ranks(ranks)


def build(op: str, name: str, ranks, nbytes: int, *, graph=None, chunks: int = 1,
          payload_bytes=None, protocol=None, channels=None):
    """The schedule of ``op`` by emulator algorithm ``name`` (a key of :data:`NAMES` or
    :data:`QSGD`); ``protocol`` and, for ``nccl``, the algorithm follow NCCL's choice unless
    given (NCCL_PROTO style for ``protocol``). ``chunks`` is NCCL's own business: ignored."""
    system = NcclSystem.of(graph, ranks)
    rings = channel_rings(system, channels)
    comm = _comm(system, rings, channels)
    b = Builder()
    if name in QSGD:
        return _qsgd(b, system, rings, name, ranks, nbytes, payload_bytes, protocol, comm)
    algo = NAMES[name]
    if algo is not None and algo not in OP_ALGOS.get(op, ()):
        raise ConfigError(f"algorithm={name!r} does not run {op} (NCCL runs {op} with "
                          f"{', '.join(OP_ALGOS.get(op, ()))})")
    (a, p, t), timed, rings, nc = _choose(system, rings, op, nbytes, algo, protocol, comm=comm)
    sched = None
    if len(system.ranks) >= 2:
        eff = cost.efficiency(system, rings, a, p, nbytes)
        if a == "Ring" and op != "broadcast":
            scale = cost.ring_latency_scale(system, op, p, nbytes, comm)
            sched = _ring(system, rings, op, name, nbytes, p, eff, scale, nc)
        elif a == "Ring":
            builders.broadcast(b, system, rings, nbytes, p, eff)
        elif a == "Tree":
            builders.tree_allreduce(b, system, rings, nbytes, p, eff)
        elif a == "NVLS":
            builders.nvls_allreduce(b, system, nbytes)
        elif a == "NVLSTree":
            builders.nvls_tree_allreduce(b, system, rings, nbytes)
        else:
            p2p.alltoall(b, system, _a2a_sizes(system, nbytes), p, eff=eff)
    if sched is None:
        sched = b.build(system.ranks, op, name, nbytes, 1)
    return sched.annotate(nccl=Plan(op, a, p, nc, t, timed,
                                    _loops(system, op, a, p, nbytes, nc)).to_dict(),
                          payload_bytes=_payload(op, a, len(system.ranks), nbytes))


#: The last ring schedule :func:`_ring` built: (its key, the objects keyed by identity, it).
_KEPT: dict = {}


def _ring(system: NcclSystem, rings: list, op: str, name: str, nbytes: int, proto: str,
          eff: float, lat_scale: float = 1.0, nc: int | None = None):
    """The ring schedule of ``op`` (``nc`` NCCL channels on ``rings``): the last one built,
    :meth:`~emulator.Schedule.resized`, when it had the same system, channels, protocol,
    efficiency and latency scale (a ring's transfers, dependencies and routes do not depend on
    the bytes, only the bytes and the steps' handshake waits do; a study asks for a collective
    at dozens of sizes and at 1024 GPUs building one costs seconds), else built. One is kept
    (at 1024 GPUs and 8 channels it holds 8 million transfers)."""
    blocks = _blocks(system, op, nbytes)
    waits = cost.ring_waits(system, rings, op, proto, eff, nbytes, nc or len(rings), lat_scale)
    key = (op, name, proto, eff, lat_scale, len(rings))
    objs = (system, *rings)
    kept = _KEPT.get("ring")
    if kept is not None and kept[0] == key and all(a is b for a, b in zip(kept[1], objs)):
        return kept[2].resized(builders.ring_sizes(system, rings, op, blocks, proto, eff), nbytes,
                               builders.ring_compute(system, rings, op, proto, waits, lat_scale))
    _KEPT.clear()
    b = Builder()
    builders.ring(b, system, rings, op, blocks, proto, eff, lat_scale=lat_scale, waits=waits)
    sched = b.build(system.ranks, op, name, nbytes, 1)
    _KEPT["ring"] = (key, objs, sched)
    return sched


def _payload(op, algo, p, nbytes) -> int:
    """Payload bytes all GPUs send together, without protocol and link overheads."""
    if p < 2:
        return 0
    if op == "allreduce":
        return int(2 * (p - 1) * nbytes) if algo != "NVLS" else int(p * nbytes * (1 + 1 / p))
    if op in ("allgather", "reduce_scatter", "alltoall"):
        return int((p - 1) * nbytes)
    return int((p - 1) * nbytes)


def _qsgd(b, system, rings, name, ranks, nbytes, payload_bytes, protocol, comm=None):
    from ..compressed import _payloads

    p = len(system.ranks)
    sizes = _payloads(payload_bytes, p, name)
    total = max(int(sizes.sum()), 1)
    (a, proto, t), timed, rings, nc = _choose(system, rings, "allgather", total, "Ring",
                                              protocol, blocks=sizes, comm=comm)
    sent = 0
    if p >= 2:
        eff = cost.efficiency(system, rings, "Ring", proto)
        waits = cost.ring_waits(system, rings, "allgather", proto, eff, total, nc)
        if QSGD[name] == "allgather":
            builders.ring(b, system, rings, "allgather", sizes, proto, eff, waits=waits)
            sent = int((p - 1) * sizes.sum())
        else:
            owners = p2p.uniform(system, sizes)      # each owner's slice from every rank
            scatter = p2p.alltoall(b, system, owners, "Simple", tag="scatter")
            by_rank = np.argsort(system.ranks, kind="stable")   # senders in rank order
            done = {}
            for k, y in enumerate(system.ranks):
                inbound = scatter[by_rank, k]
                done[y] = int(b.local(y, [np.asarray([v]) for v in inbound[inbound >= 0]],
                                      "reduce")[0])
            builders.ring(b, system, rings, "allgather", sizes, proto, eff, first_deps=done,
                          waits=waits)
            sent = int((p - 1) * sizes.sum() * 2)
            t += p2p.time(system, owners)
    sched = b.build(system.ranks, "allreduce", name, nbytes, 1)
    return sched.annotate(nccl=Plan("allreduce", "Ring", proto, nc, t, timed,
                                    _loops(system, "allgather", "Ring", proto, total, nc)
                                    ).to_dict(),
                          payload_bytes=sent)
