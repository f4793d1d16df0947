"""What-if studies: world sizes x bit widths x transports x topologies, as a typed table.

One task per (topology, world size, transport) builds the graph and replays that
transport's bit widths on it, sharing the emulator's per-collective cache within the task;
tasks run in this process, in local processes (``workers``) or on a Dask cluster
(``cluster``, :mod:`emulator.distributed`). :func:`run_study` returns a
:class:`~emulator.Study` whose rows are in a fixed order whatever ran them, so the three give
identical tables; :mod:`emulator.studyconfig` checks the grid and :mod:`emulator.studyresult`
documents the columns and their units.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import math
import time
from typing import Callable

from emulator._malloc import prepare_worker
from emulator.compute import ComputeModel
from emulator.errors import ConfigError
from emulator.network import Network
from emulator.replaying import TRANSPORTS, collective_requests, replay
from emulator.shardstudy import memory_of, shard_size, sharded_task
from emulator.interpolation import DEFAULT_RTOL
from emulator.estimate import estimate, task_label, wall_of
from emulator.studyconfig import StudyConfig
from emulator.studyresult import COMM_BOUND_SHARE, Study, StudyRow
from ._checks import is_int, is_number

DENSE_BITS = {"fp32": 32, "fp16": 16}


def resolve_compute(config: StudyConfig) -> dict:
    """One :class:`ComputeModel` per topology of ``config`` (``device="auto"``: the topology's
    GPU), each timing the trace's operators at the configured batch and precision.

    Raises ConfigError when a topology names no GPU and no device is given, or when the
    precision needs units the GPU lacks.

    Examples
    --------
    >>> import emulator, qsgd
    >>> trace = qsgd.measure("resnet50", qsgd.QSGDConfig.from_bits(4), device="meta")
    >>> models = emulator.resolve_compute(emulator.StudyConfig(
    ...     trace=trace, world_sizes=(16,), topologies=("cluster:dgx_h100x{N}", "cluster:p4dx{N}")))
    >>> [(m.device, m.precision, m.batch_size) for m in models.values()]
    [('H100-SXM', 'amp-bf16', 256), ('A100-40GB', 'amp-bf16', 256)]
    """
    return {spec: ComputeModel.for_topology(
        topology_for(spec, min(config.world_sizes)), config.trace, device=config.device,
        batch_size=config.batch_size, precision=config.precision, codec=config.codec,
        attention=config.attention)
        for spec in config.topologies}


# ---------------------------------------------------------------- one task
def topology_for(spec: str, world_size: int):
    """The graph of ``spec`` for ``world_size`` GPUs.

    Placeholders: ``{n}`` is the GPU count itself (``"switch:{n}"``), ``{N}`` the number of
    machines a cluster spec needs for it (``"cluster:dgx_a100x{N}"``).

    Examples
    --------
    >>> import emulator
    >>> emulator.topology_for("cluster:dgx_a100x{N}", 12).graph["name"]   # 2 machines of 8
    'cluster:dgx_a100x2'
    >>> emulator.topology_for("switch:{n}", 12).graph["name"]
    'switch:12'
    """
    import topologies

    spec = spec.replace("{n}", str(world_size))
    if "{N}" in spec:
        per_node = len(topologies.gpus(topologies.from_spec(spec.replace("{N}", "1"))))
        nodes = max(1, math.ceil(world_size / per_node))
        G = topologies.from_spec(spec.replace("{N}", str(nodes)))
    else:
        G = topologies.from_spec(spec)
    n = len(topologies.gpus(G))
    if n < world_size:
        raise ConfigError(f"topology {spec!r} has {n} GPUs, fewer than world_size={world_size}")
    return G


def placement_notes(config: StudyConfig) -> list[str]:
    """Sentences on world sizes that leave part of a machine idle (``{N}`` specs only).

    Examples
    --------
    >>> import emulator, qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> emulator.placement_notes(emulator.StudyConfig(
    ...     trace=trace, world_sizes=(3, 8, 12), topologies=("cluster:dgx_a100x{N}",)))
    ['cluster:dgx_a100x{N} at 3 GPUs: 3 of the 8 GPUs of 1 machine take part, 5 idle',
     'cluster:dgx_a100x{N} at 12 GPUs: 12 of the 16 GPUs of 2 machines take part, 4 idle']
    """
    import topologies

    notes = []
    for spec in config.topologies:
        if "{N}" not in spec:
            continue
        per_node = len(topologies.gpus(topologies.from_spec(spec.replace("{N}", "1").replace(
            "{n}", "1"))))
        for w in config.sizes_of(spec):
            machines = math.ceil(w / per_node)
            if w % per_node:
                notes.append(f"{spec} at {w} GPUs: {w} of the {machines * per_node} GPUs of "
                             f"{machines} machine{'s' if machines > 1 else ''} take part, "
                             f"{machines * per_node - w} idle")
    return notes


def run_task(task: tuple, progress: Callable[[str], None] | None = None) -> list[tuple]:
    """Predictions of one task: ``task = (config, spec, world_size, combos)``.

    ``progress(text)``, when given, hears how far the task has come: which bit width of how
    many it replays, and the collectives simulated so far with the last one's wall seconds.

    Returns ``[(bits, transport, graph name, Prediction, method), ...]`` in the order of
    ``combos``; ``method`` says how its collectives' seconds were made
    (:meth:`Network.method`: the engine, or NCCL's calibrated closed form for the largest).
    """
    cfg, spec, world_size, combos = task
    state = {"combo": 0, "simulated": 0}

    def on_simulated(op: str, nbytes: int, wall_s: float) -> None:
        state["simulated"] += 1
        bits, transport = combos[state["combo"]]
        progress(f"{task_label(task)}: {transport} {bits}-bit "
                 f"({state['combo'] + 1}/{len(combos)}), "
                 f"{state['simulated']} collectives simulated, last {op} of {nbytes:,} B "
                 f"in {wall_s:.1f} s")

    if progress is not None:            # never a silent wait: 8,192 GPUs take seconds here
        progress(f"{task_label(task)}: building the topology and NCCL's analysis of it")
    G = _task_graph(spec, world_size)
    net = Network(G, world_size, cfg.algorithm,
                  on_simulated=None if progress is None else on_simulated,
                  interpolate=None if cfg.exact else DEFAULT_RTOL,
                  engine_budget_s=None if cfg.exact else ENGINE_BUDGET_S)
    compute = cfg.compute_for(spec)
    if cfg.parallelism != "ddp":
        # the data-parallel network's collectives over the whole task (the shard groups' run
        # on the engine)
        res = sharded_task(cfg, G, net, compute, combos, state, str(G.graph.get("name", spec)))
        return [(*r, net.method()) for r in res]
    if not cfg.exact:
        # the sweep needs every size of the task at once to pick which ones to simulate
        if progress is not None:
            progress(f"{task_label(task)}: choosing NCCL's algorithm for each collective size")
        net.prefetch([r for bits, transport in combos for r in collective_requests(
            cfg.trace, net, transport, bits if TRANSPORTS[transport].compressed else None,
            compute.grad_bytes)])
    name = str(G.graph.get("name", spec))
    out = []
    for k, (bits, transport) in enumerate(combos):
        state["combo"] = k
        net.used.clear()
        pred = replay(cfg.trace, G, transport=transport, compute=compute, network=net,
                      bits=bits if TRANSPORTS[transport].compressed else None)
        out.append((bits, transport, name, pred, net.method()))
    return out


#: The approximate mode's budget per collective: an NCCL collective whose engine run should
#: take longer takes the calibrated closed form (:meth:`Network.fast`; 8,192-GPU clusters).
ENGINE_BUDGET_S = 30.0


def _task_bound(task) -> float:
    """Wall seconds an approximate study's task should take at most: building and analysing
    its cluster (:func:`emulator.fastpath.analysis_seconds`) and, per bit width, the engine
    for at most :data:`ENGINE_BUDGET_S` (longer collectives take the closed form)."""
    from .fastpath import analysis_seconds

    return analysis_seconds(task[2]) + len(task[3]) * ENGINE_BUDGET_S


@functools.lru_cache(maxsize=4)
def _task_graph(spec: str, world_size: int):
    """:func:`topology_for`, kept for the next tasks in this process: the transports of one
    (topology, world size) are separate tasks, and the engine keeps a graph's routes with it
    (:mod:`emulator.netpaths`), so they route the GPU pairs once, not once per transport.
    Tasks only read the graph."""
    return topology_for(spec, world_size)


def _tasks(config: StudyConfig) -> list[tuple]:
    """One task per (topology, world size, transport): the grid in pieces small enough to
    keep every worker busy; a task's bit widths share its :class:`Network` cache."""
    tasks = []
    for spec in config.topologies:
        for w in config.sizes_of(spec):
            by_transport: dict[str, list] = {}
            for bits, transport in config.combos():
                by_transport.setdefault(transport, []).append((bits, transport))
            tasks += [(config, spec, w, tuple(c)) for c in by_transport.values()]
    return tasks


def _rows(config: StudyConfig, results: list[list[tuple]]) -> Study:
    """Rows in grid order, with the speedups over the dense transports of the same cell."""
    trace = config.trace
    preds: dict = {}
    names: dict = {}
    methods: dict = {}
    for task, res in zip(_tasks(config), results):
        _, spec, w, _ = task
        for bits, transport, name, pred, method in res:
            preds[(spec, w, bits, transport)] = pred
            methods[(spec, w, bits, transport)] = method
            names[(spec, w)] = name
    rows = []
    for spec in config.topologies:
        compute = config.compute_for(spec)
        batch = compute.batch_size or trace.batch_size
        memory = memory_of(config, spec, compute, batch)
        for w in config.sizes_of(spec):
            dense = {t: preds.get((spec, w, DENSE_BITS[t], t)) for t in DENSE_BITS}
            for bits, transport in config.combos():
                pred = preds[(spec, w, bits, transport)]
                it = pred.iteration_s
                speedup = {t: (None if p is None else p.iteration_s / it) for t, p in dense.items()}
                rows.append(StudyRow(
                    topology=spec, topology_name=names[(spec, w)], world_size=w, bits=bits,
                    transport=transport, iteration_s=it,
                    throughput_samples_s=w * batch / it,
                    speedup_vs_fp32=speedup["fp32"], speedup_vs_fp16=speedup["fp16"],
                    scaling_efficiency=pred.compute_s / it, bytes_per_gpu=pred.bytes_per_gpu,
                    compute_s=pred.compute_s, exposed_comm_s=pred.exposed_comm_s,
                    encode_decode_s=pred.encode_decode_s,
                    bound="communication" if pred.exposed_comm_s > COMM_BOUND_SHARE * it
                    else "compute",
                    model=trace.model, batch_size=batch, device=compute.device,
                    precision=compute.precision or "as measured",
                    algorithm=config.algorithm, source=f"{pred.source}; compute: {compute.source}",
                    parallelism=config.parallelism,
                    memory_per_gpu=None if w not in memory else memory[w].total,
                    comm_method=methods[(spec, w, bits, transport)]))
    return Study(tuple(rows), predictions={r.key: preds[r.key] for r in rows},
                 config=config.to_dict())


# ---------------------------------------------------------------- the study
def _timed(task, progress=None) -> tuple[float, list]:
    """``run_task`` and its wall seconds, measured where it runs."""
    t0 = time.perf_counter()
    out = run_task(task, progress)
    return time.perf_counter() - t0, out


class _Relay:
    """``progress(text)`` in a worker process, put on a queue the parent reads."""

    def __init__(self, queue):
        self.queue = queue

    def __call__(self, text: str) -> None:
        self.queue.put(text)


def _timed_relayed(task, queue) -> tuple[float, list]:
    return _timed(task, _Relay(queue))


def run_study(config: StudyConfig, *, progress: Callable[..., None] | None = None,
              workers: int = 1, cluster: str | None = None,
              time_limit_s: float | None = None,
              task_progress: Callable[[str], None] | None = None) -> Study:
    """Run every task of ``config``; the :class:`~emulator.Study` of its rows.

    The tasks of the smallest world size run first, a pilot; from their times the rest is
    estimated (:func:`estimate`). While the pilot and that estimate exceed ``time_limit_s``, the
    next world size joins the pilot if its own estimate fits in what is left (small tasks are
    mostly overheads, so an estimate from a larger size is closer); when it does not, the
    study stops with a :class:`ConfigError` saying how to make it smaller.

    Parameters
    ----------
    progress : callable, optional
        ``progress(done, total, eta_s)`` after each task (one per topology, world size and
        transport); ``eta_s`` is the estimated seconds left (None until it is known).
    workers : int
        Local processes (1: in this process).
    cluster : str, optional
        Address of a Dask scheduler (``"tcp://host:8786"``); tasks run there.
    time_limit_s : float, optional
        Refuse a study estimated to take longer (wall seconds), before its larger tasks start.
    task_progress : callable, optional
        ``task_progress(text)`` while a task runs: the bit width it replays and the collectives
        simulated so far (:func:`run_task`), from local processes too (not from a Dask cluster).

    Returns
    -------
    Study
        Rows in a fixed order whatever ran them, each with its replayed timeline.

    Examples
    --------
    A small MLP measured on this CPU, its operators timed on A100s at batch 32, replayed on 4
    and 8 GPUs behind one 1 Gbit/s switch:

    >>> import emulator, qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> study = emulator.run_study(emulator.StudyConfig(
    ...     trace=trace, world_sizes=(4, 8), bits=(32, 4), transports=("fp32", "qsgd_allgather"),
    ...     topologies=("switch:{n},bw=1Gbit",), device="A100", batch_size=32))
    >>> [(r.world_size, r.label) for r in study.rows]
    [(4, 'fp32'), (4, 'qsgd_allgather 4-bit'), (8, 'fp32'), (8, 'qsgd_allgather 4-bit')]
    >>> [round(r.bytes_per_gpu / 1e6, 3) for r in study.rows]     # MB each GPU sends
    [1.411, 0.376, 1.646, 0.877]
    >>> study.best().label, study.best().world_size   # the fastest QSGD row at the largest size
    ('qsgd_allgather 4-bit', 8)
    """
    if not is_int(workers) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    if config.compute is None:
        config = dataclasses.replace(config, compute=resolve_compute(config))
    config.combos()
    tasks = _tasks(config)
    for spec in config.topologies:  # a bad spec fails here, before any work is sent out
        topology_for(spec, min(config.world_sizes) if "{" in spec else max(config.sizes_of(spec)))
        if config.parallelism != "ddp":
            # a strategy the world size cannot form, a model that does not fit: said up front
            for w in config.sizes_of(spec):
                shard_size(config, topology_for(spec, w), w)
            compute = config.compute_for(spec)
            memory_of(config, spec, compute, compute.batch_size or config.trace.batch_size,
                      refuse=True)
    if time_limit_s is not None and (not is_number(time_limit_s) or not time_limit_s > 0):
        raise ConfigError(f"time_limit_s must be a number of seconds > 0, got {time_limit_s!r}")
    total = len(tasks)
    results: list = [None] * total
    seconds: dict = {}
    sizes = sorted({task[2] for task in tasks})
    stage = [[i for i, task in enumerate(tasks) if task[2] == w] for w in sizes]
    rest = [i for i in range(total) if tasks[i][2] != sizes[0]]
    left: dict = {}          # remaining task -> estimated seconds, once the first pilot has run

    def done(i, wall_s, out):
        results[i], seconds[i] = out, wall_s
        left.pop(i, None)
        if progress is not None:
            # every task after the first pilot runs once an estimate is made
            eta = wall_of(left.values(), workers) if len(seconds) > len(stage[0]) else None
            progress(len(seconds), total, eta)

    # one set of local processes for the pilot's stages and the rest
    with _Local(min(workers, total), task_progress) as local:
        if rest and (time_limit_s is not None or progress is not None):
            # the pilot's times are extrapolated (refusal, ETA): numba's compiling must not
            # be in them
            _warm_up(local if cluster is None else None)
        _run_tasks(tasks, stage[0], done, cluster, task_progress, local=local)
        k = 0
        while rest:
            plan = estimate(tasks, dict(seconds), workers,
                            cap=None if config.exact else _task_bound)
            left.clear()
            left.update(plan.by_task)
            spent = wall_of(seconds.values(), workers)
            if time_limit_s is None or spent + plan.seconds <= time_limit_s:
                break
            nxt = wall_of((plan.by_task[i] for i in stage[k + 1]), workers)
            if spent + nxt > time_limit_s:
                whole = dataclasses.replace(plan, seconds=spent + plan.seconds)
                raise ConfigError(whole.advice(time_limit_s))
            k += 1
            _run_tasks(tasks, stage[k], done, cluster, task_progress, local=local)
            rest = [i for i in rest if i not in seconds]
        # Largest first: the longest tasks start at once and the short ones fill the gaps
        # (longest-processing-time-first scheduling).
        _run_tasks(tasks, sorted(rest, key=lambda i: -tasks[i][2]), done, cluster,
                   task_progress, local=local)
    return _rows(config, results)


def _warm_up(local) -> None:
    """Compile the engine's kernels before the pilot: with two or more local processes, in
    them, each path's kernels in its own process at once (the event loop's and the
    contention-free pass's, ~7 and ~4 s of compiling on a fresh checkout; each writes numba's
    cache, from which the other loads them), while they import; else here."""
    from . import engine

    if local is None or local.workers < 2:
        engine.warm_up()
        return
    pool = local.executor()
    for f in [pool.submit(engine.warm_up, (path,)) for path in engine.WARM_PATHS]:
        f.result()


class _Local:
    """A study's local processes, started on first use and kept for all its batches (the
    pilot's stages, the rest): each start costs every process its imports (~2 s). Each keeps
    the memory it frees for its next simulation (:mod:`emulator._malloc`)."""

    def __init__(self, workers: int, task_progress):
        self.workers, self.relayed = workers, task_progress is not None
        self.pool = self.manager = self.relay = None

    def executor(self):
        if self.pool is None:
            import concurrent.futures as cf
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")  # no forked torch/numba thread pools
            if self.relayed:
                self.manager = ctx.Manager()
                self.relay = self.manager.Queue()
            self.pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                               initializer=prepare_worker,
                                               initargs=(gc.get_threshold(),))
        return self.pool

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
        if self.manager is not None:
            self.manager.shutdown()


