"""Exact times of a schedule whose flows never share a channel at the same time.

When no two flows are ever on one directed channel together, max-min fair sharing gives every
flow the bandwidth of its slowest channel for its whole life, and the flow-level model reduces
to a longest-path (critical path) pass over the dependency DAG: a transfer starts when its
last dependency has arrived (no earlier than its sender's straggler delay) plus its
``compute_s``, its last byte leaves ``bytes / bottleneck`` later, and it arrives one path
latency after that. These are exactly the event engine's rules (:mod:`emulator.engine`), so
on such schedules both give the same times; this pass needs no events at all.

Whether the premise holds is checked on the result: per directed channel, the intervals
[first byte leaves, last byte leaves) of the flows crossing it must not overlap. If any do,
the flows would have shared bandwidth and :func:`emulator.simulate` falls back to the event
engine. Rings on rings, switches and non-blocking fabrics, trees and the QSGD transports on
uncongested fabrics all take this path, which is what makes thousand-GPU studies cheap.

Two implementations of the same rules, chosen by the schedule's shape:

- per wave, in numpy (:func:`waves`): a wave is a run of consecutive transfers none of which
  waits for another of the run, so its times are a handful of array operations on earlier
  waves' times. A 1024-GPU ring allreduce is 2,046 waves of 1,024 transfers: ~0.3 s, and no
  numba, whose import and cached-kernel load cost ~0.35 s of a process. Its overlap check
  follows each pair's and each shared channel's flows in index order, which is start order
  on the textbook rings; where it is not (or a tie leaves the order open) the kernel
  decides.
- per transfer, in the kernels (:mod:`emulator._jit`): numba-compiled for big schedules of
  narrow waves (pipelined chunks, where each wave holds a few transfers), for schedules whose
  pairs share channels, and for every schedule once the kernels are compiled in the process
  (they stop at the first overlap and need no temporaries); interpreted for small ones,
  where loading numba would cost more than the loop.

Both give the same floats (the same operations in the same order per transfer); the tests
hold them to equality.
"""
from __future__ import annotations

import numpy as np

from ._jit import compiled, kernel, use_compiled
from .collectives._schedule import latest_dependency

# Overlaps shorter than this fraction of the time at which they happen are float noise (the
# same relative tolerance the event engine uses to finish flows together).
_REL_TOL = 1e-12


@kernel
def _times(dep_ptr, dep_idx, after, earliest, compute_s, size, moves, pair_of, pair_rate,
           pair_lat):
    """Start, leave and arrival times (s) of every transfer, in index order (deps and
    ``after`` point back)."""
    n = len(size)
    start = np.empty(n)
    leave = np.empty(n)
    arrive = np.empty(n)
    for i in range(n):
        t = 0.0
        for k in range(dep_ptr[i], dep_ptr[i + 1]):
            a = arrive[dep_idx[k]]
            if a > t:
                t = a
        if earliest[i] > t:
            t = earliest[i]
        s = t + compute_s[i]
        if after[i] >= 0 and leave[after[i]] > s:
            s = leave[after[i]]
        p = pair_of[i]
        start[i] = s
        leave[i] = s + size[i] / pair_rate[p] if moves[i] else s
        arrive[i] = leave[i] + pair_lat[p]
    return start, leave, arrive


@kernel
def _sorted_by_start(members, start):
    """``members`` (flow indices) ordered by start time; stable, cheap when already sorted."""
    for k in range(len(members) - 1):
        if start[members[k + 1]] < start[members[k]]:
            return members[np.argsort(start[members], kind="mergesort")]
    return members


@kernel
def _overlaps(order, start, leave):
    for k in range(len(order) - 1):
        a, b = order[k], order[k + 1]
        if leave[a] > start[b] + _REL_TOL * leave[a]:
            return True
    return False


