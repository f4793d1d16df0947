"""Alpha-beta closed forms of every collective schedule of :mod:`emulator.collectives`.

The model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005): a message of ``m`` bytes between
two ranks takes ``alpha + m * beta`` seconds, ``alpha`` the path latency (s) and ``beta`` the
inverse bandwidth (s/byte), and no two messages slow each other down. That is
exactly what :mod:`emulator.engine` does with a flow whose channels nobody else uses: its bytes
leave at the path's bottleneck bandwidth and the last one arrives one path latency later. A
schedule's time is then the longest path through its dependency graph, each transfer weighing
``alpha + m * beta``; every function below writes that longest path down for one schedule,
including its integer splits (:func:`~emulator.collectives.split` gives the extra bytes to the
first parts, so critical paths carry ceiling sizes) and its chunk pipelining.

When the formulas are exact (what ``tests/emulator/test_closed_form.py`` checks against the
engine to 1e-9): every GPU pair's path has latency ``alpha`` and bottleneck ``1/beta`` and no
two concurrent flows share a directed channel: the ring algorithms on ``topologies.ring(p)``;
ring, tree broadcast and rhd on ``topologies.switch(p)`` (alpha = two link latencies); every
algorithm on ``topologies.fully_connected(p)``; and the latency is worth more than a few bytes
(``alpha >= p * beta``; true of any real link) so that one-byte split differences never make a
rank's next send overlap its previous one. Exceptions, where the schedule congests itself on
any topology and the formula is a lower bound: the double binary tree for ``p < 4`` with
``chunks > 1`` or for ``chunks > ceil(log2 p)`` (its two trees then use one GPU pair at once),
and ``qsgd_scatter_reduce_allgather`` when payload sizes differ by more than ``alpha / beta``
bytes (an owner's all-gather then overlaps its own scatter). Direct algorithms (and the
parameter server) assume a port per peer: on one switch each rank's ``p - 1`` concurrent
messages share its link, which multiplies their bandwidth term by ``p - 1``.

Everywhere, congestion and slower paths only add time, so with the fastest path's alpha and
beta the formula is a lower bound of the simulated time on any topology.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .collectives import ALGORITHMS, OPS, split
from .collectives.compressed import _payloads
from .errors import ConfigError
from ._checks import is_int

__all__ = ["closed_form", "MODELS"]


@dataclass(frozen=True)
class _Args:
    p: int                  # ranks
    n: int                  # bytes (nccl-tests convention, see emulator.collectives)
    alpha: float            # s, path latency
    beta: float             # s/byte, 1 / path bandwidth
    c: int                  # chunks per message
    payload: object         # per-rank payload bytes (QSGD transports)
    g: object               # GPUs per node (hierarchical)
    alpha_inter: float      # s, inter-node path latency (hierarchical)
    beta_inter: float       # s/byte, inter-node inverse bandwidth (hierarchical)

    def msg(self, m: float, chunks: int = 1) -> float:
        """Seconds of one message of ``m`` bytes sent as ``chunks`` back-to-back chunks."""
        return chunks * self.alpha + m * self.beta


def _ring(seg, steps: int, c: int, alpha: float, beta: float, start=None):
    """Longest paths through :func:`emulator.collectives.ring.ring_pass` (Patarasuk & Yuan 2009).

    ``seg[j]`` bytes of segment (block) j, each cut into ``c`` chunks by ``split``; position r
    sends one segment per step, each chunk after the previous one arrived (its connection) and
    after the previous position's same chunk arrived (its data). A path follows one position's
    chain, whose segment index drops by one per step, or jumps to the next position at some
    chunk i: that position handles the *same* segment in the next step, so the path repeats
    chunk i but skips the rest of a step. Any path is therefore L runs over the consecutive
    segments S, S-1, ..., S-L+1 (mod p), each run one whole segment plus extra repeated chunks
    (best the largest, chunk 0, of size ceil(seg/c)), with ``steps - L`` repeats in all:

        T(S, L) = start[S] + L c alpha + (steps - L) alpha
                  + beta (sum_window seg + (steps - L) max_window ceil(seg / c)).

    With c = 1 this is ``steps (alpha + max(seg) beta)``; with equal segments of s bytes it is
    ``steps (c alpha + s beta)``, the ring docstring's formula.

    Returns
    -------
    (best_from, best_to) : ndarray of float
        Seconds of the longest path that starts with segment S, and that ends with segment E.
    """
    seg = np.asarray(seg, dtype=np.int64)
    p = len(seg)
    head = -(-seg // c)                     # ceil: split gives the first chunk the extra byte
    start = np.zeros(p) if start is None else np.asarray(start, dtype=float)
    best_from = np.full(p, -np.inf)
    best_to = np.full(p, -np.inf)
    win = np.zeros(p, dtype=np.int64)       # bytes of the window S, S-1, ..., S-L+1
    top = np.zeros(p, dtype=np.int64)       # its largest chunk
    for L in range(1, steps + 1):
        win += np.roll(seg, L - 1)          # np.roll(a, k)[S] = a[(S - k) % p]
        np.maximum(top, np.roll(head, L - 1), out=top)
        extra = steps - L
        val = start + (L * c + extra) * alpha + beta * (win + extra * top).astype(float)
        np.maximum(best_from, val, out=best_from)
        np.maximum(best_to, np.roll(val, -(L - 1)), out=best_to)
    return best_from, best_to


def _ring_time(seg, steps: int, c: int, alpha: float, beta: float) -> float:
    if steps < 1:
        return 0.0
    if c == 1:  # the path stays on the largest segment (see _ring)
        return steps * (alpha + int(np.max(seg)) * beta)
    return float(_ring(seg, steps, c, alpha, beta)[0].max())


# -- one function per schedule: _Args -> seconds -----------------------------------------------
def _ring_allreduce(a: _Args) -> float:
    """Ring allreduce, 2(p-1) steps: 2(p-1)(c alpha + n/p beta) for p*c | n (Patarasuk & Yuan
    2009; Thakur et al. 2005 without the reduction term)."""
    return _ring_time(split(a.n, a.p), 2 * (a.p - 1), a.c, a.alpha, a.beta)


def _ring_half(a: _Args) -> float:
    """Ring reduce-scatter or allgather of n bytes in all: (p-1)(c alpha + n/p beta) for p*c | n
    (Thakur et al. 2005, ring algorithm)."""
    return _ring_time(split(a.n, a.p), a.p - 1, a.c, a.alpha, a.beta)


def _chain_broadcast(a: _Args) -> float:
    """Pipelined chain: hop h sends chunk i after hop h-1 did and after its chunk i-1 arrived,
    a (p-1) x c grid whose longest path is every chunk once plus p-2 largest chunks:
    c alpha + n beta + (p-2)(alpha + ceil(n/c) beta), i.e. (p + c - 2)(alpha + n/c beta) when
    c | n (the pipelined chain of Pjesivac-Grbovic et al. 2007)."""
    if a.p < 2:
        return 0.0
    return a.msg(a.n, a.c) + (a.p - 2) * a.msg(-(-a.n // a.c))


def _binomial_broadcast(a: _Args) -> float:
    """Binomial tree, each rank sending the whole message (c chunks) to one child after the
    other, largest subtree first: ceil(log2 p)(c alpha + n beta) (Thakur et al. 2005,
    binomial tree). Position 1, the root's last child, waits for ceil(log2 p) - 1 whole sends first;
    pipelining gains nothing as a child only starts once the previous one is served."""
    return (a.p - 1).bit_length() * a.msg(a.n, a.c)


def _double_tree(a: _Args) -> float:
    """NCCL's double binary tree: each tree reduces then broadcasts h = ceil(n/2) bytes in c
    chunks along chains of 2H transfers, H = ceil(log2 p) the trees' height, a 2H x c grid:
    c alpha + h beta + (2H - 1)(alpha + ceil(h/c) beta) (Sanders, Speck & Traeff 2009: the
    latency term grows as 2 log2(p) alpha and the bandwidth term tends to n/2 beta as c grows,
    a link per pair). Exact while the trees keep off each other's pairs: p >= 4 and
    c <= H, or c = 1 (module docstring)."""
    if a.p < 2:
        return 0.0
    h = -(-a.n // 2)
    H = (a.p - 1).bit_length()
    return a.msg(h, a.c) + (2 * H - 1) * a.msg(-(-h // a.c))


def _rhd(a: _Args) -> float:
    """Rabenseifner's halving-doubling (Thakur et al. 2005), q = 2**floor(log2 p):
    2 log2(q) rounds of c alpha plus, along the critical path, the blocks that hold segment 0
    (the largest of split(n, q)); for p > q a whole message before and after, r = p - q.

    The path in a round goes to either partner, so it can keep the largest block in every
    round and ends at active rank q-1. The final message to an excluded rank leaves from active
    rank b < r, which costs the allgather the rounds whose bit b leaves clear (there the path
    gets the neighbouring block); the best b <= r-1 follows from a scan of r-1's bits.
    """
    if a.p < 2:
        return 0.0
    q = 1 << (a.p.bit_length() - 1)
    extra = a.p - q
    q0, rem = divmod(a.n, q)
    dists = [q >> k for k in range(1, q.bit_length())]          # q/2, ..., 1

    def block(d, j):  # bytes of segments [j d, (j + 1) d)
        return d * q0 + min(max(rem - j * d, 0), d)

    rounds = sum(a.msg(block(d, 0), a.c) for d in dists)        # reduce-scatter = free allgather
    if not extra:
        return 2 * rounds
    gain = {d: block(d, 0) - block(d, 1) for d in dists}        # >= 0
    M = extra - 1
    best = sum(gain[d] for d in dists if M & d)                 # b = M itself
    above = 0
    for d in dists:                                             # b below M: clear a set bit
        if M & d:
            best = max(best, above + sum(gain[e] for e in dists if e < d))
            above += gain[d]
    constrained = sum(a.msg(block(d, 1), a.c) for d in dists) + best * a.beta + a.msg(a.n, a.c)
    return a.msg(a.n, a.c) + rounds + max(rounds, constrained)


def _direct_once(a: _Args) -> float:
    """One-shot all-pairs round (allgather, reduce-scatter, all-to-all): alpha + ceil(n/p) beta,
    a port per peer (the pairwise exchange of Thakur et al. 2005 with its p-1 steps at once)."""
    return a.msg(-(-a.n // a.p)) if a.p >= 2 else 0.0


def _direct_allreduce(a: _Args) -> float:
    """Direct reduce-scatter then direct allgather of the owner's segment: 2(alpha + ceil(n/p)
    beta), the path through the owner of segment 0."""
    return 2 * _direct_once(a)


def _parameter_server(a: _Args) -> float:
    """Push the whole gradient to the server, pull the sum back: 2(alpha + n beta) with a port
    per worker (Li et al. 2014); a single server port would carry (p-1) n bytes each way."""
    return 2 * a.msg(a.n) if a.p >= 2 else 0.0


def _qsgd_allgather(a: _Args) -> float:
    """Ring all-gather of payloads C_j, p-1 steps: (p-1)(alpha + max_j C_j beta) for c = 1 (the
    largest payload is forwarded hop by hop, each hop waiting for it); equal payloads C give
    (p-1)(c alpha + C beta) (the ring allgather of Thakur et al. 2005 with blocks C_j)."""
    sizes = _payloads(a.payload, a.p, "qsgd_allgather")
    return _ring_time(sizes, a.p - 1, a.c, a.alpha, a.beta) if a.p >= 2 else 0.0


def _qsgd_sra(a: _Args) -> float:
    """All-to-all of compressed chunks to their owners (owner S ready at alpha + C_S beta), then
    the ring all-gather of the owners' chunks started by each owner once ready:
    max_S [alpha + C_S beta + longest ring path starting at segment S] (see _ring)."""
    sizes = _payloads(a.payload, a.p, "qsgd_scatter_reduce_allgather")
    if a.p < 2:
        return 0.0
    ready = a.alpha + sizes.astype(float) * a.beta
    return float(_ring(sizes, a.p - 1, a.c, a.alpha, a.beta, ready)[0].max())


def _hierarchical(a: _Args) -> float:
    """Intra-node ring reduce-scatter (g-1 steps, (alpha, beta)), a ring allreduce of each local
    segment r across the H = p/g nodes along rail r (2(H-1) steps, (alpha_inter, beta_inter)),
    then an intra-node ring allgather (g-1 steps). Local rank r ends the reduce-scatter with
    segment r, reduces it along its rail and starts the allgather with it, so
    T = max_r [RS ending with segment r + rail r + AG starting with segment r]
    (Jia et al. 2018; Horovod's hierarchical allreduce), which is
    2(g-1)(c alpha + n/g beta) + 2(H-1)(c alpha_inter + n/(gH) beta_inter) when g H c | n.
    Exact when intra and rail flows use disjoint channels (a NIC per GPU on a rail fabric)."""
    g = a.g
    H = a.p // g
    seg = split(a.n, g)
    if g >= 2:
        ag_from, rs_to = _ring(seg, g - 1, a.c, a.alpha, a.beta)
    else:
        ag_from = rs_to = np.zeros(1)
    rail = {s: _ring_time(split(s, H), 2 * (H - 1), a.c, a.alpha_inter, a.beta_inter)
            for s in set(seg.tolist())}
    return float(max(rs_to[r] + rail[int(s)] + ag_from[r] for r, s in enumerate(seg)))


#: (op, algorithm) -> model(_Args) -> seconds; the keys are those of
#: collectives.TEXTBOOK_ALGORITHMS (the NCCL family's closed forms need the graph:
#: emulator.collectives.nccl.cost).
MODELS: dict[tuple[str, str], Callable[[_Args], float]] = {
    ("allreduce", "ring"): _ring_allreduce,
    ("allreduce", "tree"): _double_tree,
    ("allreduce", "rhd"): _rhd,
    ("allreduce", "direct"): _direct_allreduce,
    ("allreduce", "hierarchical"): _hierarchical,
    ("allreduce", "parameter_server"): _parameter_server,
    ("allreduce", "qsgd_allgather"): _qsgd_allgather,
    ("allreduce", "qsgd_scatter_reduce_allgather"): _qsgd_sra,
    ("reduce_scatter", "ring"): _ring_half,
    ("reduce_scatter", "direct"): _direct_once,
    ("allgather", "ring"): _ring_half,
    ("allgather", "direct"): _direct_once,
    ("broadcast", "ring"): _chain_broadcast,
    ("broadcast", "tree"): _binomial_broadcast,
    ("alltoall", "direct"): _direct_once,
}


def _int(name: str, value, minimum: int) -> int:
    if not is_int(value) or value < minimum:
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}")
    return int(value)


def _real(name: str, value, *, positive: bool, unit: str) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ConfigError(f"{name}={value!r} must be a finite number {'>' if positive else '>='} "
                          f"0 ({unit})")
    return float(value)


def closed_form(op: str, algorithm: str, p: int, nbytes: int, alpha: float, beta: float, *,
                chunks: int = 1, payload_bytes=None, gpus_per_node: int | None = None,
                alpha_inter: float | None = None, beta_inter: float | None = None) -> float:
    """Seconds that the schedule of ``op`` by ``algorithm`` takes in the alpha-beta model.

    Parameters
    ----------
    op, algorithm : str
        A key of :data:`emulator.collectives.ALGORITHMS` (and of :data:`MODELS`).
    p : int
        Number of ranks, >= 1 (one rank: 0 s).
    nbytes : int
        Message size in bytes, > 0 (nccl-tests convention: per rank for allreduce, broadcast
        and all-to-all, the gathered total for allgather and reduce-scatter).
    alpha : float
        Latency of every rank-to-rank path in seconds, >= 0.
    beta : float
        Inverse bandwidth of every path in s/byte (1 / bytes/s), > 0.
    chunks : int
        Chunks per message, as given to :func:`emulator.build_schedule` (ignored by the direct
        algorithms and the parameter server, whose schedules ignore it).
    payload_bytes : int or sequence of int, optional
        Compressed bytes per rank; required by the ``qsgd_*`` transports.
    gpus_per_node : int, optional
        GPUs per node g (``hierarchical`` only, required there; g must divide p).
    alpha_inter, beta_inter : float, optional
        Latency (s) and inverse bandwidth (s/byte) of the inter-node (rail) paths of
        ``hierarchical``; default ``alpha`` and ``beta``.

    Returns
    -------
    float
        Seconds from the first send to the last arrival. Exact (equal to
        :func:`emulator.simulate`) under the conditions of the module docstring.

    Raises
    ------
    ConfigError
        Naming the field and value that are not valid.

    Examples
    --------
    A ring allreduce: 2 (p - 1) (alpha + n / (p B)).

    >>> import emulator
    >>> t = emulator.closed_form("allreduce", "ring", 8, 80_000_000, alpha=1e-6, beta=1 / 10e9)
    >>> round(t * 1e3, 4), round(2 * 7 * (1e-6 + 10_000_000 / 10e9) * 1e3, 4)
    (14.014, 14.014)
    """
    if (op, algorithm) not in MODELS:
        if algorithm.startswith("nccl"):
            raise ConfigError(f"algorithm={algorithm!r} is an NCCL algorithm: its closed form "
                              f"needs the topology (emulator.collectives.nccl.plan)")
        if op not in OPS:
            raise ConfigError(f"op={op!r} is not known; known ops: {list(OPS)}")
        algos = sorted(al for o, al in ALGORITHMS if o == op)
        raise ConfigError(f"algorithm={algorithm!r} is not known for op={op!r}; known: {algos}")
    p = _int("p", p, 1)
    if not is_int(nbytes) or nbytes <= 0:
        raise ConfigError(f"nbytes={nbytes!r} must be an integer number of bytes > 0")
    alpha = _real("alpha", alpha, positive=False, unit="seconds")
    beta = _real("beta", beta, positive=True, unit="s/byte")
    chunks = _int("chunks", chunks, 1)
    g = None
    if algorithm == "hierarchical":
        if gpus_per_node is None:
            raise ConfigError("gpus_per_node=None: algorithm 'hierarchical' needs the GPUs per "
                              "node (an integer dividing p)")
        g = _int("gpus_per_node", gpus_per_node, 1)
        if p % g:
            raise ConfigError(f"gpus_per_node={g} does not divide p={p}")
    alpha_inter = alpha if alpha_inter is None else \
        _real("alpha_inter", alpha_inter, positive=False, unit="seconds")
    beta_inter = beta if beta_inter is None else \
        _real("beta_inter", beta_inter, positive=True, unit="s/byte")
    args = _Args(p, int(nbytes), alpha, beta, chunks, payload_bytes, g, alpha_inter, beta_inter)
    return float(MODELS[(op, algorithm)](args))
