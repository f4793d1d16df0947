"""The flow-level network engine: SimPy drives time, flows share links max-min fairly.

A transfer of a :class:`~emulator.collectives.Schedule` becomes a *flow* once its
dependencies have arrived (and its ``compute_s`` of local work has passed, and any straggler
delay of its sender). The flow follows the route :class:`topologies.Router` gives for its
(source GPU, destination GPU) and crosses the directed channels of that route. Concurrent
flows share every channel max-min fairly (progressive filling, Bertsekas & Gallager, *Data
Networks*, section 6.5.2); rates are recomputed only when a flow starts or its last byte
leaves. A flow's bytes leave at its (changing) rate and arrive one path latency later, so an
uncongested message of m bytes takes latency + m / bandwidth: the alpha-beta model of
Thakur, Rabenseifner & Gropp (2005), which :mod:`emulator.closed_form` writes down.

A schedule whose flows never share a channel needs no events: :mod:`emulator.critical_path`
times it in one pass and checks that premise (a 1024-GPU ring allreduce, 2 million transfers,
in about a second). Every other schedule runs here: one SimPy process (a generator taking
``env`` first) advances from event to event, handling all flows that start or finish together
as one numpy batch (about 75 us per event). Results are deterministic: no randomness, no
dependence on dict or set order.
"""
from __future__ import annotations

import heapq
import itertools

import numpy as np
import simpy

from .collectives import Schedule, build_schedule
from .critical_path import contention_free
from .errors import ConfigError, SimulationError
from .faults import Fault
from .result import CollectiveResult, LinkUsage

__all__ = ["simulate", "run_collective", "max_min_rates"]

# Flows whose finish times agree to this relative tolerance finish in the same event: the same
# byte count at the same rate computed through different float paths.
_REL_TOL = 1e-12


def max_min_rates(entry_flow: np.ndarray, entry_chan: np.ndarray, capacity: np.ndarray,
                  n_flows: int) -> np.ndarray:
    """Max-min fair rates (bytes/s) by progressive filling.

    Parameters
    ----------
    entry_flow, entry_chan : ndarray of int
        One entry per (flow, channel) crossing: flow index in 0..n_flows-1, channel index.
    capacity : ndarray of float
        Bandwidth of each channel in bytes/s.
    n_flows : int

    Returns
    -------
    ndarray of float
        The rate of each flow: no channel is over capacity, and no flow can go faster without
        slowing a flow that is not faster than it.
    """
    rate = np.zeros(n_flows)
    frozen = np.zeros(n_flows, dtype=bool)
    cap = capacity.astype(float).copy()
    alive = np.ones(len(entry_flow), dtype=bool)
    n_ch = len(capacity)
    while alive.any():
        count = np.bincount(entry_chan[alive], minlength=n_ch)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, cap / np.maximum(count, 1), np.inf)
        m = share.min()
        bottleneck = share <= m * (1 + _REL_TOL)
        hit = alive & bottleneck[entry_chan]
        flows = np.unique(entry_flow[hit])
        rate[flows] = m
        frozen[flows] = True
        newly = alive & frozen[entry_flow]
        cap -= np.bincount(entry_chan[newly], minlength=n_ch) * m
        np.maximum(cap, 0.0, out=cap)
        alive &= ~newly
    return rate


