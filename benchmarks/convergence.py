"""Convergence report: does QSGD train as well as fp32 allreduce, and for how many bytes?

Real DDP training (the project's own ``testbench.training`` loop, the code behind ``qsgd-emu
train``) of the MLP on scikit-learn's digits over N local gloo ranks: fp32 allreduce, QSGD at
8, 4 and 2 bits (DDP hook ``qsgd.qsgd_hook``), optionally PyTorch's ``fp16_compress_hook`` and
``powerSGD_hook``, all with the same epochs, learning rate, batch size and seeds. Prints, per
compression: final test accuracy (mean over seeds, and the range), its difference from fp32 in
percentage points (mean of the per-seed differences: same seed = same initialisation, data split
and shuffles), the bytes each rank sends per step and their ratio to fp32. Checks that QSGD 8-bit
and 4-bit end within ``--tolerance`` points (default 1) of fp32, i.e. ``|delta| <= 1``; 2-bit is
reported as it is. With ``--recommend B`` (default 4) it also trains the per-layer widths
``qsgd-emu recommend`` gives for this MLP (measured here with its per-bucket variance; DDP
buckets of ``--bucket-cap-mb`` so that each layer is its own bucket, in every run) at the
variance of uniform B-bit QSGD on ``--recommend-topology`` at ``--recommend-gpus`` GPUs, and
checks it within the tolerance too. Exit code 0 when the checks pass, 1 otherwise.

Why several seeds: the test set has 449 digits (one digit = 0.22 points) and single-seed fp32
accuracies after the same training differ by about a point from seed to seed, as much as the
tolerance; the mean difference over seeds is the fair comparison. The per-seed differences
are printed too (``--json`` has every run).

All runs share one launch of the ranks (start-up dominates on small machines)::

    .venv/bin/python benchmarks/convergence.py [--epochs 20] [--ranks 2] [--seeds 0,1,2]
        [--bits 8,4,2] [--transport allgather] [--also fp16,powersgd] [--json] [--store PATH]
        [--recommend 4 --recommend-topology 'cluster:dgx_a100x{N},nic_bw=25Gbit' --recommend-gpus 64]

``--store PATH`` also logs every run step by step into a run store (``qsgd-emu dashboard``
shows them) and saves the table there as a ``"convergence"`` result.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from qsgd_emu.commands.study import int_list  # noqa: E402  (after ROOT is on the path)

FORMAT, VERSION = "qsgd-convergence", 1


def _names(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [n for n in names if n not in ("fp16", "powersgd")]
    if bad:
        raise argparse.ArgumentTypeError(f"--also takes fp16 and/or powersgd, got {bad}")
    return names


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20, help="epochs of every run (default 20)")
    ap.add_argument("--ranks", type=int, default=2, help="local gloo ranks (default 2)")
    ap.add_argument("--seeds", type=int_list("seeds"), default=(0, 1, 2), help="comma-separated (default 0,1,2)")
    ap.add_argument("--bits", type=int_list("bits"), default=(8, 4, 2), help="QSGD widths (default 8,4,2)")
    ap.add_argument("--transport", default="allgather", choices=["allgather", "scatter_reduce_allgather"])
    ap.add_argument("--also", type=_names, default=(), help="also run fp16 and/or powersgd")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--bucket-size", type=int, default=512, help="QSGD coordinates per scale (default 512)")
    ap.add_argument("--error-feedback", action="store_true", help="QSGD with error feedback")
    ap.add_argument("--tolerance", type=float, default=1.0, help="allowed |delta| in points (default 1)")
    ap.add_argument("--recommend", type=int, default=4, metavar="B",
                    help="also train the recommended per-layer widths at the variance of uniform "
                         "B-bit QSGD (0: skip; default 4)")
    ap.add_argument("--recommend-variance", type=float, default=None, metavar="V",
                    help="the recommendation's variance budget instead of uniform B-bit's")
    ap.add_argument("--recommend-topology", default="cluster:dgx_a100x{N},nic_bw=25Gbit",
                    help="topology the recommendation is for")
    ap.add_argument("--recommend-gpus", type=int, default=64, help="GPUs the recommendation is for")
    ap.add_argument("--recommend-device", default="A100", help="target device of its compute model")
    ap.add_argument("--bucket-cap-mb", type=float, default=0.05,
                    help="DDP bucket cap of every run (MiB; 0.05: one bucket per MLP layer)")
    ap.add_argument("--store", default=None, help="also log the runs into this run store")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.ranks < 1 or args.batch_size < 1:
        ap.error("--epochs, --ranks and --batch-size must be >= 1")
    if any(b == 32 or not 2 <= b <= 16 for b in args.bits):
        ap.error(f"--bits: QSGD widths are 2..16, got {args.bits}")
    return args


def recommendation(args) -> dict | None:
    """What ``qsgd-emu recommend`` gives for the MLP of these runs (``None`` without
    ``--recommend``): measured here on digits-sized inputs with the runs' DDP bucket cap."""
    if not args.recommend:
        return None
    import emulator
    import qsgd
    from testbench.training.datasets import load_dataset
    from testbench.training.loop import TrainConfig, build

    data = load_dataset("digits", args.seeds[0])
    model = build(TrainConfig(), data.n_features, data.n_classes)
    cap = int(args.bucket_cap_mb * 2**20)
    trace = qsgd.measure(model, qsgd.QSGDConfig.from_bits(4, bucket_size=args.bucket_size),
                         iterations=2, batch_size=args.batch_size, device="cpu", seed=0,
                         bucket_cap_bytes=cap, first_bucket_bytes=cap, input_shape=(data.n_features,))
    w = args.recommend_gpus
    vm = emulator.VarianceModel(trace)
    budget = emulator.Budget(variance=args.recommend_variance if args.recommend_variance is not None
                             else vm.increase((args.recommend,) * trace.num_buckets, "qsgd_allgather", w))
    rec = emulator.recommend(trace, emulator.topology_for(args.recommend_topology, w), world_size=w,
                             budget=budget, transports=("qsgd_" + args.transport,),
                             compute=emulator.ComputeModel.for_device(args.recommend_device, trace))
    return {"policy": rec.policy, "bucket_bits": list(rec.best.bits), "variance": rec.best.variance,
            "budget_variance": budget.variance, "bits_per_element": rec.best.bits_per_element,
            "predicted_speedup_vs_uniform": next(
                c.iteration_s for c in rec.uniform if c.bits[0] == args.recommend) / rec.best.iteration_s,
            "topology": rec.topology, "gpus": w, "budget_bits": args.recommend}


