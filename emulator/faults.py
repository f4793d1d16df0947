"""Faults as what-ifs: a degraded link, a removed link, a straggler rank.

A fault changes a copy of the graph (links) or the schedule's timing (stragglers); the
original graph is never touched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError, SimulationError
from ._checks import is_int, is_number


class Fault:
    """Base class: :meth:`apply` edits a graph copy; :meth:`start_delay` delays ranks."""

    def apply(self, G) -> None:  # noqa: D401 - the default leaves the graph as it is
        """Change the graph copy ``G`` in place."""

    def start_delay(self) -> dict:
        """rank -> seconds before which that rank starts nothing."""
        return {}


def _edge(G, u, v, what):
    if not G.has_edge(u, v):
        raise ConfigError(f"{what}: there is no link ({u!r}, {v!r}) in the topology")
    return G.edges[u, v]


@dataclass(frozen=True)
class DegradedLink(Fault):
    """Link ``u``-``v`` runs at ``factor`` of its bandwidth (both directions), 0 < factor <= 1."""

    u: str
    v: str
    factor: float

    def __post_init__(self):
        f = self.factor
        if not is_number(f) or not (0 < f <= 1):
            raise ConfigError(f"DegradedLink: factor={f!r} must be in (0, 1]")

    def apply(self, G) -> None:
        _edge(G, self.u, self.v, "DegradedLink")["bandwidth"] *= float(self.factor)


@dataclass(frozen=True)
class RemovedLink(Fault):
    """Link ``u``-``v`` is down: flows re-route; a partition is an error."""

    u: str
    v: str

    def apply(self, G) -> None:
        _edge(G, self.u, self.v, "RemovedLink")
        G.remove_edge(self.u, self.v)
        import networkx as nx

        if not nx.is_connected(G):
            parts = sorted((len(c) for c in nx.connected_components(G)), reverse=True)
            raise SimulationError(f"RemovedLink({self.u!r}, {self.v!r}) partitions the cluster into "
                                  f"{len(parts)} parts of {parts} nodes; no route survives")


@dataclass(frozen=True)
class Straggler(Fault):
    """Rank ``rank`` starts its part of the collective ``delay_s`` seconds late."""

    rank: int
    delay_s: float

    def __post_init__(self):
        if not is_int(self.rank) or self.rank < 0:
            raise ConfigError(f"Straggler: rank={self.rank!r} must be an int >= 0")
        d = self.delay_s
        if not is_number(d) or not math.isfinite(d) or d < 0:
            raise ConfigError(f"Straggler: delay_s={d!r} must be a finite number of seconds >= 0")

    def start_delay(self) -> dict:
        return {self.rank: float(self.delay_s)}
