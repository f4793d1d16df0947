"""``qsgd-emu simulate`` on big clusters: wall and CPU seconds, peak memory, the method used.

Each case runs the command in a fresh process, as a user would (process start included),
and reads its rusage (``os.wait4``): wall, user + system CPU seconds and peak resident memory.
``--root`` runs another checkout's code (a worktree of an older commit, for before/after
ratios in the same run: timings move with the machine's load, ratios much less). Before each
case a fixed pure-Python loop runs in its own process (``ref s``): this VM's speed swings by
up to 1.6x from one minute to the next, and that column says how fast it ran at the time.

    .venv/bin/python benchmarks/scale_simulate.py \\
        --cases "cluster:dgx_h100x1024,fabric=rail 1MB" "cluster:dgx_h100x1024 1GB"
    .venv/bin/python benchmarks/scale_simulate.py --root /tmp/scale-base --timeout 120 \\
        --cases "cluster:dgx_a100x256 1MB"
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = ["cluster:dgx_h100x1024,fabric=rail 1MB", "cluster:dgx_h100x1024,fabric=rail 1GB",
           "cluster:dgx_h100x1024,fabric=leaf_spine 1MB",
           "cluster:dgx_h100x1024,fabric=leaf_spine 1GB"]


def run_case(root: str, spec: str, size: str, extra: list, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=root)
    argv = [sys.executable, "-m", "qsgd_emu", "simulate", "--topology", spec, "--bytes", size,
            *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"wall": time.perf_counter() - t0, "status": f"no answer in {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    # communicate() reaped the child; its rusage is in RUSAGE_CHILDREN deltas, so read
    # the peak from the child's own report instead when wait4 is no longer possible.
    usage = _child_usage()
    lines = {l.split()[0]: l for l in out.splitlines() if l.strip()}
    return {"wall": wall, "status": "ok" if proc.returncode == 0 else err.strip()[-200:],
            "method": _value(lines, "method")[:48], "time": _value(lines, "time"), **usage,
            "progress": sum(1 for l in err.splitlines() if l.startswith("simulate:"))}


#: The reference workload: six million Python additions of squares (0.64-1.19 s on this
#: 2-core VM across 2026-12-06, 0.66 s in its usual minutes).
REFERENCE = "s = 0\nfor i in range(6_000_000): s += i * i"


def reference_s() -> float:
    """Wall seconds of :data:`REFERENCE` in a fresh interpreter (start-up included)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", REFERENCE], check=True)
    wall = time.perf_counter() - t0
    _child_usage()          # its CPU seconds are not the next case's
    return wall


def _value(lines: dict, key: str) -> str:
    """The value of an output row ``key  value`` ("" when the output has no such row)."""
    parts = lines.get(key, "").split(None, 1)
    return parts[1] if len(parts) > 1 else ""


_LAST = {"cpu": 0.0}


def _child_usage() -> dict:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = r.ru_utime + r.ru_stime
    delta, _LAST["cpu"] = cpu - _LAST["cpu"], cpu
    return {"cpu": delta, "peak_gb": r.ru_maxrss / 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                    help="checkout whose code runs (PYTHONPATH)")
    ap.add_argument("--cases", nargs="+", default=DEFAULT, help='"SPEC SIZE" pairs')
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--extra", default="", help="more simulate options, space separated")
    args = ap.parse_args(argv)
    print(f"{'case':52s} {'ref s':>6s} {'wall s':>7s} {'cpu s':>7s} {'peak GB':>8s} {'lines':>5s}  "
          f"{'time':>14s}  method / status")
    for case in args.cases:
        spec, size = case.split()
        ref = reference_s()
        r = run_case(args.root, spec, size, args.extra.split(), args.timeout)
        if r["status"] != "ok":
            print(f"{case:52s} {ref:6.2f} {r['wall']:7.1f} {'':>7s} {'':>8s} {'':>5s}  {'':>14s}  "
                  f"{r['status']}", flush=True)
            continue
        print(f"{case:52s} {ref:6.2f} {r['wall']:7.1f} {r['cpu']:7.1f} {r['peak_gb']:8.2f} "
              f"{r['progress']:5d}  {r['time']:>14s}  {r['method']}", flush=True)
    print("ref s: the reference loop just before the case (the machine's speed then); peak GB: "
          "the largest resident set of any child so far (ru_maxrss of RUSAGE_CHILDREN); lines: "
          "progress lines on stderr")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
