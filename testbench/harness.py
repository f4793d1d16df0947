"""Time real collectives and real QSGD training steps on the current process group.

Run on every rank (inside ``torchrun``, a SLURM job, ``--spawn N`` local ranks, or one rank
per namespace of :mod:`.testbed`); rank 0 writes a :class:`MeasuredTrace`:

- a size sweep of allreduce and allgather as nccl-tests does it (``-b/-e/-f``: sizes from
  ``min_bytes`` to ``max_bytes`` by ``factor``; ``warmup`` untimed runs, then ``iters``
  timed repetitions, each started after a barrier). A repetition's time is the slowest
  rank's (the collective is done when the last rank is), and the point is the median.
- real DDP training steps of a deep MLP whose gradients fill several buckets
  (``bucket_cap_mb``), so that buckets communicate while backward goes on: fp32 allreduce,
  fp16 allreduce and :func:`qsgd.qsgd_hook` at each bit width. Each point has the median
  seconds per step, the measured timeline of every bucket (ready, first collective issued,
  last collective done, done; :mod:`.steptiming`), and the :class:`qsgd.PayloadTrace` that
  :func:`emulator.replay` predicts the same steps from: the compute alone (DDP with a hook
  that communicates nothing, all ranks computing at once, so CPU contention is the same),
  each bucket's ready time, and the hook's own in-step stage seconds.
"""
from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass

import emulator
from emulator.validation import CollectivePoint, MeasuredTrace, TrainingPoint

from .errors import ConfigError
from ._checks import is_int, is_number

__all__ = ["HarnessConfig", "ComputeLoad", "Traffic", "sizes", "run", "sweep_collective", "time_training",
           "build_mlp"]

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
    train_fp16 : bool
        Also time DDP's fp16 allreduce.
    width, depth : int
        Deep MLP: ``depth`` hidden layers of ``width`` units (parameters ~ depth * width**2).
    batch_size : int
        Samples per rank per step.
    bucket_cap_mb : float
        DDP's bucket cap (MiB): a layer of ``width**2`` fp32 elements above it fills a bucket
        of its own.
    train_warmup, train_steps : int
        Untimed and timed training steps per transport (at least 2 untimed: DDP rebuilds its
        buckets in the second step).
    timeout_s : float
        Process-group timeout, seconds: a dead peer fails a collective instead of hanging.
    loaded : bool
        Also sweep every other size while every rank computes (:class:`ComputeLoad`, three
        times ``iters`` repetitions): the
        collectives' times when they overlap backward, which :func:`emulator.replay` uses
        for the parts of a step where the ranks compute; and time the compute-alone steps
        again beside a running collective (:class:`Traffic`): training points then carry
        ``compute_busy_s`` and ``compute_pace`` (alone / beside, at most 1).
    """

    ops: tuple = SWEEP_OPS
    min_bytes: int = 1 << 20
    max_bytes: int = 16 << 20
    factor: int = 2
    warmup: int = 2
    iters: int = 5
    train_bits: tuple = (4,)
    train_transport: str = "allgather"
    train_fp16: bool = True
    width: int = 1024
    depth: int = 6
    batch_size: int = 32
    bucket_cap_mb: float = 4.0
    train_warmup: int = 2
    train_steps: int = 5
    bucket_size: int = 512
    seed: int = 0
    timeout_s: float = 120.0
    topology: str | None = None
    loaded: bool = True

    def __post_init__(self):
        for op in self.ops:
            if op not in SWEEP_OPS:
                raise ConfigError(f"ops: {op!r} not one of {', '.join(SWEEP_OPS)}")
        for name in ("min_bytes", "max_bytes", "iters", "width", "depth", "batch_size",
                     "train_steps", "bucket_size"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ConfigError(f"{name} {v!r} must be a positive integer")
        for name, low in (("warmup", 0), ("train_warmup", 2)):
            v = getattr(self, name)
            if not is_int(v) or v < low:
                raise ConfigError(f"{name} {v!r} must be an integer >= {low}")
        if not is_number(self.bucket_cap_mb) or not self.bucket_cap_mb > 0:
            raise ConfigError(f"bucket_cap_mb {self.bucket_cap_mb!r} must be a positive number of MiB")
        if not isinstance(self.train_fp16, bool):
            raise ConfigError(f"train_fp16 {self.train_fp16!r} must be true or false")
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
        if not isinstance(self.loaded, bool):
            raise ConfigError(f"loaded {self.loaded!r} must be true or false")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s {self.timeout_s!r} must be > 0 seconds")


def sizes(min_bytes: int, max_bytes: int, factor: int, *, align: int = 4) -> list[int]:
    """nccl-tests' size sequence (:func:`emulator.sweep_sizes`), each rounded down to ``align``
    bytes (whole float32 elements)."""
    return [max(align, n - n % align) for n in emulator.sweep_sizes(min_bytes, max_bytes, factor)]


def _group_max(values, dist):
    import torch
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


class _Background:
    """A daemon thread running ``_run`` from the ``with`` block's start to its end; ``_run``
    returns once ``self._stop`` is set."""

    def __init__(self, name: str):
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self):
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class ComputeLoad(_Background):
    """A thread that computes (float32 matrix products in torch, one intra-op thread) until the
    ``with`` block ends: a rank's backward, as the collectives of a training step see it
    when they overlap it. Where a collective needs the CPU (gloo: the rank's threads copy,
    reduce and push its bytes through the kernel's TCP stack) and ranks share cores, this is
    what slows them."""

    def __init__(self, size: int = 256):
        import torch

        super().__init__("compute-load")
        self._a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))

    def _run(self):
        import torch

        out = torch.empty_like(self._a)
        while not self._stop.is_set():
            torch.mm(self._a, self._a, out=out)      # releases the GIL while it runs


class Traffic(_Background):
    """Allreduces of ``nbytes``, one after another on a gloo group of their own, until the
    ``with`` block ends (on every rank; the ranks stop together): a collective running all the
    while, to time the compute beside it."""

    def __init__(self, nbytes: int):
        import torch
        import torch.distributed as dist

        super().__init__("traffic")
        self._group = dist.new_group(backend="gloo")
        self._buf = torch.zeros(max(2, nbytes // 4))   # zeros: sums stay zero

    def _run(self):
        import torch.distributed as dist

        while True:
            # element 0 carries "stop" with the data, so every rank sees it in the same round
            self._buf[0] = 1.0 if self._stop.is_set() else 0.0
            dist.all_reduce(self._buf, group=self._group)
            if self._buf[0] > 0:
                return

    def __exit__(self, *exc):
        import torch.distributed as dist

        super().__exit__(*exc)
        dist.destroy_process_group(self._group)


def sweep_collective(op: str, nbytes: int, warmup: int, iters: int, *,
                     load: bool = False) -> CollectivePoint:
    """Time one collective of ``nbytes`` (nccl-tests convention) on the default group; with
    ``load``, while every rank computes (:class:`ComputeLoad`)."""
    if load:
        with ComputeLoad():
            pt = sweep_collective(op, nbytes, warmup, iters)
        return dataclasses.replace(pt, extra={"load": "compute"})
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
    """A deep MLP: few FLOPs per parameter, so its steps are bound by the gradient exchange."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers, d = [], in_features
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, classes))
    return nn.Sequential(*layers)


