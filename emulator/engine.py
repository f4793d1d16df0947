"""The flow-level network engine: SimPy drives time, flows share links max-min fairly.

A transfer of a :class:`~emulator.collectives.Schedule` becomes a *flow* once its
dependencies have arrived (and its ``compute_s`` of local work has passed, and any straggler
delay of its sender), and, if it is queued on a connection (``after``), once the message ahead
of it has left: a connection's bytes go out in order, so its messages never share a link with
each other (NCCL's rings, docs/nccl.md). The flow follows the route :class:`topologies.Router` gives for its
(source GPU, destination GPU) and crosses the directed channels of that route. Concurrent
flows share every channel max-min fairly (progressive filling, Bertsekas & Gallager, *Data
Networks*, section 6.5.2); rates change only when a flow starts or its last byte leaves. A
flow's bytes leave at its (changing) rate and arrive one path latency later, so an
uncongested message of m bytes takes latency + m / bandwidth: the alpha-beta model of
Thakur, Rabenseifner & Gropp (2005), which :mod:`emulator.closed_form` writes down.

A schedule whose flows never share a channel needs no events: :mod:`emulator.critical_path`
times it in one pass and checks that premise (a 1024-GPU ring allreduce, 2 million transfers,
in about a second). Every other schedule runs here. Everything due at one instant is one
event: starts, arrivals and finishes within 1e-12 of each other (relative) are handled
together and the rates re-solved once. Re-solving is incremental and compiled
(:mod:`emulator.maxmin`): flows on one path are one entity, and only the flows an event can
speed up or slow down are recomputed. Flows in progress are tracked per path
(:mod:`emulator.flows`), so an event costs in proportion to what it changes. The events
themselves run in a compiled loop (:mod:`emulator.events`) that one SimPy process (a
generator taking ``env`` first) drives: each step of the SimPy clock hands it up to
:data:`EVENTS_PER_STEP` events and moves the clock to the last one. Routes are computed once
per graph and kept with it (:mod:`emulator.netpaths`).

``exact=False`` (the approximate mode, for sweeps) also finishes, with the earliest flow, the
next ones in order of finish time as long as each one's last byte would leave within
``tolerance`` of its own duration later: a flow ends at most that fraction of its duration
early (its last bytes count as sent);
on a chain of flows that never share, the collective is at most ``tolerance`` (relative)
short. Through sharing the error can spread further; ``qsgd-emu bench emulator`` measures
it against the exact mode. Results are deterministic: no randomness, no dependence on dict or
set order.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import simpy

from . import events as _events
from . import flows as _flows
from . import maxmin as _maxmin
from . import symmetry as _symmetry
from ._jit import use_compiled
from .collectives import Schedule, build_schedule
from .critical_path import contention_free
from .errors import ConfigError, SimulationError
from .faults import Fault
from .netpaths import Network as _Network
from .result import CollectiveResult, LinkUsage

__all__ = ["simulate", "run_collective", "max_min_rates", "APPROX_TOLERANCE"]

# Events closer than this (relative to the time) are one event: the same byte count at the
# same rate computed through different float paths.
_REL_TOL = 1e-12

#: ``exact=False``: a flow may finish this fraction of its duration early to share an event.
APPROX_TOLERANCE = 1e-3

#: Events the compiled loop handles per step of the SimPy clock.
EVENTS_PER_STEP = 4096


def max_min_rates(entry_flow: np.ndarray, entry_chan: np.ndarray, capacity: np.ndarray,
                  n_flows: int) -> np.ndarray:
    """Max-min fair rates (bytes/s) by progressive filling: the reference, one numpy pass
    per level, that the engine's incremental allocator (:mod:`emulator.maxmin`) is tested
    against.

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

    Examples
    --------
    >>> max_min_rates(np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([1.0, 2.0]), 2)
    array([0.5, 0.5])
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


