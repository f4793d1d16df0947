"""``qsgd-emu study``: what-if sweep over world sizes x bits x transports x topologies.

Example::

    qsgd-emu study --trace trace.json --topology 'cluster:dgx_a100x{N}' --world-sizes 8,64,512 \\
        --bits 32,16,8,4,2 --out out/study [--workers 2] [--cluster tcp://host:8786]

``--model NAME`` measures the model first (a short CPU/GPU run, as ``qsgd-emu measure``).
Writes DIR/study.csv, DIR/study.json, DIR/report.html and prints the summary table (``--json``:
the rows as JSON). A progress bar goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

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
    parser.add_argument("--measure-bits", type=int, default=4, help="QSGD bits when measuring")
    parser.add_argument("--batch-size", type=int,
                        help="samples per iteration when measuring (default: 32 on CUDA, 2 on CPU)")
    parser.add_argument("--iterations", type=int, default=2, help="measured iterations")
    parser.add_argument("--topology", action="append", metavar="SPEC",
                        help="topology spec, repeatable; {N} = machines for the world size, {n} = "
                             f"GPUs (default: {' and '.join(topologies)})")
    parser.add_argument("--world-sizes", type=int_list("world-sizes"), default="8,64,512",
                        help="comma-separated GPU counts")
    parser.add_argument("--bits", type=int_list("bits"), default="32,16,8,4,2",
                        help="32 = fp32, 16 = fp16 (and QSGD 16), 2..15 QSGD")
    parser.add_argument("--transports", type=_names, default=",".join(TRANSPORT_NAMES),
                        help="comma-separated transports")
    parser.add_argument("--device", default="measured",
                        help="target accelerator of the compute model: measured, K80, V100, A100, H100, H200")
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


def measure_trace(model: str, bits: int, batch_size: int | None, iterations: int, seed: int = 0):
    """Measure ``model`` on this machine (``qsgd.measure``), reporting progress on stderr."""
    import qsgd

    import torch

    cfg = qsgd.QSGDConfig.from_bits(bits)
    if batch_size is None:
        batch_size = 32 if torch.cuda.is_available() else 2
    print(f"measuring {model} (batch {batch_size}, {iterations} iterations, QSGD {bits} bits)...",
          file=sys.stderr, flush=True)
    return qsgd.measure(model, cfg, iterations=iterations, batch_size=batch_size, device="auto",
                        seed=seed, progress=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))


def run_with(args, trace) -> int:
    """Run the study of ``args`` on ``trace``, write DIR/study.{csv,json}, report.html, print."""
    import emulator

    # One compute model for the rows and the report's timeline alike.
    compute = emulator.ComputeModel.for_device(args.device, trace)
    cfg = emulator.StudyConfig(trace=trace, world_sizes=args.world_sizes, bits=args.bits,
                               transports=args.transports,
                               topologies=tuple(args.topology or DEFAULT_TOPOLOGIES),
                               device=args.device, algorithm=args.algorithm, compute=compute,
                               exact=args.exact)
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
        notes=f"Measured on {trace.device_name} (batch {trace.batch_size} per GPU); compute "
              f"model: {study.rows[0].device}. Speedups are against fp32 allreduce at the same "
              f"size and topology.")
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
        trace = measure_trace(args.model, args.measure_bits, args.batch_size, args.iterations)
    return run_with(args, trace)
