"""One rank's iteration as a fluid model: backward's thread, the hook's callback thread and the
communication stream, each progressing at a rate set by which of the three are running.

:func:`emulator.replay` describes an iteration as work for three servers of one rank
(module docstring of :mod:`emulator.replaying`) and this module times it:

- **backward's thread** runs its items in order: compute up to each bucket's ready point, then
  that bucket's hook stages (encode), then the rest of backward;
- **the callback thread** runs the callback stages (decode, average, re-encode) one at a time in
  plan order, each once the step it waits for is done;
- **the stream** runs the collectives one at a time in plan order, each once the step it waits
  for is done.

The two threads share the rank's compute resource equally while both run (processor sharing,
docs/collectives.md "Work beside backward"): each then does ``share`` seconds of work per
second. While a collective runs, both do ``pace`` times that (the compute the harness measured
beside a running collective). A collective does ``1 / idle_s`` of itself per second while the
rank computes nothing, ``1 / loaded_s`` while either thread works. Between events all rates
are constant, so the model is exact piecewise-linear progress: at each step the next event is
the earliest completion, everything advances to it, and waiting work starts. Completions
within a relative 1e-12 of the earliest happen together.

Every rate is positive while its server works, so the times are continuous in every input:
a collective a little longer moves what waits for it by at most a bounded multiple of that.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SimulationError

_TIE = 1e-12


@dataclass(frozen=True)
class Work:
    """An item of one server: ``key`` names it in the result (unique, not None), ``after`` is
    the key of what it waits for (None: nothing), ``seconds`` its work alone (s); a
    collective's ``loaded_s`` is its duration while the rank computes throughout."""

    key: object
    seconds: float
    after: object = None
    loaded_s: float | None = None
    #: The threads' pace while this collective runs (None: :func:`run`'s ``pace``): a GPU
    #: collective's kernel takes its thread blocks' SMs from the compute
    #: (:meth:`emulator.Network.blocks`).
    pace: float | None = None


def run(backward: list, callbacks: list, stream: list, *, share: float = 0.5,
        pace: float = 1.0) -> dict:
    """Start and end times (s) of every keyed item.

    Parameters
    ----------
    backward : list of Work
        Backward's thread, in order (``after`` unused: each follows the one before).
    callbacks : list of Work
        The callback thread's stages, in order.
    stream : list of Work
        The collectives, in order; ``loaded_s`` defaults to ``seconds``.
    share : float
        Each thread's share of the compute while both run (0 < share <= 1).
    pace : float
        The threads' pace while a collective runs (0 < pace <= 1), unless the collective's
        :class:`Work` gives its own.

    Returns
    -------
    dict
        key -> (start_s, end_s); ``"backward end"`` -> (0, when backward's thread finished).

    Examples
    --------
    A 2 s decode beside 3 s of backward: both at half pace for 4 s, then backward's last second
    alone:

    >>> out = run([Work("bwd", 3.0)], [Work("dec", 2.0)], [])
    >>> out["dec"], out["bwd"]
    ((0.0, 4.0), (0.0, 5.0))
    """
    queues = [list(backward), list(callbacks), list(stream)]
    for w in (w for q in queues for w in q):
        for name, value in (("seconds", w.seconds), ("loaded_s", w.loaded_s)):
            if value is not None and not 0.0 <= value < math.inf:
                raise SimulationError(f"{w.key!r}: {name}={value!r} must be finite and >= 0")
        if w.pace is not None and not 0.0 < w.pace <= 1.0:
            raise SimulationError(f"{w.key!r}: pace={w.pace!r} must be in (0, 1]")
    heads = [0, 0, 0]
    left = [0.0, 0.0, 0.0]          # work (threads, s) or fraction (stream) of the head left
    started = [False, False, False]
    out: dict = {}
    done: set = {None}
    t = 0.0

    def startable(i: int) -> bool:
        if heads[i] >= len(queues[i]):
            return False
        return i == 0 or queues[i][heads[i]].after in done

    while True:
        # start what may start; finish what has nothing to do, until nothing changes
        changed = True
        while changed:
            changed = False
            for i in range(3):
                if not started[i] and startable(i):
                    w = queues[i][heads[i]]
                    started[i], left[i] = True, (1.0 if i == 2 else w.seconds)
                    out[w.key] = (t, t)
                if started[i] and (queues[i][heads[i]].seconds <= 0.0 or left[i] <= 0.0):
                    _finish(queues[i][heads[i]], t, out, done)
                    heads[i] += 1
                    started[i] = False
                    changed = True
        if not any(started):
            break
        bwd, cb, coll = started
        beside = 1.0
        if coll:
            own = queues[2][heads[2]].pace
            beside = pace if own is None else own
        rates = [(share if cb else 1.0) * beside, (share if bwd else 1.0) * beside, 0.0]
        if coll:
            w = queues[2][heads[2]]
            loaded = w.seconds if w.loaded_s is None else w.loaded_s
            rates[2] = 1.0 / (loaded if (bwd or cb) else w.seconds)
        dts = [left[i] / rates[i] if started[i] else float("inf") for i in range(3)]
        dt = min(dts)
        t += dt
        for i in range(3):
            if started[i]:
                left[i] = 0.0 if dts[i] <= dt * (1.0 + _TIE) else left[i] - rates[i] * dt
    if any(heads[i] < len(queues[i]) for i in range(3)):
        stuck = [queues[i][heads[i]] for i in range(3) if heads[i] < len(queues[i])]
        raise SimulationError(f"items wait for steps that never run: {stuck}")
    out["backward end"] = (0.0, out[queues[0][-1].key][1] if backward else 0.0)
    return out


def _finish(w: Work, t: float, out: dict, done: set) -> None:
    out[w.key] = (out[w.key][0], t)
    done.add(w.key)
