"""Simulate one transfer per class of equivalent ones: the engine's exact symmetry reduction.

On a cluster of identical machines on a regular fabric, NCCL's rings, the all-to-all and the
QSGD transports repeat one pattern: rank ``r + d`` does what rank ``r`` does, ``d`` ranks
along, over links that are images of each other. Such a shift ``sigma(r) = (r + d) mod p``
is a *symmetry* of a schedule on a network when

1. it maps transfers onto transfers: the k-th transfer (in schedule order) from ``a`` to
   ``b`` onto the k-th from ``sigma(a)`` to ``sigma(b)``, with the same bytes and local
   work, its dependencies onto the image's dependencies and its connection predecessor
   (``after``) onto the image's; and
2. it maps channels onto channels: position i of the path from ``a`` to ``b`` onto position
   i of the path from ``sigma(a)`` to ``sigma(b)``, consistently (a channel has one image,
   an image one preimage), with equal capacity, and every path onto one of equal latency.

Then the simulation is equivariant: the max-min fair allocation is unique, so equivalent
flows get equal rates at every instant and every event of a transfer happens at the same
time for its ``n = p / d`` images. The engine then needs one transfer per class (those sent
from positions ``0..d-1``; a class's dependencies become their classes' representatives) on
a *quotient network* whose channels are the classes of channels: a class of ``n_c``
channels crossed by representatives that stand for ``n`` flows each saturates when its
representatives' rates sum to ``capacity * n_c / n`` (each of its channels then carries
``capacity``). Path latencies stay the representatives' own. The reduction is exact, not an
approximation: times agree with the full engine to the events' merge tolerance (1e-12
relative; ``tests/emulator/test_symmetry.py`` compares both on random regular fabrics up to
1,024 GPUs). It is the orbit (quotient) construction of symmetry reduction in discrete-event
and model-checking practice (Ip & Dill, *Better verification through symmetry*, 1996), for
the cyclic group a shift generates.

Where a fault, a straggler, ECMP hashing that differs from machine to machine, or a tree
(NCCL's double binary tree puts each machine at a different place) breaks the shift, no
symmetry is found and the engine simulates every transfer, as before. Found or not, the
check costs a few array passes over the schedule (no Python loop per transfer).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Symmetry", "find", "QuotientNetwork", "QuotientSchedule", "MAX_CANDIDATES"]

#: Shifts tried at most (the smallest first) after the per-rank signature has ruled out the
#: rest; most fail on the first transfer of each (sender, receiver) group, cheaply.
MAX_CANDIDATES = 32

_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Symmetry:
    """A shift of ``shift`` ranks that maps a schedule on its network onto itself.

    Attributes
    ----------
    shift : int
        ``d``: rank position ``r`` maps to ``(r + d) mod p``.
    copies : int
        ``n = p / d``: transfers per class (every class has exactly ``n``).
    image : ndarray of int
        Transfer index -> index of its image under the shift.
    reps : ndarray of int
        Indices of the classes' representatives (the transfers sent from positions < d),
        increasing; the quotient's transfer ``i`` is ``reps[i]``.
    class_of : ndarray of int
        Transfer index -> its class (quotient transfer index).
    chan_class : ndarray of int
        Channel id -> its class of channels (-1: no transfer crosses it).
    class_size : ndarray of int
        Channels per class of channels.
    """

    shift: int
    copies: int
    image: np.ndarray
    reps: np.ndarray
    class_of: np.ndarray
    chan_class: np.ndarray
    class_size: np.ndarray

    def holds_for(self, schedule) -> bool:
        """Whether the shift still maps ``schedule``'s bytes and local work onto themselves
        (the rest is its :attr:`~emulator.Schedule.structure`, checked when found)."""
        return _same(schedule.size, self.image) and _same(schedule.compute_s, self.image)


def _same(values: np.ndarray, image: np.ndarray) -> bool:
    return bool(np.array_equal(values[image], values))


def _distinct(x: np.ndarray) -> np.ndarray:
    """The distinct values of ``x``, increasing (a sort: numpy's hashing ``unique`` is
    slower on the wide int64 keys made here)."""
    xs = np.sort(x)
    return xs[np.r_[True, xs[1:] != xs[:-1]]] if len(xs) else xs


def _positions(schedule) -> tuple:
    """Sender and receiver of each transfer as positions 0..p-1 in ``schedule.ranks``."""
    ranks = tuple(schedule.ranks)
    p = len(ranks)
    if ranks == tuple(range(p)):
        return p, schedule.src.astype(np.int64), schedule.dst.astype(np.int64)
    pos = np.full(max(ranks) + 1, -1, dtype=np.int64)
    pos[list(ranks)] = np.arange(p)
    return p, pos[schedule.src], pos[schedule.dst]


def _candidates(p: int, src: np.ndarray, dst: np.ndarray, schedule) -> list:
    """Shifts ``d`` (divisors of ``p`` below it, smallest first) under which every rank's
    sends look alike: equal sums of a hash of (distance to the receiver, bytes, dependencies)
    on ranks ``d`` apart. Necessary, not sufficient: :func:`_verify` decides."""
    dist = ((dst - src) % p).astype(np.uint64)
    ndeps = np.diff(schedule.dep_ptr).astype(np.uint64)
    size = schedule.size.astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (dist + np.uint64(1)) * _MIX
        h ^= (size + np.uint64(7)) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= (ndeps + np.uint64(3)) * np.uint64(0x94D049BB133111EB)
        h *= _MIX
    # order-free per rank: sums of 21-bit slices (exact in float64 up to 2**32 transfers)
    sig = np.stack([np.bincount(src, weights=((h >> np.uint64(b)) & np.uint64(0x1FFFFF))
                                .astype(np.float64), minlength=p) for b in (0, 21, 42)])
    out = []
    for d in _divisors(p):
        if np.array_equal(sig, np.roll(sig, -d, axis=1)):
            out.append(d)
            if len(out) == MAX_CANDIDATES:
                break
    return out


def _divisors(p: int) -> list:
    """Divisors of ``p`` below it, increasing."""
    small = [d for d in range(1, int(p ** 0.5) + 1) if p % d == 0]
    return sorted({*small, *(p // d for d in small)} - {p})


class _Keys:
    """Transfers grouped by (sender, receiver) position, each with its order in the group."""

    def __init__(self, p: int, src: np.ndarray, dst: np.ndarray):
        self.p = p
        self.src, self.dst = src, dst
        key = src * p + dst
        self.order = np.argsort(key, kind="stable")
        ks = key[self.order]
        starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        self.uniq = ks[starts]                        # distinct groups, increasing
        self.first = starts                           # their first place in ``order``
        self.count = np.diff(np.r_[starts, len(ks)])
        self.k = np.empty(len(key), dtype=np.int64)
        self.k[self.order] = np.arange(len(key)) - np.repeat(starts, self.count)
        self.leader = self.order[starts]              # each group's first transfer

    def _at(self, src, dst, s, k):
        p = self.p
        key = ((src + s) % p) * p + (dst + s) % p
        g = np.minimum(np.searchsorted(self.uniq, key), len(self.uniq) - 1)
        if not (np.array_equal(self.uniq[g], key) and np.all(k < self.count[g])):
            return None
        return self.order[self.first[g] + k]

    def shifted(self, s):
        """Index of the k-th transfer of each transfer's group shifted by ``s`` positions
        (a number or one per transfer), or None when some has no such transfer."""
        return self._at(self.src, self.dst, s, self.k)

    def leaders_shifted(self, s: int):
        """(each group's first transfer, the first of its group shifted by ``s``) or None."""
        img = self._at(self.src[self.leader], self.dst[self.leader], s,
                       np.zeros(len(self.leader), dtype=np.int64))
        return None if img is None else (self.leader, img)


def _deps_map(schedule, image: np.ndarray) -> bool:
    """Whether each transfer's image depends on the images of its dependencies (as sets)."""
    ptr, idx = schedule.dep_ptr.astype(np.int64), schedule.dep_idx.astype(np.int64)
    n = np.diff(ptr)
    if not np.array_equal(n[image], n):
        return False
    seg = np.repeat(np.arange(len(n)), n)
    mapped = image[idx]                                            # images of t's deps
    offs = np.arange(len(idx)) - np.repeat(ptr[:-1], n)
    theirs = idx[np.repeat(ptr[image], n) + offs]                  # deps of t's image
    if np.array_equal(mapped, theirs):
        return True
    a = np.lexsort((mapped, seg))
    b = np.lexsort((theirs, seg))
    return bool(np.array_equal(mapped[a], theirs[b]))


def _channel_map(net, frm: np.ndarray, to: np.ndarray):
    """The channel map that taking transfers ``frm`` to ``to`` induces (channel -> image,
    -1 where unused), or None where it is not one."""
    pair, pimg = net.pair_of[frm], net.pair_of[to]
    ptr = net.pair_ptr
    npairs = len(ptr) - 1
    combo = _distinct(pair * npairs + pimg)
    a, b = combo // npairs, combo % npairs
    la, lb = ptr[a + 1] - ptr[a], ptr[b + 1] - ptr[b]
    if not np.array_equal(la, lb) or not np.array_equal(net.pair_lat[a], net.pair_lat[b]):
        return None
    offs = np.arange(int(la.sum())) - np.repeat(np.cumsum(la) - la, la)
    ca = net.pair_chan[np.repeat(ptr[a], la) + offs]
    cb = net.pair_chan[np.repeat(ptr[b], la) + offs]
    cap = np.asarray(net.capacity)
    if not np.array_equal(cap[ca], cap[cb]):
        return None
    n_ch = len(cap)
    edges = _distinct(ca * n_ch + cb)
    fa, fb = edges // n_ch, edges % n_ch
    # one image per channel, one preimage per image
    if len(_distinct(fa)) != len(fa) or len(_distinct(fb)) != len(fb):
        return None
    kappa = np.full(n_ch, -1, dtype=np.int64)
    kappa[fa] = fb
    if np.any(kappa[fb] < 0):      # an image outside the used channels: cannot be (bijection)
        return None
    return kappa


def _classes(kappa: np.ndarray, copies: int) -> tuple:
    """Classes of the used channels under ``kappa`` (which has order dividing ``copies``):
    the smallest channel id of each orbit by pointer doubling, then compacted."""
    used = np.flatnonzero(kappa >= 0)
    low = np.where(kappa >= 0, np.arange(len(kappa)), -1)
    step = kappa.copy()
    span = 1
    while span < copies:
        low[used] = np.minimum(low[used], low[step[used]])
        step[used] = step[step[used]]
        span *= 2
    ids, cls = np.unique(low[used], return_inverse=True)
    chan_class = np.full(len(kappa), -1, dtype=np.int64)
    chan_class[used] = cls
    return chan_class, np.bincount(cls, minlength=len(ids))


def _verify(net, schedule, keys: _Keys, p: int, d: int):
    # first each group's first transfer (a few per rank): most shifts fail here, cheaply
    lead = keys.leaders_shifted(d)
    if lead is None or _channel_map(net, *lead) is None:
        return None
    image = keys.shifted(d)
    if image is None or not _same(schedule.size, image) or \
            not _same(schedule.compute_s, image):
        return None
    after = np.asarray(schedule.after, dtype=np.int64)
    mapped_after = np.where(after >= 0, image[np.maximum(after, 0)], -1)
    if not np.array_equal(after[image], mapped_after) or not _deps_map(schedule, image):
        return None
    kappa = _channel_map(net, np.arange(len(schedule)), image)
    if kappa is None:
        return None
    copies = p // d
    chan_class, class_size = _classes(kappa, copies)
    # a representative crossing two channels of one class would load it twice: not handled
    ptr = net.pair_ptr
    lens = np.diff(ptr)
    owner = np.repeat(np.arange(len(lens)), lens)
    cls = chan_class[net.pair_chan]
    if len(cls) and len(_distinct(owner * (len(class_size) + 1) + cls)) != len(cls):
        return None
    reps = np.flatnonzero(keys.src < d)
    rep = keys.shifted(-(keys.src // d) * d)
    class_of_rep = np.full(len(schedule), -1, dtype=np.int64)
    class_of_rep[reps] = np.arange(len(reps))
    return Symmetry(shift=d, copies=copies, image=image, reps=reps,
                    class_of=class_of_rep[rep], chan_class=chan_class, class_size=class_size)


def find(net, schedule):
    """The shift with the most copies that maps ``schedule`` on ``net`` onto itself, or None.

    Parameters
    ----------
    net : emulator.netpaths.Network
        The schedule's paths on its topology.
    schedule : Schedule

    Returns
    -------
    Symmetry or None
        None when no shift of fewer than ``p`` ranks (``p`` = the schedule's ranks) holds.

    Examples
    --------
    A ring allreduce on 8 GPUs behind one switch: every GPU does what the one before it
    does, so one transfer in 8 is simulated.

    >>> import emulator, topologies
    >>> from emulator.netpaths import Network
    >>> G = topologies.switch(8)
    >>> s = emulator.build_schedule("allreduce", "ring", 8, 8_000_000)
    >>> emulator.symmetry.find(Network(G, s), s).copies
    8
    """
    p, src, dst = _positions(schedule)
    if p < 2 or len(schedule) < 2:
        return None
    cands = _candidates(p, src, dst, schedule)
    if not cands:
        return None
    keys = _Keys(p, src, dst)
    for d in cands:
        sym = _verify(net, schedule, keys, p, d)
        if sym is not None:
            return sym
    return None


class QuotientNetwork:
    """The engine's view of a network with one path per class of paths (see the module
    docstring): what :class:`emulator.netpaths.Network` offers the event loop."""

    def __init__(self, net, sym: Symmetry):
        reps = sym.reps
        used, self.pair_of = np.unique(net.pair_of[reps], return_inverse=True)
        self.pair_of = self.pair_of.astype(np.int64)
        ptr = net.pair_ptr
        lens = ptr[used + 1] - ptr[used]
        self.pair_ptr = np.zeros(len(used) + 1, dtype=np.int64)
        np.cumsum(lens, out=self.pair_ptr[1:])
        offs = np.arange(int(lens.sum())) - np.repeat(self.pair_ptr[:-1], lens)
        self.pair_chan = sym.chan_class[net.pair_chan[np.repeat(ptr[used], lens) + offs]]
        self.pair_lat = net.pair_lat[used]
        # a class of n_c channels carries n flows per representative: capacity * n_c / n
        first = np.full(len(sym.class_size), -1, dtype=np.int64)
        chans = np.flatnonzero(sym.chan_class >= 0)
        first[sym.chan_class[chans[::-1]]] = chans[::-1]
        self.capacity = np.asarray(net.capacity)[first] * sym.class_size / sym.copies
        self.derived: dict = {}


class QuotientSchedule:
    """The representatives of a schedule's classes as the event loop reads a schedule:
    their bytes and local work, and dependencies and connection predecessors replaced by
    those transfers' classes."""

    def __init__(self, schedule, sym: Symmetry):
        reps = sym.reps
        self.src, self.dst = schedule.src[reps], schedule.dst[reps]
        self.size, self.compute_s = schedule.size[reps], schedule.compute_s[reps]
        self.ids = schedule.ids[reps]
        ptr = schedule.dep_ptr.astype(np.int64)
        n = ptr[reps + 1] - ptr[reps]
        self.dep_ptr = np.zeros(len(reps) + 1, dtype=np.int64)
        np.cumsum(n, out=self.dep_ptr[1:])
        offs = np.arange(int(n.sum())) - np.repeat(self.dep_ptr[:-1], n)
        self.dep_idx = sym.class_of[schedule.dep_idx.astype(np.int64)[np.repeat(ptr[reps], n)
                                                                       + offs]]
        after = np.asarray(schedule.after, dtype=np.int64)[reps]
        self.after = np.where(after >= 0, sym.class_of[np.maximum(after, 0)], -1)

    def __len__(self) -> int:
        return len(self.src)
