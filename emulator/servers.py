"""Work on a rank's servers, each in a fixed order, waiting for work on the others: a list schedule.

A sharded step (:mod:`emulator.sharded`) is work for a few servers of one rank: the compute
stream (forward, backward and the optimizer as segments between the points where a unit's
parameters must be there or its gradients go out), one NCCL stream per process group (a
communicator's collectives run one at a time in the order they were issued, Li et al.,
"PyTorch Distributed", VLDB 2020, Section 3.2.3), and the stream beside compute that runs
the codec's stages. Every server takes its items in its own order, one at a time; an item
starts when its server is free and every item it waits for has ended. The order on each server
is the order in which the host issues the work (program order), so the schedule is the
earliest start of each item under those orders: one pass, no fluid rates (the servers share
nothing; work beside compute does not slow it, a simplification :mod:`emulator.sharded` names).

>>> out = run({"compute": [Item("a", 2.0), Item("b", 1.0, ("g",))],
...            "stream": [Item("g", 3.0)]})
>>> out["b"], out["g"]
((3.0, 4.0), (0.0, 3.0))
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


def run(queues: dict) -> dict:
    """Start and end (s) of every item of ``queues`` (server name -> items in order).

    Raises SimulationError when an item waits for one that never runs or for one queued
    behind itself (a cycle), naming the stuck items.
    """
    for items in queues.values():
        for it in items:
            if not 0.0 <= it.seconds < math.inf:
                raise SimulationError(f"{it.key!r}: seconds={it.seconds!r} must be finite and >= 0")
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
