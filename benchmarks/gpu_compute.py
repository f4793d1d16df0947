"""The compute model against a real GPU, per operator class: profile zoo models, compare.

For each (model, batch, precision) this times one real training step per operator on the
device (:func:`qsgd.operators.measured.time_operators`: torch.profiler, each kernel's device
time) and prints, per operator class, the measured milliseconds beside what
``emulator.compute``'s rules give for the same operator records on that GPU, and the whole
step's (the host pipeline included). This is the check the compute-model issue asks of a
lent GPU; it outranks every published figure. It needs CUDA (``--device cpu`` runs the same
path on this CPU as a smoke test, with no model column).

    python benchmarks/gpu_compute.py [--device cuda] [--json out.json]

Default grid: ResNet-50 at 64 and 128, GPT-2 (124M) at 4 and 8 sequences of 1024, one
Llama-2-7B-shaped decoder block (a 1-layer ``llama``) at 1 and 2 sequences of 4096; each in
fp32 and amp-bf16 (amp-fp16 where the GPU has no bf16 units).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

GRID = (
    ("resnet50", {}, (64, 128)),
    ("gpt2", {}, (4, 8)),
    ("llama", {"n_layers": 1}, (1, 2)),
)


def _row(name, kwargs, batch, precision, device) -> dict:
    import torch

    import qsgd
    from emulator.compute import device_named_as, kernel_seconds, precision as prec_named, step_times
    from qsgd.operators.measured import time_operators

    torch.manual_seed(0)
    model = qsgd.build_model(name, **kwargs).to(device)
    t0 = time.perf_counter()
    m = time_operators(model, batch, precision=precision)
    wall = time.perf_counter() - t0
    gpu = device_named_as(m.device_name)
    by_kind: dict = {}
    prec = prec_named(precision)
    for op, s in zip(m.operators.ops, m.seconds):
        k = by_kind.setdefault(op.kind, [0.0, 0.0, 0])
        k[0] += s
        k[2] += 1
        if gpu is not None:
            k[1] += kernel_seconds(op, batch, gpu, prec.mode(op.kind, op.dtype, gpu))
    step = None
    if gpu is not None:
        step = step_times(m.operators, batch, gpu, prec).step_s
    return {"model": name, "kwargs": kwargs, "batch": batch, "precision": precision,
            "device": m.device_name, "measured_kernels_s": sum(m.seconds),
            "modelled_step_s": step, "profile_wall_s": wall,
            "by_kind": {k: {"measured_s": v[0], "modelled_s": v[1] if gpu else None, "ops": v[2]}
                        for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1][0])}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_compute: no CUDA device here; nothing to run", file=sys.stderr)
        return 2
    precisions = ["fp32", "amp-bf16"]
    if args.device.startswith("cuda") and not torch.cuda.is_bf16_supported():
        precisions[1] = "amp-fp16"
    rows = []
    for name, kwargs, batches in GRID:
        for batch in batches:
            for precision in precisions:
                r = _row(name, kwargs, batch, precision, args.device)
                rows.append(r)
                step = "-" if r["modelled_step_s"] is None else f"{r['modelled_step_s'] * 1e3:.2f}"
                print(f"\n{name} batch {batch} {precision} on {r['device']}: kernels measured "
                      f"{r['measured_kernels_s'] * 1e3:.2f} ms, modelled step {step} ms")
                print(f"  {'kind':12s} {'ops':>5s} {'measured ms':>12s} {'modelled ms':>12s} {'ratio':>7s}")
                for kind, v in r["by_kind"].items():
                    mod = v["modelled_s"]
                    ratio = "-" if not mod else f"{v['measured_s'] / mod:.2f}"
                    print(f"  {kind:12s} {v['ops']:5d} {v['measured_s'] * 1e3:12.3f} "
                          f"{'-' if mod is None else f'{mod * 1e3:.3f}':>12s} {ratio:>7s}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
