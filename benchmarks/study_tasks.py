"""Wall seconds of each task of a study at one world size: where a study's time goes.

    python benchmarks/study_tasks.py --trace out/demo/trace.json --world-size 64

One task per transport (its bit widths share the task's Network cache), run in this process in
the study's order, so the first task also pays for routing the graph that the others reuse.
Prints a table: task, collectives simulated, wall seconds, the slowest collective.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import emulator
import qsgd
from emulator.study import _tasks, run_task


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="a PayloadTrace (qsgd-emu measure)")
    ap.add_argument("--world-size", type=int, default=64, help="GPUs")
    ap.add_argument("--topology", default="cluster:dgx_a100x{N}", help="study topology spec")
    ap.add_argument("--device", default="A100", help="device the compute is scaled to")
    ap.add_argument("--approximate", action="store_true",
                    help="the study's approximate mode (StudyConfig(exact=False))")
    args = ap.parse_args(argv)
    trace = qsgd.add_operators(qsgd.PayloadTrace.load(args.trace))
    cfg = emulator.StudyConfig(trace=trace, world_sizes=(args.world_size,), bits=(32, 16, 8, 4, 2),
                               topologies=(args.topology,), device=args.device,
                               exact=not args.approximate)
    # as run_study does: the device resolved into compute models once, before the tasks
    cfg = dataclasses.replace(cfg, compute=emulator.resolve_compute(cfg))
    print(f"{'task':<32} {'collectives':>11} {'wall s':>8}  slowest collective")
    for task in _tasks(cfg):
        seen: list[tuple[float, str]] = []

        def heard(text: str) -> None:
            if "last " not in text:         # a stage (building, choosing), not a collective
                return
            wall = float(text.rsplit(" in ", 1)[1].rstrip(" s"))
            seen.append((wall, text.rsplit("last ", 1)[1]))

        t0 = time.perf_counter()
        run_task(task, heard)
        wall = time.perf_counter() - t0
        slowest = max(seen)[1] if seen else "-"
        print(f"{task[3][0][1]:<32} {len(seen):>11} {wall:>8.1f}  {slowest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
