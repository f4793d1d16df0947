"""Predict measured points with the calibrated emulator and score them: the ValidationReport.

Format ``qsgd-validation-report`` version 1 (docs/formats.md): the topology, the calibration,
one row per collective point (measured and predicted seconds, relative error
``(predicted - measured) / measured``, whether the point was held out of the fit), a summary
over the held-out points, and, when the trace has training steps, the measured iteration
times and the QSGD speedup over fp32 next to the emulator's prediction of the same step.
Training steps are predicted by :mod:`emulator.validation.training`.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field

import networkx as nx

from .._checks import required, number, save_json, text
from ..errors import TraceError
from .calibrate import Calibration, calibrate, predict
from .trace import MeasuredTrace
from .training import training_rows

__all__ = ["ValidationReport", "compare", "FORMAT", "VERSION"]

FORMAT = "qsgd-validation-report"
VERSION = 1


def _summary(errors: list[float]) -> dict:
    if not errors:
        return {"points": 0, "median_abs_rel_error": None, "max_abs_rel_error": None}
    a = [abs(e) for e in errors]
    return {"points": len(a), "median_abs_rel_error": statistics.median(a),
            "max_abs_rel_error": max(a)}


@dataclass(frozen=True)
class ValidationReport:
    """Measured against predicted, per point, with the calibration that produced it."""

    topology: str
    calibration: dict
    points: tuple
    summary: dict
    training: tuple = ()
    environment: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict, compare=False)

    def held_out(self, op: str | None = None) -> list[dict]:
        return [p for p in self.points if p["held_out"] and (op is None or p["op"] == op)]

    def to_dict(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, "topology": self.topology,
             "calibration": dict(self.calibration), "points": [dict(p) for p in self.points],
             "summary": dict(self.summary), "training": [dict(t) for t in self.training],
             "environment": dict(self.environment)}
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d) -> "ValidationReport":
        if not isinstance(d, dict):
            raise TraceError("validation report: top level is not an object")
        if d.get("format") != FORMAT:
            raise TraceError(f"format: {d.get('format')!r} is not {FORMAT!r}")
        if d.get("version") != VERSION:
            raise TraceError(f"version: {d.get('version')!r} is not supported (expected {VERSION})")
        points = required(d, "points", "")
        if not isinstance(points, list):
            raise TraceError(f"points: {points!r} is not a list")
        for i, p in enumerate(points):
            path = f"points[{i}]"
            if not isinstance(p, dict):
                raise TraceError(f"{path}: not an object")
            text(required(p, "op", f"{path}."), f"{path}.op")
            number(required(p, "bytes", f"{path}."), f"{path}.bytes", positive=True)
            number(required(p, "measured_s", f"{path}."), f"{path}.measured_s", positive=True)
            number(required(p, "predicted_s", f"{path}."), f"{path}.predicted_s", positive=True)
            number(required(p, "rel_error", f"{path}."), f"{path}.rel_error")
            if not isinstance(p.get("held_out", True), bool):
                raise TraceError(f"{path}.held_out: {p['held_out']!r} is not true/false")
        summary = required(d, "summary", "")
        if not isinstance(summary, dict):
            raise TraceError(f"summary: {summary!r} is not an object")
        cal = d.get("calibration", {})
        if not isinstance(cal, dict):
            raise TraceError(f"calibration: {cal!r} is not an object")
        known = ("format", "version", "topology", "calibration", "points", "summary", "training",
                 "environment")
        return cls(topology=str(d.get("topology", "")), calibration=cal, points=tuple(points),
                   summary=summary, training=tuple(d.get("training", [])),
                   environment=dict(d.get("environment", {})),
                   extra={k: v for k, v in d.items() if k not in known})

    def save(self, path) -> None:
        """Write JSON (atomically: a reader never sees half a file)."""
        save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path) -> "ValidationReport":
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f))
        except json.JSONDecodeError as exc:
            raise TraceError(f"{os.fspath(path)}: not JSON: {exc}") from None

    def figure(self):
        """Measured and predicted seconds per size (:func:`emulator.figures.validation_figure`)."""
        from emulator.figures import validation_figure

        return validation_figure(self.points, self.topology, self.summary)

    def write_html(self, path) -> None:
        """Write the figure, then each training row's measured and predicted bucket timelines
        side by side (:func:`emulator.figures.timeline_comparison`), as one self-contained
        HTML file (plotly.js inlined once, works offline); missing folders are made."""
        from ..figures import timeline_comparison

        figs = [self.figure()] + [timeline_comparison(r) for r in self.training if r.get("timeline")]
        body = "\n".join(f.to_html(full_html=False, include_plotlyjs=i == 0)
                         for i, f in enumerate(figs))
        os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
        with open(os.fspath(path), "w", encoding="utf-8") as fh:
            fh.write(f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>validation: "
                     f"{self.topology}</title></head><body>\n{body}\n</body></html>\n")


def _topology(trace: MeasuredTrace, G, topology: str | None):
    import topologies

    spec = topology or trace.environment.get("topology")
    if G is None:
        if not spec:
            raise TraceError("environment.topology: missing; pass the topology the trace ran on "
                             "(e.g. --topology switch:4,bw=1Gbit)")
        G = topologies.from_spec(spec)
    return G, (spec or G.graph.get("name") or "topology")


def compare(trace: MeasuredTrace, G: nx.Graph | None = None, *, topology: str | None = None,
            calibration: Calibration | None = None, fit_sizes=None, fit_ops=None,
            per_op: bool = False, algorithm: str | None = None, predictor: str = "simulate",
            min_bytes: int = 0, uncalibrated: bool = False) -> ValidationReport:
    """Calibrate (unless given), predict every point, and score the held-out ones.

    Parameters
    ----------
    trace : MeasuredTrace
    G : nx.Graph, optional
        Topology the trace ran on; default ``topologies.from_spec(topology or
        trace.environment["topology"])``.
    calibration : Calibration, optional
        Use these link parameters instead of fitting.
    fit_sizes, fit_ops : optional
        Passed to :func:`calibrate` (default: smallest and largest size of every op).
    per_op : bool
        Fit each op separately (its own link parameters); default one fit for all ops, so a
        single set of links has to explain every collective.
    min_bytes : int
        Score only held-out points of at least this many bytes (the summary; every point is
        still listed).
    uncalibrated : bool
        Predict with the topology's own figures (a preset's datasheet values), fitting nothing:
        every point is held out. Excludes ``calibration``.

    Examples
    --------
    >>> from emulator.validation import import_nccl_tests
    >>> t = import_nccl_tests("tests/emulator/data/nccl_tests/b200_1node_allreduce.log")
    >>> r = compare(t, uncalibrated=True, min_bytes=1 << 30)
    >>> r.topology, r.summary["points"], r.summary["median_abs_rel_error"] < 0.1
    ('hgx_b200', 5, True)
    """
    G, spec = _topology(trace, G, topology)
    if not trace.collectives:
        raise TraceError("collectives: the trace has no collective points to compare")
    ops = sorted({c.op for c in trace.collectives})
    fits: dict = {}
    if uncalibrated:
        if calibration is not None:
            raise TraceError("uncalibrated=True and a calibration exclude each other")
        calibration = Calibration(links={}, fitted_on=(), predictor=predictor,
                                  extra={"uncalibrated": True})
    if calibration is not None:
        fits = {op: calibration for op in ops}
    elif per_op:
        for op in ops:
            fits[op] = calibrate(trace, G, fit_sizes=fit_sizes, ops=(op,), algorithm=algorithm,
                                 predictor=predictor)
    else:
        cal = calibrate(trace, G, fit_sizes=fit_sizes, ops=fit_ops, algorithm=algorithm,
                        predictor=predictor)
        fits = {op: cal for op in ops}
    graphs = {id(c): c.apply(G) for c in fits.values()}
    points, held = [], []
    for c in trace.points():
        cal = fits[c.op]
        H = graphs[id(cal)]
        pred = predict(H, c.op, algorithm or c.algorithm, c.bytes, predictor)
        err = (pred - c.time_s) / c.time_s
        is_held = (c.op, c.bytes) not in set(cal.fitted_on)
        points.append({"op": c.op, "bytes": c.bytes, "measured_s": c.time_s, "predicted_s": pred,
                       "rel_error": err, "held_out": is_held, "algorithm": algorithm or c.algorithm})
        if is_held and c.bytes >= min_bytes:
            held.append(err)
    summary = _summary(held)
    summary["min_bytes"] = min_bytes
    summary["per_op"] = {op: _summary([p["rel_error"] for p in points if p["op"] == op
                                       and p["held_out"] and p["bytes"] >= min_bytes]) for op in ops}
    first = next(iter(fits.values()))
    cal_dict = first.to_dict() if not per_op or calibration is not None else {
        "per_op": {op: fits[op].to_dict() for op in ops}}
    # Training steps are predicted on the links fitted to allreduce (what fp32 DDP runs), and
    # where the trace has collectives measured while the ranks computed, on links fitted to
    # those for the parts of a step that overlap compute.
    train_cal = fits.get("allreduce", first)
    loaded = None
    if trace.loaded and not uncalibrated:
        lcal = calibrate(MeasuredTrace(environment=dict(trace.environment),
                                       collectives=trace.loaded), G, algorithm=algorithm,
                         predictor=predictor)
        loaded = lcal.apply(G)
        cal_dict = {**cal_dict, "loaded": lcal.to_dict()}
    # and at the pace the harness measured the compute to keep beside a running collective
    paces = [t.get("compute_pace") for t in trace.training if t.get("compute_pace")]
    pace = statistics.median(paces) if paces and not uncalibrated else 1.0
    if pace != 1.0:
        cal_dict = {**cal_dict, "compute_pace": pace}
    training = training_rows(trace, graphs[id(train_cal)], predictor, loaded=loaded,
                             compute_pace=pace) if trace.training else []
    if training:
        errs = [r["speedup_rel_error"] for r in training if r.get("speedup_rel_error") is not None]
        if errs:
            summary["speedup_max_abs_rel_error"] = max(abs(e) for e in errs)
    return ValidationReport(topology=spec, calibration=cal_dict, points=tuple(points),
                            summary=summary, training=tuple(training),
                            environment=dict(trace.environment))
