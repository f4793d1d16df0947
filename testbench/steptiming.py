"""Time real DDP training steps bucket by bucket, and turn them into what the replay reads.

Every transport runs through a DDP communication hook that records, per bucket and step, when
DDP handed the bucket over (``ready``), when its first collective was issued, when its last one
was done and when the bucket's future was complete (decode included), all on the
``time.perf_counter`` clock: :func:`qsgd.qsgd_hook` records them itself
(``QSGDState.last_stats["timeline"]``); fp32 and fp16 go through :func:`dense_hook`, DDP's
allreduce and ``fp16_compress_hook`` with the same records. A :func:`noop_hook` run (DDP's
copies, no communication) times the compute alone, with every rank computing at once, so that
CPU contention is as in training.

:func:`payload_trace` builds, from those runs, the :class:`qsgd.PayloadTrace` that
:func:`emulator.replay` predicts the steps from: the compute run's forward, backward and
optimizer seconds and each bucket's ready time, and the QSGD run's in-step work of the hook's
stages (``encode_s`` the hook's own, ``decode_s`` the callbacks' per payload: their CPU seconds
at the training thread's speed, see :func:`payload_trace`).
Per step each figure is the slowest rank's (a collective waits for its last rank), then the
median over steps.

(No ``from __future__ import annotations`` here: DDP checks the hooks' return annotation object.)
"""
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import qsgd

__all__ = ["DenseHookState", "dense_hook", "noop_hook", "NoopState", "run_steps", "StepRecords",
           "bucket_summary", "payload_trace", "DENSE"]

#: dense transport -> (wire-plan transport, dtype on the wire)
DENSE = {"fp32": ("fp32", torch.float32), "fp16": ("fp16", torch.float16)}


class NoopState:
    """A hook state that communicates nothing: the compute run's bucket ready times and layout."""

    def __init__(self):
        self.timeline: list[dict] = []
        self.layout: dict[int, tuple] = {}

    def take(self) -> list[dict]:
        out, self.timeline = self.timeline, []
        return out


def noop_hook(state: NoopState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Returns the bucket unreduced (no communication); records when DDP handed it over."""
    t = time.perf_counter()
    state.timeline.append({"bucket": bucket.index(), "called": t, "collectives": [], "stages": {},
                           "done": t})
    state.layout[bucket.index()] = tuple(id(p) for p in bucket.parameters())
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


class DenseHookState:
    """State of :func:`dense_hook`: an fp32 or fp16 allreduce of every bucket, timed.

    Parameters
    ----------
    kind : {"fp32", "fp16"}
        DDP's default allreduce, or its ``fp16_compress_hook`` (cast, allreduce, cast back).
    process_group : ProcessGroup, optional
    """

    def __init__(self, kind: str, process_group=None):
        if kind not in DENSE:
            raise ValueError(f"kind: expected one of {sorted(DENSE)}, got {kind!r}")
        self.kind, self.process_group = kind, process_group
        self.timeline: list[dict] = []

    def take(self) -> list[dict]:
        out, self.timeline = self.timeline, []
        return out


def dense_hook(state: DenseHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's allreduce (``fp32``) or ``fp16_compress_hook`` (``fp16``), recording a timeline.

    The collective is the bucket's :func:`qsgd.wire_plan` of that transport (one allreduce).
    """
    t0 = time.perf_counter()
    buf = bucket.buffer()
    p = dist.get_world_size(state.process_group)
    rec = {"bucket": bucket.index(), "called": t0, "stages": {}, "collectives": []}
    state.timeline.append(rec)
    wire, dtype = DENSE[state.kind]
    tensor = buf.to(dtype).div_(p) if dtype != buf.dtype else buf.div_(p)
    t1 = time.perf_counter()
    rec["stages"]["encode"] = [t0, t1]
    coll = {"name": "allreduce", "op": "allreduce", "dtype": str(dtype).replace("torch.", ""),
            "nbytes": tensor.numel() * tensor.element_size(), "issued": t1, "done": None}
    rec["collectives"].append(coll)
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)

    def finish(fut):
        t2 = time.perf_counter()
        coll["done"] = t2
        out = fut.value()[0]
        if out is not buf:
            buf.copy_(out)
        t3 = time.perf_counter()
        rec["stages"]["decode"] = [t2, t3]
        rec["done"] = t3
        return buf
    rec["returned"] = time.perf_counter()
    return work.get_future().then(finish)