def configs(args, rec: dict | None = None):
    """``[(label, compression, bits, TrainConfig)]``: every compression for every seed."""
    from testbench.training.loop import TrainConfig

    common = dict(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, momentum=args.momentum,
                  transport=args.transport, bucket_size=args.bucket_size,
                  error_feedback=args.error_feedback, bucket_cap_mb=args.bucket_cap_mb)
    kinds = [("fp32", "fp32", 32, ())] + [(c, c, 16 if c == "fp16" else 32, ()) for c in args.also] + \
        [(f"qsgd{b}", "qsgd", b, ()) for b in args.bits]
    if rec is not None:
        # labelled by its widest width; the widths per layer are in the settings
        kinds.append(("qsgd-recommended", "qsgd", max(rec["policy"].values()),
                      tuple(sorted(rec["policy"].items()))))
    out = []
    for seed in args.seeds:
        for label, comp, bits, policy in kinds:
            cfg = TrainConfig(compression=comp, bits=bits if comp == "qsgd" else 4, seed=seed,
                              name=f"convergence {label} seed {seed}", bit_policy=policy, **common)
            out.append((label, comp, bits, cfg))
    return out


def _ranks_main(rank: int, world: int, cfgs, store_path, run_ids):
    """Every rank trains every config in turn; rank 0 logs and returns the summaries."""
    from testbench.training.loop import train

    store = None
    if rank == 0 and store_path is not None:
        from testbench.store import RunStore

        store = RunStore(store_path)
    out = []
    for cfg, run_id in zip(cfgs, run_ids):
        t0 = time.perf_counter()
        s = train(cfg, store=store, run_id=run_id)
        s.pop("checkpoint", None)
        if store is not None:
            store.finish_run(run_id, "finished", update={
                "final_test_accuracy": s["final_test_accuracy"], "final_loss": s["final_loss"],
                "bytes_sent_per_step": s["bytes_sent_per_step"], "steps": s["steps"]})
        if rank == 0:
            print(f"  {cfg.name}: {100 * s['final_test_accuracy']:.2f} % in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        out.append(s)
    return out


def report(args, runs, rec: dict | None = None) -> dict:
    """The table (one row per compression, seeds aggregated) and the checks."""
    from testbench.training.datasets import load_dataset

    by = {}
    for (label, comp, bits, cfg), s in runs:
        by.setdefault((label, comp, bits), {})[cfg.seed] = s
    fp32 = by[("fp32", "fp32", 32)]
    fp32_bytes = statistics.fmean(s["bytes_sent_per_step"] for s in fp32.values())
    rows = []
    for (label, comp, bits), seeds in by.items():
        # keyed by str(seed): JSON (and the run store) keys are strings
        acc = {str(seed): 100 * s["final_test_accuracy"] for seed, s in seeds.items()}
        deltas = {str(seed): 100 * (s["final_test_accuracy"] - fp32[seed]["final_test_accuracy"])
                  for seed, s in seeds.items()}
        nbytes = statistics.fmean(s["bytes_sent_per_step"] for s in seeds.values())
        rows.append({
            "compression": label, "method": comp, "bits": bits,
            "transport": args.transport if comp == "qsgd" else "allreduce",
            "test_accuracy_pct": statistics.fmean(acc.values()),
            "test_accuracy_min_pct": min(acc.values()), "test_accuracy_max_pct": max(acc.values()),
            "delta_vs_fp32_points": statistics.fmean(deltas.values()),
            "per_seed_accuracy_pct": acc, "per_seed_delta_points": deltas,
            "bytes_per_step_per_rank": nbytes, "bytes_ratio_vs_fp32": nbytes / fp32_bytes,
            "final_loss": statistics.fmean(s["final_loss"] for s in seeds.values()),
            "steps": next(iter(seeds.values()))["steps"],
        })
    checks = []
    for b in (8, 4):
        row = next((r for r in rows if r["compression"] == f"qsgd{b}"), None)
        if row is not None:
            d = row["delta_vs_fp32_points"]
            checks.append({"check": f"QSGD {b}-bit within {args.tolerance:g} point(s) of fp32",
                           "delta_points": d, "pass": abs(d) <= args.tolerance})
    row = next((r for r in rows if r["compression"] == "qsgd-recommended"), None)
    if row is not None:
        d = row["delta_vs_fp32_points"]
        checks.append({"check": f"QSGD recommended widths within {args.tolerance:g} point(s) of fp32",
                       "delta_points": d, "pass": abs(d) <= args.tolerance})
    first = next(iter(fp32.values()))
    return {
        "format": FORMAT, "version": VERSION,
        "settings": {"dataset": "digits", "model": "mlp", "hidden": list(first["config"]["hidden"]),
                     "ranks": args.ranks, "epochs": args.epochs, "steps_per_epoch": first["steps_per_epoch"],
                     "batch_size_per_rank": args.batch_size, "lr": args.lr, "momentum": args.momentum,
                     "seeds": list(args.seeds), "transport": args.transport,
                     "bucket_size": args.bucket_size, "error_feedback": args.error_feedback,
                     "tolerance_points": args.tolerance, "bucket_cap_mb": args.bucket_cap_mb,
                     "recommendation": rec,
                     "test_samples": len(load_dataset("digits", args.seeds[0]).test_y)},
        "rows": rows, "checks": checks, "pass": all(c["pass"] for c in checks) and bool(checks),
    }


def print_table(doc: dict) -> None:
    s = doc["settings"]
    print(f"Convergence on digits: MLP 64-{'-'.join(map(str, s['hidden']))}-10, {s['ranks']} gloo ranks, "
          f"{s['epochs']} epochs x {s['steps_per_epoch']} steps, batch {s['batch_size_per_rank']}/rank, "
          f"SGD lr {s['lr']:g} momentum {s['momentum']:g}, QSGD bucket {s['bucket_size']}"
          f"{' + error feedback' if s['error_feedback'] else ''}, seeds {','.join(map(str, s['seeds']))}, "
          f"{s['test_samples']} test digits")
    head = ("compression", "bits", "transport", "test acc %", "min..max %", "delta pts", "per-seed delta",
            "bytes/step/rank", "vs fp32")
    lines = [head]
    for r in doc["rows"]:
        lines.append((r["compression"], str(r["bits"]), r["transport"], f"{r['test_accuracy_pct']:.2f}",
                      f"{r['test_accuracy_min_pct']:.2f}..{r['test_accuracy_max_pct']:.2f}",
                      f"{r['delta_vs_fp32_points']:+.2f}",
                      " ".join(f"{d:+.2f}" for d in r["per_seed_delta_points"].values()),
                      f"{r['bytes_per_step_per_rank']:,.0f}", f"{r['bytes_ratio_vs_fp32']:.3f}"))
    widths = [max(len(ln[i]) for ln in lines) for i in range(len(head))]
    for ln in lines:
        print("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(ln, widths))))
    print()
    for c in doc["checks"]:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['check']}: delta {c['delta_points']:+.2f} points")
    rec = s.get("recommendation")
    if rec:
        print(f"info  recommended widths (variance budget {rec['budget_variance']:.4g} on {rec['topology']}, "
              f"{rec['gpus']} GPUs; predicted {rec['predicted_speedup_vs_uniform']:.2f}x uniform's speed): "
              f"{rec['policy']}, {rec['bits_per_element']:.2f} bits/element, variance "
              f"{rec['variance']:.4g} <= {rec['budget_variance']:.4g}")
    two = [r for r in doc["rows"] if r["compression"] == "qsgd2"]
    for r in two:
        print(f"info  QSGD 2-bit (reported as it is): delta {r['delta_vs_fp32_points']:+.2f} points, "
              f"{r['bytes_ratio_vs_fp32']:.3f} of fp32's bytes")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from testbench.training import launch

    rec = recommendation(args)
    plan = configs(args, rec)
    run_ids = [None] * len(plan)
    if args.store:
        from dataclasses import asdict

        from testbench.store import RunStore

        store = RunStore(args.store)
        run_ids = [store.create_run("train", cfg.name, dict(asdict(cfg), world_size=args.ranks))
                   for _, _, _, cfg in plan]
    print(f"training {len(plan)} runs on {args.ranks} ranks...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    summaries = launch.spawn(_ranks_main, args.ranks, [c for _, _, _, c in plan],
                             args.store, run_ids, timeout_s=3600.0)[0]
    print(f"done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    doc = report(args, list(zip(plan, summaries)), rec)
    if args.store:
        RunStore(args.store).save_result(None, "convergence", doc)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_table(doc)
    return 0 if doc["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
