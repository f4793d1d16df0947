"""``qsgd-emu measure``: real QSGD payloads of a real model, per DDP bucket, into a PayloadTrace.

Example::

    qsgd-emu measure --model resnet152 --bits 4 --bucket-size 512 --codec packed --norm max \\
        --device auto --iterations 3 --batch-size 2 --out trace.json

prints one row per bucket (elements, fp32 bytes, bytes sent with QSGD, ratio, ready time, encode
and decode times, means over the iterations) and writes the trace (docs/formats.md). ``--json``
prints the same table as JSON instead.
"""
from __future__ import annotations

import argparse
import json
import sys

from qsgd_emu import computeargs
from qsgd_emu.outputs import output_file


#: qsgd.measure's bucket orders and the paper's small-tensor threshold (kept here so that
#: ``--help`` does not import torch).
BUCKET_ORDERS = ("ready", "reverse", "find_unused")
DEFAULT_MIN_NUMEL = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="resnet50",
                        help="model name (alexnet, vgg19, resnet50, resnet152, resnet110, resnet20, "
                             "bn_inception, lstm_an4, mlp) or import path pkg.mod:Class")
    parser.add_argument("--input-shape", metavar="D0,D1,...",
                        help="shape of one sample, for a model without input_shape (e.g. 3,224,224)")
    q = parser.add_mutually_exclusive_group()
    q.add_argument("--bits", type=int, help="bits per coordinate, levels = 2**(bits-1) - 1 (default 4)")
    q.add_argument("--levels", type=int, help="quantization levels s (instead of --bits)")
    parser.add_argument("--bucket-size", type=int, default=512, help="QSGD bucket size d, elements")
    parser.add_argument("--norm", default="max", help="bucket scale: max or l2")
    parser.add_argument("--codec", default="packed", help="packed or elias")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--iterations", type=int, default=3, help="recorded iterations")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded iterations first")
    parser.add_argument("--batch-size", type=int,
                        help="samples per iteration (default 32 on CUDA, 2 on CPU)")
    parser.add_argument("--min-numel", type=int, default=DEFAULT_MIN_NUMEL,
                        help="parameters with fewer elements go uncompressed")
    parser.add_argument("--bucket-cap", default="25MiB", help="DDP bucket cap")
    parser.add_argument("--first-bucket", default="1MiB", help="DDP first-bucket cap")
    parser.add_argument("--bucket-order", default="ready", choices=sorted(BUCKET_ORDERS),
                        help="ready: DDP's rebuilt buckets from the measured gradient order (default); "
                             "reverse: reverse registration order; find_unused: DDP with "
                             "find_unused_parameters=True")
    parser.add_argument("--seed", type=int, default=0, help="seed of model init, data and quantization")
    parser.add_argument("--variance-bits", default="2,3,4,5,6,8", metavar="B1,B2,...",
                        help="widths whose quantization variance is measured per bucket and parameter "
                             "(for qsgd-emu recommend); 'none' to skip")
    parser.add_argument("--variance-samples", type=int, default=2,
                        help="quantizations averaged per width and iteration")
    parser.add_argument("--out", metavar="PATH", type=output_file,
                        help="write the PayloadTrace JSON here (folders are created)")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--activation-checkpointing", default="none",
                        choices=computeargs.CHECKPOINTING_CHOICES,
                        help="record the step with every block (the modules FSDP wraps) "
                             "checkpointed: its forward runs again in backward, up to torch's "
                             "early stop (blocks) or whole (blocks_full: reentrant, or torch "
                             "before 2.1) or but what torchtitan's selective op policy keeps "
                             "(selective); only the blocks' inputs (and those kept outputs) and "
                             "one block's activations are kept")


def _shape(text: str | None):
    if text is None:
        return None
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--input-shape: expected integers like 3,224,224, got {text!r}") from None
    if not shape or min(shape) < 1:
        raise ValueError(f"--input-shape: expected positive integers like 3,224,224, got {text!r}")
    return shape


