"""``qsgd-emu bench emulator``: the flow-level engine against a naive SimPy model.

The ring case: a ring allreduce of ``--bytes`` (default 100 MB = 1e8
bytes, nccl-tests convention: per rank) on N GPUs of a two-level fat tree, timed end to end
(schedule + simulation; the topology is built once and shared). The two-level fat tree is a
non-blocking leaf-spine (folded Clos, :func:`topologies.leaf_spine`): 32 GPUs per leaf,
32 spines, every link 100 Gbit/s (12.5e9 bytes/s) and 1 us, so each leaf has 32 ports down
and 32 up. (:func:`topologies.fat_tree` is the three-level k-ary tree of Al-Fares et al.)
The spines' radix grows as N/32; that is a model of the fabric, not a switch one can buy.

The baseline, written here and measured in the same run, is a naive model: one SimPy process per message; every directed link channel a
``simpy.Resource(capacity=1)``; a message waits for its dependencies, takes every channel
of its route (cut-through: it holds them all for ``bytes / bottleneck bandwidth``), releases
them, and arrives one path latency later. Same schedule (:func:`emulator.build_schedule`),
same routes (:class:`topologies.Router`). On a ring nothing is shared, so both must predict
the same time; the table gives their relative difference. Under contention they differ on
purpose: FIFO resources serialize, the engine shares max-min fairly.

Targets: 1024 GPUs in <= 2 s of wall time, and >= 20x faster than the naive
model at 256 GPUs. Wall times on a shared machine are noisy; cases that would take longer
than ``--budget-s`` (extrapolated from the previous case by the number of flows) or more
memory than is available are skipped, and the table says so.

The same table then has the congested cases of :mod:`qsgd_emu.bench.congested` (flows that
share channels, so the event loop and its max-min allocator do the work), each run in a fresh
process: the exact engine, the approximate mode (``--tolerance``) with its error against the
exact time, the naive model where its message count allows (under contention it serializes
FIFO where the engine shares max-min fairly, so its time differs on purpose), and the peak
resident memory of the process. Below the table, ``qsgd-emu simulate`` is timed as a user
runs it, process start included (:func:`startup_times`).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import simpy

__all__ = ["fabric", "naive_simulate", "engine_run", "bench_case", "run_bench", "format_table",
           "nccl_case", "format_nccl_table", "startup_times", "STARTUP_COMMANDS"]

SIZES = (64, 256, 1024, 4096, 8192)
HOSTS_PER_LEAF = 32
SPINES = 32
BANDWIDTH = 12.5e9   # bytes/s: 100 Gbit/s, one EDR InfiniBand or 100GbE port
LATENCY = 1e-6       # s per link


def fabric(n_gpus: int, *, hosts_per_leaf: int = HOSTS_PER_LEAF, spines: int = SPINES,
           bandwidth: float = BANDWIDTH, latency: float = LATENCY):
    """The benchmark's two-level fat tree: ``n_gpus / hosts_per_leaf`` non-blocking leaves.

    Parameters
    ----------
    n_gpus : int
        A multiple of ``hosts_per_leaf``.
    bandwidth : float
        Bytes/s per direction of every GPU-leaf link; leaf-spine links get
        ``hosts_per_leaf * bandwidth / spines`` (oversubscription 1).
    latency : float
        Seconds per link.
    """
    import topologies

    if n_gpus < hosts_per_leaf or n_gpus % hosts_per_leaf:
        raise ValueError(f"GPUs {n_gpus} must be a positive multiple of {hosts_per_leaf} "
                         f"(GPUs per leaf)")
    return topologies.leaf_spine(n_gpus // hosts_per_leaf, spines, hosts_per_leaf,
                                 bandwidth=bandwidth, latency=latency)


def naive_simulate(G, schedule) -> float:
    """Simulated time (s) of ``schedule`` on ``G`` by the naive model (module docstring)."""
    import topologies

    env = simpy.Environment()
    router = topologies.Router(G)
    nodes = topologies.gpus(G)
    channels: dict = {}   # directed channel -> (global order, Resource)
    routes: dict = {}     # (src, dst) -> (resources in global order, bottleneck B/s, latency s)

    def route(s, d):
        if (s, d) not in routes:
            path = router.channels(nodes[s], nodes[d])
            for c in path:
                if c not in channels:
                    channels[c] = (len(channels), simpy.Resource(env, capacity=1))
            # Taking channels in one global order means no two messages ever wait on each
            # other in a cycle (the resource-ordering rule against deadlock).
            res = [r for _, r in sorted(channels[c] for c in path)]
            routes[s, d] = (res, min(G.edges[c]["bandwidth"] for c in path),
                            sum(G.edges[c]["latency"] for c in path))
        return routes[s, d]

    src, dst, size = schedule.src.tolist(), schedule.dst.tolist(), schedule.size.tolist()
    compute = schedule.compute_s.tolist()
    ptr, idx = schedule.dep_ptr.tolist(), schedule.dep_idx.tolist()
    after = schedule.after.tolist()
    done = [env.event() for _ in range(len(src))]
    left = [env.event() for _ in range(len(src))]

    def message(i):
        deps = idx[ptr[i]:ptr[i + 1]]
        if deps:
            yield env.all_of([done[j] for j in deps])
        if compute[i]:
            yield env.timeout(compute[i])
        if after[i] >= 0:
            yield left[after[i]]
        if src[i] == dst[i]:
            left[i].succeed()
        else:
            res, bandwidth, latency = route(src[i], dst[i])
            held = []
            for r in res:
                req = r.request()
                yield req
                held.append((r, req))
            yield env.timeout(size[i] / bandwidth)
            for r, req in held:
                r.release(req)
            left[i].succeed()
            yield env.timeout(latency)
        done[i].succeed()

    for i in range(len(src)):
        env.process(message(i))
    env.run()
    return float(env.now)


def engine_run(G, n_gpus: int, nbytes: int, force_events: bool = False):
    """Build the ring allreduce schedule and simulate it with :func:`emulator.simulate`.

    ``force_events`` skips the contention-free pass (:mod:`emulator.critical_path`) and steps
    the event engine, which is what any schedule whose flows share a channel costs.
    """
    import emulator
    from emulator.engine import simulate

    sched = emulator.build_schedule("allreduce", "ring", n_gpus, nbytes)
    return simulate(G, sched, _force_events=force_events)


def _naive_run(G, n_gpus: int, nbytes: int) -> float:
    import emulator

    return naive_simulate(G, emulator.build_schedule("allreduce", "ring", n_gpus, nbytes))


def _timed(fn, *args):
    """``(fn(*args), wall seconds)`` with Python's cyclic garbage collector paused.

    Its passes over millions of live generators cost the naive model 20-30 % at 256 GPUs on
    this machine: that is the interpreter's price, not the model's, and would inflate the
    speedup. Paused for both models alike.
    """
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn(*args)
        return out, time.perf_counter() - t0
    finally:
        gc.enable()


def bench_case(n_gpus: int, nbytes: int, *, naive: bool = True, event_loop: bool = False,
               G=None) -> dict:
    """One row: engine (and optionally naive) wall time (s), flows, events, simulated time (s).

    ``G`` defaults to :func:`fabric` of ``n_gpus``. ``event_loop`` also times the engine with
    its contention-free pass switched off (``events_s``, ``events``: its steps).
    """
    G = fabric(n_gpus) if G is None else G
    res, wall = _timed(engine_run, G, n_gpus, nbytes)
    row = {"gpus": n_gpus, "nbytes": nbytes, "flows": res.flows, "events": None,
           "engine_s": wall, "engine_time_s": res.time_s, "events_s": None, "naive_s": None,
           "naive_time_s": None, "speedup": None, "rel_diff": None, "skipped": None}
    del res
    if event_loop:
        res, row["events_s"] = _timed(engine_run, G, n_gpus, nbytes, True)
        row["events"] = res.events
        row["events_rel_diff"] = abs(res.time_s - row["engine_time_s"]) / res.time_s
        del res
    if naive:
        t_naive, wall_naive = _timed(_naive_run, G, n_gpus, nbytes)
        row.update(naive_s=wall_naive, naive_time_s=t_naive, speedup=wall_naive / wall,
                   rel_diff=abs(row["engine_time_s"] - t_naive) / t_naive)
    return row


def _ring_flows(n: int) -> int:
    return 2 * (n - 1) * n   # 2(p-1) steps of p messages (emulator.collectives.ring)


def _available_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return float("inf")


def run_bench(sizes, nbytes: int, *, naive_max: int, budget_s: float, progress=None,
              make_graph=fabric, events_max: int = 0) -> list[dict]:
    """Rows of :func:`bench_case` for each GPU count, skipping what would not fit.

    ``make_graph(n)`` gives the topology of ``n`` GPUs; ``progress(row)`` is called per row.

    A case is skipped when its wall time, extrapolated from the previous engine case in
    proportion to the flows, exceeds ``budget_s``, or its memory, extrapolated from this
    process's peak resident size per flow so far, exceeds what the machine has available.
    """
    rows: list[dict] = []
    last = None
    # Load the compiled kernels (numba's on-disk cache) once, outside every timed case: the
    # contention-free pass's and the event loop's.
    from emulator import _jit

    _jit.compile_kernels()
    engine_run(make_graph(min(sizes)), min(sizes), nbytes)
    engine_run(make_graph(min(sizes)), min(sizes), nbytes, True)
    for n in sorted(sizes):
        flows = _ring_flows(n)
        reason = None
        if last is not None:
            est_s = last["engine_s"] * flows / last["flows"]
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # KiB on Linux
            est_mem = peak / last["flows"] * flows
            if est_s > budget_s:
                reason = f"estimated {est_s:,.0f} s > --budget-s {budget_s:g}"
            elif est_mem > _available_bytes():
                reason = (f"estimated {est_mem / 1e9:,.1f} GB > {_available_bytes() / 1e9:,.1f} "
                          f"GB available")
        if reason:
            rows.append({"gpus": n, "nbytes": nbytes, "flows": flows, "skipped": reason})
        else:
            last = bench_case(n, nbytes, naive=n <= naive_max, event_loop=n <= events_max,
                              G=make_graph(n))
            last["peak_mb"] = _peak_mb()
            rows.append(last)
        if progress:
            progress(rows[-1])
    return rows


def _peak_mb() -> float:
    from qsgd_emu.bench.congested import _peak_mb as peak

    return peak()


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_table(rows: list[dict], congested: list[dict] = (), startup: list[dict] = ()) -> str:
    """The rows (ring cases, then congested cases) as one text table, the startup times
    below it, and the targets checked."""
    head = (f"{'GPUs':>5} {'flows':>12} {'engine s':>9} {'events':>10} {'event-loop s':>12} "
            f"{'naive s':>8} {'speedup':>8} {'engine sim us':>13} {'naive sim us':>12} "
            f"{'rel diff':>8} {'approx s':>8} {'approx err':>10} {'peak MB':>8}  case")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"{r['gpus']:>5} {r['flows']:>12,} skipped: {r['skipped']}")
            continue
        sim_n = None if r["naive_time_s"] is None else r["naive_time_s"] * 1e6
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
        lines.append(f"{r['gpus']:>5} {r['flows']:>12,} {r['engine_s']:>9.2f} "
                     f"{_fmt(r['events'], '10,'):>10} {_fmt(r['events_s'], '12.2f'):>12} "
                     f"{_fmt(r['naive_s'], '8.2f'):>8} {speed:>8} "
                     f"{r['engine_time_s'] * 1e6:>13.1f} {_fmt(sim_n, '12.1f'):>12} "
                     f"{_fmt(r['rel_diff'], '8.1e'):>8} {'-':>8} {'-':>10} "
                     f"{_fmt(r.get('peak_mb'), '8.0f'):>8}  ring-{r['gpus']}")
    for r in congested:
        if r.get("skipped"):
            lines.append(f"{'':>5} {'':>12} skipped: {r['skipped']}  {r['case']}")
            continue
        gpus = r.get("gpus", "")
        sim_n = None if r["naive_time_s"] is None else r["naive_time_s"] * 1e6
        speed = "-" if r["naive_s"] is None else f"{r['naive_s'] / r['engine_s']:.1f}x"
        lines.append(f"{gpus:>5} {r['flows']:>12,} {r['engine_s']:>9.2f} {r['events']:>10,} "
                     f"{'-':>12} {_fmt(r['naive_s'], '8.2f'):>8} {speed:>8} "
                     f"{r['engine_time_s'] * 1e6:>13.2f} {_fmt(sim_n, '12.1f'):>12} {'-':>8} "
                     f"{_fmt(r['approx_s'], '8.2f'):>8} {_fmt(r['approx_rel_err'], '10.1e'):>10} "
                     f"{r['peak_mb']:>8.0f}  {r['case']}: {r['what']} on {r['topology']}")
    nbytes = rows[0]["nbytes"] if rows else 0
    lines.append(f"ring-N: ring allreduce of {nbytes:,} B per rank on a non-blocking leaf-spine "
                 f"({HOSTS_PER_LEAF} GPUs/leaf, {SPINES} spines, {BANDWIDTH * 8 / 1e9:g} Gbit/s, "
                 f"{LATENCY * 1e6:g} us links); wall s = schedule + simulation (routing "
                 f"included); naive = one SimPy process per message on Resource links; "
                 f"event-loop s = the engine with its contention-free pass off; approx = "
                 f"exact=False; approx err = (approx - exact) / exact simulated time; peak MB = "
                 f"peak resident memory of the process (of the process so far for ring rows)")
    for r in startup:
        lines.append(f"startup: {r['command']}: min {r['min_s']:.2f} s, median "
                     f"{r['median_s']:.2f} s of {r['runs']} (process start included)")
    by_n = {r["gpus"]: r for r in rows if not r.get("skipped")}
    by_case = {r["case"]: r for r in congested if not r.get("skipped")}
    by_cmd = {r["command"]: r for r in startup}
    checks = [
        ("engine <= 2 s at 1024 GPUs (ring)", by_n.get(1024, {}).get("engine_s"),
         lambda v: v <= 2.0, " s"),
        ("speedup >= 20x at 256 GPUs (ring)", by_n.get(256, {}).get("speedup"),
         lambda v: v >= 20.0, "x"),
        ("alltoall-256 <= 3 s", by_case.get("alltoall-256", {}).get("engine_s"),
         lambda v: v <= 3.0, " s"),
        ("alltoall-256 simulates 5846.00 us (the engine before the allocator) to 1e-9",
         by_case.get("alltoall-256", {}).get("engine_time_s"),
         lambda v: abs(v - ALLTOALL_256_S) <= 1e-9 * ALLTOALL_256_S, " s"),
        ("alltoall-1024 <= 60 s exact", by_case.get("alltoall-1024", {}).get("engine_s"),
         lambda v: v <= 60.0, " s"),
        ("simulate ring:8 <= 0.6 s", by_cmd.get(STARTUP_COMMANDS[0], {}).get("median_s"),
         lambda v: v <= 0.6, " s"),
        ("simulate 1024-GPU ring <= 1 s", by_cmd.get(STARTUP_COMMANDS[1], {}).get("median_s"),
         lambda v: v <= 1.0, " s"),
    ]
    for target, value, ok, unit in checks:
        verdict = "not measured" if value is None else \
            f"{value:.{6 if unit == ' s' and value < 1e-2 else 2}f}{unit}: " \
            f"{'met' if ok(value) else 'MISSED'}"
        lines.append(f"target {target}: {verdict}")
    return "\n".join(lines)


#: Machine of the NCCL-channel cases: DGX A100 nodes (8 GPUs, 8 HDR NICs) on the cluster's
#: default fabric, so that NCCL's model runs 8 rail-aligned channels that share NVSwitch links.
NCCL_NODE = "dgx_a100"


def nccl_case(n_gpus: int, nbytes: int) -> dict:
    """One NCCL-model row: allreduce as NCCL runs it on ``cluster:dgx_a100xN`` (``n_gpus / 8``
    nodes): wall seconds to build the schedule and to simulate it, its flows and events, the
    simulated seconds, and the closed form's seconds for the same choice."""
    import emulator
    import topologies

    G = topologies.from_spec(f"cluster:{NCCL_NODE}x{n_gpus // 8}")
    sched, build_s = _timed(lambda: emulator.build_schedule("allreduce", "nccl", n_gpus, nbytes,
                                                            graph=G))
    res, sim_s = _timed(emulator.simulate, G, sched)
    plan = sched.detail["nccl"]
    return {"gpus": n_gpus, "nbytes": nbytes, "chosen": f"{plan['algorithm']}/{plan['protocol']}",
            "channels": plan["channels"], "flows": res.flows, "events": res.events,
            "build_s": build_s, "simulate_s": sim_s, "time_s": res.time_s,
            "closed_form_s": plan["predicted_s"],
            "busbw": nbytes * 2 * (n_gpus - 1) / n_gpus / res.time_s}


