"""The main job's study under the textbook ring and under NCCL's model, side by side.

``make run`` (``qsgd-emu demo``) used to time every collective as one textbook ring through one
NIC; it now times them as NCCL runs them (docs/nccl.md). This script runs the demo's grid both
ways on one payload trace and one compute model (measured once, so both columns share the
same compute and codec times) and prints the QSGD speedups over fp32 under each.

    .venv/bin/python benchmarks/nccl_study.py --trace out/demo/trace.json --world-sizes 8,16,32

The trace is the one ``make run`` writes (``out/demo/trace.json``); ``--json`` prints the rows.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from qsgd_emu.commands.study import int_list


def main(argv=None) -> int:
    import dataclasses

    import qsgd
    from emulator.compute import ComputeModel
    from emulator.study import StudyConfig, run_study

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="out/demo/trace.json", help="PayloadTrace JSON")
    ap.add_argument("--world-sizes", type=int_list("world-sizes"), default=(8, 16, 32))
    ap.add_argument("--bits", type=int_list("bits"), default=(32, 16, 8, 4, 2))
    ap.add_argument("--topology", action="append", default=None,
                    help="spec, repeatable (default the demo's two)")
    ap.add_argument("--device", default="A100")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from qsgd_emu.commands.demo import DEFAULT_TOPOLOGIES

    trace = qsgd.add_operators(qsgd.PayloadTrace.load(args.trace))
    base = StudyConfig(trace=trace, world_sizes=args.world_sizes, bits=args.bits,
                       topologies=tuple(args.topology or DEFAULT_TOPOLOGIES), device=args.device)
    compute = ComputeModel.for_device(args.device, trace)
    rows, wall = {}, {}
    for algorithm in ("ring", "nccl"):
        cfg = dataclasses.replace(base, algorithm=algorithm, compute=compute)
        t0 = time.perf_counter()
        rows[algorithm] = run_study(cfg, workers=args.workers)
        wall[algorithm] = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"wall_s": wall, "rows": rows}, indent=1))
        return 0
    head = (f"{'topology':34s} {'GPUs':>4} {'bits':>4} {'transport':>30} "
            f"{'ring ms':>8} {'nccl ms':>8} {'ring x':>7} {'nccl x':>7}")
    print(head)
    print("-" * len(head))
    for a, b in zip(rows["ring"], rows["nccl"]):
        assert (a["topology"], a["world_size"], a["transport"], a["bits"]) == \
            (b["topology"], b["world_size"], b["transport"], b["bits"])
        print(f"{a['topology']:34s} {a['world_size']:>4} {a['bits']:>4} {a['transport']:>30} "
              f"{a['iteration_s'] * 1e3:>8.2f} {b['iteration_s'] * 1e3:>8.2f} "
              f"{a['speedup_vs_fp32']:>6.2f}x {b['speedup_vs_fp32']:>6.2f}x")
    print(f"compute {compute.source}; wall s: ring {wall['ring']:.0f}, nccl {wall['nccl']:.0f}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
