"""``qsgd-emu recommend``: the fastest QSGD widths per layer group (DDP bucket) under a budget.

Example::

    qsgd-emu recommend --trace trace.json --topology 'cluster:dgx_a100x{N}' --world-sizes 64,512 \\
        --device A100 --variance-as-bits 4 [--max-variance 0.05 | --max-bits-per-element 3.5] \\
        [--transports qsgd_allgather] [--bits 2,3,4,8] [--json] [--out rec.json]

For each world size: the recommended transport and widths, ready to paste into ``QSGDState``,
its predicted iteration time, speedup over fp32 and fp16 and variance increase, how many
candidates were predicted, and the Pareto front of speedup against variance increase with the
uniform-width configurations marked (``U``). The trace needs variance records
(``qsgd-emu measure`` writes them); ``--model`` measures one first.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from qsgd_emu import computeargs
from qsgd_emu.commands.study import int_list, _names
from qsgd_emu.outputs import output_file, write_json

TRANSPORTS = ("qsgd_allgather", "qsgd_scatter_reduce_allgather")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="PATH", help="a PayloadTrace with variance records (qsgd-emu measure)")
    src.add_argument("--model", help="measure this model first (name or pkg.mod:Class)")
    parser.add_argument("--measure-device", default="auto", choices=("auto", "cpu", "meta"),
                        help="where --model is measured: auto/cpu run real steps here (their "
                             "gradients give the variance records a variance budget needs); "
                             "meta records its layout and operators without running it (any "
                             "size), enough for --parallelism and --max-bits-per-element")
    parser.add_argument("--measure-batch-size", type=computeargs.positive_int("measure-batch-size"),
                        help="samples per iteration when measuring (default: 32 on CUDA, 2 on "
                             "CPU); what is predicted is --batch-size")
    parser.add_argument("--iterations", type=int, default=2, help="measured iterations")
    parser.add_argument("--topology", default="cluster:dgx_a100x{N}", metavar="SPEC",
                        help="topology spec; {N} = machines for the world size, {n} = GPUs")
    parser.add_argument("--world-sizes", type=int_list("world-sizes"), default="64",
                        help="comma-separated GPU counts")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--max-variance", type=float, metavar="V",
                        help="largest relative increase of the whole-model gradient variance")
    budget.add_argument("--variance-as-bits", type=int, metavar="B",
                        help="the variance budget of uniform B-bit QSGD all-gather at each world size")
    budget.add_argument("--max-bits-per-element", type=float, metavar="B",
                        help="largest mean bits per compressed element")
    parser.add_argument("--transports", type=_names, default=",".join(TRANSPORTS),
                        help="comma-separated compressed transports allowed")
    parser.add_argument("--bits", type=int_list("bits"),
                        help="comma-separated widths allowed (default: all the trace measured)")
    computeargs.add_arguments(parser)
    parser.add_argument("--parallelism", default="ddp", metavar="STRATEGIES",
                        help="ddp (default): QSGD widths per DDP bucket; 'auto' or a comma-separated "
                             "list of strategies (ddp, zero1, zero2, zero3, fsdp, fsdp_grad_op, "
                             "hsdp): the fastest strategy, transport and uniform width (--bits, "
                             "default 8,4) that fit the GPU's memory")
    parser.add_argument("--exhaustive", action="store_true",
                        help="evaluate every combination instead of the greedy search (small cases)")
    parser.add_argument("--workers", type=_workers_arg, default="auto",
                        help="local processes that simulate the distinct collective sizes "
                             f"first; auto (default): one per usable core from {AUTO_FROM_GPUS} "
                             "GPUs up, else 1")
    parser.add_argument("--out", metavar="PATH", type=output_file,
                        help="write the recommendations as JSON here (folders are created)")
    parser.add_argument("--json", action="store_true", help="print the recommendations as JSON")


#: From this many GPUs a search's distinct sizes take seconds each, which repays a process
#: per core (each imports and routes the graph once, 1-2 s): measured on 2 cores, 64 GPUs
#: 5.5 -> 4.0 s, 512 GPUs about 95 -> 53 s (benchmarks/RESULTS.md).
AUTO_FROM_GPUS = 64


def _workers_arg(text: str):
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not 'auto' or an integer >= 1")
    return n


def workers_for(workers, world_size: int) -> int:
    """Processes for a search at ``world_size`` GPUs: ``workers``, or for ``"auto"`` the
    usable cores from :data:`AUTO_FROM_GPUS` GPUs up and 1 below."""
    if workers != "auto":
        return workers
    if world_size < AUTO_FROM_GPUS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


#: budget option (its argparse dest) -> the kind of :func:`emulator.budget_for`
BUDGET_OPTIONS = {"max_variance": "variance", "variance_as_bits": "variance_as_bits",
                  "max_bits_per_element": "bits_per_element"}


def _budget_spec(args) -> tuple[str, float, str]:
    """(kind, value, option) of the budget option given."""
    for dest, kind in BUDGET_OPTIONS.items():
        if getattr(args, dest) is not None:
            return kind, getattr(args, dest), "--" + dest.replace("_", "-")
    raise ValueError("give one of --max-variance, --variance-as-bits, --max-bits-per-element")


def _budget(args, trace, world_size: int):
    import emulator

    kind, value, option = _budget_spec(args)
    return emulator.budget_for(trace, world_size, kind, value, name=option)


#: front rows printed (the uniform and recommended points always, others evenly spaced)
MAX_ROWS = 24


def _thin(front, best) -> list:
    if len(front) <= MAX_ROWS:
        return list(front)
    keep = {i for i, c in enumerate(front) if c.uniform or c == best}
    rest = [i for i in range(len(front)) if i not in keep]
    room = max(0, MAX_ROWS - len(keep))
    keep |= {rest[round(j * (len(rest) - 1) / max(room - 1, 1))] for j in range(room)} if room else set()
    return [front[i] for i in sorted(keep)][:max(MAX_ROWS, len(keep))]


def format_text(rec) -> str:
    b = rec.best
    lines = [
        f"{rec.topology} at {rec.world_size} GPUs, budget {rec.budget.describe()}: "
        f"{rec.evaluated} candidates predicted ({rec.method}) in {rec.search_s:.1f} s",
        f"  recommended: {b.transport}, widths per bucket {list(b.bits)} "
        f"({b.bits_per_element:.2f} bits/element), variance increase {b.variance:.4g}",
        f"  iteration {b.iteration_s * 1e3:.2f} ms; fp32 {rec.fp32_s * 1e3:.2f} ms "
        f"(speedup {rec.speedup_fp32:.2f}x), fp16 {rec.fp16_s * 1e3:.2f} ms (speedup {rec.speedup_fp16:.2f}x)",
        f"  {rec.state_snippet()}",
        *([f"  note: {rec.note}"] if rec.note else []),
        *[f"  skipped {t}: {why}" for t, why in rec.extra.get("skipped_transports", {}).items()],
        f"  Pareto front (U = uniform widths; {len(rec.front)} points"
        f"{f', {MAX_ROWS} shown, --json has all' if len(rec.front) > MAX_ROWS else ''}):",
        "     iter ms  speedup  variance  bits/el  transport                      widths",
    ]
    for c in _thin(rec.front, rec.best):
        lines.append(f"  {'U' if c.uniform else ' '} {c.iteration_s * 1e3:8.2f}  {rec.fp32_s / c.iteration_s:6.2f}x  "
                     f"{c.variance:8.4g}  {c.bits_per_element:7.2f}  {c.transport:<29}  {list(c.bits)}")
    return "\n".join(lines)


def _strategies(args, trace) -> int:
    """``--parallelism`` other than ddp: the strategy recommendation per world size."""
    import emulator

    kind, value, option = _budget_spec(args)
    out = []
    for w in args.world_sizes:
        G, compute = _cluster(args, trace, w)
        # the budget where it applies, the strategies, the widths: as the dashboard asks
        choice = emulator.recommend_parallelism(
            trace, G, world_size=w, compute=compute, parallelism=args.parallelism,
            bits=args.bits, budget=(kind, value), budget_name=option)
        out.append(choice)
        if not args.json:
            b = choice.best
            print(f"{args.topology} at {w} GPUs ({choice.device_memory}): "
                  f"{b.strategy} with {b.transport}"
                  f"{'' if b.transport == 'fp32' else f' {b.bits}-bit'}, "
                  f"{b.iteration_s * 1e3:.1f} ms/iteration, {b.memory_per_gpu / 1e9:.1f} GB per GPU")
            for o in choice.options:
                it = "does not fit" if not o.fits else f"{o.iteration_s * 1e3:9.1f} ms"
                print(f"  {o.strategy:<13} {o.transport:<30} {o.bits:>2}-bit  {it:>14}  "
                      f"{o.memory_per_gpu / 1e9:7.1f} GB")
            for note in choice.notes:
                print(f"  note: {note}")
    doc = {"model": trace.model, "topology": args.topology,
           "strategies": [c.to_dict() for c in out]}
    if args.out:
        write_json(args.out, doc)
    if args.json:
        print(json.dumps(doc, indent=1))
    return 0


def _cluster(args, trace, world_size: int):
    """The topology at ``world_size`` GPUs and the compute model the options ask for on it."""
    import emulator

    G = emulator.topology_for(args.topology, world_size)
    return G, emulator.ComputeModel.for_topology(G, trace, device=args.device,
                                                 batch_size=args.batch_size,
                                                 precision=args.precision, codec=args.codec,
                                                 attention=args.attention_kernel)


def run(args) -> int:
    import emulator
    import qsgd

    if args.trace:
        trace = qsgd.PayloadTrace.load(args.trace)
    else:
        from qsgd_emu.commands.study import measure_trace
        trace = measure_trace(args.model, 4, args.measure_batch_size, args.iterations,
                              device=args.measure_device)
    trace = computeargs.operators_for(trace, args)
    if args.parallelism != "ddp":
        return _strategies(args, trace)
    if not trace.has_variance:
        how = ("--measure-device cpu (or auto)" if args.model else
               "qsgd-emu measure --variance-bits 2,3,4,5,6,8")
        raise ValueError(f"per-bucket widths are chosen by their gradient variance, and "
                         f"{trace.model}'s trace has no variance records (a step recorded on the "
                         f"meta device has none): measure it with {how}, or ask for a strategy "
                         f"with --parallelism auto")
    out = []
    for w in args.world_sizes:
        G, compute = _cluster(args, trace, w)
        progress = None if args.json else (lambda msg, w=w: print(f"  {w} GPUs: {msg}", file=sys.stderr,
                                                                   flush=True))
        rec = emulator.recommend(trace, G, world_size=w, budget=_budget(args, trace, w),
                                 transports=args.transports, bits=args.bits, compute=compute,
                                 exhaustive=args.exhaustive, progress=progress,
                                 workers=workers_for(args.workers, w))
        out.append(rec)
        if w == args.world_sizes[0]:
            computeargs.say_assumed({args.topology: compute})
        if not args.json:
            print(format_text(rec), flush=True)
    doc = {"model": trace.model, "topology": args.topology, "device": compute.device,
           "precision": compute.precision, "batch_size": compute.batch_size,
           "recommendations": [r.to_dict() for r in out]}
    if args.out:
        write_json(args.out, doc)
        if not args.json:
            print(f"wrote {args.out}")
    if args.json:
        print(json.dumps(doc, indent=1))
    return 0