def format_nccl_table(rows: list[dict]) -> str:
    """The NCCL rows as a text table."""
    head = (f"{'GPUs':>5} {'chosen':>12} {'channels':>8} {'flows':>9} {'events':>9} "
            f"{'build s':>8} {'simulate s':>10} {'sim us':>9} {'closed us':>9} {'busbw GB/s':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['gpus']:>5} {r['chosen']:>12} {r['channels']:>8} {r['flows']:>9,} "
                     f"{_fmt(r['events'], '9,'):>9} {r['build_s']:>8.2f} {r['simulate_s']:>10.2f} "
                     f"{r['time_s'] * 1e6:>9.1f} {r['closed_form_s'] * 1e6:>9.1f} "
                     f"{r['busbw'] / 1e9:>10.1f}")
    nbytes = rows[0]["nbytes"] if rows else 0
    lines.append(f"allreduce of {nbytes:,} B per rank as NCCL runs it on cluster:{NCCL_NODE}xN "
                 f"(8 GPUs and 8 NICs per node): channels share NVSwitch links, so the engine "
                 f"steps its event loop; closed us = the NCCL closed form of the same choice")
    return "\n".join(lines)


#: Simulated time (s) of alltoall-256 by the engine before the incremental allocator
#: (``qsgd-emu simulate --topology fat_tree:k=16 --ranks 256 --op alltoall --algorithm direct
#: --bytes 64MB``, 392 s of wall time): the new one must agree to 1e-9.
ALLTOALL_256_S = 5846.00e-6