@dataclass
class StepRecords:
    """One rank's timed steps: per step ``wall`` (s), ``forward_end``/``backward_end`` (s from
    the step's start) and the hook's per-bucket records, relative to the step's start."""

    wall: list = field(default_factory=list)
    forward_end: list = field(default_factory=list)
    backward_end: list = field(default_factory=list)
    buckets: list = field(default_factory=list)
    cpu: list = field(default_factory=list)     # CPU seconds of the training thread per step
    share: float | None = None                  # its CPU seconds per wall second (slowest rank)


def _relative(rec: dict, t0: float) -> dict:
    """One bucket's record as seconds from the step's start."""
    colls = rec.get("collectives") or []
    stages = rec.get("stages") or {}
    hook_stages = sum(e - s for n, (s, e) in stages.items() if n == "encode")
    callback_stages = sum(e - s for n, (s, e) in stages.items() if n != "encode")
    cpus = rec.get("stages_cpu") or {}
    out = {"bucket": rec["bucket"], "ready": rec["called"] - t0, "done": rec["done"] - t0,
           "encode_s": hook_stages, "decode_s": callback_stages,
           "encode_cpu": sum(c for n, c in cpus.items() if n == "encode"),
           "decode_cpu": sum(c for n, c in cpus.items() if n != "encode")}
    if colls:
        out["issued"] = colls[0]["issued"] - t0
        out["comm_done"] = max(c["done"] for c in colls) - t0
    else:
        out["issued"] = out["comm_done"] = out["ready"]
    return out


def run_steps(step, hook_records, warmup: int, steps: int) -> StepRecords:
    """Run ``warmup`` untimed and ``steps`` timed steps; ``step()`` returns ``(t_forward_end,
    t_backward_end)`` and ``hook_records()`` the finished step's bucket records."""
    out = StepRecords()
    for _ in range(warmup):
        step()
        hook_records()
    dist.barrier()
    for _ in range(steps):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        t_fwd, t_bwd = step()
        t1 = time.perf_counter()
        out.cpu.append(time.thread_time() - c0)
        out.wall.append(t1 - t0)
        out.forward_end.append(t_fwd - t0)
        out.backward_end.append(t_bwd - t0)
        out.buckets.append(sorted((_relative(r, t0) for r in hook_records()),
                                  key=lambda r: r["bucket"]))
    return out


def _slowest(per_rank: list[StepRecords]) -> StepRecords:
    """Per step, the slowest rank's figure of each quantity (a collective waits for its last
    rank); steps whose bucket counts differ across ranks are dropped."""
    out = StepRecords()
    out.share = min(sum(r.cpu) / sum(r.wall) for r in per_rank)
    for s in range(min(len(r.wall) for r in per_rank)):
        out.wall.append(max(r.wall[s] for r in per_rank))
        out.forward_end.append(max(r.forward_end[s] for r in per_rank))
        out.backward_end.append(max(r.backward_end[s] for r in per_rank))
        rows = [r.buckets[s] for r in per_rank]
        if len({len(b) for b in rows}) != 1:
            continue
        out.buckets.append([{k: col[0][k] if k == "bucket" else max(c[k] for c in col)
                             for k in col[0]} for col in zip(*rows)])
    return out


