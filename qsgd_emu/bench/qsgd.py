"""Benchmark of the QSGD codec: encode/decode time, throughput, size and memory per codec.

``qsgd-emu bench qsgd [--json] [--numel N]`` quantizes and encodes a ``N``-element float32
gradient (default 2**26) for the packed codec at 2, 4 and 8 bits and the Elias codec at
s = 1, 3, 7 and floor(sqrt(d)), and prints, for each, the median encode and decode seconds,
elements/s, payload bytes, compression ratio, and ratios against two baselines timed in the same
run: ``x.clone()`` (the memory-bound floor: read 4 B, write 4 B per element) and a
straightforward torch QSGD (norm per bucket, ``torch.rand``, floor, int8 levels, no packing).

Peak extra memory of an encode is measured, on CPU, as the growth of the process's resident
set high-water mark (``VmHWM`` of /proc/self/status, reset through /proc/self/clear_refs after
``malloc_trim``), so it counts the payload and every temporary, torch's included; on CUDA as
``torch.cuda.max_memory_allocated`` growth.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import statistics
import time

import torch

from qsgd.codec import decode, encode
from qsgd.config import QSGDConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--numel", type=int, default=1 << 26,
                        help="elements of the float32 gradient (2**26 = 67108864)")
    parser.add_argument("--bucket-size", type=int, default=512, help="QSGD bucket size d")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the gradient and of QSGD")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


# ---------------------------------------------------------------------------------------------
# the straightforward baseline, as anyone would first write it

def naive_encode(x: torch.Tensor, s: int, d: int):
    """QSGD with max norm in plain torch: int8 levels (s <= 127) and fp32 norms, no packing."""
    n = x.numel()
    nb = -(-n // d)
    v = torch.zeros(nb * d, dtype=torch.float32, device=x.device)
    v[:n] = x.reshape(-1)
    v = v.view(nb, d)
    norm = v.abs().amax(1, keepdim=True)
    a = v.abs() / norm.clamp_min(torch.finfo(torch.float32).tiny) * s
    low = a.floor()
    level = low + (torch.rand(a.shape, device=x.device) < (a - low)).float()
    return (level * v.sign()).to(torch.int8), norm


def naive_decode(levels: torch.Tensor, norm: torch.Tensor, s: int, n: int) -> torch.Tensor:
    return (levels.float() * (norm / s)).reshape(-1)[:n]


# ---------------------------------------------------------------------------------------------
# measurement

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device: torch.device, repeats: int) -> float:
    """Median wall seconds of ``fn()`` (its result dropped before the next call)."""
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times)


def _proc_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_extra_bytes(fn, device: torch.device) -> float | None:
    """Peak memory ``fn()`` needs beyond what was in use before, in bytes (None if unknown)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        del out
        return float(peak - base)
    _trim()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return None
    base = _proc_kib("VmRSS")
    out = fn()
    peak = _proc_kib("VmHWM")
    del out
    if base is None or peak is None:
        return None
    return float(max(0, peak - base) * 1024)


def configs(d: int) -> list[tuple[str, QSGDConfig]]:
    """The benchmarked configurations: packed at 2, 4, 8 bits; Elias at s = 1, 3, 7, sqrt(d)."""
    rows = [(f"packed {b}-bit", QSGDConfig.from_bits(b, bucket_size=d)) for b in (2, 4, 8)]
    for s in (1, 3, 7, max(1, math.isqrt(d))):
        rows.append((f"elias s={s}", QSGDConfig(levels=s, bucket_size=d, codec="elias")))
    return rows