#: ``qsgd-emu simulate`` command lines timed with process start (the start-up cases): a
#: small ring, the issue's 1024-GPU ring allreduce (the textbook ring, a target), and the same
#: collective by NCCL's model (the default algorithm; its selection routes the NCCL trees too).
STARTUP_COMMANDS = ("simulate --topology ring:8 --bytes 1MB",
                    "simulate --topology fat_tree:k=16 --ranks 1024 --op allreduce "
                    "--algorithm ring --bytes 100MB",
                    "simulate --topology fat_tree:k=16 --bytes 100MB")


def startup_times(commands=STARTUP_COMMANDS, runs: int = 3) -> list[dict]:
    """Wall seconds of ``qsgd-emu COMMAND`` in a fresh interpreter, ``runs`` times each
    (after one untimed run that fills numba's on-disk cache)."""
    out = []
    for command in commands:
        argv = [sys.executable, "-m", "qsgd_emu.cli", *command.split()]
        subprocess.run(argv, check=True, capture_output=True)
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, env=dict(os.environ))
            walls.append(time.perf_counter() - t0)
        out.append({"command": command, "runs": runs, "min_s": min(walls),
                    "median_s": statistics.median(walls), "walls_s": walls})
    return out


def run_congested(names, *, tolerance: float, naive_max_flows: int, progress=None) -> list[dict]:
    """Rows of the congested cases ``names`` (:mod:`qsgd_emu.bench.congested`)."""
    from qsgd_emu.bench.congested import CASES, run_case

    rows = []
    for name in names:
        row = run_case(name, naive=CASES[name].flows_hint <= naive_max_flows,
                       tolerance=tolerance)
        rows.append(row)
        if progress:
            progress(row)
    return rows


