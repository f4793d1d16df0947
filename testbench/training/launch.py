"""Process groups for ``qsgd-emu train``: torchrun's environment, ``--spawn N`` local ranks, or one process.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
``init_process_group("env://")`` reads them (PyTorch's torchrun documentation). Without them a
single process joins a one-rank gloo group on an in-memory store. ``spawn`` starts N local gloo
ranks (Python's ``spawn`` start method: no inherited threads or CUDA state) and returns what each
returned, killing the survivors when one fails so that nothing is left running.
"""
from __future__ import annotations

import os
import queue
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..processes import free_port
from .._checks import is_int


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(backend: str | None = None, timeout_s: float = 120.0) -> tuple[int, int]:
    """Join the process group this process was launched into; returns (rank, world_size)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    timeout = timedelta(seconds=timeout_s)
    if launched_by_torchrun():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        dist.init_process_group(backend or "gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def _worker(rank: int, world: int, port: int, timeout_s: float, fn, args, results) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        # One intra-op thread per rank: N ranks share the machine's cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        try:
            out = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException as exc:  # reported to the parent, which raises
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def spawn(fn: Callable[..., Any], world_size: int, *args, timeout_s: float = 300.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local gloo ranks; their results by rank.

    ``fn`` and its results must be picklable. Raises RuntimeError (with the failing rank's
    traceback) when a rank fails or does not finish within ``timeout_s`` seconds.
    """
    import multiprocessing as mp

    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"spawn: world size must be an int >= 1, got {world_size!r}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, timeout_s, fn, args, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        import time

        deadline = time.monotonic() + timeout_s
        while len(out) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"spawn: ranks {sorted(set(range(world_size)) - set(out))} did not "
                                   f"finish within timeout_s={timeout_s:g}")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"spawn: rank {dead[0]} died with exit code "
                                       f"{procs[dead[0]].exitcode}") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed: {value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [out[r] for r in range(world_size)]