def _widths(text: str) -> tuple[int, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--variance-bits: expected integers like 2,4,8 or 'none', got {text!r}") from None


def bucket_rows(trace) -> list[dict]:
    """One row per bucket: means over the iterations (bytes, seconds)."""
    rows = []
    for b in trace.buckets:
        wire = trace.mean_wire_bytes(b.index)
        rows.append({
            "bucket": b.index, "params": len(b.params), "numel": b.numel,
            "compressed_numel": b.compressed_numel, "raw_numel": b.raw_numel,
            "fp32_bytes": b.fp32_bytes, "payload_bytes": trace.mean_payload_bytes(b.index),
            "raw_bytes": wire - trace.mean_payload_bytes(b.index), "sent_bytes": wire,
            "ratio": b.fp32_bytes / wire,  # a bucket always sends something: numel >= 1
            "ready_s": trace.mean_ready_s(b.index), "encode_s": trace.mean_encode_s(b.index),
            "decode_s": trace.mean_decode_s(b.index),
        })
    return rows


def format_table(trace, rows: list[dict]) -> str:
    head = ("bucket", "params", "numel", "fp32 B", "sent B", "ratio", "ready ms", "enc ms", "dec ms")
    body = [(str(r["bucket"]), str(r["params"]), f"{r['numel']:,}", f"{r['fp32_bytes']:,}",
             f"{r['sent_bytes']:,.0f}", f"{r['ratio']:.2f}x", f"{r['ready_s'] * 1e3:.2f}",
             f"{r['encode_s'] * 1e3:.2f}", f"{r['decode_s'] * 1e3:.2f}") for r in rows]
    fp32 = sum(r["fp32_bytes"] for r in rows)
    sent = sum(r["sent_bytes"] for r in rows)
    body.append(("total", str(sum(r["params"] for r in rows)), f"{trace.parameters:,}", f"{fp32:,}",
                 f"{sent:,.0f}", f"{fp32 / sent:.2f}x" if sent else "-", "",
                 f"{sum(r['encode_s'] for r in rows) * 1e3:.2f}",
                 f"{sum(r['decode_s'] for r in rows) * 1e3:.2f}"))
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in body]
    c = trace.config
    title = (f"{trace.model}: {trace.parameters:,} parameters, batch {trace.batch_size} on {trace.device} "
             f"({trace.device_name}); QSGD {c.bits}-bit (s={c.levels}), d={c.bucket_size}, {c.norm} norm, "
             f"{c.codec}; buckets: {trace.bucket_assignment} order")
    ckpt = "none" if trace.operators is None else trace.operators.extra.get("checkpointing", "none")
    if ckpt != "none":
        from qsgd import CHECKPOINTING

        title += f"; activation checkpointing: {CHECKPOINTING[ckpt]}"
    times = (f"per iteration (mean of {trace.num_iterations}): forward {trace.mean_iteration('forward_s') * 1e3:.1f} ms, "
             f"backward {trace.mean_iteration('backward_s') * 1e3:.1f} ms, "
             f"optimizer {trace.mean_iteration('optimizer_s') * 1e3:.1f} ms")
    return "\n".join([title, times, *lines])


def run(args: argparse.Namespace) -> int:
    import torch

    import qsgd
    import topologies

    cfg_kwargs = dict(bucket_size=args.bucket_size, norm=args.norm, codec=args.codec)
    cfg = (qsgd.QSGDConfig(levels=args.levels, **cfg_kwargs) if args.levels is not None
           else qsgd.QSGDConfig.from_bits(4 if args.bits is None else args.bits, **cfg_kwargs))
    on_cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    batch = args.batch_size if args.batch_size is not None else (32 if on_cuda else 2)
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    trace = qsgd.measure(
        args.model, cfg, iterations=args.iterations, batch_size=batch, device=args.device,
        min_numel=args.min_numel, seed=args.seed, bucket_cap_bytes=topologies.parse_bytes(args.bucket_cap),
        first_bucket_bytes=topologies.parse_bytes(args.first_bucket), bucket_order=args.bucket_order,
        warmup=args.warmup, input_shape=_shape(args.input_shape), variance_bits=_widths(args.variance_bits),
        variance_samples=args.variance_samples, progress=progress,
        checkpointing=args.activation_checkpointing)
    if args.out:
        trace.save(args.out)
    rows = bucket_rows(trace)
    if args.json:
        print(json.dumps({"model": trace.model, "parameters": trace.parameters, "device": trace.device,
                          "device_name": trace.device_name, "config": trace.config.to_dict(),
                          "bucket_assignment": trace.bucket_assignment, "out": args.out,
                          "activation_checkpointing": args.activation_checkpointing,
                          "forward_s": trace.mean_iteration("forward_s"),
                          "backward_s": trace.mean_iteration("backward_s"),
                          "optimizer_s": trace.mean_iteration("optimizer_s"), "buckets": rows}, indent=2))
        return 0
    print(format_table(trace, rows))
    if args.out:
        print(f"trace written to {args.out}")
    return 0
