"""``qsgd-emu simulate``: one collective, or a nccl-tests size sweep, over a topology.

Examples::

    qsgd-emu simulate --topology cluster:dgx_a100x8 --op allreduce --bytes 102MB
    qsgd-emu simulate --topology dgx_h100 --bytes 1GiB --algorithm nccl_ring --protocol LL128
    qsgd-emu simulate --topology fat_tree:k=8,bw=100Gbit --op allreduce --algorithm ring \\
        --bytes 256MB
    qsgd-emu simulate --topology dgx_a100 --min-bytes 8 --max-bytes 4G --factor 2
    qsgd-emu simulate --topology ring:8 --bytes 64MB --degrade gpu0,gpu1,0.5 --straggler 3,20us

The default algorithm, ``nccl``, runs the collective as NCCL would on the topology (channels
over NVLinks and rail-aligned NICs; Ring, Tree, NVLS or NVLSTree with LL, LL128 or Simple,
whichever NCCL's cost model finds fastest for the size) and says what it chose;
``--algorithm nccl_ring`` (``nccl_tree``, ``nccl_nvls``, ...) and ``--protocol`` (``LL``,
``LL128``, ``Simple`` or an NCCL_PROTO list such as ``^LL``) override the choice, ``--channels``
the channel count; ``ring``, ``tree``, ``rhd``, ... are the textbook algorithms.

One collective prints its time, algbw, busbw, flows, engine events, the peak link
utilization and the busiest links. A sweep prints the columns of nccl-tests'
``all_reduce_perf`` (time in us, bandwidths in GB/s with GB = 1e9 bytes), so a prediction
can be read next to a real log. Sizes read as nccl-tests reads them: ``4G`` (a bare prefix)
is 4 GiB, as in ``all_reduce_perf -e 4G``; ``4GiB`` is the same; ``4GB`` is 4e9 bytes.
``--json`` prints the result (or the list of rows) with SI values: seconds and bytes/s.

Faults are what-ifs applied to a copy of the topology: ``--degrade U,V,FACTOR`` (link U-V at
FACTOR of its bandwidth), ``--remove U,V`` (link down, flows re-route) and
``--straggler RANK,DELAY`` (RANK starts DELAY late, e.g. ``3,20us``). U and V are node ids
(see ``qsgd-emu topology SPEC --json``) or GPU ranks. Each option may be repeated.
"""
from __future__ import annotations

import argparse
import json

import topologies

from .faultoptions import FAULT_FORMS, describe_fault, int_option as _int_option, parse_faults

