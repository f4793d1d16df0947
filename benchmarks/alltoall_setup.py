"""NCCL's all-to-all on a fresh graph: schedule and simulation seconds, first size and a second.

A study's first all-to-all on a graph pays for routing its sends (NCCL's PXN routes: GPU,
proxy GPU, NIC, NIC, GPU) and for NCCL's per-pair analysis; later sizes reuse both. This
prints the two phases for two sizes and the process's peak resident memory.

    .venv/bin/python benchmarks/alltoall_setup.py --gpus 256
    .venv/bin/python benchmarks/alltoall_setup.py --gpus 1024

Sizes are nccl-tests' (each rank's whole buffer, bytes); the topology is
``cluster:dgx_a100x{gpus/8}``.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time


def main(argv=None) -> int:
    import emulator
    import topologies

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=256, help="a multiple of 8")
    ap.add_argument("--sizes", default="4121600,13167616", help="two sizes, bytes")
    args = ap.parse_args(argv)
    G = topologies.from_spec(f"cluster:dgx_a100x{args.gpus // 8}")
    # compile (or load) the engine's kernels outside the timings
    emulator.simulate(topologies.switch(4), emulator.build_schedule("alltoall", "direct", 4, 4000))
    print(f"{'size B':>12} {'sends':>10} {'schedule s':>11} {'simulate s':>11} {'time us':>10}")
    for n in (int(v) for v in args.sizes.split(",")):
        t0 = time.perf_counter()
        sched = emulator.build_schedule("alltoall", "nccl_p2p", args.gpus, n, graph=G)
        t1 = time.perf_counter()
        res = emulator.simulate(G, sched)
        t2 = time.perf_counter()
        print(f"{n:>12,} {len(sched):>10,} {t1 - t0:>11.2f} {t2 - t1:>11.2f} "
              f"{res.time_s * 1e6:>10.2f}", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory: {peak:,.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
