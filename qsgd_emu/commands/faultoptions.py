"""``qsgd-emu simulate``'s fault options: ``--degrade``, ``--remove`` and ``--straggler``.

Each option's comma-separated fields are parsed into an :class:`emulator.Fault` and applied
to one working copy of the topology as it is read, so a bad value or a combination that
cannot run is refused naming the option and the value, before anything is simulated.
"""
from __future__ import annotations

import topologies

__all__ = ["FAULT_FORMS", "parse_faults", "describe_fault", "int_option"]


#: option -> (number of comma-separated fields, their names, help); parsers in _FAULT_PARSERS
FAULT_FORMS = {
    "--degrade": (3, "U,V,FACTOR", "link U-V runs at FACTOR (0 < FACTOR <= 1) of its bandwidth; "
                  "repeatable"),
    "--remove": (2, "U,V", "link U-V is down (flows re-route); repeatable"),
    "--straggler": (2, "RANK,DELAY", "rank RANK starts DELAY late (e.g. 3,20us); repeatable"),
}


def int_option(option: str, text: str, minimum: int) -> int:
    """``text`` as an int of at least ``minimum``; a ValueError naming ``option`` else."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{option} {text!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{option} {text!r} must be >= {minimum}")
    return value


def _node(G, order, option: str, spec: str, text: str):
    """A node id of ``G``, or the GPU of a rank."""
    if text in G:
        return text
    try:
        rank = int(text)
    except ValueError:
        raise ValueError(f"{option} {spec!r}: {text!r} is neither a node id nor a GPU rank "
                         f"of the topology") from None
    if not 0 <= rank < len(order):
        raise ValueError(f"{option} {spec!r}: rank {rank} is out of range 0..{len(order) - 1}")
    return order[rank]


def _link(G, order, option: str, spec: str, u: str, v: str) -> tuple:
    a, b = _node(G, order, option, spec, u), _node(G, order, option, spec, v)
    if not G.has_edge(a, b):
        raise ValueError(f"{option} {spec!r}: there is no link {a} - {b} in the topology")
    return a, b


def _degrade(G, order, nranks, spec, u, v, factor):
    import emulator

    a, b = _link(G, order, "--degrade", spec, u, v)
    try:
        return emulator.DegradedLink(a, b, float(factor))
    except ValueError:
        raise ValueError(f"--degrade {spec!r}: FACTOR {factor!r} must be a number in "
                         f"(0, 1]") from None


def _remove(G, order, nranks, spec, u, v):
    import emulator

    return emulator.RemovedLink(*_link(G, order, "--remove", spec, u, v))


def _straggler(G, order, nranks, spec, rank, delay):
    import emulator

    r = int_option(f"--straggler {spec!r}: RANK", rank, 0)
    if r >= nranks:
        raise ValueError(f"--straggler {spec!r}: rank {r} does not take part "
                         f"(ranks 0..{nranks - 1})")
    try:
        return emulator.Straggler(r, topologies.parse_time(delay))
    except ValueError as exc:
        raise ValueError(f"--straggler {spec!r}: {exc}") from None


_FAULT_PARSERS = {"--degrade": _degrade, "--remove": _remove, "--straggler": _straggler}


def parse_faults(args, G, nranks: int) -> list:
    """The :class:`emulator.Fault` objects of the ``--degrade/--remove/--straggler`` options.

    Each fault is applied to one working copy of ``G`` as it is parsed, so a link removed
    twice, or removals that partition the cluster only together, are reported here, naming
    the option, rather than in the middle of a simulation.
    """
    import emulator

    if not any(getattr(args, option.lstrip("-")) for option in FAULT_FORMS):
        return []           # no working copy: copying 65,536 GPUs' graph takes seconds
    order = topologies.gpus(G)
    work = G.copy()
    faults = []
    for option, (fields, form, _) in FAULT_FORMS.items():
        for spec in getattr(args, option.lstrip("-")):
            parts = [p.strip() for p in spec.split(",")]
            if len(parts) != fields or not all(parts):
                raise ValueError(f"{option} {spec!r}: expected {form}")
            fault = _FAULT_PARSERS[option](work, order, nranks, spec, *parts)
            try:
                fault.apply(work)
            except (ValueError, emulator.SimulationError) as exc:
                raise ValueError(f"{option} {spec!r}: {exc}") from None
            faults.append(fault)
    return faults


def describe_fault(fault) -> str:
    """One line naming ``fault`` (an :class:`emulator.Fault`), as the outputs list it."""
    import emulator

    if isinstance(fault, emulator.DegradedLink):
        return f"degrade {fault.u}-{fault.v} x{fault.factor:g}"
    if isinstance(fault, emulator.RemovedLink):
        return f"remove {fault.u}-{fault.v}"
    return f"straggler rank {fault.rank} +{fault.delay_s * 1e6:g} us"
