"""Operator records added to a trace after it was made (:func:`add_operators`).

A trace written before traces carried operator records, or without the families a precision
needs (the ``half`` family of ``fp16`` is recorded only when asked for), gets them recorded
from its model on the meta device, beside what it has.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from qsgd.models import build_model
from qsgd.operators import record_operators
from qsgd.operators.checkpoint import check_checkpointing
from qsgd.operators.records import DEFAULT_FAMILIES
from qsgd.trace import PayloadTrace

__all__ = ["add_operators"]


def add_operators(trace: PayloadTrace, families: tuple[str, ...] | None = None, *,
                  model: nn.Module | None = None, checkpointing: str | None = None,
                  transients: bool = False) -> PayloadTrace:
    """``trace`` with its model's operator records (:func:`qsgd.record_operators`), for a
    trace written before traces carried them (or carried these ``families``); the model is
    ``model`` (one built with arguments a name does not carry) or is built from
    ``trace.model`` on the meta device (no weights). A trace that has them is returned as it
    is; one that lacks some of ``families`` gets those recorded beside its own.

    ``checkpointing`` (a :data:`qsgd.CHECKPOINTING` key; None: as the trace's records were
    made) other than the trace's records ``families`` (default: every family it has) again
    with that activation checkpointing, in place of all it had (a measured step's
    per-operator seconds go with them: they timed another step).

    ``transients``: also record backward's transient memory for the families recorded before
    it was (:attr:`qsgd.operators.Operators.without_transients`), their other records and a
    measured step's seconds kept as they are (what a report of memory needs).

    Raises
    ------
    TraceError
        The model cannot be built here (an import path that does not resolve).

    Examples
    --------
    >>> import dataclasses, qsgd
    >>> old = dataclasses.replace(qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4),
    ...                                        device="meta"), operators=None)
    >>> qsgd.add_operators(old).operators.family("fp32").optimizer
    'sgd'
    >>> fp32 = qsgd.add_operators(old, families=("fp32",))
    >>> sorted(qsgd.add_operators(fp32, families=("half",)).operators.families)
    ['fp32', 'half']
    """
    from qsgd.errors import ModelError, TraceError

    have = trace.operators
    if families is None:
        families = DEFAULT_FAMILIES if have is None else ()
    first = None if have is None else next(iter(have.families.values()), None)
    optimizer = None if first is None else first.optimizer
    now = "none" if have is None else have.extra.get("checkpointing", "none")
    if checkpointing is not None and check_checkpointing(checkpointing) != now and have is not None:
        # again the other way: the families asked for, else all it has
        families = tuple(families) or tuple(have.families)
        extra = {k: v for k, v in have.extra.items() if k != "checkpointing"}
        if checkpointing != "none":
            extra["checkpointing"] = checkpointing
        have = dataclasses.replace(have, families={}, measured=None, extra=extra)
    missing = tuple(f for f in families if have is None or f not in have.families)
    stale = have.without_transients if transients and have is not None else ()
    if not missing and not stale:
        return trace
    try:
        if model is None:
            with torch.device("meta"):
                model = build_model(trace.model)
    except ModelError as exc:
        what = ("no operator records" if have is None else
                f"no {list(missing)} operator records" if missing else
                f"no transient memory in its {list(stale)} records")
        raise TraceError(f"trace of {trace.model!r} has {what} and its model cannot "
                         f"be built here to record them: {exc}") from None
    # the new families as the others were recorded: layout, attention, checkpointing,
    # optimizer
    extra = {} if have is None else dict(have.extra)
    new = record_operators(model, input_shape=trace.input_shape, families=missing + stale,
                           channels_last=extra.get("memory_format") == "channels_last",
                           fused_attention=extra.get("attention", "fused") != "math",
                           checkpointing=(checkpointing if checkpointing is not None else
                                          extra.get("checkpointing", "none")),
                           optimizer=optimizer)
    if have is not None:
        kept = {f: dataclasses.replace(o, transient=new.families[f].transient) if f in stale else o
                for f, o in have.families.items()}
        new = dataclasses.replace(have, families={**kept, **{f: new.families[f] for f in missing}})
    return dataclasses.replace(trace, operators=new)
