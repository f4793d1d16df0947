"""The studies' approximate mode against exact studies: the error on the study's own rows.

Runs the demo's grid (``qsgd-emu demo``: both DGX A100 fabrics, fp32, fp16 and QSGD at
16/8/4/2 bits over both transports) on one payload trace and one compute model, once exact
and once approximate (``StudyConfig(exact=False)``, :mod:`emulator.interpolation`), and prints
each world size's largest row error (iteration time, exposed communication, speedup over
fp32) with both walls. Studies may default to the approximate mode only if every row is
within 0.5 % (issue 11).

    .venv/bin/python benchmarks/study_interpolation.py --trace out/demo/trace.json \
        --world-sizes 8,16,32,64,128,256

``--approximate-only`` times the approximate study alone (for world sizes whose exact study
takes too long).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from qsgd_emu.commands.study import int_list

TOPOLOGIES = ("cluster:dgx_a100x{N}", "cluster:dgx_a100x{N},nic_bw=25Gbit")
TARGET = 0.005


def _errors(exact, approx) -> dict:
    """World size -> largest |relative error| of each compared column."""
    cols = ("iteration_s", "exposed_comm_s", "speedup_vs_fp32")
    out: dict = {}
    by_key = {r.key: r for r in exact.rows}
    for r in approx.rows:
        e = by_key[r.key]
        worst = out.setdefault(r.world_size, dict.fromkeys(cols, 0.0))
        for c in cols:
            a, b = getattr(r, c), getattr(e, c)
            if b:                       # exposed communication may be exactly 0
                worst[c] = max(worst[c], abs(a / b - 1))
            elif a:
                worst[c] = float("inf")
    return out


def main(argv=None) -> int:
    import qsgd
    from emulator.compute import ComputeModel
    from emulator.study import StudyConfig, run_study

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="out/demo/trace.json", help="PayloadTrace JSON")
    ap.add_argument("--world-sizes", type=int_list("world-sizes"),
                    default=(8, 16, 32, 64, 128, 256))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--approximate-only", action="store_true")
    args = ap.parse_args(argv)

    trace = qsgd.PayloadTrace.load(args.trace)
    cfg = StudyConfig(trace=trace, world_sizes=args.world_sizes, topologies=TOPOLOGIES,
                      bits=(32, 16, 8, 4, 2), device="A100",
                      compute=ComputeModel.for_device("A100", trace))
    runs = {}
    modes = (False,) if args.approximate_only else (True, False)
    for exact in modes:
        t0 = time.perf_counter()
        runs[exact] = run_study(dataclasses.replace(cfg, exact=exact), workers=args.workers)
        print(f"{'exact' if exact else 'approximate'} study, world sizes {args.world_sizes}, "
              f"{args.workers} worker(s): {time.perf_counter() - t0:.1f} s wall", flush=True)
    if args.approximate_only:
        return 0
    errs = _errors(runs[True], runs[False])
    print(f"\n{'GPUs':>5} {'rows':>5} {'iteration':>10} {'exposed':>10} {'speedup':>10}")
    worst = 0.0
    for w in sorted(errs):
        e = errs[w]
        n = sum(1 for r in runs[False].rows if r.world_size == w)
        print(f"{w:>5} {n:>5} {e['iteration_s']:>10.2e} {e['exposed_comm_s']:>10.2e} "
              f"{e['speedup_vs_fp32']:>10.2e}")
        worst = max(worst, e["iteration_s"], e["speedup_vs_fp32"])
    verdict = "met" if worst <= TARGET else "MISSED"
    print(f"target every row's iteration time and speedup within {TARGET:.1%}: "
          f"largest {worst:.2e}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