#: --method choices.
METHODS = ("auto", "engine", "closed-form")
#: With --method auto and no --time-limit: the engine when it should take under this (s).
AUTO_ENGINE_S = 20.0
#: Without --time-limit: refuse what would take longer than this (s); a typo of two zeros in
#: a cluster's size is refused at once rather than left running.
DEFAULT_LIMIT_S = 600.0

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topology", required=True, metavar="SPEC",
                        help="topology spec (ring:8, fat_tree:k=8,bw=100Gbit, dgx_a100, ...) "
                             "or a .json/.yaml/.graphml file")
    parser.add_argument("--op", default="allreduce",
                        help="collective: allreduce, allgather, reduce_scatter, broadcast, "
                             "alltoall")
    parser.add_argument("--algorithm", default="nccl",
                        help="nccl (NCCL's choice), nccl_ring, nccl_tree, nccl_nvls, "
                             "nccl_nvls_tree, nccl_p2p, or a textbook one: ring, tree, rhd, ...")
    parser.add_argument("--protocol", default=None,
                        help="NCCL algorithms: LL, LL128, Simple or an NCCL_PROTO list "
                             "(e.g. ^LL); default NCCL's choice for the size")
    parser.add_argument("--channels", default=None,
                        help="NCCL algorithms: channels (rings) to use; default NCCL's")
    parser.add_argument("--nccl-buffsize", metavar="SIZE", default=None,
                        help="NCCL algorithms: NCCL_BUFFSIZE, the Simple protocol's buffer per "
                             "connection (default 4MiB; at least 4096 bytes)")
    parser.add_argument("--bytes", metavar="SIZE",
                        help="one collective of SIZE (e.g. 256MB, 64MiB; nccl-tests convention: "
                             "per rank for allreduce, the total for allgather/reduce_scatter)")
    parser.add_argument("--min-bytes", metavar="SIZE", help="sweep: first size (nccl-tests -b)")
    parser.add_argument("--max-bytes", metavar="SIZE", help="sweep: largest size (nccl-tests -e)")
    parser.add_argument("--factor", default="2", help="sweep: size ratio, > 1 (nccl-tests -f; "
                        "default 2)")
    parser.add_argument("--dtype", default="float32",
                        help="sweep: element type of the count column")
    parser.add_argument("--chunks", default="1", help="pipelining chunks per message")
    parser.add_argument("--ranks", metavar="N", help="use GPU ranks 0..N-1 (default all GPUs)")
    parser.add_argument("--top", default="5", help="busiest links to list")
    for option, (_, form, help_text) in FAULT_FORMS.items():
        parser.add_argument(option, action="append", default=[], metavar=form, help=help_text)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--exact", dest="approx", action="store_false",
                      help="every flow finishes at its own time (default)")
    mode.add_argument("--approx", nargs="?", const="default", default=None, metavar="TOL",
                      help="approximate mode for big sweeps: a flow may finish TOL of its "
                           "duration early to share an event (default 1e-3)")
    parser.set_defaults(approx=None)
    parser.add_argument("--method", default="auto", choices=METHODS,
                        help="engine: simulate every transfer; closed-form: NCCL's cost model "
                             "with link loads, calibrated by the engine on a smaller cluster "
                             "of the same machines (NCCL algorithms); auto: the engine when it "
                             "should take under --time-limit (without one, "
                             f"{AUTO_ENGINE_S:g} s), else the closed form, named in the output")
    parser.add_argument("--time-limit", default=None, metavar="TIME",
                        help="refuse up front what would take longer (e.g. 30s, 2min; without "
                             f"one, {DEFAULT_LIMIT_S / 60:g} min), saying how to ask a smaller "
                             "question; given, it is also --method auto's budget for the engine")
    parser.add_argument("--json", action="store_true", help="print JSON (SI units)")


# -- parsing at the edge: every error names the option and the value ----------------------
def _size_option(option: str, text: str) -> int:
    try:
        value = topologies.parse_bytes(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    if value < 1:
        raise ValueError(f"{option} {text!r} must be at least 1 byte")
    return value


def _mode_option(args) -> dict:
    """``exact``/``tolerance`` of :func:`emulator.simulate` from --exact/--approx [TOL]."""
    if not args.approx:
        return {}
    if args.approx == "default":
        return {"exact": False}
    try:
        tol = float(args.approx)
    except ValueError:
        raise ValueError(f"--approx {args.approx!r} is not a number") from None
    if not 0.0 < tol < 0.5:
        raise ValueError(f"--approx {args.approx!r} must be a fraction in (0, 0.5)")
    return {"exact": False, "tolerance": tol}


def _factor_option(text: str) -> float | int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--factor {text!r} is not a number") from None
    if not value > 1 or value == float("inf"):
        raise ValueError(f"--factor {text!r} must be a finite number > 1")
    return int(value) if value.is_integer() else value


# -- output ----------------------------------------------------------------------------------
def nccl_time(seconds: float) -> str:
    """A time in us with nccl-tests' precision: 2 decimals below 100 us, 1 below 10 ms."""
    us = seconds * 1e6
    return f"{us:7.0f}" if us >= 1e4 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def format_sweep(rows: list[dict], title: str = "") -> str:
    """Rows of :func:`emulator.size_sweep` as nccl-tests' table (widths of src/common.cu)."""
    lines = [f"# {title}"] if title else []
    lines += [
        "#",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'time':>7}  {'algbw':>6}  "
        f"{'busbw':>6}",
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  "
        f"{'(GB/s)':>6}",
    ]
    for r in rows:
        lines.append(f"{r['size']:>12}  {r['count']:>12}  {r['type']:>8}  {r['redop']:>6}  "
                     f"{nccl_time(r['time_s'])}  {r['algbw'] / 1e9:6.2f}  {r['busbw'] / 1e9:6.2f}")
    avg = sum(r["busbw"] for r in rows) / len(rows) / 1e9
    lines += [f"# Avg bus bandwidth    : {avg:g} ", "#"]
    return "\n".join(lines)


