"""What a simulated collective returns: its time, per-rank timeline and per-link usage."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkUsage:
    """Use of one directed link channel ``u -> v`` during a collective.

    Attributes
    ----------
    u, v : str
        The channel's ends (a full-duplex link has one channel per direction).
    capacity : float
        Bandwidth in bytes/s.
    bytes : int
        Bytes that crossed the channel.
    busy_s : float
        Seconds during which at least one flow was sending over it.
    peak_utilization : float
        Highest allocated rate over capacity (0..1; never above 1 by max-min fairness).
    """

    u: str
    v: str
    capacity: float
    bytes: int
    busy_s: float
    peak_utilization: float

    def utilization(self, time_s: float) -> float:
        """Mean utilization over a collective of ``time_s`` seconds: bytes / (capacity * time)."""
        return self.bytes / (self.capacity * time_s) if time_s > 0 else 0.0


@dataclass(frozen=True)
class CollectiveResult:
    """Outcome of :func:`emulator.simulate`.

    Attributes
    ----------
    op, algorithm : str
    nbytes : int
        The collective's size in bytes (nccl-tests convention).
    ranks : tuple of int
    time_s : float
        From the first transfer's start to the last arrival, in seconds.
    rank_start_s, rank_finish_s : tuple of float
        Per rank (in the order of ``ranks``): first send, last send or receive, in seconds.
    links : tuple of LinkUsage
        Every channel that carried bytes.
    flows : int
        Network transfers simulated.
    bytes_sent, bytes_received : int
        Totals over all transfers (equal when every byte arrived).
    events : int
        Steps of the event engine (rate recomputations happen only at flow starts and ends);
        0 when no two flows ever shared a channel and the contention-free pass
        (:mod:`emulator.critical_path`) gave the times without stepping.
    copies : int
        Equivalent transfers each simulated one stood for: 1 when every transfer was
        simulated, ``n`` when a shift of the ranks mapped the schedule onto itself and one
        transfer per class of ``n`` ran (:mod:`emulator.symmetry`; exact).
    """

    op: str
    algorithm: str
    nbytes: int
    ranks: tuple
    time_s: float
    rank_start_s: tuple
    rank_finish_s: tuple
    links: tuple
    flows: int
    bytes_sent: int
    bytes_received: int
    events: int = 0
    copies: int = 1

    @property
    def algbw(self) -> float:
        """nccl-tests' algorithm bandwidth: nbytes / time, in bytes/s."""
        return self.nbytes / self.time_s if self.time_s > 0 else float("inf")

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth in bytes/s (algbw times the op's factor)."""
        from .collectives import busbw_factor

        op = self.op if self.op in ("allgather", "reduce_scatter", "alltoall", "broadcast") \
            else "allreduce"
        return self.algbw * busbw_factor(op, len(self.ranks))

    @property
    def peak_utilization(self) -> float:
        """Highest utilization of any channel (0..1)."""
        return max((l.peak_utilization for l in self.links), default=0.0)

    def to_dict(self) -> dict:
        """JSON-ready form (what the dashboard draws)."""
        return {
            "op": self.op, "algorithm": self.algorithm, "nbytes": self.nbytes,
            "ranks": list(self.ranks), "time_s": self.time_s, "algbw": self.algbw,
            "busbw": self.busbw, "flows": self.flows, "events": self.events,
            "copies": self.copies,
            "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
            "timeline": [{"rank": r, "start_s": s, "finish_s": f}
                         for r, s, f in zip(self.ranks, self.rank_start_s, self.rank_finish_s)],
            "links": [{"u": l.u, "v": l.v, "capacity": l.capacity, "bytes": l.bytes,
                       "busy_s": l.busy_s, "peak_utilization": l.peak_utilization,
                       "utilization": l.utilization(self.time_s)} for l in self.links],
        }
