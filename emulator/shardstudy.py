"""A study under a sharded strategy (``StudyConfig.parallelism``): its tasks, its checks, its memory.

:func:`emulator.run_study` calls these for every strategy but DDP: a task replays each
(bits, transport) with :func:`emulator.replay_sharded`; before any task runs, a world size
the strategy cannot form (HSDP's machine not dividing it) and a model that does not fit the
GPU are refused (:func:`emulator.memory.check_fits`); each row carries the memory one GPU
needs.
"""
from __future__ import annotations

import dataclasses

from emulator.compute import ComputeModel
from emulator.errors import ConfigError
from emulator.network import Network
from emulator.replaying import TRANSPORTS
from emulator.sharded import ShardNetworks, machine_size, replay_sharded

__all__ = ["sharded_task", "shard_size", "memory_of"]


def sharded_task(cfg, G, net: Network, compute: ComputeModel, combos, state: dict,
                 name: str) -> list[tuple]:
    """:func:`emulator.study.run_task` under a sharded strategy: each (bits, transport) of
    ``combos`` replayed by :func:`replay_sharded`, the process groups' collectives cached
    across them; ``[(bits, transport, graph name, Prediction), ...]``."""
    shard = shard_size(cfg, G, net.world_size)
    groups = ShardNetworks(net, shard or net.world_size)
    out = []
    for k, (bits, transport) in enumerate(combos):
        state["combo"] = k
        compressed = TRANSPORTS[transport].compressed
        out.append((bits, transport, name, replay_sharded(
            cfg.trace, G, parallelism=cfg.parallelism, transport=transport,
            bits=bits if compressed else None, weight_bits=cfg.weight_bits if compressed else None,
            compute=compute, network=net, shard_size=shard, networks=groups)))
    return out


def shard_size(cfg, G, world_size: int) -> int | None:
    """HSDP's shard group on ``G`` at ``world_size`` (None for the other strategies)."""
    import qsgd

    if not qsgd.STRATEGIES[cfg.parallelism].hybrid:
        return None
    g = cfg.shard_size or machine_size(G)
    if world_size % min(g, world_size):
        raise ConfigError(f"parallelism='hsdp': a shard group of {g} GPUs does not divide "
                          f"world_size={world_size}; use world sizes that are multiples of {g}")
    return min(g, world_size)


def memory_of(config, spec: str, compute: ComputeModel, batch: int,
              refuse: bool = False) -> dict:
    """``{world size: emulator.memory.Memory}`` of topology ``spec`` (empty when the compute
    model is not timed from operator records); with ``refuse``, ConfigError where a sharded
    strategy does not fit the GPU (:func:`emulator.memory.check_fits`)."""
    from emulator.compute import device
    from emulator.memory import check_fits, memory_per_gpu
    from emulator.study import topology_for

    ops = getattr(config.trace, "operators", None)
    if compute.precision is None or compute.device in ("measured", "custom") or ops is None:
        return {}
    dev = device(compute.device)
    if compute.memory_bytes is not None:        # the part run, where it differs in memory
        dev = dataclasses.replace(dev, memory_bytes=compute.memory_bytes)
    out = {}
    for w in config.sizes_of(spec):
        shard = None
        if config.parallelism == "hsdp":
            shard = config.shard_size or machine_size(topology_for(spec, w))
        if refuse:
            out.update(check_fits(config.trace, config.parallelism, [w], precision=compute.precision,
                                  batch_size=batch, device=dev, shard_size=shard))
        else:
            out[w] = memory_per_gpu(config.trace, config.parallelism, w, precision=compute.precision,
                                    batch_size=batch, shard_size=shard,
                                    device_bytes=dev.memory_bytes)
    return out
