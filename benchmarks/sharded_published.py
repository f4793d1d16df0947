"""Sharded studies against published FSDP throughputs (issue 31): median error target 15 %.

Reads the published sharded runs of the registry (``tests/emulator/data/published_runs``,
llm-foundry's MPT tables; see its README for each file's source and caveats) directly, and
predicts every point with the study's own path: ``emulator.run_study(StudyConfig(
parallelism="fsdp", transports=("fp32",), ...))`` on the model's layout measured on the meta
device, at the point's micro-batch, precision and GPU, on the cluster preset closest to what
the source states. Prints one row per point (predicted and published tokens/s per GPU, the
error, the memory per GPU) and the median absolute error.

The models: MPT is a GPT-style decoder (pre-LayerNorm, GELU MLP of 4 d_model, tied
embeddings, no biases, ALiBi instead of learned positions); it is built here as the zoo's
GPT-2 class at the file's ``model_args`` (d_model, layers, heads, vocabulary, sequence), which
adds its biases and learned positions (under 0.3 % of the parameters of MPT-7B).

The clusters: the H100 tables state no network: ``cluster:dgx_h100x{N}`` (8 GPUs and eight
400 Gbit/s NICs a node). The A100 tables state "1600 Gbps node-node interconnect (RoCE)":
``cluster:dgx_a100x{N}`` (eight 200 Gbit/s NICs a node), its GPUs timed as the table's
A100-40GB.

A file's ``activation_checkpointing`` (llm-foundry's A100 MPT-7B rows: ``"blocks_full"``) is how
its model's step is recorded (``qsgd.record_operators(checkpointing=...)``).

Left out, and why: the ``torchtitan-llama3-8b`` files (96 GB H100s at 500 W, a part the
device catalogue does not have: ``validate published`` predicts them on the 700 W H100-SXM
and counts them as doubtful; their selective checkpointing is recorded), and world sizes above ``--max-gpus`` (default 128: the replay simulates every collective of the
largest ones for minutes).

    PYTHONPATH=. .venv/bin/python benchmarks/sharded_published.py [--max-gpus 128]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DATA = os.path.join(ROOT, "tests", "emulator", "data", "published_runs")
#: files whose setup the replay models, and the topology spec of each GPU
TOPOLOGY = {"H100-SXM": "cluster:dgx_h100x{N}", "A100-40GB": "cluster:dgx_a100x{N}"}
SKIP = {"torchtitan-llama3-8b-fsdp-eager-h100": "96 GB 500 W H100 not in the device catalogue "
                                                "(validate published: doubtful)",
        "torchtitan-llama3-8b-fsdp-compile-h100": "as the eager file, and torch.compile"}


def mpt_model(name: str, args: dict):
    """The zoo's GPT-2 class at an MPT file's dimensions, as ``validate published`` builds it
    (``emulator.validation.published.zoo_model``: the one owner of that mapping), on the meta
    device (no memory: a 13B layout builds in seconds)."""
    import qsgd
    import torch
    from emulator.validation.published import zoo_model

    name, kwargs = zoo_model(name, args, "model_args")
    with torch.device("meta"):
        return qsgd.build_model(name, **kwargs)


def points(max_gpus: int):
    """``(file id, run, [points])`` of the sharded files the replay models."""
    for path in sorted(glob.glob(os.path.join(DATA, "*.json"))):
        with open(path, encoding="utf-8") as fh:
            run = json.load(fh)
        if run.get("parallelism") != "fsdp":
            continue
        if run["id"] in SKIP:
            print(f"skip {run['id']}: {SKIP[run['id']]}")
            continue
        pts = [p for p in run["points"] if p["world_size"] <= max_gpus and p["method"] == "none"]
        left = [p["world_size"] for p in run["points"] if p["world_size"] > max_gpus]
        if left:
            print(f"skip {run['id']} at {left} GPUs: above --max-gpus {max_gpus}")
        if pts:
            yield run["id"], run, pts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-gpus", type=int, default=128)
    ap.add_argument("--json", metavar="PATH", help="write the rows here")
    args = ap.parse_args(argv)
    import emulator
    import qsgd

    rows, t0 = [], time.perf_counter()
    traces: dict = {}
    for fid, run, pts in points(args.max_gpus):
        margs = run["model_args"]
        ckpt = run.get("activation_checkpointing", "none")
        key = json.dumps([margs, ckpt], sort_keys=True)
        if key not in traces:
            traces[key] = qsgd.measure(mpt_model(run["model"], margs), qsgd.QSGDConfig.from_bits(4),
                                       device="meta", checkpointing=ckpt)
        trace = traces[key]
        cfg = emulator.StudyConfig(
            trace=trace, world_sizes=tuple(p["world_size"] for p in pts), bits=(32,),
            transports=("fp32",), topologies=(TOPOLOGY[run["device"]],), device=run["device"],
            batch_size=run["batch_size"], precision=run["precision"], parallelism="fsdp")
        study = emulator.run_study(cfg)
        for p, row in zip(pts, study.rows):
            tok_gpu = row.throughput_samples_s * margs["seq_len"] / row.world_size
            pub = p["throughput"] / (p["world_size"] if p["per"] == "total" else 1)
            rows.append({"file": fid, "world_size": p["world_size"], "predicted": tok_gpu,
                         "published": pub, "error": tok_gpu / pub - 1,
                         "memory_gb": row.memory_per_gpu / 1e9, "iteration_s": row.iteration_s,
                         "exposed_s": row.exposed_comm_s})
    print(f"\n{'file':<40} {'GPUs':>5} {'pred tok/s/GPU':>15} {'published':>10} {'error':>7} "
          f"{'GB/GPU':>7} {'exposed ms':>10}")
    for r in rows:
        print(f"{r['file']:<40} {r['world_size']:>5} {r['predicted']:>15.0f} {r['published']:>10.0f} "
              f"{100 * r['error']:>6.1f}% {r['memory_gb']:>7.1f} {1e3 * r['exposed_s']:>10.1f}")
    med = statistics.median(abs(r["error"]) for r in rows)
    print(f"\n{len(rows)} points, median |error| {100 * med:.1f}% (target <= 15%), "
          f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