def gather_slowest(rec: StepRecords) -> StepRecords:
    """All ranks' records (every rank calls it), reduced by :func:`_slowest`."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, rec)
    return _slowest(every)


def bucket_summary(rec: StepRecords) -> list[dict]:
    """Per bucket, the median over steps of each timeline figure (seconds from step start)."""
    if not rec.buckets:
        return []
    out = []
    for col in zip(*rec.buckets):
        keys = [k for k in col[0] if k != "bucket"]
        out.append({"bucket": col[0]["bucket"],
                    **{k: statistics.median(c[k] for c in col) for k in keys}})
    return out


def payload_trace(model: torch.nn.Module, names: dict, compute: StepRecords, layout: dict,
                  qsgd_buckets: list[dict] | None, payload_sizes: dict | None, cfg: qsgd.QSGDConfig,
                  *, min_numel: int, batch_size: int, input_shape: tuple, bucket_cap_bytes: int,
                  seed: int, device_name: str) -> qsgd.PayloadTrace:
    """The one-iteration :class:`qsgd.PayloadTrace` of these runs (medians over steps).

    Parameters
    ----------
    names : dict
        ``id(parameter) -> name``.
    compute : StepRecords
        The no-op hook's run (slowest rank per step).
    layout : dict
        Bucket index -> parameter ids in bucket order (DDP's rebuilt buckets).
    qsgd_buckets : list of dict, optional
        :func:`bucket_summary` of the QSGD run: per bucket ``encode_cpu`` (CPU seconds of the
        hook's own stages) and ``decode_cpu`` (of its callbacks', all payloads); none: no codec
        seconds. They become seconds of the training thread's speed in the compute run
        (``compute.share`` CPU seconds per second: its ranks share the cores), the speed the
        replay runs every local stage at, on the one compute resource each rank has.
    payload_sizes : dict, optional
        Bucket index -> bytes of this rank's payload (``QSGDState.last_stats``); none: the
        packed codec's exact size.
    """
    by_id = {id(p): p for p in model.parameters()}
    fwd = statistics.median(compute.forward_end)
    bwd = statistics.median(b - f for b, f in zip(compute.backward_end, compute.forward_end))
    opt = statistics.median(w - b for w, b in zip(compute.wall, compute.backward_end))
    ready = bucket_summary(compute)
    p = dist.get_world_size()
    tbuckets, timings = [], []
    for k in sorted(layout):
        params = [by_id[i] for i in layout[k]]
        comp = sum(q.numel() for q in params if q.numel() >= min_numel)
        raw = sum(q.numel() for q in params) - comp
        tbuckets.append({"index": k, "numel": comp + raw, "params": [names[i] for i in layout[k]],
                         "compressed_numel": comp, "raw_numel": raw})
        payload = 0
        if comp:
            payload = (payload_sizes or {}).get(k) or qsgd.payload_nbytes(comp, cfg)
        enc = dec = 0.0
        if qsgd_buckets and comp:
            q = next(b for b in qsgd_buckets if b["bucket"] == k)
            speed = compute.share or 1.0
            # the trace's decode_s is one payload's
            enc, dec = q["encode_cpu"] / speed, q["decode_cpu"] / speed / p
        r = next(b for b in ready if b["bucket"] == k)
        timings.append({"index": k, "ready_s": min(max(0.0, r["ready"] - fwd), bwd),
                        "payload_bytes": payload, "raw_bytes": 4 * raw, "encode_s": enc,
                        "decode_s": dec})
    return qsgd.PayloadTrace.from_dict({
        "format": "qsgd-payload-trace", "version": 1, "model": "harness-mlp",
        "parameters": sum(b["numel"] for b in tbuckets), "device": "cpu", "device_name": device_name,
        "torch_version": torch.__version__, "batch_size": batch_size, "input_shape": list(input_shape),
        "config": cfg.to_dict(), "min_numel": min_numel, "bucket_cap_bytes": bucket_cap_bytes,
        "first_bucket_bytes": bucket_cap_bytes, "seed": seed, "bucket_assignment": "ready",
        "buckets": tbuckets,
        "iterations": [{"index": 0, "forward_s": fwd, "backward_s": bwd, "optimizer_s": opt,
                        "buckets": timings}]})