@kernel
def _any_overlap(flows, flow_pair, start, leave, n_pairs, chan_ptr, chan_pairs):
    """True when two flows are on one channel at once.

    ``flows`` are the transfers that move bytes and ``flow_pair`` their (source, destination)
    pair; ``chan_ptr``/``chan_pairs`` (CSR) list the pairs whose route crosses each channel.
    Flows of one pair share every channel of its route; flows of different pairs meet only
    on channels that several pairs cross, which are checked on the merged flows.
    """
    # Group the flows by pair (counting sort keeps index order inside a pair).
    count = np.zeros(n_pairs + 1, dtype=np.int64)
    for k in range(len(flows)):
        count[flow_pair[k] + 1] += 1
    ptr = np.cumsum(count)
    fill = ptr[:-1].copy()
    grouped = np.empty(len(flows), dtype=np.int64)
    for k in range(len(flows)):
        p = flow_pair[k]
        grouped[fill[p]] = flows[k]
        fill[p] += 1
    for p in range(n_pairs):
        seg = _sorted_by_start(grouped[ptr[p]:ptr[p + 1]], start)
        grouped[ptr[p]:ptr[p + 1]] = seg
        if _overlaps(seg, start, leave):
            return True
    for c in range(len(chan_ptr) - 1):
        lo, hi = chan_ptr[c], chan_ptr[c + 1]
        if hi - lo < 2:
            continue
        total = 0
        for j in range(lo, hi):
            total += ptr[chan_pairs[j] + 1] - ptr[chan_pairs[j]]
        merged = np.empty(total, dtype=np.int64)
        m = 0
        for j in range(lo, hi):
            p = chan_pairs[j]
            for k in range(ptr[p], ptr[p + 1]):
                merged[m] = grouped[k]
                m += 1
        if _overlaps(merged[np.argsort(start[merged], kind="mergesort")], start, leave):
            return True
    return False


# -- per wave, in numpy -------------------------------------------------------------------
#: Mean transfers per wave from which the pass runs per wave in numpy rather than compiling
#: its kernels: a wave costs ~20 numpy calls (~50 us) whatever its width (module docstring).
WIDE = 64
#: Most overlap-check entries per flow (itself and the shared channels of its route) for which
#: the check runs per wave: one flow and a switch's two ports.
ENTRIES = 3
_BLOCK = 1 << 16


def waves(dep_ptr, dep_idx, after, most: int | None = None):
    """Boundaries of a schedule's waves: maximal runs of consecutive transfers none of which
    waits (for a dependency or its ``after``) on another of its run.

    Parameters
    ----------
    dep_ptr, dep_idx : ndarray of int
        The dependency CSR of :class:`emulator.Schedule` (dependencies point back).
    after : ndarray of int
        :attr:`emulator.Schedule.after` (-1 for none).
    most : int, optional
        Give up (return None) past this many waves.

    Returns
    -------
    ndarray of int64 or None
        ``bounds``: wave ``w`` is transfers ``bounds[w]:bounds[w + 1]``.

    Examples
    --------
    Two independent transfers, then one waiting for the first:

    >>> waves(np.array([0, 0, 0, 1]), np.array([0]), np.array([-1, -1, -1])).tolist()
    [0, 2, 3]
    """
    n = len(after)
    last = np.maximum(after, latest_dependency(dep_ptr, dep_idx))   # what each one waits for
    # last[i] < i, so the first transfer from a on that waits for one at or after a ends the
    # wave that starts at a; the running maximum of ``last`` finds it by bisection.
    reach = np.maximum.accumulate(last) if n else last
    bounds = [0]
    a = 0
    while a < n:
        if most is not None and len(bounds) > most:
            return None
        a = max(int(np.searchsorted(reach, a, side="left")), a + 1)
        bounds.append(a)
    return np.asarray(bounds, dtype=np.int64)


def _times_by_wave(bounds, dep_ptr, dep_idx, after, earliest, compute_s, dur, lat):
    """:func:`_times` one wave at a time (``dur``: seconds on the wire, 0 for local steps;
    ``lat``: path latency, per transfer)."""
    n = len(dur)
    start, leave, arrive = np.empty(n), np.empty(n), np.empty(n)
    waits = dep_ptr[1:] > dep_ptr[:-1]
    queued = after >= 0
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        t = earliest[a:b].copy()
        lo, hi = dep_ptr[a], dep_ptr[b]
        if hi > lo:
            w = np.flatnonzero(waits[a:b])
            t[w] = np.maximum(t[w], np.maximum.reduceat(arrive[dep_idx[lo:hi]],
                                                        dep_ptr[a:b][w] - lo))
        t += compute_s[a:b]
        q = np.flatnonzero(queued[a:b])
        if len(q):
            t[q] = np.maximum(t[q], leave[after[a:b][q]])
        start[a:b] = t
        t += dur[a:b]
        leave[a:b] = t
        arrive[a:b] = t + lat[a:b]
    return start, leave, arrive