class _Network:
    """Routes, channel capacities and latencies of the (route, source, destination) triples a
    schedule uses; transfers of one triple share its path ("pair" below)."""

    def __init__(self, G, schedule: Schedule):
        import topologies

        self.G = G
        self.nodes = topologies.gpus(G)
        n_gpus = len(self.nodes)
        bad = [r for r in schedule.ranks if r >= n_gpus]
        if bad:
            raise ConfigError(f"ranks {bad[:5]} are not in the topology {G.graph.get('name', '')!r} "
                              f"({n_gpus} GPUs, ranks 0..{n_gpus - 1})")
        for route in schedule.routes:
            missing = [v for v in route.via if v not in G]
            if missing:
                raise ConfigError(f"route via {missing[0]!r} is not a node of the topology "
                                  f"{G.graph.get('name', '')!r}")
        router = topologies.Router(G)
        net = schedule.src != schedule.dst
        nn = n_gpus * n_gpus
        key = np.where(net, schedule.route * nn + schedule.src * n_gpus + schedule.dst, -1)
        if nn * len(schedule.routes) <= 1 << 26:
            # Pairs by a presence table over all keys: linear, where np.unique sorts the
            # millions of transfers of a big ring (0.5 s at 1024 GPUs).
            seen = np.zeros(nn * len(schedule.routes) + 1, dtype=bool)
            seen[key + 1] = True
            pairs = np.flatnonzero(seen) - 1
            self.pair_of = (np.cumsum(seen) - 1)[key + 1]
        else:
            pairs, self.pair_of = np.unique(key, return_inverse=True)
        self.chan_ids: dict = {}
        ptr, chans, lat = [0], [], []
        for k in pairs.tolist():
            if k < 0:  # local steps: no route
                ptr.append(ptr[-1])
                lat.append(0.0)
                continue
            r, sd = divmod(k, nn)
            s, d = divmod(sd, n_gpus)
            route = schedule.routes[r]
            stops = (self.nodes[s], *route.via, self.nodes[d])
            path = [c for a, b in zip(stops, stops[1:]) for c in router.channels(a, b, route.flow)]
            ids = [self.chan_ids.setdefault(c, len(self.chan_ids)) for c in path]
            chans.extend(ids)
            ptr.append(len(chans))
            lat.append(sum(G.edges[u, v]["latency"] for u, v in path))
        self.pair_ptr = np.array(ptr, dtype=np.int64)
        self.pair_chan = np.array(chans, dtype=np.int64)
        self.pair_lat = np.array(lat)
        self.channels = list(self.chan_ids)
        self.capacity = np.array([float(G.edges[u, v]["bandwidth"]) for u, v in self.channels])

    def entries(self, pair_ids: np.ndarray):
        """(flow index, channel id) entries of flows with these pair ids."""
        starts = self.pair_ptr[pair_ids]
        lens = self.pair_ptr[pair_ids + 1] - starts
        total = int(lens.sum())
        flow = np.repeat(np.arange(len(pair_ids)), lens)
        offs = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
        return flow, self.pair_chan[np.repeat(starts, lens) + offs]


