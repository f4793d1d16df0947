"""``qsgd-emu study``: what-if sweep over world sizes x bits x transports x topologies.

Example::

    qsgd-emu study --trace trace.json --topology 'cluster:dgx_a100x{N}' --world-sizes 8,64,512 \\
        --bits 32,16,8,4,2 --out out/study [--workers 2] [--cluster tcp://host:8786]

``--model NAME`` measures the model first (a short CPU/GPU run, as ``qsgd-emu measure``;
``--measure-device meta`` records its layout and operators without running it, at any size).
Writes DIR/study.csv, DIR/study.json, DIR/report.html and prints the summary table (``--json``:
the rows as JSON). A progress bar goes to stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from qsgd_emu import computeargs
from qsgd_emu.outputs import output_dir
from qsgd_emu.progress import ProgressBar

TRANSPORT_NAMES = ("fp32", "fp16", "qsgd_allgather", "qsgd_scatter_reduce_allgather")


def int_list(name: str):
    def parse(text: str) -> tuple[int, ...]:
        try:
            vals = tuple(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be comma-separated integers, got {text!r}")
        if not vals:
            raise argparse.ArgumentTypeError(f"--{name} must not be empty")
        return vals
    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


#: Topologies of a study when --topology is not given.
DEFAULT_TOPOLOGIES = ("cluster:dgx_a100x{N}",)


def add_arguments(parser: argparse.ArgumentParser, *, demo: bool = False,
                  topologies: tuple = DEFAULT_TOPOLOGIES) -> None:
    if not demo:
        src = parser.add_mutually_exclusive_group(required=True)
        src.add_argument("--trace", metavar="PATH", help="a PayloadTrace from qsgd-emu measure")
        src.add_argument("--model", help="measure this model first (name or pkg.mod:Class)")
        parser.add_argument("--measure-device", default="auto", choices=("auto", "cpu", "meta"),
                            help="where --model is measured: auto/cpu run real steps, "
                                 "gradients and codec here; meta records its layout and "
                                 "operators without running it (any size: a 70B model "
                                 "needs no memory), which the compute model times")
    parser.add_argument("--measure-bits", type=int, default=4, help="QSGD bits when measuring")
    parser.add_argument("--measure-batch-size", type=computeargs.positive_int("measure-batch-size"),
                        help="samples per iteration when measuring (default: 32 on CUDA, 2 on "
                             "CPU); what is predicted is --batch-size")
    parser.add_argument("--iterations", type=int, default=2, help="measured iterations")
    parser.add_argument("--topology", action="append", metavar="SPEC",
                        help="topology spec, repeatable; {N} = machines for the world size, {n} = "
                             f"GPUs (default: {' and '.join(topologies)})")
    parser.add_argument("--world-sizes", type=int_list("world-sizes"), default="8,64,512",
                        help="comma-separated GPU counts")
    parser.add_argument("--bits", type=int_list("bits"), default="32,16,8,4,2",
                        help="32 = fp32, 16 = fp16 (and QSGD 16), 2..15 QSGD")
    parser.add_argument("--transports", type=_names, default=",".join(TRANSPORT_NAMES),
                        help="comma-separated transports (also: powersgd, PyTorch's PowerSGD "
                             "hook at rank 1, a row of width 32; a strategy that reduce-scatters "
                             "takes fp32, fp16 and qsgd_scatter_reduce_allgather)")
    add_parallelism(parser)
    computeargs.add_arguments(parser)
    parser.add_argument("--algorithm", default="nccl",
                        help="allreduce algorithm of fp32/fp16: nccl (as NCCL runs it), or ring, "
                             "tree, ... for the textbook ones")
    parser.add_argument("--out", metavar="DIR", default=None if not demo else "out/demo", type=output_dir,
                        required=not demo, help="output directory")
    parser.add_argument("--workers", type=int, default=1, help="local processes")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--exact", dest="exact", action="store_true", default=False,
                      help="simulate every distinct collective")
    mode.add_argument("--approximate", dest="exact", action="store_false",
                      help="simulate a few sizes of each schedule shape and read the others "
                           "off checked lines (the default; emulator.interpolation, rows within "
                           "4e-5 of exact studies in benchmarks/RESULTS.md)")
    parser.add_argument("--time-limit", type=float, default=60.0, metavar="MINUTES",
                        help="refuse a study estimated (from its smallest world size, timed "
                             "first) to take longer, and say how to make it smaller")
    parser.add_argument("--cluster", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://host:8786")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def add_parallelism(parser: argparse.ArgumentParser) -> None:
    """``--parallelism``, ``--weight-bits`` and ``--shard-size`` (study, demo, recommend)."""
    parser.add_argument("--parallelism", default="ddp", choices=computeargs.STRATEGY_CHOICES,
                        help="data-parallel strategy: ddp, fsdp (FULL_SHARD), fsdp_grad_op "
                             "(SHARD_GRAD_OP), hsdp (HYBRID_SHARD), zero1, zero2, zero3")
    parser.add_argument("--weight-bits", type=int, default=None,
                        help="QSGD bits of the parameter all-gathers in the QSGD rows of a "
                             "sharded strategy (QSDP); default dense")
    parser.add_argument("--shard-size", type=computeargs.positive_int("shard-size"),
                        help="HSDP's shard group (default: the GPUs of a machine)")


def sharded_options(args) -> dict:
    """StudyConfig's strategy keywords from ``args`` (the transports a strategy takes when
    --transports was left at its default)."""
    import qsgd

    kw = {"parallelism": getattr(args, "parallelism", "ddp"),
          "weight_bits": getattr(args, "weight_bits", None),
          "shard_size": getattr(args, "shard_size", None)}
    if kw["parallelism"] != "ddp" and tuple(args.transports) == TRANSPORT_NAMES \
            and qsgd.STRATEGIES[kw["parallelism"]].grads == "reduce_scatter":
        kw["transports"] = None
    return kw


def measure_trace(model: str, bits: int, batch_size: int | None, iterations: int, seed: int = 0,
                  device: str = "auto"):
    """Measure ``model`` on this machine (``qsgd.measure``), reporting progress on stderr;
    ``device="meta"`` records its layout and operators only (no step runs)."""
    import qsgd

    import torch

    cfg = qsgd.QSGDConfig.from_bits(bits)
    if device == "meta":
        print(f"recording {model}'s layout and operators on the meta device (no step runs)...",
              file=sys.stderr, flush=True)
        return qsgd.measure(model, cfg, device="meta", seed=seed)
    if batch_size is None:
        batch_size = 32 if torch.cuda.is_available() else 2
    print(f"measuring {model} (batch {batch_size}, {iterations} iterations, QSGD {bits} bits)...",
          file=sys.stderr, flush=True)
    return qsgd.measure(model, cfg, iterations=iterations, batch_size=batch_size, device=device,
                        seed=seed, progress=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))


def run_with(args, trace) -> int:
    """Run the study of ``args`` on ``trace``, write DIR/study.{csv,json}, report.html, print."""
    import emulator

    trace = computeargs.operators_for(trace, args)
    cfg = emulator.StudyConfig(**{
        "trace": trace, "world_sizes": args.world_sizes, "bits": args.bits,
        "transports": args.transports, "topologies": tuple(args.topology or DEFAULT_TOPOLOGIES),
        "device": args.device, "algorithm": args.algorithm, "exact": args.exact,
        "batch_size": args.batch_size, "precision": args.precision, "codec": args.codec,
        "attention": args.attention_kernel, "max_gpus": getattr(args, "max_gpus", None), **sharded_options(args)})
    # One compute model per topology for the rows and the report's timeline, said up front.
    models = emulator.resolve_compute(cfg)
    computeargs.say_assumed(models)
    cfg = dataclasses.replace(cfg, compute=models)
    for note in emulator.placement_notes(cfg):
        print(f"note: {note}", file=sys.stderr)
    if not args.time_limit > 0:
        raise ValueError(f"--time-limit {args.time_limit!r} must be > 0 minutes")
    bar = ProgressBar("study")
    study = emulator.run_study(cfg, progress=bar, task_progress=bar.detail, workers=args.workers,
                               cluster=args.cluster, time_limit_s=60 * args.time_limit)
    os.makedirs(args.out, exist_ok=True)
    study.save_csv(os.path.join(args.out, "study.csv"))
    study.save_json(os.path.join(args.out, "study.json"))
    report = emulator.write_report(
        study, os.path.join(args.out, "report.html"), title=f"QSGD what-if study: {trace.model}",
        notes=f"Payloads measured on {trace.device_name}; compute: "
              f"{'; '.join(sorted({m.source for m in models.values()}))}. Speedups are against "
              f"fp32 allreduce at the same size and topology.")
    if args.json:
        print(json.dumps([r.to_dict() for r in study.rows], indent=1))
    else:
        print(study.table())
        print("\n" + "\n".join(study.conclusions()))
        print(f"\nwrote {os.path.join(args.out, 'study.csv')}, study.json and {report}")
    return 0


def run(args) -> int:
    import qsgd

    if args.trace:
        trace = qsgd.PayloadTrace.load(args.trace)
    else:
        trace = measure_trace(args.model, args.measure_bits, args.measure_batch_size,
                              args.iterations, device=args.measure_device)
    return run_with(args, trace)
