"""Collective algorithms as pure functions: (ranks, bytes) -> a :class:`Schedule` of transfers.

No SimPy here: a schedule says who sends how many bytes to whom after what; the engine
(:mod:`emulator.engine`) decides when, over which links, at what rate.

Sizes follow nccl-tests: ``nbytes`` is the message per rank for allreduce, broadcast and
all-to-all, and the total gathered (scattered) bytes for allgather and reduce-scatter.

Two families: the textbook algorithms (one module each, pure functions of ranks and bytes), and
collectives as NCCL runs them (:mod:`.nccl`: channels over the graph's NVLinks and NICs, trees,
NVLS, the LL/LL128/Simple protocols), named ``nccl*`` and needing the graph.
"""
from __future__ import annotations

from .._checks import is_int
from ..errors import ConfigError
from . import compressed, direct, hierarchical, nccl, rhd, ring, tree
from ._schedule import Route, Schedule, Transfer, check_ranks, split

__all__ = ["Route", "Transfer", "Schedule", "ALGORITHMS", "NCCL_ALGORITHMS", "TEXTBOOK_ALGORITHMS",
           "OPS", "BUSBW_OPS", "build_schedule", "busbw_factor", "split", "nccl"]


def _nccl(op: str, name: str):
    def build(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None, protocol=None,
              channels=None):
        return nccl.build(op, name, ranks, nbytes, graph=graph, chunks=chunks,
                          payload_bytes=payload_bytes, protocol=protocol, channels=channels)

    build.__name__ = f"{name}_{op}"
    build.__doc__ = f"{op} as NCCL runs it ({name}); see emulator.collectives.nccl."
    return build


#: (op, algorithm) of the NCCL family -> builder (also accepts ``protocol`` and ``channels``).
NCCL_ALGORITHMS = {
    **{(op, "nccl"): _nccl(op, "nccl") for op in nccl.OP_ALGOS},
    **{(op, "nccl_ring"): _nccl(op, "nccl_ring")
       for op in ("allreduce", "allgather", "reduce_scatter", "broadcast")},
    ("allreduce", "nccl_tree"): _nccl("allreduce", "nccl_tree"),
    ("allreduce", "nccl_nvls"): _nccl("allreduce", "nccl_nvls"),
    ("allreduce", "nccl_nvls_tree"): _nccl("allreduce", "nccl_nvls_tree"),
    ("alltoall", "nccl_p2p"): _nccl("alltoall", "nccl_p2p"),
    ("allreduce", "nccl_qsgd_allgather"): _nccl("allreduce", "nccl_qsgd_allgather"),
    ("allreduce", "nccl_qsgd_scatter_reduce_allgather"):
        _nccl("allreduce", "nccl_qsgd_scatter_reduce_allgather"),
}

#: (op, algorithm) -> builder(ranks, nbytes, *, chunks, graph, payload_bytes) -> Schedule
ALGORITHMS = {
    ("allreduce", "ring"): ring.allreduce,
    ("allreduce", "tree"): tree.allreduce,
    ("allreduce", "rhd"): rhd.allreduce,
    ("allreduce", "direct"): direct.allreduce,
    ("allreduce", "hierarchical"): hierarchical.allreduce,
    ("allreduce", "parameter_server"): direct.parameter_server,
    ("allreduce", "qsgd_allgather"): compressed.qsgd_allgather,
    ("allreduce", "qsgd_scatter_reduce_allgather"): compressed.qsgd_scatter_reduce_allgather,
    ("reduce_scatter", "ring"): ring.reduce_scatter,
    ("reduce_scatter", "direct"): direct.reduce_scatter,
    ("allgather", "ring"): ring.allgather,
    ("allgather", "direct"): direct.allgather,
    ("broadcast", "ring"): ring.broadcast,
    ("broadcast", "tree"): tree.broadcast,
    ("alltoall", "direct"): direct.alltoall,
    **NCCL_ALGORITHMS,
}

OPS = tuple(sorted({op for op, _ in ALGORITHMS}))

#: The textbook algorithms: pure functions of (ranks, bytes), closed forms in
#: :mod:`emulator.closed_form`; the NCCL ones need the graph (closed forms in
#: :mod:`emulator.collectives.nccl.cost`).
TEXTBOOK_ALGORITHMS = {k: v for k, v in ALGORITHMS.items() if k not in NCCL_ALGORITHMS}