class _Run:
    """State of one simulation; :meth:`process` is the SimPy process."""

    def __init__(self, net: "_Network", schedule: Schedule, earliest: np.ndarray):
        self.s = schedule
        self.net = net
        n = len(schedule)
        self.n = n
        self.remaining = np.diff(schedule.dep_ptr).astype(np.int64)
        owners = np.repeat(np.arange(n, dtype=np.int64), self.remaining)
        order = np.argsort(schedule.dep_idx, kind="stable")
        self.rev_idx = owners[order]
        self.rev_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(schedule.dep_idx, minlength=n), out=self.rev_ptr[1:])
        self.earliest = earliest
        self.start_t = np.full(n, np.nan)
        self.arrive_t = np.full(n, np.nan)
        self.starts: list = []     # heap of (time, seq, indices) whose flows start then
        self.arrivals: list = []   # heap of (time, seq, indices) that arrive then
        self.seq = itertools.count()
        self.act = np.empty(0, dtype=np.int64)    # active flows (transfer indices)
        self.rate = np.empty(0)                      # their rates, bytes/s
        self.fin = np.empty(0)                       # when their last byte leaves, s
        nch = len(self.net.channels)
        self.ch_count = np.zeros(nch, dtype=np.int64)  # active flows per channel
        self.loaded = np.empty(0, dtype=np.int64)
        self.ch_bytes = np.zeros(nch, dtype=np.int64)
        self.ch_busy = np.zeros(nch)
        self.ch_peak = np.zeros(nch)
        self.load = np.zeros(nch)
        self.events = 0
        self.done = 0

    # -- bookkeeping --------------------------------------------------------------------
    def _ready(self, idx: np.ndarray, t: float) -> None:
        """Transfers whose dependencies all arrived at ``t``: schedule their starts."""
        if not len(idx):
            return
        st = np.maximum(t, self.earliest[idx]) + self.s.compute_s[idx]
        for when in np.unique(st):
            heapq.heappush(self.starts, (float(when), next(self.seq), idx[st == when]))

    def _complete(self, idx: np.ndarray, t: float) -> None:
        self.arrive_t[idx] = t
        self.done += len(idx)
        lo, hi = self.rev_ptr[idx], self.rev_ptr[idx + 1]
        lens = hi - lo
        total = int(lens.sum())
        if total == 0:
            return
        offs = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
        dependants = self.rev_idx[np.repeat(lo, lens) + offs]
        uniq, cnt = np.unique(dependants, return_counts=True)
        self.remaining[uniq] -= cnt
        self._ready(uniq[self.remaining[uniq] == 0], t)

    def _start(self, idx: np.ndarray, t: float) -> None:
        """Start the transfers ``idx`` at ``t``: flows join, empty ones just travel."""
        self.start_t[idx] = t
        size = self.s.size[idx]
        local = self.s.src[idx] == self.s.dst[idx]
        instant = local | (size == 0)   # no bytes to send: arrives after the path latency
        if instant.any():
            self._travel(idx[instant], t)
        flows = idx[~instant]
        if not len(flows):
            return
        flow, chan = self.net.entries(self.net.pair_of[flows])
        nbytes = self.s.size[flows].astype(float)
        self.ch_bytes += np.bincount(chan, weights=nbytes[flow],
                                     minlength=len(self.ch_bytes)).astype(np.int64)
        # Fast path: flows on channels nobody else uses change nobody's rate; each runs at the
        # bandwidth of its slowest channel.
        if not self.ch_count[chan].any() and len(np.unique(chan)) == len(chan):
            starts = np.concatenate([[0], np.cumsum(np.bincount(flow))[:-1]])
            rate = np.minimum.reduceat(self.net.capacity[chan], starts)
            self.ch_count[chan] += 1
            self._set_load(chan, rate[flow])
            self.act = np.concatenate([self.act, flows])
            self.rate = np.concatenate([self.rate, rate])
            self.fin = np.concatenate([self.fin, t + nbytes / rate])
            return
        rem = self._remaining(t)
        self.act = np.concatenate([self.act, flows])
        self._reallocate(np.concatenate([rem, nbytes]), t)

    def _travel(self, idx: np.ndarray, t: float) -> None:
        """Transfers whose last byte left at ``t`` arrive one path latency later."""
        lat = self.net.pair_lat[self.net.pair_of[idx]]
        for when in np.unique(lat):
            heapq.heappush(self.arrivals, (t + float(when), next(self.seq), idx[lat == when]))

    def _remaining(self, t: float) -> np.ndarray:
        """Bytes still to send of each active flow at ``t``."""
        return np.maximum((self.fin - t) * self.rate, 0.0)

    def _set_load(self, chan: np.ndarray, load: np.ndarray) -> None:
        self.load[chan] = load
        np.maximum.at(self.ch_peak, chan, load / self.net.capacity[chan])
        self.loaded = np.flatnonzero(self.load > 0)

    def _reallocate(self, rem: np.ndarray, t: float) -> None:
        """Max-min fair rates of every active flow, from their remaining bytes at ``t``."""
        flow, chan = self.net.entries(self.net.pair_of[self.act])
        self.rate = max_min_rates(flow, chan, self.net.capacity, len(self.act))
        self.fin = t + rem / self.rate
        self.ch_count = np.bincount(chan, minlength=len(self.load))
        self.load = np.zeros(len(self.load))
        self._set_load(chan, np.bincount(chan, weights=self.rate[flow], minlength=len(self.load))[chan])

    def _finish(self, t: float) -> None:
        """Flows whose last byte leaves at ``t`` (to a relative tolerance) leave the network."""
        gone = self.fin <= t + _REL_TOL * max(t, 1e-300)
        ids = self.act[gone]
        self._travel(ids, t)
        flow, chan = self.net.entries(self.net.pair_of[ids])
        keep = ~gone
        if np.all(self.ch_count[chan] == 1):
            # Fast path: they had their channels to themselves; nobody else speeds up.
            self.ch_count[chan] = 0
            self._set_load(chan, np.zeros(len(chan)))
            self.act, self.rate, self.fin = self.act[keep], self.rate[keep], self.fin[keep]
            return
        rem = self._remaining(t)[keep]
        self.act = self.act[keep]
        self._reallocate(rem, t)

    # -- the SimPy process --------------------------------------------------------------
    def process(self, env: simpy.Environment):
        self._ready(np.flatnonzero(self.remaining == 0), 0.0)
        while True:
            t = env.now
            # Everything due now, until nothing more is: arrivals release dependants, whose
            # starts (with no local work) are due now too.
            while True:
                moved = False
                while self.arrivals and self.arrivals[0][0] <= t:
                    _, _, idx = heapq.heappop(self.arrivals)
                    self._complete(idx, t)
                    moved = True
                while self.starts and self.starts[0][0] <= t:
                    _, _, idx = heapq.heappop(self.starts)
                    self._start(idx, t)
                    moved = True
                if not moved:
                    break
            nxt = []
            if self.starts:
                nxt.append(self.starts[0][0])
            if self.arrivals:
                nxt.append(self.arrivals[0][0])
            t_fin = float(self.fin.min()) if len(self.act) else np.inf
            nxt.append(t_fin)
            t_next = min(nxt)
            if t_next == np.inf:
                return
            self.events += 1
            self.ch_busy[self.loaded] += t_next - t
            yield env.timeout(t_next - t)
            if t_fin <= env.now:
                self._finish(env.now)

    def result(self) -> CollectiveResult:
        if self.done != self.n:
            stuck = np.flatnonzero(np.isnan(self.arrive_t))[:5]
            raise SimulationError(f"{self.n - self.done} of {self.n} transfers never ran "
                                  f"(dependencies never satisfied), e.g. transfers "
                                  f"{self.s.ids[stuck].tolist()}")
        return _result(self.s, self.net, self.start_t, self.arrive_t, self.ch_bytes,
                       self.ch_busy, self.ch_peak, self.events)


