"""Regenerate the nccl-tests fixture logs of this folder (run once; the outputs are committed).

The logs are synthetic: times from an alpha-beta model with 2% seeded noise, printed with the
column layout and number formatting of NVIDIA/nccl-tests (src/util.cu getFloatStr and the
header of writeResultHeader), in the variants met in practice: the current text table with a
``root`` column, an older table without it (``error`` column), ``srun --label`` prefixes, and
the ``-J`` JSON report (version 2). Host and device names are invented.
"""
import json
import random

random.seed(7)


def fmt(v, w):
    power, val = 0, 1
    while v >= val:
        power += 1
        val *= 10
    if power < w - 2:
        return f"{v:{w}.2f}"
    if power < w - 1:
        return f"{v:{w}.1f}"
    if power < w + 1:
        return f"{v:{w}.0f}"
    return f"{v:{w}.1e}"


def ar_time(n, p, alpha=1.2e-6, base=14e-6, bw=48e9):
    return base + 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw


def ag_time(n, p, alpha=1.0e-6, base=10e-6, bw=45e9):
    return base + (p - 1) * alpha + (p - 1) / p * n / bw


def noisy(t):
    return t * (1 + random.uniform(-0.02, 0.02))


HOSTS = ["gpu-a017", "gpu-a018"]


def rank_lines(p, per=8, prefix="", gpu="NVIDIA H100 80GB HBM3"):
    return [f"{prefix}#  Rank {r:2d} Group  0 Pid {41000 + r * 7:6d} on {HOSTS[r // per]:>10s} device "
            f"{r % per:2d} [0000:{0x18 + (r % per) * 0x10:02x}:00] {gpu}" for r in range(p)]


def row(n, count, typ, redop, t, ti, factor, root=True, prefix="", err="#wrong"):
    alg, algi = n / t / 1e9, n / ti / 1e9
    wrong = f"{0:6g}" if err == "#wrong" else f"{0:5.0e}"
    head = f"{prefix}{n:12d}  {count:12d}  {typ:>8s}  {redop:>6s}" + (f"  {-1:6d}" if root else "")
    return (head + f"  {fmt(t * 1e6, 7)}  {fmt(alg, 6)}  {fmt(alg * factor, 6)}  {wrong}"
            f"  {fmt(ti * 1e6, 7)}  {fmt(algi, 6)}  {fmt(algi * factor, 6)}  {wrong}")


HEADER_ROOT = [
    "#                                                              out-of-place                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong ",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)        ",
]

# 1. current text format, 16 ranks on 2 hosts, NCCL INFO lines in between.
p = 16
lines = ["# nccl-tests version 2.15.1 nccl-headers=22304 nccl-library=22304",
         "# Collective test starting: all_reduce_perf",
         "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 4(factor) warmup iters: 5 iters: 20 "
         "agg iters: 1 validation: 1 graph: 0 unalign: 0", "#", "# Using devices", *rank_lines(p),
         "gpu-a017:41000:41000 [0] NCCL INFO Bootstrap : Using ibp26s0:10.31.4.17<0>",
         "gpu-a017:41000:41000 [0] NCCL INFO NCCL version 2.23.4+cuda12.6", "#", *HEADER_ROOT]