def _run_tasks(tasks: list, order: list, done: Callable, cluster,
               task_progress: Callable[[str], None] | None = None, *, local: _Local) -> None:
    """Run ``tasks[i]`` for ``i`` in ``order`` here, in ``local``'s processes or on a Dask
    cluster; ``done(i, wall_s, result)`` as each finishes, ``task_progress(text)`` while they
    run."""
    if not order:
        return
    if cluster is not None:
        from emulator.distributed import map_on_cluster

        map_on_cluster(_timed, [tasks[i] for i in order], cluster,
                       on_done=lambda k, value: done(order[k], *value))
    elif local.workers == 1 or (len(order) == 1 and local.pool is None):
        for i in order:
            done(i, *_timed(tasks[i], task_progress))
    else:
        _run_local(tasks, order, done, task_progress, local)


def _run_local(tasks: list, order: list, done: Callable, task_progress, local: _Local) -> None:
    import concurrent.futures as cf
    import queue as queues

    pool = local.executor()
    relay = local.relay
    futs = {(pool.submit(_timed_relayed, tasks[i], relay) if relay is not None
             else pool.submit(_timed, tasks[i])): i for i in order}
    pending = set(futs)
    while pending:
        finished, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
        while relay is not None:
            try:
                task_progress(relay.get_nowait())
            except queues.Empty:
                break
        for f in finished:
            done(futs[f], *f.result())
