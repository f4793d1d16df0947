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
import time

TRANSPORT_NAMES = ("fp32", "fp16", "qsgd_allgather", "qsgd_scatter_reduce_allgather")


def _ints(name: str):
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


def add_arguments(parser: argparse.ArgumentParser, *, demo: bool = False) -> None:
    if not demo:
        src = parser.add_mutually_exclusive_group(required=True)
        src.add_argument("--trace", metavar="PATH", help="a PayloadTrace from qsgd-emu measure")
        src.add_argument("--model", help="measure this model first (name or pkg.mod:Class)")
    parser.add_argument("--measure-bits", type=int, default=4, help="QSGD bits when measuring (default 4)")
    parser.add_argument("--batch-size", type=int, help="samples per iteration when measuring (default 2 on CPU)")
    parser.add_argument("--iterations", type=int, default=2, help="measured iterations (default 2)")
    parser.add_argument("--topology", action="append", metavar="SPEC",
                        help="topology spec, repeatable; {N} = nodes for the world size "
                             "(default cluster:dgx_a100x{N})")
    parser.add_argument("--world-sizes", type=_ints("world-sizes"), default=(8, 64, 512),
                        help="comma-separated GPU counts (default 8,64,512)")
    parser.add_argument("--bits", type=_ints("bits"), default=(32, 16, 8, 4, 2),
                        help="32 = fp32, 16 = fp16 (and QSGD 16), 2..15 QSGD (default 32,16,8,4,2)")
    parser.add_argument("--transports", type=_names, default=TRANSPORT_NAMES,
                        help=f"comma-separated, of {','.join(TRANSPORT_NAMES)} (default all)")
    parser.add_argument("--device", default="measured",
                        help="target accelerator of the compute model: measured, K80, V100, A100, H100, H200")
    parser.add_argument("--algorithm", default="nccl", help="allreduce algorithm of fp32/fp16 (default nccl: as NCCL runs it; ring, tree, ... for the textbook ones)")
    parser.add_argument("--out", metavar="DIR", default=None if not demo else "out/demo",
                        required=not demo, help="output directory")
    parser.add_argument("--workers", type=int, default=1, help="local processes (default 1)")
    parser.add_argument("--cluster", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://host:8786")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


class ProgressBar:
    """A one-line progress bar on a stream (stderr): ``[#####     ] 3/6 tasks 1.2 s``."""

    def __init__(self, label: str, stream=None, width: int = 30):
        self.label, self.stream, self.width = label, stream or sys.stderr, width
        self.t0 = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // max(total, 1)
        self.stream.write(f"\r{self.label} [{'#' * filled}{' ' * (self.width - filled)}] {done}/{total} "
                          f"{time.perf_counter() - self.t0:.1f} s")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


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
    from emulator.study import StudyConfig, summary_table, write_csv, write_json

    # Resolve the compute model once, for the rows and the report's timeline alike: for a CPU
    # trace ComputeModel.for_device measures the host, and measuring it twice (run_study, then
    # the timeline below) gave the timeline a different scale from the rows it illustrates.
    compute = emulator.ComputeModel.for_device(args.device, trace)
    cfg = StudyConfig(trace=trace, world_sizes=args.world_sizes, bits=args.bits,
                      transports=args.transports,
                      topologies=tuple(args.topology or ("cluster:dgx_a100x{N}",)),
                      device=args.device, algorithm=args.algorithm, compute=compute)
    rows = emulator.run_study(cfg, progress=ProgressBar("study"), workers=args.workers, cluster=args.cluster)
    os.makedirs(args.out, exist_ok=True)
    write_csv(rows, os.path.join(args.out, "study.csv"))
    write_json(rows, os.path.join(args.out, "study.json"), cfg)
    # the timeline of the best QSGD row at the largest world size of the first topology
    top, big = cfg.topologies[0], max(cfg.world_sizes)
    cands = [r for r in rows if r["topology"] == top and r["world_size"] == big]
    # As the comment above says: the best QSGD row (the fastest of all rows was often fp32, so
    # the timeline showed no codec at all); any row when the grid has no QSGD transport.
    cands = [r for r in cands if emulator.TRANSPORTS[r["transport"]].compressed] or cands
    best = min(cands, key=lambda r: r["iteration_s"])
    from emulator.study import topology_for

    G = topology_for(top, big)
    pred = emulator.replay(trace, G, transport=best["transport"], world_size=big,
                           compute=compute,
                           algorithm=args.algorithm,
                           bits=best["bits"] if emulator.TRANSPORTS[best["transport"]].compressed else None)
    report = emulator.write_report(
        rows, os.path.join(args.out, "report.html"), prediction=pred,
        title=f"QSGD what-if study: {trace.model}",
        notes=f"Measured on {trace.device_name} (batch {trace.batch_size}); compute model: "
              f"{rows[0]['device']}. Speedups are against fp32 allreduce at the same size and topology.")
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(summary_table(rows))
        print(f"\nwrote {os.path.join(args.out, 'study.csv')}, study.json and {report}")
    return 0


def run(args) -> int:
    import qsgd

    if args.trace:
        trace = qsgd.PayloadTrace.load(args.trace)
    else:
        trace = measure_trace(args.model, args.measure_bits, args.batch_size, args.iterations)
    return run_with(args, trace)