def _sizes(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes {text!r} must be comma-separated integers") from None
    if not out:
        raise argparse.ArgumentTypeError("--sizes must name at least one GPU count")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=_sizes, default=",".join(map(str, SIZES)),
                        help=f"GPU counts, multiples of {HOSTS_PER_LEAF}")
    parser.add_argument("--max-gpus", type=int, default=max(SIZES), help="skip sizes above this")
    parser.add_argument("--naive-max", type=int, default=256,
                        help="run the naive model only up to this many GPUs (it takes about a "
                             "minute at 1024)")
    parser.add_argument("--events-max", type=int, default=256,
                        help="also time the event loop alone (contention-free pass off) up to "
                             "this many GPUs")
    parser.add_argument("--bytes", default="100MB", help="allreduce size per rank")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="skip an engine case estimated to take longer (seconds)")
    parser.add_argument("--nccl", type=_sizes, default=None,
                        help="also time NCCL's model (channels) on DGX A100 clusters of these "
                             "GPU counts, multiples of 8 (e.g. 16,32,64); none when not given")
    parser.add_argument("--congested", default="all", metavar="CASES",
                        help="congested cases to run, comma-separated, or 'none'; 'all' is "
                             "alltoall-64,alltoall-256,alltoall-1024,ring8-1024,nccl-a2a-1024,"
                             "qsgd-sra-512")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="approximate mode's tolerance; emulator.engine.APPROX_TOLERANCE "
                             "when not given")
    parser.add_argument("--naive-max-flows", type=int, default=70_000,
                        help="run the naive model on congested cases up to this many messages")
    parser.add_argument("--no-startup", dest="startup", action="store_false",
                        help="do not time qsgd-emu simulate with process start")
    parser.add_argument("--json", action="store_true",
                        help="print the tables as JSON: {rows, congested, startup, nccl}")