def busiest_links(result, top: int) -> list[dict]:
    """The ``top`` channels with the highest mean utilization (bytes / (capacity * time))."""
    ranked = sorted(result.links, key=lambda l: (-l.utilization(result.time_s), l.u, l.v))
    return [{"u": l.u, "v": l.v, "capacity": l.capacity, "bytes": l.bytes, "busy_s": l.busy_s,
             "utilization": l.utilization(result.time_s), "peak_utilization": l.peak_utilization}
            for l in ranked[:top]]


def describe_choice(d: dict) -> str:
    """``NCCL Ring/LL128, 8 channels`` from a schedule's ``detail["nccl"]``."""
    s = "" if d["channels"] == 1 else "s"
    return f"NCCL {d['algorithm']}/{d['protocol']}, {d['channels']} channel{s}"


def describe_sweep_choices(rows: list[dict]) -> str:
    """NCCL's choices over a sweep as size ranges: ``8..65536 B Tree/LL; ...``."""
    runs: list = []
    for r in rows:
        d = r.get("nccl")
        if d is None:
            return ""
        label = f"{d['algorithm']}/{d['protocol']}"
        if runs and runs[-1][0] == label:
            runs[-1][2] = r["size"]
        else:
            runs.append([label, r["size"], r["size"]])
    return "; ".join(f"{lo}..{hi} B {label}" for label, lo, hi in runs)


