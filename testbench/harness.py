"""Time real collectives and real QSGD training steps on the current process group.

Run on every rank (inside ``torchrun``, a SLURM job, ``--spawn N`` local ranks, or one rank
per namespace of :mod:`.testbed`); rank 0 writes a :class:`MeasuredTrace`:

- a size sweep of allreduce and allgather as nccl-tests does it (``-b/-e/-f``: sizes from
  ``min_bytes`` to ``max_bytes`` by ``factor``; ``warmup`` untimed runs, then ``iters``
  timed repetitions, each started after a barrier). A repetition's time is the slowest
  rank's (the collective is done when the last rank is), and the point is the median.
- real DDP training steps of a communication-bound model (a wide MLP) with fp32 allreduce
  and with :func:`qsgd.qsgd_hook`, median seconds per step, plus what the emulator needs to
  predict the same step: the compute time measured with all ranks computing at once (as they
  do in training, so CPU contention is the same), and the QSGD payload size and encode/decode
  seconds of the model's real gradients.

Gradients go in one DDP bucket (``bucket_cap_mb`` above the model size) so that the step is
compute, then communication, with no overlap to model; the prediction in :mod:`.compare`
composes the same three terms.
"""
from __future__ import annotations

import datetime
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass

from emulator.validation import CollectivePoint, MeasuredTrace, TrainingPoint

from .errors import ConfigError

__all__ = ["HarnessConfig", "sizes", "run", "sweep_collective", "time_training"]

SWEEP_OPS = ("allreduce", "allgather")


@dataclass(frozen=True)
class HarnessConfig:
    """What to measure.

    Parameters
    ----------
    ops : tuple of str
        Collectives to sweep, from ``SWEEP_OPS``.
    min_bytes, max_bytes : int
        Sweep range, bytes (per rank for allreduce, total for allgather, as nccl-tests).
    factor : int
        Size multiplier between points (>= 2).
    warmup, iters : int
        Untimed and timed repetitions per size.
    train_bits : tuple of int
        QSGD bit widths to time besides fp32 (empty: no training steps).
    train_transport : str
        QSGD transport of the hook: ``"allgather"`` or ``"scatter_reduce_allgather"``.
    width, depth : int
        Wide MLP: ``depth`` hidden layers of ``width`` units (parameters ~ depth * width**2).
    batch_size : int
        Samples per rank per step.
    train_warmup, train_steps : int
        Untimed and timed training steps per transport.
    timeout_s : float
        Process-group timeout, seconds: a dead peer fails a collective instead of hanging.
    """

    ops: tuple = SWEEP_OPS
    min_bytes: int = 1 << 20
    max_bytes: int = 16 << 20
    factor: int = 2
    warmup: int = 2
    iters: int = 5
    train_bits: tuple = (4,)
    train_transport: str = "allgather"
    width: int = 1024
    depth: int = 3
    batch_size: int = 16
    train_warmup: int = 2
    train_steps: int = 5
    bucket_size: int = 512
    seed: int = 0
    timeout_s: float = 120.0
    topology: str | None = None

    def __post_init__(self):
        for op in self.ops:
            if op not in SWEEP_OPS:
                raise ConfigError(f"ops: {op!r} not one of {', '.join(SWEEP_OPS)}")
        for name in ("min_bytes", "max_bytes", "iters", "width", "depth", "batch_size",
                     "train_steps", "bucket_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} {v!r} must be a positive integer")
        for name in ("warmup", "train_warmup"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} {v!r} must be an integer >= 0")
        if self.max_bytes < self.min_bytes:
            raise ConfigError(f"max_bytes {self.max_bytes} is below min_bytes {self.min_bytes}")
        if not isinstance(self.factor, int) or self.factor < 2:
            raise ConfigError(f"factor {self.factor!r} must be an integer >= 2")
        for b in self.train_bits:
            if not isinstance(b, int) or not 2 <= b <= 16:
                raise ConfigError(f"train_bits: {b!r} must be an integer in 2..16")
        if self.train_transport not in ("allgather", "scatter_reduce_allgather"):
            raise ConfigError(f"train_transport {self.train_transport!r} not one of allgather, "
                              "scatter_reduce_allgather")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s {self.timeout_s!r} must be > 0 seconds")


def sizes(min_bytes: int, max_bytes: int, factor: int, *, align: int = 4) -> list[int]:
    """nccl-tests' size sequence: min, min*f, ... <= max, each rounded down to ``align`` bytes."""
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(max(align, n - n % align))
        n *= factor
    return out


