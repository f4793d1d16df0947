"""The engine with and without its symmetry reduction (emulator.symmetry), on the same schedules.

Prints, per case: transfers, the classes' size (copies), seconds to find the shift, the full
engine's seconds, the reduced engine's seconds (the shift found again, as a first run does),
the ratio, and the relative difference of the simulated times (exact: ~0).

    .venv/bin/python benchmarks/symmetry.py [--cases "SPEC OP ALGORITHM BYTES" ...]
"""
from __future__ import annotations

import argparse
import time

DEFAULT_CASES = (
    "cluster:dgx_h100x64,fabric=rail allgather nccl_ring 64MB",
    "cluster:dgx_h100x128,fabric=rail allreduce nccl_ring 16MB",
    "cluster:dgx_a100x64,fabric=leaf_spine allreduce nccl_ring 64MB",
    "cluster:rtx4090_boxx32 allreduce nccl_qsgd_allgather 64MB",
    "cluster:dgx_h100x32,fabric=rail alltoall nccl_p2p 64MB",
)


def _case(text: str):
    import emulator
    import topologies

    spec, op, alg, size = text.split()
    G = topologies.from_spec(spec)
    p = len(topologies.gpus(G))
    nbytes = topologies.parse_bytes(size)
    kw = {"graph": G}
    if "qsgd" in alg:
        kw["payload_bytes"] = [nbytes // 8] * p       # a 4-bit payload, roughly
    return G, emulator.build_schedule(op, alg, p, nbytes, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    args = ap.parse_args(argv)

    import emulator
    from emulator import symmetry
    from emulator.netpaths import Network

    emulator.engine.warm_up()
    print(f"{'case':<62} {'transfers':>10} {'copies':>6} {'find s':>7} {'full s':>7} "
          f"{'reduced s':>9} {'speed-up':>8} {'time diff':>9}")
    for text in args.cases:
        G, s = _case(text)
        net = Network.of(G, s)                # the routes, as the engine builds them first
        t0 = time.perf_counter()
        sym = symmetry.find(net, s)
        t_find = time.perf_counter() - t0
        t0 = time.perf_counter()
        full = emulator.simulate(G, s, symmetry=False, _force_events=True)
        t_full = time.perf_counter() - t0
        net.derived.pop("symmetry", None)     # the reduced run finds it again
        t0 = time.perf_counter()
        red = emulator.simulate(G, s, _force_events=True)
        t_red = time.perf_counter() - t0
        diff = abs(red.time_s - full.time_s) / full.time_s
        copies = sym.copies if sym else 1
        print(f"{text:<62} {len(s):>10,} {copies:>6} {t_find:>7.2f} {t_full:>7.2f} "
              f"{t_red:>9.2f} {t_full / t_red:>7.1f}x {diff:>9.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
