"""The attention kernels against a published end-to-end comparison (``validate attention``).

FlashAttention-2's paper trains the same GPT models on the same 8 x A100 80GB node with
FlashAttention and with FlashAttention-2 (and without either, a column whose setup is not
known: the data file says why it is left out), and prints each run's model TFLOP/s per GPU
(its Table 1). The compute model times the same step with the same attention kernel
(:data:`emulator.compute.ATTENTION_KERNELS`), so the table checks both the kernels' speeds and
the share of the step attention takes. The cases live in
``tests/emulator/data/compute/flashattention2_table1.json`` (format
``qsgd-published-attention``, version 1), with the paper's FLOP formula and the setup read from
its training code.

The ratios between the kernels (:mod:`emulator.compute.attention`) come from the same paper's
kernel benchmarks (section 4.1), not from this table; nothing is fitted to it. The runs are
data parallel over NVLink; the prediction is one GPU's step, whose gradient traffic (ZeRO-1 on
one NVLink node) hides behind backward.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from emulator.compute import (ATTENTION_KERNELS, device as device_named,
                              precision as precision_named, step_times)
from emulator.errors import TraceError
from emulator._checks import is_int, is_number
from .compute import check_target, need, operators_of, predict_all, read_cases, repo_path

FORMAT = "qsgd-published-attention"
#: Where the published cases are kept (relative to the repository).
DEFAULT_PATH = os.path.join("tests", "emulator", "data", "compute", "flashattention2_table1.json")


@dataclass(frozen=True)
class AttentionCase:
    """One published run: a GPT model's training step with one attention implementation."""

    id: str
    row: str
    column: str
    args: dict
    attention: str
    device: str
    precision: str
    batch_size: int
    tflops_per_gpu: float


def load_attention_cases(path: str | os.PathLike | None = None) -> tuple[list[AttentionCase], dict]:
    """The cases of a ``qsgd-published-attention`` file and its source; errors name the file
    and the field.

    Examples
    --------
    >>> cases, source = load_attention_cases()
    >>> len(cases), sorted({c.attention for c in cases})
    (8, ['flash1', 'flash2'])
    """
    path = os.fspath(path or _default_path())
    doc, cases = read_cases(path, FORMAT)
    out = []
    for where, c in cases:
        zoo = need(c, "zoo", where)
        if not isinstance(zoo, dict) or zoo.get("model") != "gpt2" or not isinstance(zoo.get("args"), dict):
            raise TraceError(f"{where}.zoo must be {{'model': 'gpt2', 'args': {{...}}}}, got {zoo!r}")
        attention = need(c, "attention", where)
        if attention not in ATTENTION_KERNELS:
            raise TraceError(f"{where}.attention must be one of {sorted(ATTENTION_KERNELS)}, got "
                             f"{attention!r}")
        batch, rate = need(c, "batch_size", where), need(c, "tflops_per_gpu", where)
        if not is_int(batch) or batch < 1:
            raise TraceError(f"{where}.batch_size must be a positive int, got {batch!r}")
        if not is_number(rate) or not rate > 0:
            raise TraceError(f"{where}.tflops_per_gpu must be a number > 0, got {rate!r}")
        check_target(c, where)
        out.append(AttentionCase(str(need(c, "id", where)), str(c.get("row", "")),
                                 str(c.get("column", "")), dict(zoo["args"]), attention,
                                 c["device"], c["precision"], batch, float(rate)))
    return out, doc.get("source", {})


def _default_path() -> str:
    return repo_path(DEFAULT_PATH)


def predict_attention_case(case: AttentionCase, *, cache: dict | None = None) -> dict:
    """The compute model's model TFLOP/s per GPU for ``case`` beside the published figure.

    The FLOPs are the paper's: ``6 * parameters + 12 * layers * hidden * seq_len`` per token.

    Returns
    -------
    dict
        ``id``, ``row``, ``column``, ``attention``, ``published`` and ``predicted`` (model
        TFLOP/s per GPU), ``error`` (predicted / published - 1), ``tokens_per_s`` (one GPU's,
        predicted), ``step_s``.
    """
    dev, prec = device_named(case.device), precision_named(case.precision)
    prec.check(dev)
    ops = operators_of(("gpt2", tuple(sorted(case.args.items())), False, True, None, prec.family),
                       cache)
    t = step_times(ops.family(prec.family), case.batch_size, dev, prec, attention=case.attention)
    seq, layers, hidden = case.args["seq_len"], case.args["n_layer"], case.args["n_embd"]
    flops_per_token = 6 * sum(ops.parameters.values()) + 12 * layers * hidden * seq
    tokens_per_s = case.batch_size * seq / t.step_s
    predicted = tokens_per_s * flops_per_token / 1e12
    return {"id": case.id, "row": case.row, "column": case.column, "attention": case.attention,
            "published": case.tflops_per_gpu, "predicted": predicted,
            "error": predicted / case.tflops_per_gpu - 1, "tokens_per_s": tokens_per_s,
            "step_s": t.step_s}


def validate_attention(path=None, *, progress=None) -> dict:
    """Every case of ``path`` (default: the project's) predicted, with the speedups between
    the columns of each row, published and predicted.

    Returns
    -------
    dict
        ``rows`` (:func:`predict_attention_case`), ``speedups`` (per row and pair of columns:
        ``row``, ``pair``, ``published``, ``predicted``), ``median_abs_error``,
        ``max_abs_error``, ``source``.
    """
    cases, source = load_attention_cases(path)
    rows = predict_all(cases, predict_attention_case, progress)
    by_row: dict = {}
    for r in rows:
        by_row.setdefault(r["row"], {})[r["attention"]] = r
    speedups = []
    for row, cols in by_row.items():
        for a, b in (("flash1", "flash2"), ("triton", "flash2")):
            if a in cols and b in cols:
                speedups.append({"row": row, "pair": f"{b} / {a}",
                                 "published": cols[b]["published"] / cols[a]["published"],
                                 "predicted": cols[b]["predicted"] / cols[a]["predicted"]})
    errs = [abs(r["error"]) for r in rows]
    return {"rows": rows, "speedups": speedups, "median_abs_error": statistics.median(errs),
            "max_abs_error": max(errs), "source": source}
