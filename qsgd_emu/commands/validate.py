"""``qsgd-emu validate``: measure real collectives, calibrate the emulator, compare.

Actions::

    qsgd-emu validate run --out trace.json [--spawn N] [sweep and training options]
        On the current process group (inside torchrun / srun), or N local gloo ranks.
    qsgd-emu validate testbed --hosts 4 --rate 1Gbit --out trace.json [options]
        Build a shaped multi-host network of Linux namespaces (root), run one rank per host.
    qsgd-emu validate import-nccl-tests LOG --out trace.json [--op allreduce] [--topology SPEC]
    qsgd-emu validate compute [--cases PATH] [--out rows.json] [--json]
        The compute model against published single-GPU training throughput.
    qsgd-emu validate attention [--cases PATH] [--out rows.json] [--json]
        The attention kernels against FlashAttention-2's end-to-end table (its Table 1).
    qsgd-emu validate published [--registry DIR] [--ids a,b] [--max-world-size N]
                                [--out DIR] [--json]
        Every published multi-GPU training run of the registry predicted with the project's
        defaults: throughput, scaling efficiency and compression speedup, each against the
        published figure; writes published.json and published.html in --out.
    qsgd-emu validate calibrate TRACE [--topology SPEC] [--fit-sizes 1MiB,16MiB] [--json]
    qsgd-emu validate compare TRACE [--topology SPEC] [--calibration CAL.json] --out report.json
        [--html report.html] [--per-op] [--min-bytes 1MB] [--uncalibrated] [--json]

TRACE may be a MeasuredTrace or an nccl-tests log. The topology comes from ``--topology``, else
from the trace (a ``--topology`` given to ``import-nccl-tests``, the log's ``# qsgd-emu:``
header, or the preset its devices and hosts name: 16 x ``NVIDIA H100 80GB HBM3`` on 2 hosts is
``cluster:dgx_h100x2``). ``calibrate`` fits the link figures the points determine and keeps the
topology's own for the rest, and says which is which.

SLURM: ``srun --ntasks-per-node=G torchrun --nnodes=$SLURM_NNODES --nproc-per-node=G
--rdzv-backend=c10d --rdzv-endpoint=$MASTER:29500 -m qsgd_emu validate run --out t.json``
(NCCL is used when CUDA is available, gloo otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from qsgd_emu.outputs import output_dir, output_file, write_json
from qsgd_emu.progress import counted



def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("run", help="time collectives and training steps on this process group")
    harness_arguments(p)
    p.add_argument("--spawn", type=int, default=0,
                   help="start this many local gloo ranks instead of joining a launched group")
    p.add_argument("--wall-timeout", type=float, default=600.0,
                   help="bound on the whole run with --spawn, seconds")

    p = sub.add_parser("testbed", help="run the harness on a shaped namespace testbed (root)")
    harness_arguments(p)
    p.add_argument("--hosts", type=int, default=4, help="emulated hosts (one rank each)")
    p.add_argument("--rate", default="1Gbit", help="link rate of every host, each direction")
    p.add_argument("--wall-timeout", type=float, default=600.0, help="bound on the run, seconds")

    p = sub.add_parser("compute", help="the compute model against published single-GPU "
                                       "training throughput")
    p.add_argument("--cases", default=None, metavar="PATH",
                   help="a qsgd-published-compute JSON (default: the project's, "
                        "tests/emulator/data/compute/published_throughput.json)")
    p.add_argument("--ids", default=None, help="comma list of case ids (default all)")
    p.add_argument("--out", default=None, type=output_file, help="write the rows as JSON here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("attention", help="the attention kernels against FlashAttention-2's "
                                         "published end-to-end training speeds")
    p.add_argument("--cases", default=None, metavar="PATH",
                   help="a qsgd-published-attention JSON (default: the project's, "
                        "tests/emulator/data/compute/flashattention2_table1.json)")
    p.add_argument("--out", default=None, type=output_file, help="write the rows as JSON here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("published", help="predict the registry of published multi-GPU training "
                                         "runs (throughput, scaling efficiency, speedups)")
    p.add_argument("--registry", default=None, metavar="DIR",
                   help="a folder of qsgd-published-run JSON files (default: the project's, "
                        "tests/emulator/data/published_runs)")
    p.add_argument("--ids", default=None, help="comma list of registry ids (default all)")
    p.add_argument("--max-world-size", type=int, default=None,
                   help="leave out points of more GPUs (default none left out)")
    p.add_argument("--out", default="out/published", type=output_dir, metavar="DIR",
                   help="the folder published.json and published.html go in")
    p.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                   help="skip the diagnostic replay with compute timed as the published "
                        "single-GPU run")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("import-nccl-tests", help="turn an nccl-tests log into a MeasuredTrace")
    p.add_argument("log", help="all_reduce_perf / all_gather_perf output (text or -J JSON)")
    p.add_argument("--out", required=True, type=output_file, help="MeasuredTrace JSON to write")
    p.add_argument("--op", default=None, help="collective, if the log does not say")
    p.add_argument("--world-size", type=int, default=None, help="ranks, if the log does not list them")
    p.add_argument("--topology", default=None, help="topology spec of the cluster (kept for compare)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")

    for name, text in (("calibrate", "fit link latency and bandwidth to a MeasuredTrace"),
                       ("compare", "predict a MeasuredTrace with the calibrated emulator")):
        p = sub.add_parser(name, help=text)
        p.add_argument("trace", help="MeasuredTrace JSON (or an nccl-tests log)")
        p.add_argument("--topology", default=None, help="spec or file; default the trace's")
        p.add_argument("--fit-sizes", default=None,
                       help="comma list of sizes to fit on (default smallest and largest)")
        p.add_argument("--ops", default=None, help="comma list of ops to fit on (default all)")
        p.add_argument("--algorithm", default=None,
                       help="algorithm run (default each point's: ring for gloo traces, nccl for "
                            "nccl-tests logs)")
        p.add_argument("--predictor", default="simulate", choices=("simulate", "closed_form"),
                       help="predict each point with the flow-level engine or the alpha-beta "
                            "closed form")
        p.add_argument("--out", default=None, type=output_file,
                       help="write the calibration / report JSON here")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "compare":
            p.add_argument("--calibration", default=None, help="calibration JSON from 'calibrate'")
            p.add_argument("--per-op", action="store_true", help="fit each op on its own")
            p.add_argument("--min-bytes", default="0", help="score held-out points of >= this size")
            p.add_argument("--html", default=None, type=output_file,
                           help="write the figure as HTML here")
            p.add_argument("--uncalibrated", action="store_true",
                           help="predict with the topology's own figures (fit nothing)")


def harness_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the harness (``validate run`` and ``validate testbed``)."""
    parser.add_argument("--out", required=True, type=output_file,
                        help="MeasuredTrace JSON written by rank 0")
    parser.add_argument("--ops", default="allreduce,allgather", help="comma list: allreduce,allgather")
    parser.add_argument("--min-bytes", default="1MiB", help="smallest size (nccl-tests -b)")
    parser.add_argument("--max-bytes", default="16MiB", help="largest size (nccl-tests -e)")
    parser.add_argument("--factor", type=int, default=2, help="size multiplier (nccl-tests -f)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repetitions per size")
    parser.add_argument("--iters", type=int, default=5, help="timed repetitions per size")
    parser.add_argument("--train-bits", default="4",
                        help="QSGD bit widths to time against fp32 ('' for no training steps)")
    parser.add_argument("--train-transport", default="allgather",
                        choices=("allgather", "scatter_reduce_allgather"),
                        help="the QSGD hook's transport in the timed training steps")
    parser.add_argument("--width", type=int, default=1024, help="hidden units of the wide MLP")
    parser.add_argument("--depth", type=int, default=3, help="hidden layers of the wide MLP")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0,
                        help="DDP bucket cap, MiB (smaller: more buckets, more overlap)")
    parser.add_argument("--train-warmup", type=int, default=2,
                        help="untimed training steps per transport")
    parser.add_argument("--train-steps", type=int, default=5,
                        help="timed training steps per transport (their median is reported)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the MLP, its data and QSGD")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="process-group timeout, seconds (a dead peer fails, never hangs)")
    parser.add_argument("--topology", default=None,
                        help="topology spec of this set-up, kept in the trace for compare")
    parser.add_argument("--no-loaded", dest="loaded", action="store_false",
                        help="skip sweeping every other size again while every rank computes "
                             "(what replay uses for collectives that overlap backward)")