def format_result(result, topology: str, faults: list, top: int, choice: dict | None = None) -> str:
    p = len(result.ranks)
    rows = [
        ("topology", topology),
        ("collective", f"{result.op} by {result.algorithm}, {p} ranks, {result.nbytes:,} B"),
        ("time", f"{result.time_s * 1e6:,.2f} us"),
        ("algbw", f"{result.algbw / 1e9:,.2f} GB/s"),
        ("busbw", f"{result.busbw / 1e9:,.2f} GB/s (algbw x {result.busbw / result.algbw:.4g})"),
        ("flows", f"{result.flows:,}"),
        ("events", f"{result.events:,}"),
        ("peak link utilization", f"{result.peak_utilization * 100:.1f} %"),
    ]
    if choice:
        rows.insert(2, ("chosen", describe_choice(choice)))
    if result.copies > 1:
        method = (f"engine, one transfer per class of {result.copies:,} equivalent ones "
                  f"(a shift of {p // result.copies:,} ranks maps the schedule and its links "
                  f"onto themselves; exact)")
    else:
        method = "engine: every transfer simulated"
    rows.insert(2 + bool(choice), ("method", method))
    if faults:
        rows.insert(2, ("faults", "; ".join(describe_fault(f) for f in faults)))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    links = busiest_links(result, top)
    if links:
        lines.append("busiest links (mean utilization = bytes / (capacity x time)):")
        name_w = max(len(f"{l['u']} -> {l['v']}") for l in links)
        for l in links:
            lines.append(f"  {l['u'] + ' -> ' + l['v']:<{name_w}}  {l['utilization'] * 100:5.1f} %"
                         f"  peak {l['peak_utilization'] * 100:5.1f} %  {l['bytes']:>14,} B  "
                         f"{l['capacity'] / 1e9:,.2f} GB/s")
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    import emulator

    sweep = args.min_bytes is not None or args.max_bytes is not None
    if sweep and args.bytes is not None:
        raise ValueError("--bytes and --min-bytes/--max-bytes exclude each other: one "
                         "collective or a sweep")
    if not sweep and args.bytes is None:
        raise ValueError("give --bytes SIZE (one collective) or --min-bytes and --max-bytes "
                         "(a sweep)")
    for option, value in (("--min-bytes", args.min_bytes), ("--max-bytes", args.max_bytes)):
        if sweep and value is None:
            raise ValueError(f"{option} is missing: a sweep needs --min-bytes and --max-bytes")
    if (args.op, args.algorithm) not in emulator.ALGORITHMS:
        known = sorted(a for o, a in emulator.ALGORITHMS if o == args.op)
        if not known:
            ops = sorted({o for o, _ in emulator.ALGORITHMS})
            raise ValueError(f"--op {args.op!r} is not known; known: {', '.join(ops)}")
        raise ValueError(f"--algorithm {args.algorithm!r} is not known for --op {args.op}; "
                         f"known: {', '.join(known)}")
    chunks = _int_option("--chunks", args.chunks, 1)
    top = _int_option("--top", args.top, 0)
    nccl_alg = (args.op, args.algorithm) in emulator.NCCL_ALGORITHMS
    channels = None if args.channels is None else _int_option("--channels", args.channels, 1)
    buffsize = (None if args.nccl_buffsize is None
                else _size_option("--nccl-buffsize", args.nccl_buffsize))
    for option, value in (("--protocol", args.protocol), ("--channels", args.channels),
                          ("--nccl-buffsize", args.nccl_buffsize)):
        if value is not None and not nccl_alg:
            raise ValueError(f"{option} {value!r} applies to NCCL algorithms only (nccl, "
                             f"nccl_ring, ...), not --algorithm {args.algorithm}")
    given = args.time_limit is not None
    limit = _limit_option(args.time_limit) if given else DEFAULT_LIMIT_S
    from qsgd_emu.progress import Watch

    with Watch("simulate") as watch:
        return _run(args, emulator, watch, limit, given, chunks, top, nccl_alg, channels,
                    buffsize)


def _limit_option(text: str) -> float:
    try:
        value = topologies.parse_time(text)
    except ValueError as exc:
        raise ValueError(f"--time-limit {text!r}: {exc}") from None
    if not value > 0:
        raise ValueError(f"--time-limit {text!r} must be a positive time (e.g. 30s, 2min)")
    return value


def _spec_gpus(spec: str) -> int | None:
    """GPUs a ``cluster:`` spec will have, known before building it (None otherwise)."""
    try:
        family, kw = topologies.parse_spec(spec)
    except (ValueError, TypeError):
        return None
    if family != "cluster" or not isinstance(kw.get("node", "dgx_a100"), str):
        return None
    preset = topologies.PRESETS.get(kw.get("node", "dgx_a100"))
    if preset is None:
        return None
    return int(kw.get("nodes", 2)) * len(topologies.gpus(preset()))


def _refuse(what: str, seconds: float, limit: float, how: str) -> ValueError:
    from qsgd_emu.progress import duration

    return ValueError(f"simulate would take about {duration(seconds)} ({what}), more than "
                      f"--time-limit {duration(limit)}. Make it smaller: {how}, or a larger "
                      f"--time-limit.")


