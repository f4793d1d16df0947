"""Gradient compressions for ``qsgd-emu train``: each registers a DDP communication hook.

``fp32``: DDP's built-in allreduce (no hook). ``fp16``: PyTorch's ``fp16_compress_hook``.
``powersgd``: PyTorch's ``powerSGD_hook`` (Vogels et al., NeurIPS 2019) with ``PowerSGDState``.
``qsgd``: :func:`qsgd.qsgd_hook`. Each returns a :class:`Compression` whose ``bytes_sent(step)``
gives the bytes one rank sends in that step: from the QSGD hook's statistics, or computed for the
others as a ring allreduce, ``2 (p-1)/p`` times the reduced bytes (Patarasuk & Yuan 2009).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


def ring_allreduce_bytes(nbytes: float, world_size: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``nbytes`` bytes."""
    return 0 if world_size <= 1 else int(round(2 * (world_size - 1) * nbytes / world_size))


@dataclass
class Compression:
    """A registered hook and how many bytes a rank sends per step."""

    name: str
    state: Any
    bytes_sent: Callable[[int], int]
    #: bytes one rank contributes per step (its payload before any collective fan-out)
    payload_bytes: Callable[[int], int]

    def state_dict(self) -> dict:
        sd = getattr(self.state, "state_dict", None)
        return sd() if callable(sd) else {}

    def load_state_dict(self, sd: dict) -> None:
        load = getattr(self.state, "load_state_dict", None)
        if callable(load) and sd:
            load(sd)


def _grad_bytes(model: torch.nn.Module, element_size: int) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad) * element_size


def _fp32(ddp, cfg, world_size) -> Compression:
    n = _grad_bytes(ddp.module, 4)
    return Compression("fp32", None, lambda step: ring_allreduce_bytes(n, world_size), lambda step: n)


def _fp16(ddp, cfg, world_size) -> Compression:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    n = _grad_bytes(ddp.module, 2)
    return Compression("fp16", None, lambda step: ring_allreduce_bytes(n, world_size), lambda step: n)


def _powersgd(ddp, cfg, world_size) -> Compression:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    rank = cfg.powersgd_rank
    # PowerSGD runs plain allreduce before start_powerSGD_iter (it must be > 1 with error feedback).
    start = max(2, cfg.warmup_steps)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                               start_powerSGD_iter=start, min_compression_rate=2,
                               use_error_feedback=True, warm_start=True, random_seed=cfg.seed)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    dense = _grad_bytes(ddp.module, 4)
    # Per tensor, what the hook allreduces: P (n x r) and Q (m x r) for a matrix it compresses
    # (n m >= min_compression_rate (n + m) r, as in powerSGD_hook._should_compress), else the tensor.
    low = 0
    for p in ddp.module.parameters():
        if p.dim() <= 1:
            low += p.numel() * 4
            continue
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, rank)
        # Strictly greater, as torch's _should_compress (compressed * min_compression_rate <
        # uncompressed): at equality the hook allreduces the whole tensor, which was counted as P, Q.
        low += (n + m) * r * 4 if n * m > 2 * (n + m) * r else n * m * 4

    def payload(step):
        return dense if step < start else low

    return Compression("powersgd", state, lambda step: ring_allreduce_bytes(payload(step), world_size),
                       payload)


def _qsgd(ddp, cfg, world_size) -> Compression:
    import qsgd

    qcfg = qsgd.QSGDConfig.from_bits(cfg.bits, bucket_size=cfg.bucket_size, codec=cfg.codec)
    state = qsgd.QSGDState(qcfg, transport=cfg.transport, min_numel=cfg.min_numel,
                           warmup_steps=cfg.warmup_steps, error_feedback=cfg.error_feedback,
                           seed=cfg.seed, timeout_s=cfg.timeout_s,
                           bit_policy=dict(cfg.bit_policy) or None,
                           model=ddp.module if cfg.bit_policy else None)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    # The hook advances its step after the last bucket; these read the step just finished.
    return Compression("qsgd", state, lambda step: int(state.last_stats["bytes_sent"]),
                       lambda step: int(state.last_stats["payload_bytes"] + state.last_stats["raw_bytes"]))


#: name -> factory(ddp_model, TrainConfig, world_size) -> Compression
COMPRESSIONS: dict[str, Callable[..., Compression]] = {
    "fp32": _fp32, "fp16": _fp16, "powersgd": _powersgd, "qsgd": _qsgd,
}