class _Run:
    """State of one simulation; :meth:`process` is the SimPy process.

    ``tolerance`` > 0 is the approximate mode (module docstring).
    """

    def __init__(self, net: "_Network", schedule: Schedule, earliest: np.ndarray,
                 tolerance: float = 0.0, progress=None):
        self.s = schedule
        self.progress = progress
        self.net = net
        n = len(schedule)
        self.n = n
        self.tolerance = float(tolerance)
        moves = (schedule.src != schedule.dst) & (schedule.size > 0)
        # Interpreted, an event costs ~1 ms: compiled pays from ~50 flows on.
        use_compiled(1000 * int(np.count_nonzero(moves)))
        d = _derived(net, schedule)
        self.sched = _events.Schedule(
            moves=moves, compute=np.ascontiguousarray(schedule.compute_s, dtype=np.float64),
            earliest=np.ascontiguousarray(earliest, dtype=np.float64),
            lat=d["lat"], remaining=d["remaining"].copy(), rev_ptr=d["rev_ptr"],
            rev_idx=d["rev_idx"], after=d["after"], aft_ptr=d["aft_ptr"], aft_idx=d["aft_idx"],
            ready=np.full(n, np.nan), left=np.full(n, np.nan))
        self.paths = d["paths"]
        self.state = _maxmin.new_state(self.paths)
        self.flows = _flows.new_flows(net.pair_of, schedule.size, len(net.pair_ptr) - 1)
        self.clock = _events.new_clock(n)
        _events.start(self.sched, self.clock)

    @property
    def ch_peak(self) -> np.ndarray:
        """Highest load / capacity of each channel (unclipped)."""
        return self.state.peak

    @property
    def events(self) -> int:
        """Instants handled so far."""
        return int(self.clock.counts[2])

    @property
    def resolved(self) -> int:
        """Paths whose rates were re-solved, summed over the events."""
        return int(self.clock.counts[3])

    def process(self, env: simpy.Environment):
        """Advance the clock in steps of up to :data:`EVENTS_PER_STEP` events."""
        K = self.clock
        while True:
            t_next = _events.next_time(self.flows, K)
            if t_next == np.inf:
                return
            yield env.timeout(max(t_next - env.now, 0.0))
            last = _events.run(self.paths, self.state, self.flows, self.sched, K, _REL_TOL,
                               self.tolerance, EVENTS_PER_STEP)
            if self.progress is not None:
                self.progress(int(K.counts[1]), self.n)
            if K.counts[4]:
                raise SimulationError("max-min allocation gave a flow no bandwidth at "
                                      f"t={last!r} s (a channel's residual capacity reached 0)")
            if last > env.now:
                yield env.timeout(last - env.now)

    def result(self) -> CollectiveResult:
        done = int(self.clock.counts[1])
        if done != self.n:
            stuck = np.flatnonzero(np.isnan(self.clock.arrive))[:5]
            raise SimulationError(f"{self.n - done} of {self.n} transfers never ran "
                                  f"(dependencies never satisfied), e.g. transfers "
                                  f"{self.s.ids[stuck].tolist()}")
        return _result(self.s, self.net, self.clock.start, self.clock.arrive,
                       self.net.channel_bytes(self.s), self.state.busy, self.state.peak,
                       self.events)


def _derived(net: _Network, schedule: Schedule) -> dict:
    """What the event loop reads of a schedule's structure (never written by it). Kept with
    ``net``, which serves only schedules of this :attr:`~emulator.Schedule.structure`
    (:meth:`emulator.netpaths.Network.of`): a collective's other sizes reuse it."""
    if "paths" in net.derived:
        return net.derived
    n = len(schedule)
    queued = schedule.after >= 0
    rev_ptr, rev_idx = _events.dependants(schedule.dep_ptr.astype(np.int64),
                                          schedule.dep_idx.astype(np.int64), n)
    aft_ptr, aft_idx = _events.dependants(
        np.concatenate(([0], np.cumsum(queued))).astype(np.int64),
        schedule.after[queued].astype(np.int64), n)
    net.derived.update(
        remaining=np.diff(schedule.dep_ptr).astype(np.int64), rev_ptr=rev_ptr, rev_idx=rev_idx,
        aft_ptr=aft_ptr, aft_idx=aft_idx, lat=net.pair_lat[net.pair_of],
        after=np.ascontiguousarray(schedule.after, dtype=np.int64),
        paths=_maxmin.build_paths(net.pair_ptr, net.pair_chan, net.capacity))
    return net.derived