#: what the harness times -> (TrainingPoint transport, emulator.replay transport); QSGD's
#: replay transport is ``qsgd_`` + the hook's
DENSE_POINTS = {32: ("allreduce", "fp32"), 16: ("allreduce", "fp16")}


def time_training(cfg: HarnessConfig) -> list[TrainingPoint]:
    """Timed DDP steps of a deep MLP: fp32, fp16 and QSGD at each bit width (see the module doc)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import qsgd

    from . import steptiming as st

    p, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(cfg.seed + rank)
    x = torch.randn(cfg.batch_size, 256, generator=gen)
    y = torch.randint(0, 10, (cfg.batch_size,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    min_numel = qsgd.buckets.DEFAULT_MIN_NUMEL
    cap_bytes = int(cfg.bucket_cap_mb * 2**20)

    def make(hook, state):
        model = build_mlp(cfg.width, cfg.depth, seed=cfg.seed)
        ddp = DDP(model, bucket_cap_mb=cfg.bucket_cap_mb)
        ddp.register_comm_hook(state, hook)
        sgd = torch.optim.SGD(ddp.parameters(), lr=1e-3)

        def step():
            sgd.zero_grad(set_to_none=False)
            loss = loss_fn(ddp(x), y)
            t_fwd = time.perf_counter()
            loss.backward()
            t_bwd = time.perf_counter()
            sgd.step()
            return t_fwd, t_bwd
        return model, step

    # the compute alone, all ranks at once; its buckets are the layout every run shares
    noop = st.NoopState()
    model0, step = make(st.noop_hook, noop)
    compute = st.gather_slowest(st.run_steps(step, noop.take, cfg.train_warmup, cfg.train_steps))
    busy = None
    if cfg.loaded:
        # the same steps while a bucket-sized allreduce runs all the while on a second group:
        # how much the collectives slow the compute (the replay's compute_pace)
        with Traffic(cap_bytes):
            busy = st.gather_slowest(st.run_steps(step, noop.take, cfg.train_warmup,
                                                  cfg.train_steps))
    names = {id(q): n for n, q in model0.named_parameters()}
    layout = dict(noop.layout)
    numel = sum(q.numel() for q in model0.parameters())
    compressed = sum(q.numel() for q in model0.parameters() if q.numel() >= min_numel)
    common = {"numel": numel, "compressed_numel": compressed, "raw_numel": numel - compressed,
              "batch_size": cfg.batch_size, "compute_s": statistics.median(compute.wall),
              "width": cfg.width, "depth": cfg.depth, "min_numel": min_numel,
              "bucket_cap_mb": cfg.bucket_cap_mb, "buckets": len(layout),
              "compute_timeline": st.bucket_summary(compute),
              "compute_forward_s": statistics.median(compute.forward_end),
              "compute_backward_end_s": statistics.median(compute.backward_end)}
    if busy is not None:
        common.update(compute_busy_s=statistics.median(busy.wall),
                      compute_pace=min(1.0, statistics.median(compute.wall) /
                                       statistics.median(busy.wall)))
    device = environment_device()
    first_cfg = qsgd.QSGDConfig.from_bits(cfg.train_bits[0] if cfg.train_bits else 4,
                                          bucket_size=cfg.bucket_size)

    def trace_of(qcfg, buckets=None, sizes=None):
        return st.payload_trace(model0, names, compute, layout, buckets, sizes, qcfg,
                                min_numel=min_numel, batch_size=cfg.batch_size, input_shape=(256,),
                                bucket_cap_bytes=cap_bytes, seed=cfg.seed, device_name=device)

    runs = [(32, None)] + ([(16, None)] if cfg.train_fp16 else []) + [(b, b) for b in cfg.train_bits]
    points = []
    for bits, qbits in runs:
        extra = dict(common)
        if qbits is None:
            transport, replay_transport = DENSE_POINTS[bits]
            state = st.DenseHookState("fp32" if bits == 32 else "fp16")
            model, step = make(st.dense_hook, state)
            records = state.take
            qcfg = first_cfg
        else:
            transport, replay_transport = cfg.train_transport, f"qsgd_{cfg.train_transport}"
            qcfg = qsgd.QSGDConfig.from_bits(qbits, bucket_size=cfg.bucket_size)
            state = qsgd.QSGDState(qcfg, transport=transport, min_numel=min_numel, seed=cfg.seed,
                                   timeout_s=cfg.timeout_s)
            model, step = make(qsgd.qsgd_hook, state)

            def records(state=state):
                return state.last_stats["timeline"]
        rec = st.gather_slowest(st.run_steps(step, records, cfg.train_warmup, cfg.train_steps))
        buckets = st.bucket_summary(rec)
        if qbits is None:
            trace = trace_of(qcfg)
        else:
            trace = trace_of(qcfg, buckets, state.last_stats["payload_sizes"])
            extra.update(payload_bytes=sum(b.payload_bytes for b in trace.iterations[0].buckets),
                         encode_s=sum(b["encode_s"] for b in buckets),
                         decode_s=sum(b["decode_s"] for b in buckets),
                         levels=qcfg.levels, bucket_size=qcfg.bucket_size, codec=qcfg.codec)
        plans = [emulator.bucket_plan(trace, k, replay_transport, p) for k in range(trace.num_buckets)]
        extra.update(replay_transport=replay_transport, payload_trace=trace.to_dict(),
                     timeline=buckets, forward_end_s=statistics.median(rec.forward_end),
                     backward_end_s=statistics.median(rec.backward_end))
        points.append(TrainingPoint(model=f"mlp{cfg.depth}x{cfg.width}", transport=transport,
                                    bits=bits, iteration_s=statistics.median(rec.wall),
                                    samples_s=tuple(rec.wall),
                                    bytes_per_step=sum(pl.wire_bytes for pl in plans), extra=extra))
        del model, step, state
    # DDP models and their hooks' futures hold Python callbacks: free them now, while the
    # interpreter is whole (freed at exit, by gloo's threads, they aborted 2 of 4 ranks)
    del model0, noop, make, records
    gc.collect()
    return points


def environment_device() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor."""
    device = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return device