#: nccl-tests' bus bandwidth factors, busbw = algbw * f(p) (doc/PERFORMANCE.md of NVIDIA/nccl-tests).
_BUSBW = {
    "allreduce": lambda p: 2.0 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


#: Ops that have a bus bandwidth factor (the nccl-tests ops).
BUSBW_OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce")
assert set(BUSBW_OPS) == set(_BUSBW)


def busbw_factor(op: str, p: int) -> float:
    """nccl-tests' busbw / algbw factor of ``op`` on ``p`` ranks.

    Examples
    --------
    >>> import emulator
    >>> emulator.busbw_factor("allreduce", 8), emulator.busbw_factor("allgather", 8)
    (1.75, 0.875)
    """
    try:
        f = _BUSBW[op]
    except KeyError:
        raise ConfigError(f"op={op!r} has no busbw factor; known: {sorted(_BUSBW)}") from None
    if p < 1:
        raise ConfigError(f"p={p!r} must be >= 1")
    return float(f(p))


def build_schedule(op: str, algorithm: str, ranks, nbytes: int, *, chunks: int = 1, graph=None,
                   payload_bytes=None, protocol=None, channels=None) -> Schedule:
    """The schedule of ``op`` by ``algorithm`` over ``ranks``.

    Parameters
    ----------
    op, algorithm : str
        A key of :data:`ALGORITHMS`.
    ranks : int or sequence of int
        ``p`` (ranks 0..p-1) or the participating ranks, in the algorithm's order.
    nbytes : int
        Message size in bytes (nccl-tests convention, see the module docstring), >= 1.
    chunks : int
        Pipelining: each message is cut into this many chunks (NCCL's slices), >= 1.
    graph : networkx.Graph, optional
        Needed by topology-aware algorithms (``hierarchical``); ranks must be in it.
    payload_bytes : sequence of int, optional
        Compressed sizes in bytes per rank (QSGD transports).
    protocol : str, optional
        NCCL algorithms only: ``LL``, ``LL128``, ``Simple`` or an NCCL_PROTO style list
        (``"^LL"``); default NCCL's choice for the size.
    channels : int, optional
        NCCL algorithms only: channels to use (default NCCL's).

    Examples
    --------
    A ring allreduce on 4 ranks: 2 (p - 1) steps of one segment per rank, 2 (p - 1)/p of the
    message sent by each rank; NCCL's model on two DGX A100 runs 64 MiB on all 16 of NCCL's
    channels (two per NIC's ring).

    >>> import emulator, topologies
    >>> s = emulator.build_schedule("allreduce", "ring", 4, 4_000_000)
    >>> len(s), s.total_bytes // 4
    (24, 6000000)
    >>> emulator.build_schedule("allreduce", "bogus", 4, 1)
    Traceback (most recent call last):
    ...
    emulator.errors.ConfigError: algorithm='bogus' is not known for op='allreduce'; known: [...]
    >>> s = build_schedule("allreduce", "nccl", 16, 1 << 26,
    ...                    graph=topologies.from_spec("cluster:dgx_a100x2"))
    >>> s.detail["nccl"]["algorithm"], s.detail["nccl"]["channels"]
    ('Ring', 16)
    """
    if (op, algorithm) not in ALGORITHMS:
        algos = sorted(a for o, a in ALGORITHMS if o == op)
        if not algos:
            raise ConfigError(f"op={op!r} is not known; known ops: {list(OPS)}")
        raise ConfigError(f"algorithm={algorithm!r} is not known for op={op!r}; known: {algos}")
    if not is_int(nbytes) or nbytes <= 0:
        raise ConfigError(f"nbytes={nbytes!r} must be an integer number of bytes > 0")
    if not is_int(chunks) or chunks < 1:
        raise ConfigError(f"chunks={chunks!r} must be an integer >= 1")
    ranks = check_ranks(ranks)
    extra = {}
    if (op, algorithm) in NCCL_ALGORITHMS:
        extra = {"protocol": protocol, "channels": channels}
    elif protocol is not None or channels is not None:
        raise ConfigError(f"protocol={protocol!r}, channels={channels!r}: only NCCL algorithms "
                          f"(nccl, nccl_ring, ...) take them, not algorithm={algorithm!r}")
    if graph is not None:
        import topologies

        n = len(topologies.gpus(graph))
        bad = [r for r in ranks if r >= n]
        if bad:
            raise ConfigError(f"ranks {bad[:5]} are not in the graph "
                              f"{graph.graph.get('name', '')!r} ({n} GPUs, ranks 0..{n - 1})")
    return ALGORITHMS[(op, algorithm)](ranks, int(nbytes), chunks=int(chunks), graph=graph,
                                       payload_bytes=payload_bytes, **extra)
