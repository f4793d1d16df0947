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
takes too long); ``--collectives 256`` compares collective by collective instead, per NCCL
plan (how many sizes were simulated, the largest error of the others).
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


def _collectives(cfg, world_size: int) -> None:
    """Collective by collective: each task's sizes through ``Network(interpolate=...)``
    against every size simulated, the largest error per NCCL plan and how many were simulated."""
    from emulator.interpolation import DEFAULT_RTOL
    from emulator.network import Network
    from emulator.replaying import TRANSPORTS, collective_requests
    from emulator.study import topology_for

    print(f"\n{'topology':<36} {'transport':<30} {'NCCL plan':<22} {'simulated':>10} "
          f"{'largest error':>14}")
    for spec in cfg.topologies:
        G = topology_for(spec, world_size)
        for transport in cfg.transports:
            combos = [b for b, t in cfg.combos() if t == transport]
            approx = Network(G, world_size, cfg.algorithm, interpolate=DEFAULT_RTOL)
            exact = Network(G, world_size, cfg.algorithm)
            reqs = [r for b in combos for r in collective_requests(
                cfg.trace, approx, transport, b if TRANSPORTS[transport].compressed else None)]
            approx.prefetch(reqs)
            exact.prefetch(reqs)
            plans: dict = {}
            for key, (t, _) in approx._cache.items():
                plan = approx.shape(*key[:3])
                worst, n_sim, n = plans.get(plan, (0.0, 0, 0))
                err = abs(t / exact._cache[key][0] - 1)
                plans[plan] = (max(worst, err), n_sim + (key not in approx.interpolated), n + 1)
            for plan, (worst, n_sim, n) in sorted(plans.items(), key=str):
                name = "/".join(map(str, plan[2:4])) if plan and len(plan) > 2 else str(plan)
                print(f"{G.graph.get('name', spec):<36} {transport:<30} {plan[0] + ' ' + name:<22} "
                      f"{f'{n_sim} of {n}':>10} {worst:>14.2e}")


def _explain_worst(exact, approx) -> None:
    """The row furthest from exact, with its buckets' timelines both ways (ms): where a
    row moves more than its collectives, the timelines show which stage moved."""
    by_key = {r.key: r for r in exact.rows}
    row = max(approx.rows, key=lambda r: abs(r.iteration_s / by_key[r.key].iteration_s - 1))
    e, a = exact.prediction(by_key[row.key]), approx.prediction(row)
    print(f"\nfurthest row: {row.topology_name}, {row.label}: {e.iteration_s * 1e3:.4f} ms "
          f"exact, {a.iteration_s * 1e3:.4f} ms approximate")
    fields = ("ready_s", "encode_end_s", "comm_start_s", "comm_end_s", "end_s")
    print(f"{'bucket':>6} {'mode':>6} " + " ".join(f"{f[:-2]:>12}" for f in fields))
    for k, (be, ba) in enumerate(zip(e.buckets, a.buckets)):
        for mode, b in (("exact", be), ("approx", ba)):
            print(f"{k:>6} {mode:>6} " + " ".join(f"{getattr(b, f) * 1e3:>12.4f}" for f in fields))


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
    ap.add_argument("--collectives", type=int, metavar="GPUS",
                    help="instead: compare collective by collective at this world size")
    args = ap.parse_args(argv)

    trace = qsgd.add_operators(qsgd.PayloadTrace.load(args.trace))
    cfg = StudyConfig(trace=trace, world_sizes=args.world_sizes, topologies=TOPOLOGIES,
                      bits=(32, 16, 8, 4, 2), device="A100",
                      compute=ComputeModel.for_device("A100", trace))
    if args.collectives:
        _collectives(cfg, args.collectives)
        return 0
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
    _explain_worst(runs[True], runs[False])
    verdict = "met" if worst <= TARGET else "MISSED"
    print(f"target every row's iteration time and speedup within {TARGET:.1%}: "
          f"largest {worst:.2e}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
