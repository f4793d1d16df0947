"""The compute model against published single-GPU training throughput (``validate compute``).

Cases live in ``tests/emulator/data/compute/published_throughput.json`` (format
``qsgd-published-compute``, version 1; its README names each source and how every figure was
read). Each case says how this project builds its model (``zoo``: a
:data:`qsgd.MODELS` name, its arguments, whether activations are channels-last, attention
written by hand or fused, and the optimizer when the run's is not the model's usual one: a
key of :data:`qsgd.OPTIMIZERS`), the GPU,
the precision and the per-GPU batch; :func:`predict_case` records that model's operators on the
meta device and times one training step with :func:`emulator.compute.step_times`, so the
prediction is ``batch / step seconds``. Nothing in the compute model is fitted to these cases;
where one misses, ``benchmarks/RESULTS.md`` says why.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field

from emulator.compute import device as device_named, precision as precision_named, step_times
from emulator.errors import ConfigError, TraceError
from emulator._checks import is_int, is_number

FORMAT = "qsgd-published-compute"
#: Where the published cases are kept (relative to the repository).
DEFAULT_PATH = os.path.join("tests", "emulator", "data", "compute", "published_throughput.json")


@dataclass(frozen=True)
class ComputeCase:
    """One published single-GPU training throughput (fields as in the file)."""

    id: str
    model: str
    args: dict
    channels_last: bool
    fused_attention: bool
    device: str
    precision: str
    batch_size: int
    samples_per_s: float
    source: str
    notes: str = field(default="", compare=False)
    optimizer: str | None = None


def need(case: dict, key: str, where: str):
    """``case[key]``; a one-line TraceError at ``where`` when it is missing."""
    if key not in case:
        raise TraceError(f"{where}.{key} is missing")
    return case[key]


def read_cases(path: str, fmt: str) -> tuple[dict, list[tuple[str, dict]]]:
    """The document of a case file of format ``fmt`` (version 1) and its cases, each with
    where it is (``"PATH: cases[i]"``, for errors); a file that cannot be read, of another
    format, or whose cases are not a non-empty list of objects is a one-line TraceError."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt or doc.get("version") != 1:
        raise TraceError(f"{path}: format must be {fmt!r} version 1")
    cases = doc.get("cases")
    if not isinstance(cases, list) or not cases:
        raise TraceError(f"{path}: cases must be a non-empty list")
    out = []
    for i, c in enumerate(cases):
        where = f"{path}: cases[{i}]"
        if not isinstance(c, dict):
            raise TraceError(f"{where} must be an object, got {c!r}")
        out.append((where, c))
    return doc, out


def check_target(case: dict, where: str) -> None:
    """A case's ``device`` and ``precision`` are the catalogue's; else a one-line TraceError."""
    try:
        device_named(need(case, "device", where))
        precision_named(need(case, "precision", where))
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from None


def load_cases(path: str | os.PathLike | None = None) -> list[ComputeCase]:
    """The cases of a ``qsgd-published-compute`` file; errors name the file and the field.

    Examples
    --------
    >>> cases = load_cases()
    >>> len(cases) >= 10 and all(c.samples_per_s > 0 for c in cases)
    True
    """
    path = os.fspath(path or _default_path())
    _, cases = read_cases(path, FORMAT)
    out = []
    for where, c in cases:
        zoo = need(c, "zoo", where)
        if not isinstance(zoo, dict) or not isinstance(zoo.get("model"), str) \
                or not isinstance(zoo.get("args", {}), dict):
            raise TraceError(f"{where}.zoo must be {{'model': name, 'args': {{...}}}}, got {zoo!r}")
        batch, rate = need(c, "batch_size", where), need(c, "samples_per_s", where)
        if not is_int(batch) or batch < 1:
            raise TraceError(f"{where}.batch_size must be a positive int, got {batch!r}")
        if not is_number(rate) or not math.isfinite(rate) or rate <= 0:
            raise TraceError(f"{where}.samples_per_s must be a number > 0, got {rate!r}")
        check_target(c, where)
        src = need(c, "source", where)
        attention = zoo.get("attention", "fused")
        if attention not in ("fused", "math"):
            raise TraceError(f"{where}.zoo.attention must be 'fused' or 'math', got {attention!r}")
        optimizer = zoo.get("optimizer")
        if optimizer is not None and optimizer not in _optimizers():
            raise TraceError(f"{where}.zoo.optimizer must be one of {sorted(_optimizers())}, "
                             f"got {optimizer!r}")
        out.append(ComputeCase(str(need(c, "id", where)), zoo["model"], dict(zoo.get("args", {})),
                               bool(zoo.get("channels_last", False)), attention == "fused",
                               c["device"], c["precision"],
                               batch, float(rate), src.get("title", "") if isinstance(src, dict) else str(src),
                               str(c.get("notes", "")), optimizer))
    return out


