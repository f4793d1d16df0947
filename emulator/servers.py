"""Work on a rank's servers, each in a fixed order, waiting for work on the others: a list schedule.

A sharded step (:mod:`emulator.sharded`) is work for a few servers of one rank: the compute
stream (forward, backward and the optimizer as segments between the points where a unit's
parameters must be there or its gradients go out), one NCCL stream per process group (a
communicator's collectives run one at a time in the order they were issued, Li et al.,
"PyTorch Distributed", VLDB 2020, Section 3.2.3), and the stream beside compute that runs
the codec's stages. Every server takes its items in its own order, one at a time; an item
starts when its server is free and every item it waits for has ended. The order on each server
is the order in which the host issues the work (program order), so the schedule is the
earliest start of each item under those orders.

One resource is shared: the GPU's SMs. An item that occupies a ``share`` of them (a
collective's kernel: NCCL's thread blocks over the SM count, :meth:`emulator.Network.blocks`)
slows the items of the ``paced`` server (the compute stream) while it runs: they progress at
``1 - (the shares running)`` of their pace, a fluid rate that changes at every start and end
(event by event). The ``beside`` server (the codec's stages on another stream) runs on the
same SMs: while both have work, each goes at ``split`` of that pace (processor sharing, as
the DDP replay's callback stages beside backward: docs/collectives.md, "Work beside
backward"). Without shares or work beside, one pass of the list schedule, as before.

>>> out = run({"compute": [Item("a", 2.0), Item("b", 1.0, ("g",))],
...            "stream": [Item("g", 3.0)]})
>>> out["b"], out["g"]
((3.0, 4.0), (0.0, 3.0))

A collective on a fifth of the SMs for its 3 s: "a" does 2 s of work at 0.8 in 2.5 s.

>>> out = run({"compute": [Item("a", 2.0), Item("b", 1.0, ("g",))],
...            "stream": [Item("g", 3.0, share=0.2)]}, paced="compute")
>>> out["a"], out["b"]
((0.0, 2.5), (3.0, 4.0))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SimulationError


@dataclass(frozen=True)
class Item:
    """``seconds`` of work named ``key`` (unique), started once every key in ``after`` ended."""

    key: object
    seconds: float
    after: tuple = ()
    #: Share of the GPU's SMs the item occupies while it runs (0 <= share < 1).
    share: float = 0.0


#: The least pace of a paced item: shares running together may add up to all SMs, and the
#: compute stream still gets blocks scheduled as the collectives' blocks finish their steps.
MIN_PACE = 0.05


def run(queues: dict, paced: str | None = None, beside: str | None = None,
        split: float = 0.5) -> dict:
    """Start and end (s) of every item of ``queues`` (server name -> items in order); the
    items of servers ``paced`` and ``beside`` slowed by the shares of the other items running,
    and each to ``split`` of that while both run (module docstring).

    Raises SimulationError when an item waits for one that never runs or for one queued
    behind itself (a cycle), naming the stuck items.
    """
    for items in queues.values():
        for it in items:
            if not 0.0 <= it.seconds < math.inf:
                raise SimulationError(f"{it.key!r}: seconds={it.seconds!r} must be finite and >= 0")
            if not 0.0 <= it.share < 1.0:
                raise SimulationError(f"{it.key!r}: share={it.share!r} must be in [0, 1)")
    if not 0.0 < split <= 1.0:
        raise SimulationError(f"split={split!r} must be in (0, 1]")
    sharing = {paced, beside} - {None}
    shares = any(it.share > 0 for name, items in queues.items() if name not in sharing
                 for it in items)
    both = paced is not None and beside is not None and split < 1.0 and all(
        any(it.seconds > 0 for it in queues.get(name, ())) for name in (paced, beside))
    if sharing and (shares or both):
        return _run_paced(queues, sharing, split)
    heads = {name: 0 for name in queues}
    free = {name: 0.0 for name in queues}
    out: dict = {}
    left = sum(len(q) for q in queues.values())
    while left:
        progressed = False
        for name, items in queues.items():
            while heads[name] < len(items):
                it = items[heads[name]]
                if any(k not in out for k in it.after):
                    break
                start = max([free[name], *(out[k][1] for k in it.after)])
                out[it.key] = (start, start + it.seconds)
                free[name] = start + it.seconds
                heads[name] += 1
                left -= 1
                progressed = True
        if not progressed:
            stuck = [items[heads[n]].key for n, items in queues.items() if heads[n] < len(items)]
            raise SimulationError(f"items wait for work that never runs: {stuck}")
    return out


def _run_paced(queues: dict, sharing: set, split: float) -> dict:
    """:func:`run` event by event: at each time every item that can start starts; the running
    items of the ``sharing`` servers progress at ``max(MIN_PACE, 1 - shares running)``,
    times ``split`` while two of them run; the others at their own pace; the next event is
    the first end."""
    heads = {name: 0 for name in queues}
    busy: dict = {}                 # server -> [item, start, work left (s of work)]
    out: dict = {}
    t = 0.0
    left = sum(len(q) for q in queues.values())
    while left:
        for name, items in queues.items():       # start what can start now
            if name in busy or heads[name] >= len(items):
                continue
            it = items[heads[name]]
            if all(k in out and out[k][1] <= t for k in it.after):
                busy[name] = [it, t, it.seconds]
                heads[name] += 1
        if not busy:
            stuck = [items[heads[n]].key for n, items in queues.items() if heads[n] < len(items)]
            raise SimulationError(f"items wait for work that never runs: {stuck}")
        shares = sum(b[0].share for n, b in busy.items() if n not in sharing)
        pace = max(MIN_PACE, 1.0 - shares)
        if sum(1 for n, b in busy.items() if n in sharing and b[2] > 0) > 1:
            pace *= split
        rate = {n: (pace if n in sharing else 1.0) for n in busy}
        name, (it, start, work) = min(busy.items(), key=lambda kv: (kv[1][2] / rate[kv[0]], kv[0]))
        dt = work / rate[name]
        t_next = t + dt
        for n, b in list(busy.items()):
            if n == name:
                out[it.key] = (start, t_next)
                del busy[n]
                left -= 1
            else:
                b[2] = max(0.0, b[2] - rate[n] * dt)
        # zero-length and simultaneous ends finish at this time too
        for n, b in list(busy.items()):
            if b[2] <= 1e-15 * max(1.0, t_next):
                out[b[0].key] = (b[1], t_next)
                del busy[n]
                left -= 1
        t = t_next
    return out
