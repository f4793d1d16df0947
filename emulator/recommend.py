"""Recommend QSGD bit widths per layer group under a variance budget (:func:`recommend`).

The groups are DDP's buckets: a bucket's compressed elements are one QSGD payload, so one
width per bucket is what the wire (:func:`qsgd.wire_plan`) and the hook's bit policy carry.

**Variance model.** QSGD is unbiased; convergence slows with the added variance (Alistarh et
al. 2017, Theorem 3.2). A trace measured with ``variance_bits`` holds, per bucket ``k`` and
width ``b``, the real ``E||Q_b(v_k) - v_k||^2 = r_k(b) ||v_k||^2`` (:mod:`qsgd.variance`). The
relative increase of the whole-model gradient variance is
``V(b_1..b_K) = f_t(p) * sum_k r_k(b_k) ||v_k||^2 / sum_k (||v_k||^2 + ||raw_k||^2)``
(raw elements travel exact). ``f_t(p)`` is the transport's factor (:data:`VARIANCE_FACTORS`):
1 for the all-gather (each rank's payload quantized once, the mean of ``p`` independent errors
has ``1/p`` of the per-rank variance, as the stochastic gradient's own); the
scatter-reduce-allgather re-quantizes the mean chunk once more, which adds ``r ||mean||^2 <=
r ||v||^2`` at the mean's scale, ``p`` times the per-rank share: ``1 + p``, an upper bound.

**Search.** Per transport, a greedy walk starts with every group at the widest allowed width
and lowers one group one step at a time, the step that saves the most predicted seconds per
unit of variance added (marginal analysis, as in adaptive-level QSGD, Faghri et al., NeurIPS
2020), down to the narrowest: a path of ``G (W - 1)`` points, each step evaluating at most
``G`` neighbours. The best point of all evaluated ones within the budget is then improved by
local moves (lower one group, or raise one and lower another) while one is faster and within
budget. A transport whose least variance (every group at the widest width) exceeds the budget
is skipped. Every candidate is predicted by :func:`emulator.replay` with per-bucket widths on one
:class:`Network` (its collective cache shared). ``exhaustive=True`` evaluates all ``W^G``
combinations instead (the check of the search on small cases).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from emulator.compute import ComputeModel
from emulator.errors import ConfigError
from emulator.network import Network
from emulator.replaying import TRANSPORTS, collective_requests, replay
from ._checks import is_int, is_number

#: compressed transport -> factor on the per-rank variance ratio at ``p`` ranks (module docstring)
VARIANCE_FACTORS: dict[str, Callable[[int], float]] = {
    "qsgd_allgather": lambda p: 1.0,
    "qsgd_scatter_reduce_allgather": lambda p: 1.0 + p,
}


# ---------------------------------------------------------------- budget
@dataclass(frozen=True)
class Budget:
    """The limit a recommendation must stay within: exactly one of the two.

    Parameters
    ----------
    variance : float, optional
        Largest relative increase of the whole-model gradient variance (``V`` of the module
        docstring; uniform 4-bit QSGD of a ResNet is of order 0.01..0.1).
    bits_per_element : float, optional
        Largest mean bits per compressed element (weighted by elements).

    Examples
    --------
    >>> Budget(variance=-1.0)
    Traceback (most recent call last):
    ...
    emulator.errors.ConfigError: budget variance must be a finite number >= 0, got -1.0
    """

    variance: float | None = None
    bits_per_element: float | None = None

    def __post_init__(self):
        if (self.variance is None) == (self.bits_per_element is None):
            raise ConfigError("budget: give exactly one of variance or bits_per_element, got "
                              f"variance={self.variance!r}, bits_per_element={self.bits_per_element!r}")
        if self.variance is not None:
            v = self.variance
            if not is_number(v) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"budget variance must be a finite number >= 0, got {v!r}")
        else:
            v = self.bits_per_element
            if not is_number(v) or not math.isfinite(v) or v < 2:
                raise ConfigError(f"budget bits_per_element must be a finite number >= 2, got {v!r}")

    def describe(self) -> str:
        if self.variance is not None:
            return f"variance increase <= {self.variance:.4g}"
        return f"<= {self.bits_per_element:.4g} bits per compressed element"


# ---------------------------------------------------------------- variance model
class VarianceModel:
    """``V`` and bits per element of per-bucket widths, from a trace's variance records.

    Examples
    --------
    >>> import qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0, variance_bits=(2, 4))
    >>> vm = VarianceModel(trace)
    >>> vm.increase((2,), "qsgd_allgather", 8) > vm.increase((4,), "qsgd_allgather", 8) > 0
    True
    """

    def __init__(self, trace):
        missing = [b.index for b in trace.buckets if b.variance is None]
        if missing:
            raise ConfigError(f"trace: buckets {missing} have no variance records; measure with "
                              "variance_bits (qsgd-emu measure --variance-bits 2,3,4,5,6,8)")
        self.trace = trace
        self.groups = tuple(b.index for b in trace.buckets if b.compressed_numel)
        self.widths = tuple(sorted(set.intersection(*(set(b.variance.bits) for b in trace.buckets))))
        total = sum(b.variance.norm_sq + b.variance.raw_norm_sq for b in trace.buckets)
        self.total_norm_sq = total
        self._numel = {b.index: b.compressed_numel for b in trace.buckets}
        self._compressed = sum(self._numel.values())

    def increase(self, bits, transport: str, world_size: int) -> float:
        """``V`` of per-bucket widths ``bits`` (one per bucket) under ``transport``."""
        if self.total_norm_sq <= 0:
            return 0.0
        err = sum(self.trace.buckets[k].variance.error_sq(bits[k]) for k in self.groups)
        return VARIANCE_FACTORS[transport](world_size) * err / self.total_norm_sq

    def bits_per_element(self, bits) -> float:
        """Mean bits per compressed element of per-bucket widths ``bits``."""
        if not self._compressed:
            return 0.0
        return sum(bits[k] * self._numel[k] for k in self.groups) / self._compressed


# ---------------------------------------------------------------- results
@dataclass(frozen=True)
class Candidate:
    """One evaluated configuration: a transport and a width per bucket."""

    transport: str
    bits: tuple[int, ...]
    iteration_s: float
    variance: float
    bits_per_element: float

    @property
    def uniform(self) -> bool:
        return len(set(self.bits)) <= 1

    def to_dict(self) -> dict:
        return {"transport": self.transport, "bits": list(self.bits), "iteration_s": self.iteration_s,
                "variance": self.variance, "bits_per_element": self.bits_per_element,
                "uniform": self.uniform}


@dataclass(frozen=True)
class Recommendation:
    """The fastest evaluated configuration within the budget, its baselines and the front.

    ``policy`` maps each compressed parameter to its bucket's width (what
    :class:`qsgd.QSGDState` takes as ``bit_policy``); ``front`` is the Pareto front of
    (iteration seconds, variance) over all evaluated QSGD candidates, fastest first;
    ``uniform`` the uniform-width candidates; ``evaluated`` how many configurations were
    predicted (fp32 and fp16 included); ``search_s`` the wall seconds.
    """

    best: Candidate
    budget: Budget
    world_size: int
    topology: str
    fp32_s: float
    fp16_s: float
    policy: dict
    front: tuple[Candidate, ...]
    uniform: tuple[Candidate, ...]
    evaluated: int
    search_s: float
    method: str
    bucket_size: int
    extra: dict = field(default_factory=dict)

    @property
    def note(self) -> str:
        """A sentence when a dense allreduce beats the recommendation (else empty)."""
        dense = min(("fp32", self.fp32_s), ("fp16", self.fp16_s), key=lambda x: x[1])
        if dense[1] < self.best.iteration_s:
            return (f"{dense[0]} allreduce ({dense[1] * 1e3:.2f} ms) is faster than every QSGD "
                    f"configuration within the budget: compression does not pay here")
        return ""

    @property
    def speedup_fp32(self) -> float:
        return self.fp32_s / self.best.iteration_s

    @property
    def speedup_fp16(self) -> float:
        return self.fp16_s / self.best.iteration_s

    def state_snippet(self) -> str:
        """Python that builds the recommended :class:`qsgd.QSGDState` (``model``: the module
        DDP wraps)."""
        wire = TRANSPORTS[self.best.transport].wire
        base = max(self.best.bits)
        return (f"qsgd.QSGDState(qsgd.QSGDConfig.from_bits({base}, bucket_size={self.bucket_size}), "
                f"transport={wire!r}, bit_policy={self.policy!r}, model=model)")

    def to_dict(self) -> dict:
        return {"best": self.best.to_dict(), "budget": {"variance": self.budget.variance,
                                                        "bits_per_element": self.budget.bits_per_element},
                "world_size": self.world_size, "topology": self.topology, "fp32_s": self.fp32_s,
                "fp16_s": self.fp16_s, "speedup_fp32": self.speedup_fp32,
                "speedup_fp16": self.speedup_fp16, "policy": self.policy,
                "qsgd_state": self.state_snippet(), "front": [c.to_dict() for c in self.front],
                "uniform": [c.to_dict() for c in self.uniform], "evaluated": self.evaluated,
                "search_s": self.search_s, "method": self.method, "note": self.note, **self.extra}


def pareto_front(cands) -> tuple[Candidate, ...]:
    """The candidates no other is both faster and lower in variance than (fastest first).

    Examples
    --------
    >>> a, b, c = (Candidate("t", (b,), s, v, b) for b, s, v in ((2, 1.0, 0.5), (4, 2.0, 0.1), (3, 2.5, 0.3)))
    >>> [x.bits for x in pareto_front([a, b, c])]
    [(2,), (4,)]
    """
    out: list[Candidate] = []
    for c in sorted(cands, key=lambda c: (c.iteration_s, c.variance)):
        if not out or c.variance < out[-1].variance:
            out.append(c)
    return tuple(out)


# ---------------------------------------------------------------- the search
#: Wall seconds after which one step of the search is reported on its own.
PROGRESS_EVERY_S = 1.0


class _Evaluator:
    """Replays candidates once each (memoized by transport and widths)."""

    def __init__(self, trace, net: Network, compute: ComputeModel, vm: VarianceModel, progress):
        self.trace, self.net, self.compute, self.vm, self.progress = trace, net, compute, vm, progress
        self.seen: dict[tuple, Candidate] = {}

    def __call__(self, transport: str, bits: tuple) -> Candidate:
        key = (transport, bits)
        got = self.seen.get(key)
        if got is None:
            t0 = time.perf_counter()
            pred = replay(self.trace, None, transport=transport, compute=self.compute, network=self.net,
                          bits=bits)
            got = self.seen[key] = Candidate(transport, bits, pred.iteration_s,
                                             self.vm.increase(bits, transport, self.net.world_size),
                                             self.vm.bits_per_element(bits))
            # every 25th, and every one that took long enough to leave the user wondering
            slow = time.perf_counter() - t0 >= PROGRESS_EVERY_S
            if self.progress is not None and (slow or len(self.seen) % 25 == 0):
                self.progress(f"{len(self.seen)} candidates evaluated; last {transport} "
                              f"{list(bits)} in {time.perf_counter() - t0:.1f} s")
        return got


def _within(c: Candidate, budget: Budget) -> bool:
    if budget.variance is not None:
        return c.variance <= budget.variance * (1 + 1e-12)
    return c.bits_per_element <= budget.bits_per_element + 1e-12


def _greedy(ev: _Evaluator, transport: str, groups, widths, base: list) -> None:
    """The marginal walk from all-widest to all-narrowest (module docstring)."""
    state = list(base)
    for k in groups:
        state[k] = widths[-1]
    cur = ev(transport, tuple(state))
    while True:
        best, best_score = None, None
        for k in groups:
            j = widths.index(state[k])
            if j == 0:
                continue
            nxt = list(state)
            nxt[k] = widths[j - 1]
            c = ev(transport, tuple(nxt))
            saved, added = cur.iteration_s - c.iteration_s, c.variance - cur.variance
            score = (math.inf if added <= 0 else saved / added, saved)
            if best_score is None or score > best_score:
                best, best_score = (nxt, c), score
        if best is None:
            return
        state, cur = best


def _improve(ev: _Evaluator, start: Candidate, groups, widths, budget: Budget) -> Candidate:
    """Local moves from ``start`` while one is faster and within ``budget``."""
    cur = start
    while True:
        moves = []
        for k in groups:
            for dk in (-1, 1):
                jk = widths.index(cur.bits[k]) + dk
                if not 0 <= jk < len(widths):
                    continue
                one = list(cur.bits)
                one[k] = widths[jk]
                moves.append(one)
                if dk == 1:   # raise k, lower another
                    for i in groups:
                        ji = widths.index(cur.bits[i]) - 1
                        if i != k and ji >= 0:
                            two = list(one)
                            two[i] = widths[ji]
                            moves.append(two)
        better = [c for c in (ev(cur.transport, tuple(m)) for m in moves)
                  if _within(c, budget) and c.iteration_s < cur.iteration_s * (1 - 1e-12)]
        if not better:
            return cur
        cur = min(better, key=lambda c: (c.iteration_s, c.variance))


def recommend(trace, G=None, *, world_size: int | None = None, budget: Budget,
              transports=tuple(VARIANCE_FACTORS), bits=None, compute: ComputeModel | None = None,
              network: Network | None = None, exhaustive: bool = False,
              progress: Callable[[str], None] | None = None, workers: int = 1) -> Recommendation:
    """The fastest per-bucket QSGD widths and transport within ``budget`` (module docstring).

    Parameters
    ----------
    trace : qsgd.PayloadTrace
        Measured with variance records (``qsgd.measure(..., variance_bits=...)``).
    G : networkx.Graph, optional
        Topology; ignored when ``network`` is given.
    world_size : int, optional
        GPUs training; default all of ``G``.
    budget : Budget
    transports : sequence of str
        Compressed transports allowed (keys of :data:`VARIANCE_FACTORS`).
    bits : sequence of int, optional
        Widths allowed; default all the trace measured.
    compute : ComputeModel, optional
        Compute seconds (default: the measured ones).
    network : Network, optional
        Reused across calls (its cache).
    exhaustive : bool
        Evaluate every combination instead of the greedy search.
    progress : callable, optional
        Called with one-line messages.
    workers : int
        Local processes that simulate the distinct collective sizes first
        (:meth:`Network.prefetch`); 1 simulates them as the search meets them.

    Returns
    -------
    Recommendation

    Examples
    --------
    >>> import emulator, qsgd, topologies
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0, variance_bits=(2, 4, 8))
    >>> G = topologies.from_spec("switch:8,bw=1Gbit")
    >>> r = emulator.recommend(trace, G, budget=emulator.Budget(bits_per_element=4),
    ...                        transports=("qsgd_allgather",))
    >>> r.best.transport, r.best.bits_per_element <= 4, r.evaluated   # 3 widths, fp32, fp16
    ('qsgd_allgather', True, 5)
    """
    t0 = time.perf_counter()
    if not isinstance(budget, Budget):
        raise ConfigError(f"budget must be an emulator.Budget, got {type(budget).__name__}")
    if not is_int(workers) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    vm = VarianceModel(trace)
    transports = tuple(transports)
    for t in transports:
        if t not in VARIANCE_FACTORS:
            raise ConfigError(f"transports: {t!r} is not one of {sorted(VARIANCE_FACTORS)}")
    if not transports:
        raise ConfigError("transports must not be empty")
    widths = vm.widths if bits is None else tuple(sorted(set(bits)))
    for b in widths:
        if b not in vm.widths:
            raise ConfigError(f"bits: {b!r} was not measured; the trace has variance at bits {list(vm.widths)}")
    if not widths:
        raise ConfigError("bits must not be empty")
    compute = ComputeModel() if compute is None else compute
    net = network if network is not None else Network(
        G, world_size, on_simulated=None if progress is None else (
            lambda op, nbytes, wall_s: wall_s >= PROGRESS_EVERY_S and progress(
                f"simulated a {op} of {nbytes:,} B on {world_size} GPUs in {wall_s:.1f} s")))
    p = net.world_size
    ev = _Evaluator(trace, net, compute, vm, progress)
    groups = vm.groups
    base = [widths[-1]] * trace.num_buckets

    # what the budget allows at best: all groups at the widest width, the lowest factor
    lows = {t: vm.increase(tuple(base), t, p) for t in transports}
    least = min(lows.values())
    if budget.variance is not None and budget.variance < least:
        raise ConfigError(f"budget variance={budget.variance!r} is impossible: the least reachable "
                          f"with bits {list(widths)} and transports {list(transports)} is {least:.4g}")
    # a transport with no point within the budget is not searched (nor simulated)
    skipped = {t: f"its least variance increase {v:.4g} (all buckets at {widths[-1]} bits) exceeds "
                  f"the budget" for t, v in lows.items()
               if budget.variance is not None and v > budget.variance * (1 + 1e-12)}
    transports = tuple(t for t in transports if t not in skipped)
    if budget.bits_per_element is not None and budget.bits_per_element < widths[0]:
        raise ConfigError(f"budget bits_per_element={budget.bits_per_element!r} is impossible: the "
                          f"narrowest allowed width is {widths[0]} bits")

    if workers != 1:
        # the uniform widths below need every (bucket, width) size, the baselines theirs
        wanted = [r for t in transports for w in widths
                  for r in collective_requests(trace, net, t, w)]
        wanted += [r for t in ("fp32", "fp16") for r in collective_requests(trace, net, t)]
        net.prefetch(wanted, workers=workers)
    uniform = [ev(t, (w,) * trace.num_buckets) for t in transports for w in widths]
    if exhaustive:
        for t in transports:
            for combo in itertools.product(widths, repeat=len(groups)):
                state = list(base)
                for k, w in zip(groups, combo):
                    state[k] = w
                ev(t, tuple(state))
    else:
        for t in transports:
            _greedy(ev, t, groups, widths, base)
    feasible = [c for c in ev.seen.values() if _within(c, budget)]
    if not feasible:
        raise ConfigError(f"budget {budget.describe()} is impossible for transports {list(transports)} "
                          f"at {p} GPUs with bits {list(widths)}")
    best = min(feasible, key=lambda c: (c.iteration_s, c.variance))
    if not exhaustive:
        for t in transports:
            starts = [c for c in feasible if c.transport == t]
            if starts:
                got = _improve(ev, min(starts, key=lambda c: (c.iteration_s, c.variance)), groups, widths,
                               budget)
                best = min(best, got, key=lambda c: (c.iteration_s, c.variance))
    qsgd_cands = list(ev.seen.values())
    fp32 = replay(trace, None, transport="fp32", compute=compute, network=net).iteration_s
    fp16 = replay(trace, None, transport="fp16", compute=compute, network=net).iteration_s
    policy = {name: best.bits[b.index] for b in trace.buckets if b.compressed_numel
              for name in (p.name for p in b.variance.params)}
    return Recommendation(
        best=best, budget=budget, world_size=p, topology=net.name, fp32_s=fp32, fp16_s=fp16,
        policy=policy, front=pareto_front(qsgd_cands), uniform=tuple(uniform),
        evaluated=len(qsgd_cands) + 2, search_s=time.perf_counter() - t0,
        method="exhaustive" if exhaustive else "greedy+local", bucket_size=trace.config.bucket_size,
        extra={"skipped_transports": skipped})