def _overlap_in_index_order(bounds, flows, keys, n_keys, start, leave):
    """:func:`_any_overlap` for schedules whose flows start in index order per key.

    ``flows`` (increasing) and ``keys`` list, per flow, its pair and then every channel of its
    route that other pairs cross too (as keys past the pairs'). Each entry's predecessor, the
    previous entry of its key in index order, is found wave by wave; the pairs are then
    compared as the kernel compares each key's flows sorted by start. Returns True or False
    where that is the kernel's answer, None where it may not be: no overlap found, but a key
    whose flows do not start in index order, or a tie in start with a flow too short to
    overlap whichever way the kernel orders the tie.
    """
    m = len(flows)
    prev = np.empty(m, dtype=np.int64)
    last = np.full(n_keys, -1, dtype=np.int64)
    cut = np.searchsorted(flows, bounds)
    for lo, hi in zip(cut[:-1].tolist(), cut[1:].tolist()):
        k = keys[lo:hi]
        prev[lo:hi] = last[k]
        here = np.arange(lo, hi)
        last[k] = here
        if (last[k] != here).any():
            return None         # a key twice in one wave: which is first is the kernel's call
    bad = np.zeros(n_keys, dtype=bool)
    hit = np.zeros(n_keys, dtype=bool)
    # In blocks that stay in cache: a dozen temporaries of a 2-million-entry schedule would
    # cost more in page faults than the comparisons.
    for lo in range(0, m, _BLOCK):
        p = prev[lo:lo + _BLOCK]
        mine = p >= 0
        a, b, key = flows[p[mine]], flows[lo:lo + _BLOCK][mine], keys[lo:lo + _BLOCK][mine]
        sa, sb, la, lb = start[a], start[b], leave[a], leave[b]
        tie = sa == sb
        # In a tie either flow may be the kernel's first: both overlapping the other makes
        # the answer the same whichever it takes.
        both = (la - sa > _REL_TOL * la) & (lb - sb > _REL_TOL * lb)
        bad[key[(sb < sa) | (tie & ~both)]] = True
        hit[key[(tie & both) | ((sb > sa) & (la > sb + _REL_TOL * la))]] = True
    # Two flows found overlapping overlap in the kernel's order too: its first after the
    # earlier of them starts no later than the other.
    if hit.any():
        return True
    return None if bad.any() else False


def _shared_keys(flow_pair, n_pairs, pair_id, pair_chan, n_ch, most=None):
    """Entries of the overlap check: per flow its pair, then each channel of its route that
    other pairs cross too (key ``n_pairs + channel``). Returns ``(owner, keys)``, ``owner``
    the entry's index into the flows (increasing); ``(None, None)`` past ``most`` entries."""
    crossing = np.bincount(pair_chan, minlength=n_ch)
    shared = crossing[pair_chan] >= 2
    if not shared.any():
        return np.arange(len(flow_pair)), flow_pair
    sp_ptr = np.zeros(n_pairs + 1, dtype=np.int64)      # pair -> its shared channels (CSR)
    np.cumsum(np.bincount(pair_id[shared], minlength=n_pairs), out=sp_ptr[1:])
    sp_key = n_pairs + pair_chan[shared]
    count = 1 + np.diff(sp_ptr)[flow_pair]
    if most is not None and int(count.sum()) > most:
        return None, None
    owner = np.repeat(np.arange(len(flow_pair)), count)
    rank = np.arange(len(owner)) - (np.cumsum(count) - count)[owner]   # 0: the pair entry
    pair = flow_pair[owner]
    keys = pair.copy()
    ch = rank > 0
    keys[ch] = sp_key[sp_ptr[pair[ch]] + rank[ch] - 1]
    return owner, keys