def _optimizers():
    import qsgd     # torch: only once a file is read

    return qsgd.OPTIMIZERS


def repo_path(relative: str) -> str:
    """``relative``, a path in the repository (where the case files are kept), made absolute."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(os.path.dirname(here)), relative)


def _default_path() -> str:
    return repo_path(DEFAULT_PATH)


def _operators(model: str, args: tuple, channels_last: bool, fused_attention: bool,
               optimizer: str | None, family: str):
    import torch

    import qsgd

    with torch.device("meta"):
        m = qsgd.build_model(model, **dict(args))
    return qsgd.record_operators(m, channels_last=channels_last, fused_attention=fused_attention,
                                 optimizer=optimizer, families=(family,))


def operators_of(key: tuple, cache: dict | None):
    """The operator records of ``key`` = (zoo model, its arguments as sorted items,
    channels-last, fused attention, optimizer, operator family), recorded once per ``cache``."""
    if cache is not None and key in cache:
        return cache[key]
    ops = _operators(*key)
    if cache is not None:
        cache[key] = ops
    return ops


def predict_all(cases, predict, progress=None) -> list[dict]:
    """``predict(case, cache=...)`` of every case, recordings shared; ``progress(done, total,
    case id)`` before the first and after each."""
    cache: dict = {}
    rows = []
    for i, c in enumerate(cases):
        if progress is not None:
            progress(i, len(cases), c.id)
        rows.append(predict(c, cache=cache))
    if progress is not None:
        progress(len(cases), len(cases), "")
    return rows


def predict_case(case: ComputeCase, *, cache: dict | None = None) -> dict:
    """The compute model's samples/s for ``case`` beside the published one.

    Returns
    -------
    dict
        ``id``, ``model``, ``device``, ``precision``, ``batch_size``, ``published`` and
        ``predicted`` (samples/s), ``error`` (predicted / published - 1), ``step_s`` and
        ``host_bound_s`` (seconds the GPU waited for the host), ``source``.
    """
    dev, prec = device_named(case.device), precision_named(case.precision)
    prec.check(dev)
    # only the family the case's precision runs: one recording, not four
    key = (case.model, tuple(sorted(case.args.items())), case.channels_last, case.fused_attention,
           case.optimizer, prec.family)
    ops = operators_of(key, cache)
    t = step_times(ops.family(prec.family), case.batch_size, dev, prec)
    predicted = case.batch_size / t.step_s
    return {"id": case.id, "model": case.model, "device": dev.name, "precision": prec.name,
            "batch_size": case.batch_size, "published": case.samples_per_s,
            "predicted": predicted, "error": predicted / case.samples_per_s - 1,
            "step_s": t.step_s, "host_bound_s": t.host_bound_s, "source": case.source}


def validate_compute(path=None, *, ids=None, progress=None) -> dict:
    """Every case of ``path`` (default: the project's) predicted; a summary of the errors.
    ``progress(done, total, case id)``, when given, is called before the first case and after
    each (the command's progress lines).

    Returns
    -------
    dict
        ``{"rows": [predict_case(...), ...], "median_abs_error", "max_abs_error",
        "within_10": count, "within_25": count}``.
    """
    every = load_cases(path)
    if ids is not None:
        unknown = set(ids) - {c.id for c in every}
        if unknown:
            raise ConfigError(f"ids: {sorted(unknown)} are not cases of the compute validation "
                              f"(qsgd-emu validate compute --json lists them)")
    cases = [c for c in every if ids is None or c.id in ids]
    rows = predict_all(cases, predict_case, progress)
    errs = [abs(r["error"]) for r in rows]
    return {"rows": rows, "median_abs_error": statistics.median(errs) if errs else None,
            "max_abs_error": max(errs) if errs else None,
            "within_10": sum(e <= 0.10 for e in errs), "within_25": sum(e <= 0.25 for e in errs)}
