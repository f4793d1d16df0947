"""Local rank processes: start N copies of a command as ranks of one gloo group, bound them in time.

Each rank is a process in its own session (``start_new_session``), so a rank that hangs is
killed with everything it started; the environment is what ``torchrun`` would set (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; PyTorch's torchrun docs).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

from .errors import ConfigError
from ._checks import is_int

__all__ = ["RankResult", "free_port", "kill_group", "run_local_ranks"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    """What one rank's process did: exit status, output, wall seconds."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a rank's whole process group (``ip netns exec`` and everything it started)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass



def run_local_ranks(argv: list[str], world_size: int, *, timeout_s: float,
                    echo_rank0=None) -> list[RankResult]:
    """Run ``argv`` as ranks 0..world_size-1 of one group on this machine; their results by rank.

    Parameters
    ----------
    argv : list of str
        The command every rank runs.
    world_size : int
        Ranks to start, >= 1.
    timeout_s : float
        Bound on the whole run, seconds; ranks still running then are killed and reported
        with ``timed_out``.
    echo_rank0 : callable, optional
        Called with rank 0's stderr once it has finished (progress for the user).
    """
    if not is_int(world_size) or world_size < 1:
        raise ConfigError(f"world_size={world_size!r} must be an int >= 1")
    if not timeout_s > 0:
        raise ConfigError(f"timeout_s={timeout_s!r} must be > 0 seconds")
    port = free_port()
    procs, start = [], time.monotonic()
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, start_new_session=True))
    results = []
    try:
        for rank, p in enumerate(procs):
            left = max(1.0, timeout_s - (time.monotonic() - start))
            try:
                out, err = p.communicate(timeout=left)
                results.append(RankResult(rank, p.returncode, out, err, time.monotonic() - start))
            except subprocess.TimeoutExpired:
                kill_group(p)
                results.append(RankResult(rank, None, "", "", time.monotonic() - start, True))
            if rank == 0 and echo_rank0 is not None and results[-1].stderr:
                echo_rank0(results[-1].stderr)
    finally:
        for p in procs:
            kill_group(p)
    return results