def harness_config(args):
    """The :class:`testbench.HarnessConfig` of parsed harness options (validated)."""
    import testbench
    import topologies

    bits = tuple(int(b) for b in str(args.train_bits).split(",") if b.strip())
    return testbench.HarnessConfig(
        ops=tuple(o.strip() for o in args.ops.split(",") if o.strip()),
        min_bytes=topologies.parse_bytes(args.min_bytes), max_bytes=topologies.parse_bytes(args.max_bytes),
        factor=args.factor, warmup=args.warmup, iters=args.iters, train_bits=bits,
        train_transport=args.train_transport, width=args.width, depth=args.depth,
        batch_size=args.batch_size, bucket_cap_mb=args.bucket_cap_mb, train_warmup=args.train_warmup,
        train_steps=args.train_steps, seed=args.seed, timeout_s=args.timeout,
        topology=args.topology, loaded=args.loaded)


def _load_trace(path):
    from emulator import MeasuredTrace, import_nccl_tests

    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096)
    if '"qsgd-measured-trace"' in head or '"format"' in head:
        return MeasuredTrace.load(path)
    return import_nccl_tests(path)


def _graph(spec):
    if spec is None:
        return None
    import topologies

    if os.path.exists(spec):
        return topologies.load(spec)
    return topologies.from_spec(spec)