def measure(numel: int, d: int, repeats: int, device: torch.device, seed: int) -> dict:
    """Every figure of the benchmark as a dict (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=gen).to(device)
    raw = 4 * numel
    clone_s = median_seconds(lambda: x.clone(), device, repeats)
    result = {"format": "qsgd-bench", "version": 1, "device": str(device),
              "device_name": _device_name(device), "torch_version": torch.__version__,
              "threads": _threads(), "numel": numel, "bucket_size": d, "repeats": repeats,
              "clone_s": clone_s, "clone_gbps": 2 * raw / clone_s / 1e9, "rows": []}
    naive = {}
    for name, cfg in configs(d):
        s = cfg.levels
        if s not in naive and s <= 127:
            torch.manual_seed(seed)
            enc = median_seconds(lambda: naive_encode(x, s, d), device, max(1, min(repeats, 3)))
            lv, nm = naive_encode(x, s, d)
            dec = median_seconds(lambda: naive_decode(lv, nm, s, numel), device, max(1, min(repeats, 3)))
            del lv, nm
            naive[s] = (enc, dec)
        encode(x[: min(numel, 4096)], cfg, seed)  # compile / load the kernels outside the timing
        payload = encode(x, cfg, seed)
        decode(payload)
        enc_s = median_seconds(lambda: encode(x, cfg, seed), device, repeats)
        dec_s = median_seconds(lambda: decode(payload), device, repeats)
        peak = peak_extra_bytes(lambda: encode(x, cfg, seed), device)
        nbytes = int(payload.numel())
        n_enc, n_dec = naive.get(s, (None, None))
        result["rows"].append({
            "name": name, "codec": cfg.codec, "levels": s, "bits": cfg.bits,
            "encode_s": enc_s, "decode_s": dec_s,
            "encode_elements_per_s": numel / enc_s, "decode_elements_per_s": numel / dec_s,
            "payload_bytes": nbytes, "bits_per_element": 8 * nbytes / numel,
            "compression": raw / nbytes,
            "encode_vs_clone": enc_s / clone_s, "decode_vs_clone": dec_s / clone_s,
            "encode_gbps": (raw + nbytes) / enc_s / 1e9, "decode_gbps": (raw + nbytes) / dec_s / 1e9,
            "naive_encode_s": n_enc, "naive_decode_s": n_dec,
            "speedup_vs_naive_encode": None if n_enc is None else n_enc / enc_s,
            "speedup_vs_naive_decode": None if n_dec is None else n_dec / dec_s,
            "peak_extra_bytes": peak,
            "peak_extra_bytes_per_element": None if peak is None else peak / numel,
        })
        del payload
    return result


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _threads() -> int:
    import numba

    return numba.get_num_threads()


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(result: dict) -> str:
    """The human-readable table of :func:`measure`'s result."""
    head = (f"QSGD codec on {result['device']} ({result['device_name']}, {result['threads']} threads), "
            f"n = {result['numel']} float32, d = {result['bucket_size']}, median of {result['repeats']}\n"
            f"x.clone(): {result['clone_s'] * 1e3:.1f} ms ({result['clone_gbps']:.1f} GB/s)\n")
    cols = ["config", "enc ms", "dec ms", "enc Melem/s", "dec Melem/s", "payload B", "bits/el",
            "ratio", "enc/clone", "dec/clone", "enc GB/s", "vs naive enc", "vs naive dec", "peak B/el"]
    lines = ["  ".join(f"{c:>12}" for c in cols)]
    for r in result["rows"]:
        cells = [r["name"], f"{r['encode_s'] * 1e3:.1f}", f"{r['decode_s'] * 1e3:.1f}",
                 f"{r['encode_elements_per_s'] / 1e6:.0f}", f"{r['decode_elements_per_s'] / 1e6:.0f}",
                 str(r["payload_bytes"]), f"{r['bits_per_element']:.3f}", f"{r['compression']:.2f}x",
                 f"{r['encode_vs_clone']:.2f}", f"{r['decode_vs_clone']:.2f}", f"{r['encode_gbps']:.1f}",
                 _fmt(r["speedup_vs_naive_encode"], ".1f"), _fmt(r["speedup_vs_naive_decode"], ".1f"),
                 _fmt(r["peak_extra_bytes_per_element"], ".2f")]
        lines.append("  ".join(f"{c:>12}" for c in cells))
    return head + "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.numel < 1:
        raise ValueError(f"--numel must be >= 1, got {args.numel}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.bucket_size < 1:
        raise ValueError(f"--bucket-size must be >= 1, got {args.bucket_size}")
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r}: CUDA is not available")
    result = measure(args.numel, args.bucket_size, args.repeats, device, args.seed)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0
