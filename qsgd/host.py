"""The measuring CPU's achieved rates, stored with a CPU-measured trace.

A study scales a CPU trace's compute and codec seconds to a GPU by the ratio of achieved
FLOP/s and memory bandwidth (``emulator.ComputeModel``). Measured once, when the trace is
measured, and kept in it, the ratio is the same whenever and wherever the trace is studied.
"""
from __future__ import annotations

import time

import torch

__all__ = ["measure_host", "METHOD"]

#: What :func:`measure_host` times, stored next to its figures.
METHOD = ("best of up to 20 repetitions within 0.5 s: a 512x512 fp32 matmul (2 n^3 FLOPs) "
          "and a 32 MiB fp32 tensor copy (read + write: 2x the bytes), torch on the CPU")


def measure_host(budget_s: float = 0.5) -> dict:
    """Achieved fp32 matmul FLOP/s and copy bandwidth (bytes/s) of this machine's CPU.

    Returns
    -------
    dict
        ``{"matmul_flops": FLOP/s, "copy_bandwidth": bytes/s, "threads": torch threads,
        "method": METHOD}``.

    Examples
    --------
    >>> import qsgd
    >>> rates = qsgd.measure_host(budget_s=0.05)
    >>> rates["matmul_flops"] > 1e8 and rates["copy_bandwidth"] > 1e8
    True
    """
    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    src = torch.empty(8 * 2**20)
    dst = torch.empty_like(src)
    best_mm = best_cp = float("inf")
    deadline = time.perf_counter() + budget_s
    for i in range(20):
        t0 = time.perf_counter()
        torch.mm(a, b)
        t1 = time.perf_counter()
        dst.copy_(src)
        t2 = time.perf_counter()
        best_mm, best_cp = min(best_mm, t1 - t0), min(best_cp, t2 - t1)
        if i >= 2 and t2 > deadline:
            break
    return {"matmul_flops": 2 * n**3 / best_mm, "copy_bandwidth": 2 * src.numel() * 4 / best_cp,
            "threads": torch.get_num_threads(), "method": METHOD}