def _result(s: Schedule, net: _Network, start_t, arrive_t, ch_bytes, ch_busy, ch_peak,
            events: int) -> CollectiveResult:
    """The :class:`CollectiveResult` of transfer times (s) and per-channel usage."""
    time_s = float(np.max(arrive_t)) if len(s) else 0.0
    ranks = s.ranks
    first = np.full(len(ranks), np.inf)
    last = np.zeros(len(ranks))
    if len(s):
        if ranks == tuple(range(len(ranks))):
            src, dst = s.src, s.dst                       # a rank is its own place
        else:
            pos = np.zeros(max(ranks) + 1, dtype=np.int64)   # rank -> its place in ``ranks``
            pos[list(ranks)] = np.arange(len(ranks))
            src, dst = pos[s.src], pos[s.dst]
        # numpy >= 1.25 runs ufunc.at in one compiled pass (~5 ms per million transfers)
        np.fmin.at(first, src, start_t)
        np.fmax.at(last, src, arrive_t)
        np.fmax.at(last, dst, arrive_t)
    first[np.isinf(first)] = 0.0
    # the channels that carried bytes, read as Python numbers at once (78,000 of 90,000 on
    # 8,192 GPUs; numpy scalars one by one cost ~1 s, and converting each number again ~0.1 s)
    used = np.flatnonzero(np.asarray(ch_bytes) > 0)
    chans = net.channels
    columns = zip(map(chans.__getitem__, used.tolist()),
                  np.asarray(net.capacity, dtype=float)[used].tolist(),
                  np.asarray(ch_bytes)[used].astype(np.int64).tolist(),
                  np.asarray(ch_busy, dtype=float)[used].tolist(),
                  np.minimum(np.asarray(ch_peak, dtype=float)[used], 1.0).tolist())
    links = tuple([LinkUsage(str(u), str(v), cap, nb, busy, peak)
                   for (u, v), cap, nb, busy, peak in columns])
    sent = int(s.size.sum())                   # local steps carry no bytes (Schedule checks)
    arrived = ~np.isnan(arrive_t)
    received = sent if arrived.all() else int(s.size[arrived].sum())
    return CollectiveResult(op=s.op, algorithm=s.algorithm, nbytes=s.nbytes, ranks=ranks,
                            time_s=time_s, rank_start_s=tuple(first.tolist()),
                            rank_finish_s=tuple(last.tolist()), links=links,
                            flows=int(np.count_nonzero(s.src != s.dst)), bytes_sent=sent,
                            bytes_received=received, events=events)


def _tolerance(exact, tolerance) -> float:
    """The approximate mode's tolerance (0.0 when exact), validated."""
    if not isinstance(exact, bool):
        raise ConfigError(f"exact={exact!r} must be True or False")
    if tolerance is None:
        return 0.0 if exact else APPROX_TOLERANCE
    if exact:
        raise ConfigError(f"tolerance={tolerance!r} applies only with exact=False")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or \
            not 0.0 < tolerance < 0.5:
        raise ConfigError(f"tolerance={tolerance!r} must be a number in (0, 0.5)")
    return float(tolerance)