def _result(s: Schedule, net: _Network, start_t, arrive_t, ch_bytes, ch_busy, ch_peak,
            events: int) -> CollectiveResult:
    """The :class:`CollectiveResult` of transfer times (s) and per-channel usage."""
    time_s = float(np.max(arrive_t)) if len(s) else 0.0
    ranks = s.ranks
    first = np.full(len(ranks), np.inf)
    last = np.zeros(len(ranks))
    if len(s):
        pos = np.zeros(max(ranks) + 1, dtype=np.int64)   # rank -> its place in ``ranks``
        pos[list(ranks)] = np.arange(len(ranks))
        si, di = pos[s.src], pos[s.dst]
        np.minimum.at(first, si, start_t)
        np.maximum.at(last, si, arrive_t)
        np.maximum.at(last, di, arrive_t)
    first[np.isinf(first)] = 0.0
    links = tuple(
        LinkUsage(str(u), str(v), float(net.capacity[k]), int(ch_bytes[k]),
                  float(ch_busy[k]), float(min(ch_peak[k], 1.0)))
        for k, (u, v) in enumerate(net.channels) if ch_bytes[k] > 0)
    network = s.src != s.dst
    sent = int(s.size[network].sum())
    received = int(s.size[network & ~np.isnan(arrive_t)].sum())
    return CollectiveResult(op=s.op, algorithm=s.algorithm, nbytes=s.nbytes, ranks=ranks,
                            time_s=time_s, rank_start_s=tuple(first.tolist()),
                            rank_finish_s=tuple(last.tolist()), links=links,
                            flows=int(network.sum()), bytes_sent=sent,
                            bytes_received=received, events=events)


