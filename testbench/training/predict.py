"""The emulator's predicted iteration time for a training run (logged as ``predicted_iteration_s``).

Prediction = this step's measured computation (iteration time minus the hook's communication)
plus the emulator's time for the step's collective on a topology: a ring allreduce of the
payload for fp32/fp16/PowerSGD and QSGD's scatter-reduce-allgather (same volume per rank as a
ring allreduce), a ring allgather of ``world_size`` payloads for QSGD's allgather transport
(nccl-tests' size convention: the total gathered bytes). With one rank nothing is communicated.
"""
from __future__ import annotations

import sys
from typing import Callable


def make_predictor(cfg, world_size: int, topology: str | None) -> Callable[[float, int], float | None] | None:
    """``predict(compute_s, payload_bytes) -> seconds`` (None when the emulator cannot say)."""
    if topology is not None and topology.lower() == "none":
        return None
    if world_size == 1 and topology is None:
        return lambda compute_s, payload_bytes: compute_s
    import emulator
    import topologies

    G = topologies.from_spec(topology or f"switch:{world_size}")
    # The run's ranks are the first world_size GPUs of the topology: run_collective without
    # ranks= simulated every GPU of G (an 8-rank allreduce for a 2-rank run on a DGX node).
    gpus = len(topologies.gpus(G))
    if gpus < world_size:
        raise ValueError(f"--topology {topology!r} has {gpus} GPUs, fewer than the {world_size} ranks")
    if cfg.compression == "qsgd" and cfg.transport == "allgather":
        op, scale = "allgather", world_size
    else:
        op, scale = "allreduce", 1
    cache: dict[int, float | None] = {}
    broken: list[str] = []

    def predict(compute_s: float, payload_bytes: int) -> float | None:
        if broken:
            return None
        nbytes = int(payload_bytes) * scale
        if nbytes not in cache:
            try:
                cache[nbytes] = float(emulator.run_collective(G, op, "ring", nbytes,
                                                              ranks=world_size).time_s)
            except (ImportError, AttributeError, ValueError, RuntimeError) as exc:
                broken.append(str(exc))
                print(f"qsgd-emu train: no emulator prediction ({type(exc).__name__}: {exc})",
                      file=sys.stderr)
                return None
        return compute_s + cache[nbytes]

    return predict