def _sizes(text):
    if not text:
        return None
    import topologies

    return [topologies.parse_bytes(s.strip()) for s in text.split(",") if s.strip()]


def _harness_argv(args) -> list[str]:
    argv = [sys.executable, "-m", "qsgd_emu", "validate", "run", "--out", os.path.abspath(args.out)]
    for opt in ("ops", "min_bytes", "max_bytes", "factor", "warmup", "iters", "train_bits",
                "train_transport", "width", "depth", "batch_size", "bucket_cap_mb", "train_warmup",
                "train_steps",
                "seed", "timeout", "topology"):
        value = getattr(args, opt)
        if value is not None:
            argv += [f"--{opt.replace('_', '-')}", str(value)]
    if not args.loaded:
        argv.append("--no-loaded")
    return argv


def _report_ranks(results) -> int:
    bad = [r for r in results if r.returncode != 0 or r.timed_out]
    for r in bad:
        why = "timed out" if r.timed_out else f"exit status {r.returncode}"
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"rank {r.rank}: {why}: {tail}", file=sys.stderr)
    return 1 if bad else 0


def _run(args) -> int:
    import testbench

    cfg = harness_config(args)          # validated before anything starts
    if not args.spawn:
        trace = testbench.run_harness(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
        if trace is not None:
            trace.save(args.out)
            print(f"wrote {args.out}: {len(trace.collectives)} collective points, "
                  f"{len(trace.training)} training points")
        return 0
    if args.spawn < 1:
        raise ValueError(f"--spawn {args.spawn} must be >= 1")
    results = testbench.run_local_ranks(_harness_argv(args), args.spawn,
                                        timeout_s=args.wall_timeout, echo_rank0=sys.stderr.write)
    rc = _report_ranks(results)
    if rc == 0:
        print(f"wrote {args.out}")
    return rc


def _testbed(args) -> int:
    import testbench
    import topologies

    rate = topologies.parse_bandwidth(args.rate)
    if args.topology is None:
        args.topology = f"switch:{args.hosts},bw={args.rate},link=ethernet"
    harness_config(args)
    with testbench.Testbed(testbench.TestbedConfig(hosts=args.hosts, rate=rate)) as tb:
        results = tb.run(_harness_argv(args), timeout_s=args.wall_timeout, cwd=os.getcwd())
    if results[0].stderr:
        sys.stderr.write("\n".join(line for line in results[0].stderr.splitlines()
                                   if "socket.cpp" not in line) + "\n")
    rc = _report_ranks(results)
    if rc == 0:
        print(f"wrote {args.out} ({args.hosts} hosts at {args.rate})")
    return rc


def _import(args) -> int:
    from emulator import import_nccl_tests

    trace = import_nccl_tests(args.log, op=args.op, world_size=args.world_size, topology=args.topology)
    trace.save(args.out)
    if args.json:
        print(json.dumps({"out": args.out, "points": len(trace.collectives),
                          "environment": trace.environment}))
    else:
        print(f"wrote {args.out}: {len(trace.collectives)} points, world size {trace.world_size}")
        env = trace.environment
        why = {"argument": "--topology", "annotation": "the log's '# qsgd-emu:' note",
               "devices": f"{len(env.get('hosts') or [])} host(s) of "
                          f"{(env.get('devices') or ['?'])[0]}"}
        if env.get("topology"):
            print(f"topology {env['topology']} (from {why.get(env.get('topology_from'), '?')})")
        else:
            print("topology unknown (devices not recognised): pass --topology to compare")
    return 0


def _calibrate(args) -> int:
    from emulator import calibrate
    from emulator.validation.compare import _topology

    trace = _load_trace(args.trace)
    G, spec = _topology(trace, _graph(args.topology), args.topology)
    ops = tuple(o.strip() for o in args.ops.split(",")) if args.ops else None
    cal = calibrate(trace, G, fit_sizes=_sizes(args.fit_sizes), ops=ops, algorithm=args.algorithm,
                    predictor=args.predictor)
    d = cal.to_dict()
    if args.out:
        write_json(args.out, d)
    if args.json:
        print(json.dumps(d))
    else:
        print(f"calibrated {spec} on {len(cal.fitted_on)} points ({cal.iterations} iterations):")
        for line in cal.describe():
            print("  " + line)
        for (op, n), e in zip(cal.fitted_on, cal.fit_rel_errors):
            print(f"  fit {op:10s} {n:12d} B  error {e:+.2%}")
    return 0


def _compare(args) -> int:
    import topologies
    from emulator import compare
    from emulator.validation import Calibration
    from emulator.validation.training import step_breakdown

    trace = _load_trace(args.trace)
    cal = None
    if args.calibration and args.uncalibrated:
        raise ValueError("--calibration and --uncalibrated exclude each other")
    if args.calibration:
        with open(args.calibration) as f:
            cal = Calibration.from_dict(json.load(f))
    ops = tuple(o.strip() for o in args.ops.split(",")) if args.ops else None
    report = compare(trace, _graph(args.topology), topology=args.topology, calibration=cal,
                     fit_sizes=_sizes(args.fit_sizes), fit_ops=ops, per_op=args.per_op,
                     algorithm=args.algorithm, predictor=args.predictor,
                     min_bytes=topologies.parse_bytes(args.min_bytes),
                     uncalibrated=args.uncalibrated)
    if args.out:
        report.save(args.out)
    if args.html:
        report.write_html(args.html)
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    print(f"{'op':10s} {'bytes':>12s} {'measured ms':>12s} {'predicted ms':>13s} {'error':>8s}  fit")
    for p in report.points:
        print(f"{p['op']:10s} {p['bytes']:12d} {p['measured_s'] * 1e3:12.3f} "
              f"{p['predicted_s'] * 1e3:13.3f} {p['rel_error']:+8.1%}  {'' if p['held_out'] else 'yes'}")
    s = report.summary
    print(f"topology {report.topology}" + (" (uncalibrated: the topology's own figures)"
                                          if args.uncalibrated else ""))
    if s.get("points"):
        print(f"held-out points: {s['points']}, median |error| {s['median_abs_rel_error']:.1%}, "
              f"max |error| {s['max_abs_rel_error']:.1%}")
    loaded = report.calibration.get("loaded")
    if report.training and loaded:
        links = "; ".join(f"{k} latency {v['alpha_s'] * 1e6:.1f} us, bandwidth "
                          f"{v['bandwidth'] / 1e6:.1f} MB/s"
                          for k, v in loaded.get("links", {}).items())
        print(f"training steps: collectives overlapping compute on links fitted under load "
              f"({links})")
    if report.training and "compute_pace" in report.calibration:
        print(f"training steps: compute at {report.calibration['compute_pace']:.2f} of its pace "
              f"while a collective runs (measured)")
    for t in report.training:
        line = (f"train {t['model']} {t['transport']:10s} {t['bits']:2d} bits: measured "
                f"{t['measured_s'] * 1e3:.1f} ms")
        if t.get("predicted_s") is not None:
            line += f", predicted {t['predicted_s'] * 1e3:.1f} ms"
        if "measured_speedup" in t:
            line += f"; speedup measured {t['measured_speedup']:.2f}x"
            if "predicted_speedup" in t:
                line += f", predicted {t['predicted_speedup']:.2f}x ({t['speedup_rel_error']:+.1%})"
        print(line)
        where = step_breakdown(t)
        if where:
            print("  " + where)
    return 0


def _compute(args) -> int:
    from emulator.validation import validate_compute

    out = validate_compute(args.cases, ids=set(args.ids.split(",")) if args.ids else None,
                           progress=counted("validate compute", "cases"))
    if args.out:
        write_json(args.out, out)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'case':52s} {'GPU':10s} {'precision':9s} {'batch':>5s} {'published':>10s} "
          f"{'predicted':>10s} {'error':>7s}")
    for r in out["rows"]:
        print(f"{r['id'][:52]:52s} {r['device']:10s} {r['precision']:9s} {r['batch_size']:5d} "
              f"{r['published']:10.1f} {r['predicted']:10.1f} {r['error']:+7.1%}")
    n = len(out["rows"])
    print(f"{n} cases (samples/s): median |error| {out['median_abs_error']:.1%}, max "
          f"{out['max_abs_error']:.1%}; within 10 %: {out['within_10']}, within 25 %: "
          f"{out['within_25']}. Nothing in the compute model is fitted to these cases; "
          f"benchmarks/RESULTS.md says why each miss misses.")
    return 0


