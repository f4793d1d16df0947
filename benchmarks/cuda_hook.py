"""The QSGD hook and codec on a CUDA device: host synchronisations and step times.

Counts the host synchronisations (``torch.cuda.set_sync_debug_mode``: a blocking copy to the
host, a ``.item()``, a ``cudaStreamSynchronize``) of

- the packed codec alone: ``encode`` then ``decode`` of one bucket-sized tensor;
- one training step of a model under DDP with the QSGD hook (NCCL, world size 1: one GPU can
  hold one NCCL rank; the hook still quantizes, encodes and decodes every bucket);
- the same step with DDP's own allreduce, the baseline.

and times the steps with CUDA events. Prints a table; ``--json`` writes the figures.

    python benchmarks/cuda_hook.py [--model resnet50] [--steps 20] [--json out.json]

Needs a CUDA device (it says so and exits 2 without one).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import qsgd


def count_syncs(fn) -> tuple[int, list[str]]:
    """(host synchronisations during ``fn()``, their distinct messages)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
            # the hook's callbacks run on its own thread; let them end inside the window (an
            # explicit synchronize is not reported by the debug mode)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    msgs = [str(w.message).splitlines()[0] for w in seen
            if "called a synchronizing CUDA operation" in str(w.message)]
    return len(msgs), sorted(set(msgs))


def median_seconds(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, timed with CUDA events."""
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def codec_case(numel: int, bits: int, device_checks: bool) -> dict:
    """``qsgd.encode`` / ``qsgd.decode`` (checks read at once), or the hook's
    ``qsgd.devicecodec`` (checks left on the device as flags)."""
    from qsgd import devicecodec, rng

    cfg = qsgd.QSGDConfig.from_bits(bits)
    x = torch.randn(numel, device="cuda")
    key = rng.stream_key(1)

    def round_trip():
        if device_checks:
            p, _ = devicecodec.encode(x, cfg, key)
            return devicecodec.decode(p, numel, cfg)
        p = qsgd.encode(x, cfg, seed=1)
        return qsgd.decode(p)

    round_trip()
    n, msgs = count_syncs(round_trip)
    api = "qsgd.devicecodec" if device_checks else "qsgd.encode/decode"
    return {"case": f"{api} packed {bits}-bit, {numel:,} el.", "syncs": n, "messages": msgs,
            "seconds": median_seconds(round_trip, 10)}


def step_case(model_name: str, batch: int, hook: bool, steps: int, bucket_cap_mb: float) -> dict:
    torch.manual_seed(0)
    model = qsgd.build_model(model_name).cuda()
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=bucket_cap_mb)
    if hook:
        state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), transport="allgather")
        ddp.register_comm_hook(state, qsgd.qsgd_hook)
    gen = torch.Generator().manual_seed(0)
    x = model.example_input(batch, generator=gen, device="cuda")
    y = model.example_target(batch, generator=gen, device="cuda")

    def step():
        ddp.zero_grad(set_to_none=True)
        model.loss(ddp(x), y).backward()

    for _ in range(3):
        step()
    n, msgs = count_syncs(step)
    name = "QSGD hook 4-bit" if hook else "DDP allreduce"
    return {"case": f"{model_name} step, {name}, batch {batch}", "syncs": n, "messages": msgs,
            "seconds": median_seconds(step, steps)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_hook: no CUDA device", file=sys.stderr)
        return 2
    store = tempfile.NamedTemporaryFile(delete=False).name
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    torch.cuda.set_device(0)
    try:
        rows = [codec_case(1 << 24, bits, dev) for dev in (False, True) for bits in (4, 8)]
        for hook in (False, True):
            rows.append(step_case(args.model, args.batch, hook, args.steps, args.bucket_cap_mb))
    finally:
        dist.destroy_process_group()
        os.unlink(store)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| case | host syncs | median seconds |\n|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['syncs']} | {r['seconds']:.4f} |")
    for r in rows:
        for m in r["messages"]:
            print(f"  {r['case']}: {m}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
