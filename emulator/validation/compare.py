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

from ..errors import TraceError
from .calibrate import Calibration, calibrate, predict
from .trace import MeasuredTrace, _get, _num, _str
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
        points = _get(d, "points", "")
        if not isinstance(points, list):
            raise TraceError(f"points: {points!r} is not a list")
        for i, p in enumerate(points):
            path = f"points[{i}]"
            if not isinstance(p, dict):
                raise TraceError(f"{path}: not an object")
            _str(_get(p, "op", f"{path}."), f"{path}.op")
            _num(_get(p, "bytes", f"{path}."), f"{path}.bytes", positive=True)
            _num(_get(p, "measured_s", f"{path}."), f"{path}.measured_s", positive=True)
            _num(_get(p, "predicted_s", f"{path}."), f"{path}.predicted_s", positive=True)
            _num(_get(p, "rel_error", f"{path}."), f"{path}.rel_error")
            if not isinstance(p.get("held_out", True), bool):
                raise TraceError(f"{path}.held_out: {p['held_out']!r} is not true/false")
        summary = _get(d, "summary", "")
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
        tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> "ValidationReport":
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f))
        except json.JSONDecodeError as exc:
            raise TraceError(f"{os.fspath(path)}: not JSON: {exc}") from None

    def figure(self):
        """A plotly figure: measured and predicted seconds per size, per op (log-log), and the
        relative error below. Fitted points are open markers."""
        from plotly.subplots import make_subplots
        import plotly.graph_objects as go

        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35],
                            vertical_spacing=0.06)
        colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
        for i, op in enumerate(sorted({p["op"] for p in self.points})):
            pts = sorted((p for p in self.points if p["op"] == op), key=lambda p: p["bytes"])
            c = colors[i % len(colors)]
            x = [p["bytes"] for p in pts]
            fig.add_trace(go.Scatter(x=x, y=[p["measured_s"] for p in pts], name=f"{op} measured",
                                     mode="markers", marker=dict(color=c, size=9, symbol=[
                                         "circle" if p["held_out"] else "circle-open" for p in pts])),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=[p["predicted_s"] for p in pts], name=f"{op} emulator",
                                     mode="lines", line=dict(color=c, dash="dash")), row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=[p["rel_error"] for p in pts], name=f"{op} error",
                                     mode="lines+markers", line=dict(color=c), showlegend=False),
                          row=2, col=1)
        s = self.summary
        med = s.get("median_abs_rel_error")
        title = f"emulator vs measured on {self.topology}"
        if med is not None:
            title += f": held-out median |error| {med:.1%}, max {s['max_abs_rel_error']:.1%}"
        fig.update_layout(title=title, template="plotly_white", height=640)
        fig.update_xaxes(type="log", title_text="message size (bytes, nccl-tests convention)", row=2, col=1)
        fig.update_xaxes(type="log", row=1, col=1)
        fig.update_yaxes(type="log", title_text="time (s)", row=1, col=1)
        fig.update_yaxes(title_text="(pred - meas) / meas", tickformat=".0%", row=2, col=1)
        return fig

    def write_html(self, path) -> None:
        """Write the figure as a self-contained HTML file (plotly.js inlined, works offline)."""
        self.figure().write_html(os.fspath(path), include_plotlyjs=True, full_html=True)


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
    # Training steps are predicted on the links fitted to allreduce (what fp32 DDP runs).
    train_cal = fits.get("allreduce", first)
    training = training_rows(trace, graphs[id(train_cal)], predictor) if trace.training else []
    if training:
        errs = [r["speedup_rel_error"] for r in training if r.get("speedup_rel_error") is not None]
        if errs:
            summary["speedup_max_abs_rel_error"] = max(abs(e) for e in errs)
    return ValidationReport(topology=spec, calibration=cal_dict, points=tuple(points),
                            summary=summary, training=tuple(training),
                            environment=dict(trace.environment))