def _congested_names(text: str) -> list[str]:
    from qsgd_emu.bench.congested import CASES

    if text == "none":
        return []
    names = list(CASES) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CASES]
    if bad or not names:
        raise ValueError(f"--congested {text!r}: {bad or 'no case'} not known; known: "
                         f"{', '.join(CASES)}, all, none")
    return names


def run(args: argparse.Namespace) -> int:
    import topologies

    try:
        nbytes = topologies.parse_bytes(args.bytes)
    except ValueError as exc:
        raise ValueError(f"--bytes: {exc}") from None
    if nbytes < 1:
        raise ValueError(f"--bytes {args.bytes!r} must be at least 1 byte")
    sizes = [n for n in args.sizes if n <= args.max_gpus]
    bad = [n for n in sizes if n < HOSTS_PER_LEAF or n % HOSTS_PER_LEAF]
    if bad:
        raise ValueError(f"--sizes: {bad} are not positive multiples of {HOSTS_PER_LEAF} "
                         f"(GPUs per leaf)")
    if not sizes:
        raise ValueError(f"--max-gpus {args.max_gpus} leaves none of --sizes {list(args.sizes)}")
    if not args.budget_s > 0:
        raise ValueError(f"--budget-s {args.budget_s!r} must be > 0")
    names = _congested_names(args.congested)
    from emulator.engine import APPROX_TOLERANCE

    tolerance = APPROX_TOLERANCE if args.tolerance is None else args.tolerance
    if not 0.0 < tolerance < 0.5:
        raise ValueError(f"--tolerance {args.tolerance!r} must be in (0, 0.5)")
    report = None if args.json else (lambda r: print(
        f"  {r['gpus']} GPUs: " + (f"skipped ({r['skipped']})" if r.get("skipped") else
                                   f"engine {r['engine_s']:.2f} s"
                                   + ("" if r["naive_s"] is None else
                                      f", naive {r['naive_s']:.2f} s")),
        file=sys.stderr, flush=True))
    nccl_sizes = args.nccl or ()
    bad = [n for n in nccl_sizes if n < 16 or n % 8]
    if bad:
        raise ValueError(f"--nccl: {bad} are not multiples of 8 GPUs of at least 16 (two nodes)")
    # Start-up first: the cases below leave this process holding gigabytes, and a child
    # started beside them pays for it in page faults (1.13 s after them, 0.85 s before).
    startup = startup_times() if args.startup else []
    rows = run_bench(sizes, nbytes, naive_max=args.naive_max, budget_s=args.budget_s,
                     progress=report, events_max=args.events_max)
    nccl_rows = [nccl_case(n, nbytes) for n in sorted(nccl_sizes)]
    congested = run_congested(names, tolerance=tolerance, naive_max_flows=args.naive_max_flows,
                              progress=None if args.json else (lambda r: print(
                                  f"  {r['case']}: engine {r['engine_s']:.2f} s",
                                  file=sys.stderr, flush=True)))
    if args.json:
        print(json.dumps({"rows": rows, "congested": congested, "startup": startup,
                          "nccl": nccl_rows}, indent=1))
    else:
        print(format_table(rows, congested, startup))
        if nccl_rows:
            print()
            print(format_nccl_table(nccl_rows))
    return 0