def _run(args, emulator, watch, limit, given, chunks, top, nccl_alg, channels, buffsize) -> int:
    from emulator import fastpath
    from qsgd_emu.progress import duration

    guess = _spec_gpus(args.topology)
    if guess is not None:
        if fastpath.analysis_seconds(guess) > limit:
            family, kw = topologies.parse_spec(args.topology)
            per = guess // int(kw.get("nodes", 2))
            fits = int((limit - fastpath.SECONDS_FIXED) / fastpath.SECONDS_PER_GPU) // per
            raise _refuse(f"{guess:,} GPUs to build and analyse before anything is timed",
                          fastpath.analysis_seconds(guess), limit,
                          f"fewer machines in the cluster spec (this limit fits about "
                          f"{max(fits, 1):,} of these {per}-GPU machines)")
        watch.stage(f"building {args.topology} ({guess:,} GPUs)", 0.25 * fastpath.SECONDS_FIXED,
                    fastpath.analysis_seconds(guess) - 0.25 * fastpath.SECONDS_FIXED)
    G = topologies.from_spec(args.topology)
    if buffsize is not None:
        from emulator.collectives.nccl.pipeline import Buffers

        Buffers(simple=buffsize)            # one-line error naming the value and the minimum
        G.graph["nccl_buffsize"] = buffsize
    n_gpus = len(topologies.gpus(G))
    nranks = n_gpus if args.ranks is None else _int_option("--ranks", args.ranks, 2)
    if nranks > n_gpus:
        raise ValueError(f"--ranks {args.ranks!r}: the topology has only {n_gpus} GPUs")
    if nranks < 2:
        raise ValueError(f"--topology {args.topology!r} has {n_gpus} GPU(s); a collective needs 2")
    faults = parse_faults(args, G, nranks)
    mode = _mode_option(args)
    name = G.graph.get("name", args.topology)
    if args.method == "closed-form" and (not nccl_alg or args.algorithm not in
                                          fastpath._names()):
        raise ValueError(f"--method closed-form covers NCCL's algorithms (nccl, nccl_ring, ...), "
                         f"not --algorithm {args.algorithm}")
    if args.method == "closed-form" and faults:
        raise ValueError("--method closed-form does not model faults: use --method engine")

    if args.min_bytes is not None or args.max_bytes is not None:
        return _sweep(args, emulator, watch, limit, G, nranks, faults, mode, chunks, channels,
                      name)

    nbytes = _size_option("--bytes", args.bytes)
    can_fast = nccl_alg and args.algorithm in fastpath._names() and not faults \
        and args.ranks is None
    engine_s = None
    choice = None
    if nccl_alg and args.algorithm in fastpath._names():
        watch.stage(f"analysing {nranks:,} GPUs as NCCL does and choosing",
                    fastpath.analysis_seconds(nranks) - fastpath.SECONDS_FIXED)
        system = emulator.NcclSystem.of(G, range(nranks))
        choice = emulator.nccl_plan(G, args.op, nbytes, range(nranks),
                                    algo=fastpath._names()[args.algorithm], proto=args.protocol,
                                    channels=channels, system=system).to_dict()
        n_tr = fastpath.transfers(system, args.op, choice, nbytes)
        engine_s = fastpath.engine_seconds(choice["algorithm"], n_tr)
        what = (f"NCCL {choice['algorithm']}/{choice['protocol']} on {nranks:,} GPUs: "
                f"{n_tr:,} transfers to simulate")
    budget = limit if given else AUTO_ENGINE_S
    method = args.method
    if method == "auto":
        method = "engine" if (engine_s is None or engine_s <= budget or not can_fast) \
            else "closed-form"
    if method == "engine" and engine_s is not None and engine_s > limit:
        how = ("--method closed-form (NCCL's cost model, calibrated: within "
               f"{max(fastpath.CALIBRATED_BOUND.values()):.0%} of the engine where both ran), "
               if can_fast else "") + "fewer machines, --ranks or a smaller --bytes"
        raise _refuse(what, engine_s, limit, how)

    if method == "closed-form":
        small, machines = fastpath.calibration_cluster(args.topology, system, choice, n_tr)
        watch.stage("the closed form" + (f", calibrated on {machines} machines by the engine"
                                         if small is not None else ""),
                    fastpath.CALIBRATION_S)
        if small is not None:
            fast = fastpath.calibrated_collective(G, args.op, args.algorithm, nbytes, small,
                                                  protocol=args.protocol, channels=channels,
                                                  system=system)
        else:
            fast = fastpath.closed_form_collective(G, args.op, args.algorithm, nbytes,
                                                   protocol=args.protocol, channels=channels,
                                                   system=system)
        if args.json:
            out = fast.to_dict()
            out.update(topology=name, time_us=fast.time_s * 1e6)
            print(json.dumps(out, indent=1))
        else:
            print(format_fast(fast, name, engine_s))
        return 0

    watch.stage("building the schedule", None if engine_s is None else 0.4 * engine_s,
                0.0 if engine_s is None else 0.6 * engine_s)
    sched = emulator.build_schedule(args.op, args.algorithm, nranks, nbytes, chunks=chunks,
                                    graph=G, protocol=args.protocol, channels=channels)
    est = engine_s if engine_s is not None else fastpath.engine_seconds(None, len(sched))
    watch.stage(f"simulating {len(sched):,} transfers", 0.6 * est)
    result = emulator.simulate(G, sched, faults=faults,
                               progress=lambda done, total: watch.fraction(done / total),
                               **mode)
    choice = sched.detail.get("nccl")
    if args.json:
        out = result.to_dict()
        out.update(topology=name, chunks=chunks, time_us=result.time_s * 1e6,
                   peak_utilization=result.peak_utilization,
                   busiest_links=busiest_links(result, top),
                   faults=[describe_fault(f) for f in faults], method="engine")
        if choice:
            out["nccl"] = choice
        print(json.dumps(out, indent=1))
    else:
        print(format_result(result, name, faults, top, choice))
    return 0