for i in range(0, 25, 2):
    n = 8 << i
    t = noisy(ar_time(n, p))
    lines.append(row(n, n // 4, "float", "sum", t, noisy(t), 2 * (p - 1) / p))
lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 14.2127 ", "#",
          "# Collective test concluded: all_reduce_perf", "#", ""]
open("all_reduce_perf_2x8_h100.log", "w").write("\n".join(lines))

# 2. older format: no root column, 'error' column, no 'Collective test' banner; allgather, 8 ranks.
p = 8
lines = ["# nThread 1 nGpus 8 minBytes 1024 maxBytes 67108864 step: 2(factor) warmup iters: 5 iters: 20 "
         "validation: 1", "#", "# Using devices", *rank_lines(p, gpu="Tesla V100-SXM2-32GB"), "#",
         "#                                                     out-of-place                       in-place          ",
         "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
         "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "]
for i in range(10, 27, 2):
    n = 1 << i
    t = noisy(ag_time(n, p, bw=120e9))
    lines.append(row(n, n // 4 // p, "float", "none", t, noisy(t), (p - 1) / p, root=False, err="error"))
lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 41.22 ", "#", ""]
open("all_gather_perf_old_8x.log", "w").write("\n".join(lines))

# 3. srun --label: two tasks (one per node, -g 8); both print the banner, task 0 the table.
p = 16
lines = []
for task in (0, 1):
    lines += [f"{task}: # nccl-tests version 2.13.9 nccl-headers=21903 nccl-library=21903",
              f"{task}: # Collective test starting: all_reduce_perf"]
lines += ["0: # nThread 1 nGpus 8 minBytes 1048576 maxBytes 268435456 step: 2(factor) warmup iters: 5 "
          "iters: 20 agg iters: 1 validation: 1 graph: 0", "0: #", "0: # Using devices",
          *rank_lines(p, prefix="0: "), "1: gpu-a018:52311:52311 [0] NCCL INFO cudaDriverVersion 12040",
          "0: #", *("0: " + h for h in HEADER_ROOT)]
for i in range(20, 29):
    n = 1 << i
    t = noisy(ar_time(n, p, bw=40e9))
    lines.append(row(n, n // 4, "float", "sum", t, noisy(t), 2 * (p - 1) / p, prefix="0: "))
    if i == 24:
        lines.append("1: gpu-a018:52311:52330 [0] NCCL INFO Channel 02/0 : 8[0] -> 9[1] via P2P/CUMEM")
lines += ["0: # Out of bounds values : 0 OK", "0: # Avg bus bandwidth    : 24.9 ", "0: #",
          "0: # Collective test concluded: all_reduce_perf", ""]
open("all_reduce_perf_srun.log", "w").write("\n".join(lines))

# 4. -J JSON report (version 2), allgather on 8 A100 of one host.
p = 8
devices = [{"rank": r, "group": 0, "pid": 61000 + r, "hostname": "dgx-b04", "device": r,
            "device_hex": f"0000:{0x18 + r * 0x10:02x}:00", "device_info": "NVIDIA A100-SXM4-80GB"}
           for r in range(p)]
results = []
for i in range(12, 29, 2):
    n = 1 << i
    t = noisy(ag_time(n, p, bw=200e9))
    ti = noisy(t)
    results.append({
        "size": n, "count": n // 4 // p, "type": "float", "redop": "none", "root": "    -1",
        "out_of_place": {"time": round(t * 1e6, 6), "alg_bw": round(n / t / 1e9, 6),
                         "bus_bw": round(n / t / 1e9 * (p - 1) / p, 6), "nwrong": 0.0},
        "in_place": {"time": round(ti * 1e6, 6), "alg_bw": round(n / ti / 1e9, 6),
                     "bus_bw": round(n / ti / 1e9 * (p - 1) / p, 6), "nwrong": 0.0},
        "actual_iterations": 20, "experiment_name": ""})
doc = {"version": 2, "start_time": "2026-11-20 14:02:11",
       "args": ["./build/all_gather_perf", "-b", "4K", "-e", "256M", "-f", "4", "-g", "8", "-J", "ag.json"],
       "env": ["PATH=/usr/bin", "NCCL_DEBUG=WARN"], "nccl_version": 22105,
       "config": {"nthreads": 1, "ngpus": 8, "minimum_bytes": 4096, "maximum_bytes": 268435456,
                  "step_factor": 4, "warmup_iters": 5, "iterations": 20, "aggregated_iterations": 1,
                  "validation": 1, "graph": 0, "blocking_collectives": "false",
                  "per_iter_timing": "false", "parallel_init": "false", "devices": devices},
       "results": results, "out_of_bounds": {"count": 0, "okay": "true"},
       "average_bus_bandwidth": {"bandwidth": 88.1, "okay": "unchecked"}, "errors": [],
       "end_time": "2026-11-20 14:02:19"}
open("all_gather_perf_a100.json", "w").write(json.dumps(doc))

# 5. a garbled log: a row cut short (a killed job), a digit where a number should be.
good = open("all_reduce_perf_2x8_h100.log").read().splitlines()
cut = next(i for i, l in enumerate(good) if l.strip().startswith("2097152"))
good[cut] = good[cut][:60]
open("all_reduce_perf_truncated.log", "w").write("\n".join(good[: cut + 1]) + "\n")
