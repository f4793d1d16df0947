"""Predict measured points with the calibrated emulator and score them: the ValidationReport.

Format ``qsgd-validation-report`` version 1 (docs/formats.md): the topology, the calibration,
one row per collective point (measured and predicted seconds, relative error
``(predicted - measured) / measured``, whether the point was held out of the fit), a summary
over the held-out points, and, when the trace has training steps, the measured iteration
times and the QSGD speedup over fp32 next to the emulator's prediction of the same step.

The predicted training step composes what the harness measured of the CPU work with what the
emulator predicts for the network, in the order DDP runs them with one gradient bucket. For
fp32: ``compute_s`` (forward + backward + optimizer without DDP, all ranks computing at once)
plus a ring allreduce of the gradients. For QSGD (allgather transport, :func:`qsgd.qsgd_hook`):
the CPU work as the measured steps spent it, ``busy_s`` (the steps less the hook's waits on
collectives, slowest rank per segment between collectives: compute, the hook's gathers,
encode, ``p`` decodes and averaging, DDP's copies; the payload trace's view of the codec),
else ``compute_s`` plus ``local_s`` or ``encode_s + p * decode_s``; plus the emulator's
prediction of each of the hook's collectives (:func:`step_collectives`: for the elias codec a
ring allgather of the payload sizes, then one of the ``p`` payloads with the uncompressed small
tensors in front), less any local work measured while one was in flight (``overlaps_s``).
Only the network is predicted: that is what the validation validates.
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

__all__ = ["ValidationReport", "compare", "predict_training", "step_collectives",
           "step_breakdown", "FORMAT", "VERSION"]

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


def step_collectives(point, G: nx.Graph, p: int, *,
                     predictor: str = "simulate") -> list[tuple[str, float]] | None:
    """The emulator's seconds for each collective of one QSGD step, in the hook's order.

    ``[(name, seconds), ...]``: the size all_gather (elias only: packed sizes are known to
    every rank), then the all_gather of every rank's payload with its uncompressed small
    tensors in front (``4 * raw_numel`` bytes). None for a point the hook did not run this
    way (fp32 allreduce, scatter-reduce-allgather) or one without
    ``payload_bytes``/``raw_numel``.
    """
    if point.transport != "allgather" or point.get("payload_bytes") is None \
            or point.get("raw_numel") is None:
        return None
    out = []
    if point.get("codec", "packed") != "packed":
        out.append(("size all_gather", predict(G, "allgather", "ring", 16 * p, predictor)))
    per_rank = point.get("payload_bytes") + 4 * point.get("raw_numel")
    out.append(("payload all_gather", predict(G, "allgather", "ring", p * per_rank, predictor)))
    return out


def predict_training(point, G: nx.Graph, p: int, *, predictor: str = "simulate") -> float | None:
    """Seconds the emulator predicts for one measured training step (see the module doc).

    Returns None when the point lacks what the prediction needs (``compute_s`` etc.).
    """
    compute = point.get("compute_s")
    numel = point.get("numel")
    if compute is None or numel is None:
        return None
    if point.transport == "allreduce":
        return compute + predict(G, "allreduce", "ring", 4 * numel, predictor)
    colls = step_collectives(point, G, p, predictor=predictor)
    if colls is None or point.get("encode_s") is None or point.get("decode_s") is None:
        return None
    busy = point.get("busy_s")
    if busy is None:
        local = point.get("local_s")
        if local is None:
            local = point.get("encode_s") + p * point.get("decode_s")
        busy = compute + local
    overlaps = point.get("overlaps_s")
    if overlaps is None or len(overlaps) != len(colls):
        overlaps = [0.0] * len(colls)
    # a collective in flight during local work only adds what the work did not cover
    return busy + sum(max(0.0, t - o) for (_, t), o in zip(colls, overlaps))


def step_breakdown(row: dict) -> str | None:
    """One line on where a QSGD training row's step went, or None for rows without one.

    The CPU work the real steps spent outside collectives (``busy_s``) and each of the hook's
    collectives as measured inside the steps (last rank's issue to last rank's exit; "n/a"
    where the ranks had no common clock) next to the emulator's figure.
    """
    if row.get("busy_s") is None:
        return None
    parts = [f"CPU work {row['busy_s'] * 1e3:.1f} ms"]
    for c in row.get("collectives") or ():
        m = "n/a" if c["measured_s"] is None else f"{c['measured_s'] * 1e3:.1f}"
        if c.get("overlap_s"):
            m += f" (under {c['overlap_s'] * 1e3:.1f} of CPU work)"
        parts.append(f"{c['name']} {m} vs {c['predicted_s'] * 1e3:.1f} ms")
    return "; ".join(parts)


def _training_rows(trace: MeasuredTrace, G, predictor: str) -> list[dict]:
    p = trace.world_size
    rows, base = [], {}
    for t in trace.training:
        if t.transport == "allreduce" and t.bits == 32:
            base[t.model] = t
    for t in trace.training:
        pred = predict_training(t, G, p, predictor=predictor)
        row = {"model": t.model, "transport": t.transport, "bits": t.bits,
               "measured_s": t.iteration_s, "predicted_s": pred,
               "rel_error": None if pred is None else (pred - t.iteration_s) / t.iteration_s,
               "compute_s": t.get("compute_s"), "bytes_per_step": t.bytes_per_step}
        colls = step_collectives(t, G, p, predictor=predictor)
        if colls is not None:
            row["busy_s"] = t.get("busy_s")
            measured, under = t.get("collectives_s"), t.get("overlaps_s")
            # from a different hook (or version) than the prediction's: nothing to pair
            measured = measured if measured is not None and len(measured) == len(colls) else None
            under = under if under is not None and len(under) == len(colls) else None
            row["collectives"] = [{"name": n, "predicted_s": ps,
                                   "measured_s": None if measured is None else measured[i],
                                   "overlap_s": None if under is None else under[i]}
                                  for i, (n, ps) in enumerate(colls)]
        ref = base.get(t.model)
        if ref is not None and t is not ref:
            ref_pred = predict_training(ref, G, p, predictor=predictor)
            row["measured_speedup"] = ref.iteration_s / t.iteration_s
            if pred is not None and ref_pred is not None:
                row["predicted_speedup"] = ref_pred / pred
                row["speedup_rel_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1
        rows.append(row)
    return rows


def compare(trace: MeasuredTrace, G: nx.Graph | None = None, *, topology: str | None = None,
            calibration: Calibration | None = None, fit_sizes=None, fit_ops=None,
            per_op: bool = False, algorithm: str | None = None, predictor: str = "simulate",
            min_bytes: int = 0) -> ValidationReport:
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
    """
    G, spec = _topology(trace, G, topology)
    if not trace.collectives:
        raise TraceError("collectives: the trace has no collective points to compare")
    ops = sorted({c.op for c in trace.collectives})
    fits: dict = {}
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
    training = _training_rows(trace, graphs[id(train_cal)], predictor) if trace.training else []
    if training:
        errs = [r["speedup_rel_error"] for r in training if r.get("speedup_rel_error") is not None]
        if errs:
            summary["speedup_max_abs_rel_error"] = max(abs(e) for e in errs)
    return ValidationReport(topology=spec, calibration=cal_dict, points=tuple(points),
                            summary=summary, training=tuple(training),
                            environment=dict(trace.environment))
