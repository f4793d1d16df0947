"""The emulator's prediction of measured training steps: the training rows of a ValidationReport.

Each measured step is predicted by :func:`emulator.replay`, the study's own path, on the
calibrated topology: the harness stores with every training point the
:class:`qsgd.PayloadTrace` of its run (the compute measured alone, each bucket's ready time and
the hook's in-step stage seconds) and the replay transport it ran (``fp32``, ``fp16``,
``qsgd_allgather``, ...). What each bucket sends is its :func:`qsgd.wire_plan`. So only the
network and the overlap are predicted: that is what the validation validates. The collectives
are simulated whatever ``predictor`` the collective points use.

Per row: measured and predicted step seconds; the exposed communication (step minus the
compute measured alone; predicted: ``Prediction.exposed_comm_s``); the QSGD speedup over fp32;
and, per bucket, the measured and predicted timeline (seconds from the step's start: ``ready``,
``issued``, ``comm_done``, ``done``) for :func:`emulator.figures.timeline_comparison`.
"""
from __future__ import annotations

import networkx as nx

from ..replaying import replay
from .trace import MeasuredTrace

__all__ = ["predict_training", "replay_transport", "step_breakdown", "stream_busy", "training_rows"]

#: (TrainingPoint transport, bits) -> replay transport, for points that do not name theirs
_DENSE = {32: "fp32", 16: "fp16"}


def replay_transport(point) -> str:
    """The :data:`emulator.TRANSPORTS` key a training point ran."""
    named = point.get("replay_transport")
    if named:
        return named
    if point.transport == "allreduce":
        return _DENSE.get(point.bits, "fp32")
    return f"qsgd_{point.transport}"


def predict_training(point, G: nx.Graph, p: int, *, predictor: str = "simulate",
                     loaded: nx.Graph | None = None, compute_pace: float = 1.0):
    """The :class:`emulator.Prediction` of one measured training step, or None without the
    point's ``payload_trace`` (traces from older harnesses: there is no other formula).
    ``loaded``, ``compute_pace``: how compute and collectives slow each other (``replay``)."""
    import qsgd

    data = point.get("payload_trace")
    if data is None:
        return None
    trace = qsgd.PayloadTrace.from_dict(data)
    return replay(trace, G, transport=replay_transport(point), world_size=p, loaded=loaded,
                  compute_pace=compute_pace)


def _predicted_timeline(pred) -> list[dict]:
    return [{"bucket": b.index, "ready": b.ready_s, "issued": b.issued_s, "comm_done": b.comm_end_s,
             "done": b.end_s} for b in pred.buckets]


def _measured_timeline(point) -> list[dict] | None:
    rows = point.get("timeline")
    if not rows:
        return None
    return [{k: r[k] for k in ("bucket", "ready", "issued", "comm_done", "done") if k in r}
            for r in rows]


def stream_busy(buckets: list[dict]) -> float:
    """Seconds the buckets' collectives kept the stream busy: per bucket from when its first
    collective went out (or the one before was done) to when its last was done, summed."""
    busy, free = 0.0, float("-inf")
    for b in buckets:
        start = max(b["issued"], free)
        busy += max(0.0, b["comm_done"] - start)
        free = max(free, b["comm_done"])
    return busy


def step_breakdown(row: dict) -> str | None:
    """One line on where a training row's step went, or None for rows without a prediction.

    The compute measured alone, the exposed communication (step minus compute) measured next
    to the emulator's, the seconds the collectives kept the stream busy (:func:`stream_busy`)
    and when the last bucket was done, measured against predicted.
    """
    if row.get("predicted_s") is None or row.get("compute_s") is None:
        return None
    parts = [f"compute {row['compute_s'] * 1e3:.1f} ms",
             f"exposed communication {row['measured_exposed_s'] * 1e3:.1f} vs "
             f"{row['predicted_exposed_s'] * 1e3:.1f} ms"]
    tl = row.get("timeline") or {}
    m, pr = tl.get("measured"), tl.get("predicted")
    if m and pr and len(m) == len(pr):
        parts.append(f"collectives busy {stream_busy(m) * 1e3:.1f} vs {stream_busy(pr) * 1e3:.1f} ms")
        parts.append(f"{len(m)} buckets, last done at {m[-1]['done'] * 1e3:.1f} vs "
                     f"{pr[-1]['done'] * 1e3:.1f} ms")
    return "; ".join(parts)


def training_rows(trace: MeasuredTrace, G, predictor: str, *, loaded=None,
                  compute_pace: float = 1.0) -> list[dict]:
    """One row per training point: measured against the replay's prediction (see module doc);
    ``loaded`` and ``compute_pace`` as in :func:`predict_training`."""
    p = trace.world_size
    rows, base, preds = [], {}, {}
    for t in trace.training:
        if t.transport == "allreduce" and t.bits == 32:
            base[t.model] = t
    for t in trace.training:
        preds[id(t)] = predict_training(t, G, p, predictor=predictor, loaded=loaded,
                                        compute_pace=compute_pace)
    for t in trace.training:
        pred = preds[id(t)]
        compute = t.get("compute_s")
        row = {"model": t.model, "transport": t.transport, "bits": t.bits,
               "replay_transport": replay_transport(t), "measured_s": t.iteration_s,
               "predicted_s": None if pred is None else pred.iteration_s,
               "rel_error": None if pred is None else (pred.iteration_s - t.iteration_s) / t.iteration_s,
               "compute_s": compute, "bytes_per_step": t.bytes_per_step}
        if pred is not None and compute is not None:
            measured_exposed = t.iteration_s - compute
            row.update(measured_exposed_s=measured_exposed, predicted_exposed_s=pred.exposed_comm_s,
                       predicted_compute_s=pred.compute_s)
            if measured_exposed > 0:
                row["exposed_rel_error"] = (pred.exposed_comm_s - measured_exposed) / measured_exposed
            row["timeline"] = {
                "measured": _measured_timeline(t), "predicted": _predicted_timeline(pred),
                "measured_backward_end": t.get("backward_end_s"),
                "predicted_backward_end": pred.forward_s + pred.backward_s + sum(
                    b.encode_end_s - b.start_s for b in pred.buckets),
                "measured_iteration": t.iteration_s, "predicted_iteration": pred.iteration_s}
        ref = base.get(t.model)
        if ref is not None and t is not ref:
            ref_pred = preds[id(ref)]
            row["measured_speedup"] = ref.iteration_s / t.iteration_s
            if pred is not None and ref_pred is not None:
                row["predicted_speedup"] = ref_pred.iteration_s / pred.iteration_s
                row["speedup_rel_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1
        rows.append(row)
    return rows
