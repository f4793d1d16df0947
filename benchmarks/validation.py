"""The emulator against real DDP training with overlap, on the namespace testbed (issue 12). Needs root.

For each link rate (default 1 Gbit/s and 200 Mbit/s), 4 hosts on one shaped switch, ``--runs``
times (default 3):

1. ``qsgd-emu validate testbed`` runs the harness, one gloo rank per host: allreduce and
   allgather from 1 MiB to 16 MiB (factor 2; warm-up, repetitions, median), the same at 1, 4
   and 16 MiB while every rank computes (a thread of matrix products per rank, as backward
   loads the cores), then DDP steps of a deep MLP (6 x 1024, batch 32) whose gradients fill 6
   buckets of <= 4 MiB, with DDP's fp32 allreduce, its fp16 allreduce and the QSGD 4-bit hook
   (allgather transport); every bucket's ready / issued / communicated / done times are
   recorded;
2. :func:`emulator.validation.compare` fits one link latency and bandwidth on the smallest and
   the largest size of both ops, another on the sizes measured under load, and predicts each
   training step with :func:`emulator.replay` (the study's own path) from the run's payload
   trace: the compute measured alone, the buckets' ready times and the hook's own stage
   seconds; a collective runs at the loaded links' pace while the ranks compute (backward,
   the hook's decodes), at the idle links' otherwise.

Targets, on the median over the runs: every step time (fp32, fp16, QSGD 4-bit) within 10%; QSGD
4-bit's speedup over fp32 within 10%; the exposed communication (step minus the compute alone)
within 15%. Prints a table per run and the medians; writes, per rate and run, the trace, the
ValidationReport, its HTML (with the measured and predicted bucket timelines side by side) and
a ``summary.json`` under ``--out`` (default ``out/validation``).

    sudo .venv/bin/python benchmarks/validation.py [--rates 1Gbit,200Mbit] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TARGETS = {"step": 0.10, "speedup": 0.10, "exposed": 0.15}


def measure(trace: str, rate: str, args) -> None:
    cmd = [sys.executable, "-m", "qsgd_emu.cli", "validate", "testbed", "--hosts", str(args.hosts),
           "--rate", rate, "--out", trace, "--min-bytes", args.min_bytes, "--max-bytes",
           args.max_bytes, "--factor", "2", "--warmup", "2", "--iters", str(args.iters),
           "--train-bits", "4", "--width", str(args.width), "--depth", str(args.depth),
           "--batch-size", str(args.batch_size), "--bucket-cap-mb", str(args.bucket_cap_mb),
           "--train-steps", str(args.train_steps), "--wall-timeout", str(args.wall_timeout)]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=args.wall_timeout + 60)


def score(report) -> dict:
    """The run's errors: per transport the step and exposed-communication errors, and the
    QSGD speedup error."""
    out = {"collectives_median": report.summary.get("median_abs_rel_error"), "rows": {}}
    for r in report.training:
        key = "qsgd4" if r["transport"] != "allreduce" else f"fp{r['bits']}"
        out["rows"][key] = {k: r.get(k) for k in (
            "measured_s", "predicted_s", "rel_error", "compute_s", "measured_exposed_s",
            "predicted_exposed_s", "exposed_rel_error", "measured_speedup", "predicted_speedup",
            "speedup_rel_error")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1Gbit,200Mbit")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--min-bytes", default="1MiB", help="smallest size, also a calibration point")
    ap.add_argument("--max-bytes", default="16MiB")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--bucket-cap-mb", type=float, default=4.0)
    ap.add_argument("--train-steps", type=int, default=12)
    ap.add_argument("--wall-timeout", type=float, default=400.0)
    ap.add_argument("--reuse", action="store_true", help="compare existing traces, do not measure")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "validation"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    from emulator.validation import MeasuredTrace, compare
    from emulator.validation.training import step_breakdown

    summary = {}
    for rate in [r.strip() for r in args.rates.split(",") if r.strip()]:
        runs = []
        for run in range(args.runs):
            trace_path = os.path.join(args.out, f"trace_{rate}_{run}.json")
            t0 = time.monotonic()
            if not args.reuse:
                measure(trace_path, rate, args)
            trace = MeasuredTrace.load(trace_path)
            report = compare(trace, min_bytes=1_000_000)
            report.save(os.path.join(args.out, f"report_{rate}_{run}.json"))
            report.write_html(os.path.join(args.out, f"report_{rate}_{run}.html"))
            s = score(report)
            s["wall_s"] = round(time.monotonic() - t0, 1)
            runs.append(s)
            print(f"\n{rate} run {run + 1}: held-out collectives median |error| "
                  f"{s['collectives_median']:.1%} ({s['wall_s']} s)", flush=True)
            print(f"  {'transport':9s} {'measured ms':>12s} {'emulator ms':>12s} {'error':>8s} "
                  f"{'compute ms':>11s} {'exposed ms':>11s} {'emulated':>9s} {'error':>8s}  speedup")
            for key, r in s["rows"].items():
                line = (f"  {key:9s} {r['measured_s'] * 1e3:12.1f} {r['predicted_s'] * 1e3:12.1f} "
                        f"{r['rel_error']:+8.1%} {r['compute_s'] * 1e3:11.1f} "
                        f"{r['measured_exposed_s'] * 1e3:11.1f} {r['predicted_exposed_s'] * 1e3:9.1f} "
                        f"{(r['exposed_rel_error'] or 0):+8.1%}")
                if r.get("measured_speedup") is not None:
                    line += (f"  {r['measured_speedup']:.2f}x vs {r['predicted_speedup']:.2f}x "
                             f"({r['speedup_rel_error']:+.1%})")
                print(line)
            for t in report.training:
                where = step_breakdown(t)
                if where:
                    print(f"    {t['transport']} {t['bits']}: {where}")
        med = {}
        for key in runs[0]["rows"]:
            rows = [r["rows"][key] for r in runs if key in r["rows"]]
            med[key] = {k: statistics.median(r[k] for r in rows) for k in rows[0]
                        if all(r.get(k) is not None for r in rows)}
        summary[rate] = {"runs": runs, "median": med}
    print("\nMedians over the runs (targets: step <= 10%, speedup <= 10%, exposed <= 15%):")
    ok_all = True
    for rate, s in summary.items():
        for key, m in s["median"].items():
            checks = [("step", m["rel_error"]), ("exposed", m.get("exposed_rel_error"))]
            if "speedup_rel_error" in m:
                checks.append(("speedup", m["speedup_rel_error"]))
            verdict = []
            for name, e in checks:
                ok = e is not None and abs(e) <= TARGETS[name]
                ok_all &= ok
                verdict.append(f"{name} {e:+.1%} [{'OK' if ok else 'MISS'}]" if e is not None
                               else f"{name} n/a")
            print(f"  {rate:8s} {key:6s} measured {m['measured_s'] * 1e3:8.1f} ms, emulator "
                  f"{m['predicted_s'] * 1e3:8.1f} ms; " + "; ".join(verdict))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
