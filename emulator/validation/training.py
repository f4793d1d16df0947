"""The emulator's prediction of a measured training step (the training rows of a ValidationReport).

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

import networkx as nx

from .calibrate import predict
from .trace import MeasuredTrace

__all__ = ["predict_training", "step_collectives", "step_breakdown", "training_rows"]


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


def training_rows(trace: MeasuredTrace, G, predictor: str) -> list[dict]:
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