def _sweep(args, emulator, watch, limit, G, nranks, faults, mode, chunks, channels, name):
    lo, hi = _size_option("--min-bytes", args.min_bytes), _size_option("--max-bytes",
                                                                       args.max_bytes)
    if hi < lo:
        raise ValueError(f"--max-bytes {args.max_bytes!r} is smaller than --min-bytes "
                         f"{args.min_bytes!r}")
    from emulator.sweep import dtype_info

    try:
        dtype_info(args.dtype)
    except ValueError as exc:
        raise ValueError(f"--dtype: {exc}") from None
    factor = _factor_option(args.factor)
    watch.stage(f"a sweep of {len(emulator.sweep_sizes(lo, hi, factor))} sizes on "
                f"{nranks:,} GPUs")
    rows = emulator.size_sweep(G, args.op, args.algorithm, min_bytes=lo, max_bytes=hi,
                               factor=factor, ranks=nranks,
                               chunks=chunks, dtype=args.dtype, faults=faults,
                               protocol=args.protocol, channels=channels, **mode)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        fault_text = f"; faults: {'; '.join(describe_fault(f) for f in faults)}" if faults else ""
        chosen = describe_sweep_choices(rows)
        chosen = f"; NCCL chose {chosen}" if chosen else ""
        print(format_sweep(rows, f"qsgd-emu simulate (predicted): {args.op} by "
                                 f"{args.algorithm} on {name}, {nranks} ranks, {chunks} "
                                 f"chunk(s){fault_text}{chosen}"))
    return 0


def format_fast(fast, topology: str, engine_s) -> str:
    """A :class:`emulator.fastpath.FastResult` as :func:`format_result` prints a simulation,
    with the method and its measured error."""
    from qsgd_emu.progress import duration

    rows = [
        ("topology", topology),
        ("collective", f"{fast.op} by {fast.algorithm}, {fast.ranks} ranks, {fast.nbytes:,} B"),
        ("chosen", describe_choice(fast.nccl)),
        ("method", f"{fast.method}: within {fast.error:.0%} of the engine where both ran"
                   + (f" (the engine would take about {duration(engine_s)})"
                      if engine_s else "")),
        ("time", f"{fast.time_s * 1e6:,.2f} us"),
        ("algbw", f"{fast.algbw / 1e9:,.2f} GB/s"),
        ("busbw", f"{fast.busbw / 1e9:,.2f} GB/s (algbw x {fast.busbw / fast.algbw:.4g})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
