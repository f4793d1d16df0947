"""Collective times at many sizes from a few simulations: the studies' approximate mode.

A study asks for the same collective at dozens of sizes (every bucket of every bit width),
and on a 1024-GPU graph each simulation costs seconds. For one *shape* of schedule (the same
transfers, dependencies and routes; every transfer's bytes a fixed share of the
collective's), the engine's time is a continuous, piecewise affine function of the bytes:
between events every flow drains at a max-min rate that depends on which flows are active,
not on their bytes, so each event time is an affine function of the size for as long as
the events keep their order, and a change of order only changes which affine piece applies.
NCCL's plan (algorithm, protocol, channels: :func:`emulator.collectives.nccl.plan`) fixes
the shape of its schedules; integer splits (a byte more for some ranks) and chunk counts
that grow with small sizes bend it slightly, so the lines are checked, not trusted.

The method, per shape: simulate the smallest and the largest size, then the size nearest the
middle of the two (and, with four or more sizes between the ends, the one nearest the middle
of the wider half); if the straight line between the ends gives these within ``rtol``
(relative) and all the schedules have as many transfers, the sizes between the ends are read
off the line, else each half is treated the same way. Simulated sizes are
exact; the check bounds nothing between its points, so the error of the others is measured
against exact studies (``benchmarks/study_interpolation.py``, ``benchmarks/RESULTS.md``).

:class:`Interpolation` only plans: it says which sizes to simulate next (all of a round at
once, so that a caller may simulate them in parallel) and takes their results.
"""
from __future__ import annotations

from ._checks import is_number
from .errors import ConfigError

__all__ = ["Interpolation", "DEFAULT_RTOL"]

#: The middle check's tolerance (relative) of the studies' approximate mode.
DEFAULT_RTOL = 1e-3


class Interpolation:
    """Which sizes of one shape to simulate, and the times of all of them.

    Parameters
    ----------
    sizes : iterable of int
        The sizes wanted (bytes); duplicates are ignored.
    rtol : float
        Tolerance (relative, in (0, 0.1]) of the middle size against the line through the ends.

    Examples
    --------
    >>> sw = Interpolation([1, 2, 3, 4, 5], rtol=1e-3)
    >>> while sw.wanted():
    ...     for n in sw.wanted():
    ...         sw.feed(n, seconds=1.0 + 2.0 * n, sent=10.0 * n, transfers=8)
    >>> sw.results()[4], sorted(sw.simulated)
    ((9.0, 40.0), [1, 3, 5])
    """

    def __init__(self, sizes, rtol: float = DEFAULT_RTOL):
        if isinstance(rtol, bool) or not is_number(rtol) or not 0.0 < rtol <= 0.1:
            raise ConfigError(f"rtol={rtol!r} must be a number in (0, 0.1]")
        self.sizes = sorted({int(n) for n in sizes})
        self.rtol = float(rtol)
        self.simulated: dict = {}        # size -> (seconds, sent, transfers)
        self._read: dict = {}            # size -> (seconds, sent), read off a line
        self._open = [(0, len(self.sizes) - 1)] if self.sizes else []   # undecided ranges
        self._want: set = set()

    def wanted(self) -> list:
        """Sizes to simulate before the next step (empty when every size has its time)."""
        while not self._want and self._open:
            self._advance()
        return sorted(self._want)

    def feed(self, n: int, seconds: float, sent: float, transfers: int) -> None:
        """The simulated ``seconds`` and ``sent`` bytes of size ``n`` (a wanted one), whose
        schedule had ``transfers`` transfers."""
        if n not in self._want:
            raise ConfigError(f"Interpolation.feed: size {n!r} was not wanted "
                              f"(wanted: {sorted(self._want)})")
        self._want.discard(n)
        self.simulated[n] = (float(seconds), float(sent), int(transfers))

    def results(self) -> dict:
        """``{size: (seconds, sent)}`` of every size; call once :meth:`wanted` is empty."""
        if self.wanted():
            raise ConfigError(f"Interpolation.results: sizes {self.wanted()} are not simulated yet")
        return {n: self.simulated[n][:2] if n in self.simulated else self._read[n]
                for n in self.sizes}

    def _advance(self) -> None:
        """One pass over the open ranges: ask for the ends and checks not simulated yet; a
        range with all of them decides: its sizes read off its line, or its two halves open."""
        s, sim = self.sizes, self.simulated
        still = []
        for lo, hi in self._open:
            checks = self._checks(lo, hi) if hi - lo >= 2 else []
            todo = [s[k] for k in (lo, hi, *checks) if s[k] not in sim]
            if todo:
                self._want.update(todo)
                still.append((lo, hi))
                continue
            if not checks:                  # nothing between its simulated ends
                continue
            line = self._line(lo, hi)
            count = sim[s[lo]][2]
            on_line = sim[s[hi]][2] == count and all(
                sim[s[k]][2] == count and
                abs(line(s[k])[0] - sim[s[k]][0]) <= self.rtol * abs(sim[s[k]][0])
                for k in checks)
            if on_line:
                self._read.update((s[k], line(s[k])) for k in range(lo + 1, hi)
                                  if s[k] not in sim)
            else:
                still += [(lo, checks[0]), (checks[0], hi)]
        self._open = still

    def _checks(self, lo: int, hi: int) -> list:
        """The sizes that must lie on the line from ``lo`` to ``hi`` (indices): the one
        nearest the middle and, with four or more sizes between the ends, the one nearest
        the middle of the wider half too. One check alone lets a size-to-size jitter (NCCL's
        LL all-gathers at a few kB per send) pass by chance at the middle while the sizes
        beside it are a percent off; a second check at another place rarely does."""
        mid = self._middle(lo, hi)
        if hi - lo - 1 < 4:
            return [mid]
        s = self.sizes
        wide = (lo, mid) if s[mid] - s[lo] >= s[hi] - s[mid] else (mid, hi)
        if wide[1] - wide[0] < 2:
            return [mid]
        return [mid, self._middle(*wide)]

    def _middle(self, lo: int, hi: int) -> int:
        """The index between ``lo`` and ``hi`` whose size is nearest their mean."""
        s = self.sizes
        target = (s[lo] + s[hi]) / 2
        return min(range(lo + 1, hi), key=lambda k: (abs(s[k] - target), k))

    def _line(self, lo: int, hi: int):
        """``size -> (seconds, sent)`` on the straight line through sizes ``lo`` and ``hi``."""
        x0, x1 = self.sizes[lo], self.sizes[hi]
        (t0, b0, _), (t1, b1, _) = self.simulated[x0], self.simulated[x1]

        def at(x):
            w = (x - x0) / (x1 - x0)
            return t0 + w * (t1 - t0), b0 + w * (b1 - b0)
        return at