def simulate(G, schedule: Schedule, *, faults=(), exact: bool = True, tolerance=None,
             progress=None, symmetry: bool = True,
             _force_events: bool = False) -> CollectiveResult:
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
    exact : bool
        True (default): every event at its own time (to 1e-12 relative). False: the
        approximate mode of the module docstring, for sweeps.
    tolerance : float, optional
        With ``exact=False``: the fraction of its duration (0 < tolerance < 0.5) by which a
        flow may finish early to share an event; default :data:`APPROX_TOLERANCE`.
    progress : callable, optional
        ``progress(arrived, total)``: transfers arrived so far, called every
        :data:`EVENTS_PER_STEP` events of the event loop (for a command's progress line).
    symmetry : bool
        True (default): where a shift of the ranks maps the schedule and its paths onto
        themselves (:mod:`emulator.symmetry`), simulate one transfer per class of equivalent
        ones; exact, and named by the result's ``copies``. False: every transfer.

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

    An all-to-all on 8 GPUs of one switch: 7 flows share each GPU's port.

    >>> G = topologies.switch(8)
    >>> s = emulator.build_schedule("alltoall", "direct", 8, 8_000_000)
    >>> round(emulator.simulate(G, s).time_s * 1e6, 2)    # 7 flows share each GPU's port: 2 L + 7 MB / B
    562.0
    """
    import topologies

    rel_d = _tolerance(exact, tolerance)
    if not isinstance(symmetry, bool):
        raise ConfigError(f"symmetry={symmetry!r} must be True or False")
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
    net = _Network.of(G, schedule)
    earliest = np.zeros(len(schedule))
    for rank, d in delays.items():
        earliest[schedule.src == rank] = d
    if not _force_events:
        fast = contention_free(net, schedule, earliest)
        if fast is not None:
            return _result(schedule, net, fast["start_s"], fast["arrive_s"], fast["bytes"],
                           fast["busy_s"], fast["peak"], events=0)
    if symmetry and not delays:
        reduced = _reduced(net, schedule)
        if reduced is not None:
            return _simulate_reduced(net, schedule, *reduced, rel_d, progress)
    run = _Run(net, schedule, earliest, tolerance=rel_d, progress=progress)
    env = simpy.Environment()
    env.process(run.process(env))
    env.run()
    return run.result()


def _reduced(net: _Network, schedule: Schedule):
    """(symmetry, quotient network) of ``schedule`` on ``net``, found once per schedule
    structure and kept with ``net``; None when no shift holds or the sizes break it."""
    kept = net.derived.get("symmetry", False)
    if kept is False:
        sym = _symmetry.find(net, schedule)
        kept = None if sym is None else (sym, _symmetry.QuotientNetwork(net, sym))
        net.derived["symmetry"] = kept
    if kept is None or not kept[0].holds_for(schedule):
        return None
    return kept


def _simulate_reduced(net: _Network, schedule: Schedule, sym, qnet, rel_d, progress):
    """Simulate the classes' representatives on the quotient network; every transfer takes
    its representative's times and every channel its class's busy time and peak load."""
    q = _symmetry.QuotientSchedule(schedule, sym)
    n = sym.copies
    scaled = None if progress is None else (lambda done, total: progress(done * n, total * n))
    run = _Run(qnet, q, np.zeros(len(q)), tolerance=rel_d, progress=scaled)
    env = simpy.Environment()
    env.process(run.process(env))
    env.run()
    if int(run.clock.counts[1]) != len(q):
        return run.result()                  # raises: which transfers never ran
    cls = sym.class_of
    used = sym.chan_class >= 0
    busy = np.zeros(len(net.capacity))
    peak = np.zeros(len(net.capacity))
    busy[used] = run.state.busy[sym.chan_class[used]]
    peak[used] = run.state.peak[sym.chan_class[used]]
    res = _result(schedule, net, run.clock.start[cls], run.clock.arrive[cls],
                  net.channel_bytes(schedule), busy, peak, run.events)
    return dataclasses.replace(res, copies=n)


#: The engine's two compiled paths, as :func:`warm_up` names them.
WARM_PATHS = ("events", "contention_free")


def warm_up(paths=WARM_PATHS) -> None:
    """Compile the engine's kernels (or load them from numba's cache) now, by simulating a
    tiny schedule through each of ``paths`` (the event loop's, the contention-free pass's; by
    default both), so that a timing taken afterwards is the simulation's.

    A first compile takes about 14 s on a 2-core machine, and numba's cache goes stale with
    every new checkout (it checks the sources' timestamps); a study's pilot timed with it
    extrapolated a 15 s 8-GPU pilot to 85 minutes and refused to run.

    Examples
    --------
    >>> from emulator import engine
    >>> engine.warm_up()        # later simulations start with their kernels ready
    """
    import topologies
    from ._jit import compile_kernels

    bad = [p for p in paths if p not in WARM_PATHS]
    if bad or isinstance(paths, str):
        raise ConfigError(f"warm_up: paths={paths!r} must name some of {WARM_PATHS}")
    compile_kernels()
    G = topologies.switch(4)
    if "events" in paths:
        simulate(G, build_schedule("alltoall", "direct", 4, 4_000_000), _force_events=True)
    if "contention_free" in paths:
        simulate(G, build_schedule("allreduce", "ring", 4, 4_000_000))


def run_collective(G, op: str, algorithm: str, nbytes: int, *, ranks=None, chunks: int = 1,
                   payload_bytes=None, faults=(), exact: bool = True,
                   tolerance=None) -> CollectiveResult:
    """Build the schedule of ``op`` by ``algorithm`` and simulate it on ``G``.

    ``ranks`` defaults to every GPU of ``G``; ``nbytes`` follows nccl-tests (see
    :func:`emulator.build_schedule`); ``exact`` and ``tolerance`` as in :func:`simulate`.

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
    return simulate(G, sched, faults=faults, exact=exact, tolerance=tolerance)