def _attention(args) -> int:
    from emulator.validation import validate_attention

    out = validate_attention(args.cases, progress=counted("validate attention", "cases"))
    if args.out:
        write_json(args.out, out)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'row':22s} {'attention':24s} {'published':>9s} {'predicted':>9s} {'error':>7s}")
    for r in out["rows"]:
        print(f"{r['row']:22s} {r['column'][:24]:24s} {r['published']:9.1f} "
              f"{r['predicted']:9.1f} {r['error']:+7.1%}")
    print("speedups between columns (published / predicted):")
    for s in out["speedups"]:
        print(f"  {s['row']:22s} {s['pair']:16s} {s['published']:.2f}x / {s['predicted']:.2f}x")
    print(f"{len(out['rows'])} runs (model TFLOP/s per GPU, {out['source'].get('table_or_file', '')}"
          f"): median |error| {out['median_abs_error']:.1%}, max {out['max_abs_error']:.1%}. "
          f"Nothing is fitted to them; the kernels' ratios are the paper's section 4.1.")
    return 0


def _published(args) -> int:
    from emulator.validation import published_html, published_text, validate_published

    if args.max_world_size is not None and args.max_world_size < 1:
        raise ValueError(f"--max-world-size must be >= 1, got {args.max_world_size}")
    ids = {i.strip() for i in args.ids.split(",") if i.strip()} if args.ids else None
    out = validate_published(args.registry, ids=ids, max_world_size=args.max_world_size,
                             diagnose=args.diagnose, progress=counted("validate published", "points"))
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "published.json")
    html_path = os.path.join(args.out, "published.html")
    with open(json_path, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    with open(html_path, "w", encoding="utf-8") as fh:
        fh.write(published_html(out))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for line in published_text(out):
        print(line)
    print(f"wrote {json_path} and {html_path}. Nothing is fitted to the registry; "
          f"benchmarks/RESULTS.md says why each miss misses.")
    return 0


ACTIONS = {"run": _run, "testbed": _testbed, "import-nccl-tests": _import,
           "calibrate": _calibrate, "compare": _compare, "compute": _compute,
           "attention": _attention, "published": _published}


def run(args) -> int:
    return ACTIONS[args.action](args)
