"""``qsgd-emu demo`` (the README's ``make run``): the main job end to end on embedded defaults.

Measures a default model on this machine (ResNet-50 at batch 2 on CPU, real forward,
backward and QSGD codec), scales its compute to an A100 (:data:`emulator.DEVICES`: the host's
measured FLOP/s and copy bandwidth against the datasheet's), replays it over DGX A100 clusters
at 8..1024 GPUs (1 to 128 machines), once with the preset's eight 200 Gbit/s InfiniBand NICs per node and once with
the same nodes on 25 Gbit/s Ethernet NICs (a commodity cloud fabric, where compression pays),
for fp32, fp16 and QSGD at 16/8/4/2 bits over both transports, writes
out/demo/{study.csv,study.json,report.html,trace.json} and prints the summary table.

Replaying CPU-measured compute as it is ("measured") would make every iteration seconds long
and every speedup 1.00x: a what-if of GPUs needs GPU compute times.
"""
from __future__ import annotations

import argparse
import os

from qsgd_emu.commands import study as study_cmd

DEFAULT_TOPOLOGIES = ("cluster:dgx_a100x{N}", "cluster:dgx_a100x{N},nic_bw=25Gbit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="resnet50", help="model to measure")
    parser.add_argument("--trace", metavar="PATH", help="skip measuring: use this PayloadTrace")
    study_cmd.add_arguments(parser, demo=True, topologies=DEFAULT_TOPOLOGIES)
    # Up to 1024 GPUs, where QSGD starts to pay on slow NICs: NCCL's channels and QSGD's
    # all-to-all share links, so every collective runs through the event loop, and each
    # doubling of the GPUs costs about 2-4x; in the (default) approximate mode the study takes
    # about 4 minutes on the 2-core development machine (benchmarks/RESULTS.md).
    parser.set_defaults(world_sizes="8,16,32,64,128,256,512,1024", workers=default_workers())


def default_workers() -> int:
    """The demo's local processes: one per core this process may use, at most 4 (each holds
    a copy of the graph's routes; more than 4 buys little on the demo's 20 tasks)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def run(args) -> int:
    import qsgd

    if args.topology is None:
        args.topology = list(DEFAULT_TOPOLOGIES)
    if args.trace:
        trace = qsgd.PayloadTrace.load(args.trace)
    else:
        trace = study_cmd.measure_trace(args.model, args.measure_bits, args.measure_batch_size,
                                        args.iterations)
        os.makedirs(args.out, exist_ok=True)
        trace.save(os.path.join(args.out, "trace.json"))
    return study_cmd.run_with(args, trace)