def simulate(G, schedule: Schedule, *, faults=(), _force_events: bool = False) -> CollectiveResult:
    """Run ``schedule`` over topology ``G`` and return what happened.

    Parameters
    ----------
    G : networkx.Graph
        A topology (checked with :func:`topologies.validate_topology`); GPU rank r of the
        schedule is ``topologies.gpus(G)[r]``.
    schedule : Schedule
        From :func:`emulator.build_schedule` (or built by hand).
    faults : sequence of Fault
        What-ifs: :class:`~emulator.DegradedLink`, :class:`~emulator.RemovedLink`,
        :class:`~emulator.Straggler`. Applied to a copy of ``G``.

    Returns
    -------
    CollectiveResult

    Examples
    --------
    Two flows into one 10 GB/s link share it: each gets 5 GB/s, so 10 MB each take 2 ms.

    >>> import emulator, topologies
    >>> G = topologies.from_spec("switch:3,bw=10GB/s,lat=1us")
    >>> s = emulator.Schedule([emulator.Transfer(0, 0, 2, 10_000_000),
    ...                        emulator.Transfer(1, 1, 2, 10_000_000)], (0, 1, 2), "test", "x", 1)
    >>> r = emulator.simulate(G, s)
    >>> round(r.time_s * 1e3, 4), r.flows
    (2.002, 2)
    """
    import topologies

    if not isinstance(schedule, Schedule):
        raise ConfigError(f"schedule={schedule!r} must be an emulator.Schedule")
    faults = tuple(faults or ())
    for f in faults:
        if not isinstance(f, Fault):
            raise ConfigError(f"faults: {f!r} is not an emulator.Fault")
    delays: dict = {}
    if faults:
        G = G.copy()
        for f in faults:
            f.apply(G)
            for r, d in f.start_delay().items():
                delays[r] = max(delays.get(r, 0.0), d)
    topologies.validate_topology(G)
    for r in delays:
        if r not in schedule.ranks:
            raise ConfigError(f"Straggler: rank {r} does not take part (ranks {list(schedule.ranks)[:8]}...)")
    net = _Network(G, schedule)
    earliest = np.zeros(len(schedule))
    for rank, d in delays.items():
        earliest[schedule.src == rank] = d
    if not _force_events:
        fast = contention_free(net, schedule, earliest)
        if fast is not None:
            return _result(schedule, net, fast["start_s"], fast["arrive_s"], fast["bytes"],
                           fast["busy_s"], fast["peak"], events=0)
    run = _Run(net, schedule, earliest)
    env = simpy.Environment()
    env.process(run.process(env))
    env.run()
    return run.result()


def run_collective(G, op: str, algorithm: str, nbytes: int, *, ranks=None, chunks: int = 1,
                   payload_bytes=None, faults=()) -> CollectiveResult:
    """Build the schedule of ``op`` by ``algorithm`` and simulate it on ``G``.

    ``ranks`` defaults to every GPU of ``G``; ``nbytes`` follows nccl-tests (see
    :func:`emulator.build_schedule`).

    Examples
    --------
    >>> import emulator, topologies
    >>> G = topologies.from_spec("ring:4,bw=10GB/s,lat=1us")
    >>> r = emulator.run_collective(G, "allreduce", "ring", 4_000_000)
    >>> round(r.time_s * 1e6, 2), round(r.busbw / 1e9, 2)   # 6 (1 + 100) us
    (606.0, 9.9)
    """
    import topologies

    if ranks is None:
        ranks = len(topologies.gpus(G))
    sched = build_schedule(op, algorithm, ranks, nbytes, chunks=chunks, graph=G,
                           payload_bytes=payload_bytes)
    return simulate(G, sched, faults=faults)
