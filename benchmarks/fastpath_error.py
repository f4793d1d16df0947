"""The fast path's error: NCCL's closed form (with link loads) against the engine.

For each cluster and size, simulates NCCL's choice with the engine and takes the closed form
of the same choice (:func:`emulator.fastpath.closed_form_collective`), then prints the
relative error per case and the largest per NCCL algorithm: the figures
:data:`emulator.fastpath.ERROR_BOUND` states.

    .venv/bin/python benchmarks/fastpath_error.py --nodes 2,8,32,128 \
        --sizes 1MB,16MB,256MB,1GB --fabrics leaf_spine,rail --machines dgx_h100,dgx_a100

Also forced algorithms (``--algorithms nccl_ring,nccl_tree``) on the same grid. Each row
also has the calibrated closed form as ``simulate --method closed-form`` makes it (the engine
on the largest smaller cluster of the same machines that fits ``--budget`` seconds by the
estimate; :func:`emulator.fastpath.calibration_cluster`): the figures of
:data:`emulator.fastpath.CALIBRATED_BOUND`.
"""
from __future__ import annotations

import argparse
import time

import emulator
import topologies
from _grid import add_grid_arguments, clusters        # benchmarks/_grid.py
from emulator import fastpath
from emulator.collectives.nccl import NcclSystem
from emulator.fastpath import closed_form_collective


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_arguments(ap)
    ap.add_argument("--algorithms", default="nccl")
    ap.add_argument("--ops", default="allreduce")
    ap.add_argument("--budget", type=float, default=fastpath.CALIBRATION_S,
                    help="seconds the calibration's engine run may take by the estimate")
    args = ap.parse_args(argv)
    worst: dict = {}
    worst_cal: dict = {}
    print(f"{'case':58s} {'choice':22s} {'engine us':>11s} {'closed us':>11s} {'error':>8s} "
          f"{'wall s':>7s} {'calibrated on':>13s} {'error':>8s} {'wall s':>7s}")
    for spec, G, n in clusters(args):
        for op in args.ops.split(","):
            for alg in args.algorithms.split(","):
                for size in args.sizes.split(","):
                    nb = topologies.parse_bytes(size)
                    t0 = time.perf_counter()
                    s = emulator.build_schedule(op, alg, n, nb, graph=G)
                    r = emulator.simulate(G, s)
                    wall = time.perf_counter() - t0
                    d = s.detail["nccl"]
                    fast = closed_form_collective(G, op, alg, nb)
                    assert fast.nccl["algorithm"] == d["algorithm"]
                    err = (fast.time_s - r.time_s) / r.time_s
                    key = d["algorithm"]
                    if abs(err) > abs(worst.get(key, (0.0, ""))[0]):
                        worst[key] = (err, f"{spec} {op} {size}")
                    system = NcclSystem.of(G, range(n))
                    t1 = time.perf_counter()
                    small, m = fastpath.calibration_cluster(
                        spec, system, d, fastpath.transfers(system, op, d, nb),
                        args.budget)
                    cal_text = f"{'-':>13s} {'-':>8s} {'-':>7s}"
                    if small is not None:
                        cal = fastpath.calibrated_collective(G, op, alg, nb, small)
                        cerr = (cal.time_s - r.time_s) / r.time_s
                        if abs(cerr) > abs(worst_cal.get(key, (0.0, ""))[0]):
                            worst_cal[key] = (cerr, f"{spec} {op} {size} on {m}")
                        cal_text = (f"{str(m) + ' machines':>13s} {cerr:+8.2%} "
                                    f"{time.perf_counter() - t1:7.1f}")
                    print(f"{spec + ' ' + op + ' ' + alg + ' ' + size:58s} "
                          f"{d['algorithm'] + '/' + d['protocol'] + ' x' + str(d['channels']):22s} "
                          f"{r.time_s * 1e6:11.2f} {fast.time_s * 1e6:11.2f} {err:+8.2%} "
                          f"{wall:7.1f} {cal_text}", flush=True)
    print("largest |error| per NCCL algorithm, closed form:")
    for key, (err, where) in sorted(worst.items()):
        print(f"  {key:9s} {err:+8.2%}  ({where})")
    print("largest |error| per NCCL algorithm, calibrated closed form:")
    for key, (err, where) in sorted(worst_cal.items()):
        print(f"  {key:9s} {err:+8.2%}  ({where})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