def environment(cfg: HarnessConfig) -> dict:
    import torch
    import torch.distributed as dist

    p = dist.get_world_size()
    host = os.environ.get("QSGD_TESTBED_HOST") or socket.gethostname()
    hosts = [None] * p
    dist.all_gather_object(hosts, host)
    device = environment_device()
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
        loaded = []
        if cfg.loaded:
            # the sizes again while every rank computes (every other size of the sweep), with
            # three times the repetitions: waits for a core make these times heavy-tailed (a
            # 1 MiB allgather took 6 to 102 ms in one set of five on the 2-core testbed)
            for op in cfg.ops:
                for n in sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)[::2]:
                    pt = sweep_collective(op, n, cfg.warmup, 3 * cfg.iters, load=True)
                    loaded.append(pt)
                    if log and dist.get_rank() == 0:
                        log(f"{op:10s} {pt.bytes:12d} B  {pt.time_s * 1e3:9.3f} ms  "
                            f"busbw {pt.busbw / 1e6:8.2f} MB/s  (ranks computing)")
        training = time_training(cfg) if cfg.train_bits else []
        if log and dist.get_rank() == 0:
            for t in training:
                log(f"train {t.transport:24s} bits {t.bits:2d}  {t.iteration_s * 1e3:9.2f} ms/step")
        dist.barrier()
        if dist.get_rank() != 0:
            return None
        return MeasuredTrace(environment=env, collectives=tuple(points), training=tuple(training),
                             loaded=tuple(loaded))
    finally:
        gc.collect()
        if init and dist.is_initialized():
            dist.destroy_process_group()
