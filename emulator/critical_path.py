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

The two loops are kernels (:mod:`emulator._jit`): numba-compiled for big schedules (a
1024-GPU ring allreduce has 2 million transfers; a Python loop over them would take
seconds), interpreted for small ones, where loading numba would cost more than the loop.
"""
from __future__ import annotations

import numpy as np

from ._jit import kernel, use_compiled

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
    use_compiled(len(s) + len(s.dep_idx))
    n_pairs = len(net.pair_ptr) - 1
    lens = np.diff(net.pair_ptr)
    pair_id = np.repeat(np.arange(n_pairs), lens)
    n_ch = len(net.capacity)
    # Bottleneck rate of each pair's route (bytes/s); local pairs have no route.
    rate = np.full(n_pairs, np.inf)
    if len(net.pair_chan):
        np.minimum.at(rate, pair_id, net.capacity[net.pair_chan])
    moves = (s.src != s.dst) & (s.size > 0)
    start, leave, arrive = _times(s.dep_ptr, s.dep_idx, s.after, earliest, s.compute_s,
                                  s.size.astype(np.float64), moves, net.pair_of, rate,
                                  net.pair_lat)
    flows = np.flatnonzero(moves)
    flow_pair = net.pair_of[flows]
    order = np.argsort(net.pair_chan, kind="stable")
    chan_ptr = np.zeros(n_ch + 1, dtype=np.int64)
    np.cumsum(np.bincount(net.pair_chan, minlength=n_ch), out=chan_ptr[1:])
    if _any_overlap(flows, flow_pair, start, leave, n_pairs, chan_ptr, pair_id[order]):
        return None
    # Per pair, then per channel of its route: bytes, busy seconds (intervals do not overlap,
    # so they add), and the one rate every flow of the pair had.
    pair_bytes = np.bincount(flow_pair, weights=s.size[flows], minlength=n_pairs)
    pair_busy = np.bincount(flow_pair, weights=leave[flows] - start[flows], minlength=n_pairs)
    ch_bytes = np.bincount(net.pair_chan, weights=pair_bytes[pair_id], minlength=n_ch)
    ch_busy = np.bincount(net.pair_chan, weights=pair_busy[pair_id], minlength=n_ch)
    ch_peak = np.zeros(n_ch)
    used = pair_bytes[pair_id] > 0
    np.maximum.at(ch_peak, net.pair_chan[used],
                  rate[pair_id[used]] / net.capacity[net.pair_chan[used]])
    return {"start_s": start, "leave_s": leave, "arrive_s": arrive,
            "bytes": np.rint(ch_bytes).astype(np.int64), "busy_s": ch_busy, "peak": ch_peak}