def contention_free(net, schedule, earliest: np.ndarray):
    """Times of ``schedule`` if none of its flows ever share a channel, else ``None``.

    Parameters
    ----------
    net : emulator.engine._Network
        Routes of the schedule's (source, destination) pairs: ``pair_of``, ``pair_ptr``,
        ``pair_chan`` (CSR of channel ids), ``pair_lat`` (s) and channel ``capacity`` (bytes/s).
    schedule : emulator.Schedule
    earliest : ndarray of float
        Per transfer, the time (s) before which it may not start (straggler delays).

    Returns
    -------
    dict or None
        ``start_s``, ``leave_s``, ``arrive_s`` per transfer and per channel ``bytes``,
        ``busy_s`` and ``peak`` (rate / capacity), or None when two flows overlap on a channel
        (then only the event engine's max-min sharing gives the right answer).
    """
    s = schedule
    n_pairs = len(net.pair_ptr) - 1
    lens = np.diff(net.pair_ptr)
    pair_id = np.repeat(np.arange(n_pairs), lens)
    n_ch = len(net.capacity)
    # Bottleneck rate of each pair's route (bytes/s); local pairs have no route.
    rate = np.full(n_pairs, np.inf)
    if len(net.pair_chan):
        np.minimum.at(rate, pair_id, net.capacity[net.pair_chan])
    moves = (s.src != s.dst) & (s.size > 0)
    flows = np.flatnonzero(moves)
    flow_pair = net.pair_of[flows]
    # Per wave only to spare loading numba: once compiled, the kernels need no temporaries
    # and stop at the first overlap. Not where channels shared by several pairs would
    # multiply the entries to check (NCCL's channels share NVSwitch ports: those schedules
    # overlap, and the event loop compiles anyway).
    bounds = owner = None
    if not compiled():
        owner, keys = _shared_keys(flow_pair, n_pairs, pair_id, net.pair_chan, n_ch,
                                   most=ENTRIES * len(flows))
    if owner is not None:
        bounds = waves(s.dep_ptr, s.dep_idx, s.after, most=len(s) // WIDE)
    overlap = None
    if bounds is not None:
        dur = np.zeros(len(s))
        dur[flows] = (s.size if len(flows) == len(s) else s.size[flows]) / rate[flow_pair]
        start, leave, arrive = _times_by_wave(bounds, s.dep_ptr, s.dep_idx, s.after, earliest,
                                              s.compute_s, dur, net.pair_lat[net.pair_of])
        overlap = _overlap_in_index_order(bounds, flows[owner], keys, n_pairs + n_ch, start,
                                          leave)
    if overlap is None:
        use_compiled(len(s) + len(s.dep_idx))
        if bounds is None:
            start, leave, arrive = _times(s.dep_ptr, s.dep_idx, s.after, earliest, s.compute_s,
                                          s.size.astype(np.float64), moves, net.pair_of, rate,
                                          net.pair_lat)
        order = np.argsort(net.pair_chan, kind="stable")
        chan_ptr = np.zeros(n_ch + 1, dtype=np.int64)
        np.cumsum(np.bincount(net.pair_chan, minlength=n_ch), out=chan_ptr[1:])
        overlap = _any_overlap(flows, flow_pair, start, leave, n_pairs, chan_ptr,
                               pair_id[order])
    if overlap:
        return None
    # Per pair, then per channel of its route: bytes, busy seconds (intervals do not overlap,
    # so they add), and the one rate every flow of the pair had.
    every = len(flows) == len(s)         # every transfer moves bytes: no gathers needed
    pair_bytes = np.bincount(flow_pair, weights=s.size if every else s.size[flows],
                             minlength=n_pairs)
    busy = leave - start
    pair_busy = np.bincount(flow_pair, weights=busy if every else busy[flows],
                            minlength=n_pairs)
    ch_bytes = np.bincount(net.pair_chan, weights=pair_bytes[pair_id], minlength=n_ch)
    ch_busy = np.bincount(net.pair_chan, weights=pair_busy[pair_id], minlength=n_ch)
    ch_peak = np.zeros(n_ch)
    used = pair_bytes[pair_id] > 0
    np.maximum.at(ch_peak, net.pair_chan[used],
                  rate[pair_id[used]] / net.capacity[net.pair_chan[used]])
    return {"start_s": start, "leave_s": leave, "arrive_s": arrive,
            "bytes": np.rint(ch_bytes).astype(np.int64), "busy_s": ch_busy, "peak": ch_peak}
