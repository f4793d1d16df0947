"""NCCL's all-to-all: the engine against the per-pair closed form and the aggregate one.

For each cluster and size, simulates NCCL's all-to-all (nccl-tests sizes: ``nbytes`` from
every rank, ``nbytes / p`` to each peer) with the engine and prints the closed form of every
pair (:func:`emulator.collectives.nccl.p2p.time`, ``form="table"``) and the aggregate form
(``form="aggregate"``, :mod:`emulator.collectives.nccl.p2pform`, what clusters beyond
``p2p.TABLE_MAX`` ranks get), with their errors against the engine and the largest per form:
the figure :data:`emulator.fastpath.ERROR_BOUND` states for ``P2P``.

    .venv/bin/python benchmarks/alltoall_error.py --nodes 2,8,32,128 \\
        --sizes 1MB,16MB,256MB,1GB --fabrics leaf_spine,rail --machines dgx_h100,dgx_a100
"""
from __future__ import annotations

import argparse
import time

import emulator
import topologies
from _grid import add_grid_arguments, clusters        # benchmarks/_grid.py
from emulator.collectives.nccl import NcclSystem, p2p
from emulator.collectives.nccl import _a2a_sizes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_arguments(ap)
    args = ap.parse_args(argv)
    worst = {"table": (0.0, ""), "aggregate": (0.0, "")}
    print(f"{'case':48s} {'proto':6s} {'engine us':>11s} {'table us':>11s} {'error':>8s} "
          f"{'aggr. us':>11s} {'error':>8s} {'wall s':>7s}")
    for spec, G, n in clusters(args):
        system = NcclSystem.of(G, range(n))
        for size in args.sizes.split(","):
            nb = topologies.parse_bytes(size)
            t0 = time.perf_counter()
            s = emulator.build_schedule("alltoall", "nccl", n, nb, graph=G)
            r = emulator.simulate(G, s)
            wall = time.perf_counter() - t0
            proto = s.detail["nccl"]["protocol"]
            sizes = _a2a_sizes(system, nb)
            row = {}
            for form in ("table", "aggregate"):
                t = p2p.time(system, sizes, proto, form=form)
                err = (t - r.time_s) / r.time_s
                row[form] = (t, err)
                if abs(err) > abs(worst[form][0]):
                    worst[form] = (err, f"{spec} {size}")
            print(f"{spec + ' ' + size:48s} {proto:6s} {r.time_s * 1e6:11.2f} "
                  f"{row['table'][0] * 1e6:11.2f} {row['table'][1]:+8.2%} "
                  f"{row['aggregate'][0] * 1e6:11.2f} {row['aggregate'][1]:+8.2%} "
                  f"{wall:7.1f}", flush=True)
    for form, (err, where) in worst.items():
        print(f"largest |error|, {form}: {err:+.2%} ({where})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
