"""Training under a sharded strategy (``TrainConfig(parallelism=...)``): FSDP2 with QSGD comms.

The loop of :mod:`.loop` (same data shards, batches, SGD, logging) on a model sharded by
:func:`qsgd.sharded.shard_model`: ``compression="qsgd"`` quantizes the gradient
reduce-scatters at ``bits`` and, with ``weight_bits``, the parameter all-gathers (QSDP);
``"fp32"`` is plain FSDP. Every rank evaluates (a sharded forward is collective) and the
parameters are compared across ranks as full tensors at the end. ``zero1`` runs in
:func:`.loop.train` itself (DDP, its hook and a sharded optimizer).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as dist

from .datasets import load_dataset
from .loop import accuracy, check_ranks_agree

#: compressions a sharded run takes
SHARDED_COMPRESSIONS = ("fp32", "qsgd")


def train_sharded(cfg, *, store=None, run_id: int | None = None, device=None,
                  max_steps: int | None = None) -> dict:
    """Train ``cfg`` (a :class:`~.loop.TrainConfig` whose ``parallelism`` is sharded) under
    the current process group; returns a summary on every rank (as :func:`.loop.train`, plus
    ``"sharded"``: the comms' statistics, :meth:`qsgd.sharded.Sharded.stats`)."""
    import qsgd
    from qsgd.sharded import shard_model

    from .loop import build

    if cfg.compression not in SHARDED_COMPRESSIONS:
        raise ValueError(f"compression: a sharded run takes {list(SHARDED_COMPRESSIONS)}, got "
                         f"{cfg.compression!r}")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = device or torch.device("cpu")
    data = load_dataset(cfg.dataset, cfg.seed)
    model = build(cfg, data.n_features, data.n_classes).to(device)
    grads = weights = None
    if cfg.compression == "qsgd":
        grads = qsgd.QSGDConfig.from_bits(cfg.bits, bucket_size=cfg.bucket_size)
        if cfg.weight_bits:
            weights = qsgd.QSGDConfig.from_bits(cfg.weight_bits, bucket_size=cfg.bucket_size)
    sharded = shard_model(model, cfg.parallelism, grads=grads, weights=weights, seed=cfg.seed,
                          shard_size=cfg.shard_size or None)
    # what one rank sends a step, by the plan the comms execute (float32 on this device)
    plan = qsgd.shard_plan(cfg.parallelism, sharded.units, world, shard_size=cfg.shard_size or None,
                           gather_bytes=4, reduce_bytes=4, grads=grads, weights=weights)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    tx, ty = data.train_x.to(device), data.train_y.to(device)
    steps_per_epoch = max(1, len(tx) // (cfg.batch_size * world))
    loss_fn = torch.nn.CrossEntropyLoss()
    step, last_loss, history = 0, math.nan, []
    t_train = time.perf_counter()
    for epoch in range(cfg.epochs):
        perm = torch.from_numpy(np.random.default_rng([cfg.seed, epoch]).permutation(len(tx)))
        shard = perm[rank::world].to(device)
        for i in range(steps_per_epoch):
            if max_steps is not None and step >= max_steps:
                break
            idx = shard[i * cfg.batch_size:(i + 1) * cfg.batch_size]
            t0 = time.perf_counter()
            loss = loss_fn(model(tx[idx]), ty[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            iteration_s = time.perf_counter() - t0
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            last_loss = float(reduced) / world
            metrics = {"epoch": epoch, "loss": last_loss, "iteration_s": iteration_s,
                       "samples_per_s": cfg.batch_size * world / iteration_s if iteration_s > 0 else None}
            end_of_epoch = i == steps_per_epoch - 1
            if end_of_epoch or (cfg.eval_every and (step + 1) % cfg.eval_every == 0):
                metrics["test_accuracy"] = accuracy(model, data.test_x.to(device),
                                                     data.test_y.to(device))
            history.append(metrics)
            if store is not None and rank == 0:
                store.log_step(run_id, step, metrics)
            step += 1
    train_s = time.perf_counter() - t_train
    digest = check_ranks_agree(model, world)
    return {
        "config": asdict(cfg), "world_size": world, "rank": rank, "steps": step,
        "steps_per_epoch": steps_per_epoch, "final_loss": last_loss,
        "final_test_accuracy": accuracy(model, data.test_x.to(device), data.test_y.to(device)),
        "iteration_s": float(np.median([h["iteration_s"] for h in history])) if history else None,
        "bytes_sent_per_step": float(plan.wire_bytes), "predicted_iteration_s": None,
        "train_s": train_s, "parameter_digest": digest, "sharded": sharded.stats(),
        "history": history,
    }