def _group_max(values, dist):
    import torch
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def sweep_collective(op: str, nbytes: int, warmup: int, iters: int) -> CollectivePoint:
    """Time one collective of ``nbytes`` (nccl-tests convention) on the default group."""
    import torch
    import torch.distributed as dist

    p = dist.get_world_size()
    if op == "allreduce":
        count = nbytes // 4
        buf = torch.ones(count, dtype=torch.float32)

        def once():
            dist.all_reduce(buf)
    elif op == "allgather":
        count = max(1, nbytes // 4 // p)      # elements per rank; nbytes is the gathered total
        nbytes = count * 4 * p
        src = torch.ones(count, dtype=torch.float32)
        out = torch.empty(count * p, dtype=torch.float32)
        # Into one flat tensor, as nccl-tests (and the QSGD hook's payload exchange) do: the
        # list form adds a copy of every chunk, CPU time that is not network.
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def once():
            gather(out, src)
    else:
        raise ConfigError(f"op {op!r} not one of {', '.join(SWEEP_OPS)}")
    for _ in range(warmup):
        once()
    local = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        once()
        local.append(time.perf_counter() - t0)
    samples = _group_max(local, dist)
    return CollectivePoint.make(op, nbytes, statistics.median(samples), p, count=count,
                                dtype="float32", samples_s=tuple(samples), algorithm="ring")


def build_mlp(width: int, depth: int, in_features: int = 256, classes: int = 10, seed: int = 0):
    """A wide MLP: few FLOPs per parameter, so its steps are bound by the gradient exchange."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers, d = [], in_features
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, classes))
    return nn.Sequential(*layers)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _timed_steps(step, warmup, steps, dist, waits=None):
    """Per-step seconds: ``(wall, busy, overlaps, collectives)``; wall of the slowest rank.

    ``waits()``, called after each step, returns that step's collectives as ``(issued, wait
    start, wait end)`` ``time.perf_counter()`` triples (the QSGD hook's ``waits``). The waits
    cut the step into local-work segments (compute, codec, copies: what the network does not
    decide); each collective waits for the slowest rank's segment before it, so ``busy`` is
    the sum over segments of the max over ranks (max over ranks of the sum when ranks cut
    their steps differently). ``overlaps`` per step and collective: the local work done
    while it was in flight (wait start - issued), the least over ranks. None without
    ``waits``.

    ``collectives`` lists, per step, each collective's seconds from the last rank's issue to
    the last rank's exit: what the network took, to set next to the emulator's figure. It
    needs one clock for all ranks (``time.perf_counter`` is CLOCK_MONOTONIC, shared by the
    namespaces of one kernel: same ``boot_id``); None otherwise.
    """
    for _ in range(warmup):
        step()
    wall, segs, raw = [], [], []
    dist.barrier()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        wall.append(t1 - t0)
        if waits is not None:
            raw.append(list(waits()))
            edges = [t0, *(t for _, start, end in raw[-1] for t in (start, end)), t1]
            segs.append([edges[i + 1] - edges[i] for i in range(0, len(edges), 2)])
    wall = _group_max(wall, dist)
    if waits is None:
        return wall, None, None, None
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (_boot_id(), segs, raw))
    overlaps, collectives = [], []
    for per_rank in zip(*(r for _, _, r in every)):
        if len({len(w) for w in per_rank}) == 1:
            overlaps.append([min(w - i for i, w, _ in col) for col in zip(*per_rank)])
            collectives.append([max(e for _, _, e in col) - max(i for i, _, _ in col)
                                for col in zip(*per_rank)])
    if len({b for b, _, _ in every}) != 1 or every[0][0] is None:
        collectives = None
    return wall, critical_busy([s for _, s, _ in every]), overlaps, collectives


def critical_busy(segments) -> list[float]:
    """Seconds per step that the slowest ranks keep the others waiting, collectives excluded.

    ``segments[rank][step]`` is that rank's list of local-work seconds between collectives.
    A collective starts when its last rank arrives, so a step's busy time is the sum over
    segments of the max over ranks; ranks that cut a step differently (a different number
    of collectives) fall back to the max over ranks of their sums.
    """
    busy = []
    for per_rank in zip(*segments):
        if len({len(x) for x in per_rank}) == 1:
            busy.append(sum(max(col) for col in zip(*per_rank)))
        else:
            busy.append(max(sum(x) for x in per_rank))
    return busy


def time_training(cfg: HarnessConfig) -> list[TrainingPoint]:
    """Median step seconds of DDP on a wide MLP: fp32 allreduce, then QSGD at each bit width."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import qsgd

    p, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(cfg.seed + rank)
    x = torch.randn(cfg.batch_size, 256, generator=gen)
    y = torch.randint(0, 10, (cfg.batch_size,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    base = build_mlp(cfg.width, cfg.depth, seed=cfg.seed)
    params = list(base.parameters())
    numel = sum(q.numel() for q in params)
    min_numel = 10_000
    big = [q for q in params if q.numel() >= min_numel]
    compressed_numel = sum(q.numel() for q in big)
    raw_numel = numel - compressed_numel
    cap_mb = numel * 4 / 2**20 + 1      # one bucket: compute, then communicate (no overlap)

    # Compute alone, all ranks at once (same CPU contention as in training).
    local_model = build_mlp(cfg.width, cfg.depth, seed=cfg.seed)
    opt = torch.optim.SGD(local_model.parameters(), lr=1e-3)

    def local_step():
        opt.zero_grad(set_to_none=False)
        loss_fn(local_model(x), y).backward()
        opt.step()
    compute_s = statistics.median(_timed_steps(local_step, cfg.train_warmup, cfg.train_steps, dist)[0])
    grads = [q.grad.detach().clone() for q in local_model.parameters() if q.numel() >= min_numel]
    flat = torch.cat([g.reshape(-1) for g in grads])

    points = []
    common = {"numel": numel, "compressed_numel": compressed_numel, "raw_numel": raw_numel,
              "batch_size": cfg.batch_size, "compute_s": compute_s,
              "width": cfg.width, "depth": cfg.depth, "min_numel": min_numel}
    for bits in (32, *cfg.train_bits):
        model = build_mlp(cfg.width, cfg.depth, seed=cfg.seed)
        ddp = DDP(model, bucket_cap_mb=cap_mb)
        extra = dict(common)
        hook_stats = []
        state = None
        if bits == 32:
            transport = "allreduce"
            bytes_per_step = int(2 * (p - 1) / p * numel * 4)    # ring allreduce, per rank
        else:
            transport = cfg.train_transport
            qcfg = qsgd.QSGDConfig.from_bits(bits, bucket_size=cfg.bucket_size)
            state = qsgd.QSGDState(qcfg, transport=transport, min_numel=min_numel, seed=cfg.seed)
            ddp.register_comm_hook(state, qsgd.qsgd_hook)
            enc, dec, payload = _codec_seconds(flat, qcfg, cfg, rank)
            extra.update(payload_bytes=payload, encode_s=enc, decode_s=dec,
                         levels=qcfg.levels, bucket_size=qcfg.bucket_size, codec=qcfg.codec)
            # the hook's allgather carries the raw tensors in front of the payload; the
            # scatter-reduce-allgather transport allreduces them (ring)
            raw_sent = ((p - 1) * raw_numel * 4 if transport == "allgather"
                        else 2 * (p - 1) / p * raw_numel * 4)
            bytes_per_step = int((p - 1) * payload + raw_sent)
        sgd = torch.optim.SGD(ddp.parameters(), lr=1e-3)

        def step():
            sgd.zero_grad(set_to_none=False)
            loss_fn(ddp(x), y).backward()
            sgd.step()

        def waits():
            hook_stats.append(dict(state.last_stats))
            return [(c["issued"], c["issued"], c["done"]) for rec in hook_stats[-1]["timeline"]
                    for c in rec["collectives"]]
        samples, busy, overlaps, coll = _timed_steps(step, cfg.train_warmup, cfg.train_steps,
                                                     dist, waits if state is not None else None)
        if state is not None:
            # What the network does not decide, as the real steps spent it (the payload
            # trace's view): compute, the hook's local work (copies, encode, p decodes,
            # averaging) and DDP's own copies, slowest rank per segment between
            # collectives. The emulator predicts the rest. Re-timing the hook's pipeline
            # stand-alone instead put it 8x too high on 4 ranks sharing 2 cores (344 ms
            # against 39 ms in the steps); the max over ranks of whole steps, 10-15% low.
            extra["busy_s"] = statistics.median(busy)
            if overlaps and len({len(o) for o in overlaps}) == 1:
                # median per collective, in the hook's order: the local work that ran while
                # it was in flight (the small-tensor allreduce under the encode)
                extra["overlaps_s"] = [statistics.median(o) for o in zip(*overlaps)]
            if coll and len({len(c) for c in coll}) == 1:
                # median per collective, in the hook's order (diagnostics: the prediction
                # does not use them)
                extra["collectives_s"] = [statistics.median(c) for c in zip(*coll)]
            # the hook's own timings: each rank's median step, then the slowest rank
            med = {f"hook_{k}": statistics.median(h[k] for h in hook_stats)
                   for k in ("encode_s", "decode_s", "wait_s")}
            med["local_s"] = statistics.median(h["encode_s"] + h["decode_s"] for h in hook_stats)
            extra.update(zip(med, _group_max(list(med.values()), dist)))
        points.append(TrainingPoint(model=f"mlp{cfg.depth}x{cfg.width}", transport=transport,
                                    bits=bits, iteration_s=statistics.median(samples),
                                    samples_s=tuple(samples), bytes_per_step=bytes_per_step,
                                    extra=extra))
        del ddp, model
    return points


def _codec_seconds(flat, qcfg, cfg, rank):
    """Stand-alone codec seconds on this rank's gradient: ``(encode_s, decode_s, payload_bytes)``.

    Medians of one encode and one decode (no communication, all ranks at once); reference
    figures next to the hook's own in-step timings, which the prediction uses.
    """
    import qsgd

    payload = qsgd.encode(flat, qcfg, cfg.seed, rank=rank)
    qsgd.decode(payload)
    enc, dec = [], []
    for i in range(max(5, cfg.train_steps)):
        t0 = time.perf_counter()
        payload = qsgd.encode(flat, qcfg, cfg.seed, rank=rank, step=i)
        t1 = time.perf_counter()
        qsgd.decode(payload)
        enc.append(t1 - t0)
        dec.append(time.perf_counter() - t1)
    return statistics.median(enc), statistics.median(dec), int(payload.numel())


def environment(cfg: HarnessConfig) -> dict:
    import torch
    import torch.distributed as dist

    p = dist.get_world_size()
    host = os.environ.get("QSGD_TESTBED_HOST") or socket.gethostname()
    hosts = [None] * p
    dist.all_gather_object(hosts, host)
    device = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    device = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    env = {"backend": dist.get_backend(), "world_size": p, "hosts": hosts, "devices": ["cpu"] * p,
           "device_name": device, "cpus": os.cpu_count(), "torch_version": torch.__version__,
           "python_version": platform.python_version(), "source": "harness",
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if cfg.topology:
        env["topology"] = cfg.topology
    return env


def _one_thread_per_rank():
    """One core's worth per rank (several ranks share a machine's cores here): torch and numba
    (the QSGD codec) each default to a thread per core, and oversubscribed threads made the
    codec 4-5x slower on 2 busy cores."""
    import torch

    torch.set_num_threads(1)
    try:
        import numba
        numba.set_num_threads(1)
    except (ImportError, ValueError):
        pass


def run(cfg: HarnessConfig, *, init: bool = True, log=None) -> MeasuredTrace | None:
    """Measure on the default process group; returns the trace on rank 0, None elsewhere.

    With ``init`` the group is initialised from the ``env://`` variables (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) on gloo, or NCCL when CUDA is available, and destroyed at the end.
    """
    import torch
    import torch.distributed as dist

    if init:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.timeout_s))
    try:
        _one_thread_per_rank()
        env = environment(cfg)
        points = []
        for op in cfg.ops:
            for n in sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor):
                pt = sweep_collective(op, n, cfg.warmup, cfg.iters)
                points.append(pt)
                if log and dist.get_rank() == 0:
                    log(f"{op:10s} {pt.bytes:12d} B  {pt.time_s * 1e3:9.3f} ms  "
                        f"busbw {pt.busbw / 1e6:8.2f} MB/s")
        training = time_training(cfg) if cfg.train_bits else []
        if log and dist.get_rank() == 0:
            for t in training:
                log(f"train {t.transport:24s} bits {t.bits:2d}  {t.iteration_s * 1e3:9.2f} ms/step")
        dist.barrier()
        if dist.get_rank() != 0:
            return None
        return MeasuredTrace(environment=env, collectives=tuple(points), training=tuple(training))
    finally:
        if init and dist.is_initialized():
            dist.destroy_process_group()
