"""The training loop of ``qsgd-emu train``: DDP + a compression hook, logging live into the run store.

Runs inside an initialised process group (see :mod:`.launch`). Every rank trains on its shard of
each epoch's seeded permutation (``perm[rank::world_size]``, as ``DistributedSampler``); rank 0
evaluates on the whole test set (all ranks hold identical parameters) and writes one row per step
into the :class:`testbench.RunStore`: ``loss`` (mean over ranks), ``test_accuracy`` (when
evaluated), ``bytes_sent`` (bytes, per rank), ``iteration_s`` (seconds), ``samples_per_s``
(global) and ``predicted_iteration_s`` (the emulator's prediction, when one is available).
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist

from .compression import COMPRESSIONS
from .datasets import DATASETS, load_dataset
from .._checks import is_int, is_number

TRANSPORTS = ("allgather", "scatter_reduce_allgather")


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (validated on construction; errors name the field).

    Parameters
    ----------
    model : str
        A name in ``qsgd.MODELS`` (``"mlp"``), sized to the dataset.
    dataset : str
        A key of :data:`~testbench.training.datasets.DATASETS`.
    compression : {"fp32", "fp16", "powersgd", "qsgd"}
    bits : int
        QSGD bits per coordinate (2..16; 8, 4 or 2 in the paper's experiments).
    transport : {"allgather", "scatter_reduce_allgather"}
    epochs : int
    batch_size : int
        Samples per rank per step.
    lr, momentum : float
        SGD settings.
    seed : int
        Seeds the model initialisation, the data split, the shuffles and the QSGD streams.
    eval_every : int
        Also evaluate every this many steps (0: only at the end of each epoch).
    hidden : tuple of int
        MLP hidden widths.
    bit_policy : tuple of (str, int)
        QSGD width per parameter name (``QSGDState(bit_policy=...)``, e.g. from ``qsgd-emu
        recommend``); empty: every parameter at ``bits``.
    bucket_cap_mb : float
        DDP's bucket cap (MiB); per-parameter widths act per bucket.
    parallelism : str
        ``"ddp"`` (the default), ``"zero1"`` (DDP and its hook with the optimizer state
        sharded) or a strategy FSDP2 runs (:data:`qsgd.sharded.REAL_STRATEGIES`: ``fsdp``,
        ``fsdp_grad_op``, ``hsdp``, ``zero2``, ``zero3``; :mod:`.shardloop`), whose
        compression is ``fp32`` or ``qsgd`` (the quantized reduce-scatter at ``bits``).
    weight_bits : int
        Under a sharded strategy with ``qsgd``: QSGD width of the parameter all-gathers
        (QSDP); 0 keeps them dense.
    shard_size : int
        HSDP's shard group (0: the world size).
    """

    model: str = "mlp"
    dataset: str = "digits"
    compression: str = "qsgd"
    bits: int = 4
    transport: str = "allgather"
    epochs: int = 5
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    seed: int = 0
    eval_every: int = 0
    hidden: tuple = (256, 128)
    bucket_size: int = 512
    codec: str = "packed"
    min_numel: int = 10_000
    warmup_steps: int = 0
    error_feedback: bool = False
    powersgd_rank: int = 2
    timeout_s: float = 120.0
    name: str = ""
    bit_policy: tuple = ()
    bucket_cap_mb: float = 25.0
    parallelism: str = "ddp"
    weight_bits: int = 0
    shard_size: int = 0

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression: expected one of {sorted(COMPRESSIONS)}, got {self.compression!r}")
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset: expected one of {sorted(DATASETS)}, got {self.dataset!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport: expected one of {list(TRANSPORTS)}, got {self.transport!r}")
        import qsgd

        # Only models that take the dataset's sizes (build() passes in_features, hidden and
        # num_classes); checked here so that a wrong name is one line before any rank starts.
        sizable = sorted(m for m in qsgd.MODELS if _takes_sizes(qsgd.MODELS[m]))
        if self.model not in sizable:
            raise ValueError(f"model: expected one of {sizable} (models sized to the dataset), "
                             f"got {self.model!r}")
        for name, low in (("bits", 2), ("epochs", 1), ("batch_size", 1), ("eval_every", 0),
                          ("bucket_size", 1), ("min_numel", 0), ("warmup_steps", 0),
                          ("powersgd_rank", 1), ("seed", 0)):
            v = getattr(self, name)
            if not is_int(v) or v < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")
        if self.bits > 16:
            raise ValueError(f"bits: expected 2..16, got {self.bits}")
        for name in ("lr", "momentum", "timeout_s"):
            v = getattr(self, name)
            if not is_number(v) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")
        if self.lr == 0 or self.timeout_s == 0:
            raise ValueError(f"{'lr' if self.lr == 0 else 'timeout_s'}: must be > 0")
        if not all(isinstance(h, int) and h > 0 for h in self.hidden):
            raise ValueError(f"hidden: expected positive ints, got {self.hidden!r}")
        if not isinstance(self.bit_policy, tuple) or not all(
                isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str) and is_int(e[1])
                and 2 <= e[1] <= 16 for e in self.bit_policy):
            raise ValueError(f"bit_policy: expected a tuple of (parameter name, bits 2..16) pairs, "
                             f"got {self.bit_policy!r}")
        if not is_number(self.bucket_cap_mb) or not math.isfinite(self.bucket_cap_mb) or self.bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb: expected a finite number > 0, got {self.bucket_cap_mb!r}")
        from qsgd.sharded import REAL_STRATEGIES
        from .shardloop import SHARDED_COMPRESSIONS

        runs = ("ddp", "zero1", *REAL_STRATEGIES)
        if self.parallelism not in runs:
            raise ValueError(f"parallelism: expected one of {list(runs)}, got {self.parallelism!r}")
        if self.parallelism in REAL_STRATEGIES and self.compression not in SHARDED_COMPRESSIONS:
            raise ValueError(f"compression: parallelism={self.parallelism!r} takes "
                             f"{list(SHARDED_COMPRESSIONS)}, got {self.compression!r}")
        if not is_int(self.weight_bits) or not (self.weight_bits == 0 or 2 <= self.weight_bits <= 16):
            raise ValueError(f"weight_bits: expected 0 (dense) or 2..16, got {self.weight_bits!r}")
        if self.weight_bits and self.parallelism not in REAL_STRATEGIES:
            raise ValueError(f"weight_bits: parameters are gathered only under a sharded "
                             f"strategy {list(REAL_STRATEGIES)}, not {self.parallelism!r}")
        if not is_int(self.shard_size) or self.shard_size < 0:
            raise ValueError(f"shard_size: expected an int >= 0, got {self.shard_size!r}")

    def label(self) -> str:
        if self.name:
            return self.name
        c = f"qsgd{self.bits}-{self.transport}" if self.compression == "qsgd" else self.compression
        return f"{self.model}/{self.dataset} {c}"


def _takes_sizes(ctor) -> bool:
    """Whether ``ctor`` accepts the keyword arguments :func:`build` passes."""
    import inspect

    try:
        params = inspect.signature(ctor).parameters
    except (TypeError, ValueError):
        return False
    return {"in_features", "hidden", "num_classes"} <= set(params)


def build(cfg: TrainConfig, n_features: int, n_classes: int) -> torch.nn.Module:
    import qsgd

    torch.manual_seed(cfg.seed)  # identical initialisation on every rank
    return qsgd.MODELS[cfg.model](in_features=n_features, hidden=tuple(cfg.hidden), num_classes=n_classes)


def parameter_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the parameters' bytes: equal across ranks iff they hold identical parameters.
    Sharded parameters (FSDP2's DTensors) are gathered whole first: a collective then, which
    every rank calls."""
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_ranks_agree(model: torch.nn.Module, world: int) -> str:
    """The parameters' :func:`parameter_digest`, all-gathered; RuntimeError unless every rank
    of the group holds the same parameters (a run whose ranks drifted apart is not a result)."""
    digest = parameter_digest(model)
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    if len(set(digests)) != 1:
        raise RuntimeError(f"ranks ended with different parameters: {digests}")
    return digest


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    pred = torch.cat([model(xb).argmax(1) for xb in torch.split(x, 1024)])
    model.train()
    return float((pred == y).float().mean())


def train(cfg: TrainConfig, *, store=None, run_id: int | None = None, device=None,
          predictor=None, checkpoint: dict | None = None, max_steps: int | None = None) -> dict:
    """Train under the current process group; returns a summary (on every rank).

    Parameters
    ----------
    cfg : TrainConfig
    store : testbench.RunStore, optional
        Rank 0 logs each step into ``run_id`` of this store.
    device : torch.device, optional
        Default: the current CUDA device with NCCL, else CPU.
    predictor : callable, optional
        ``predictor(trace) -> seconds``: the emulator's iteration time of a step, replayed from
        its :class:`testbench.training.predict.StepClock` trace (rank 0 only).
    checkpoint : dict, optional
        From a previous summary's ``"checkpoint"`` (model, optimiser and hook state): resume.
    max_steps : int, optional
        Stop after this many steps in total (for checkpoint tests).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if cfg.parallelism not in ("ddp", "zero1"):
        from .shardloop import train_sharded

        return train_sharded(cfg, store=store, run_id=run_id, device=device, max_steps=max_steps)
    rank, world = dist.get_rank(), dist.get_world_size()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend() == "nccl" else torch.device("cpu")
    data = load_dataset(cfg.dataset, cfg.seed)
    model = build(cfg, data.n_features, data.n_classes).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=cfg.bucket_cap_mb)
    comp = COMPRESSIONS[cfg.compression](ddp, cfg, world)
    if cfg.parallelism == "zero1":
        from qsgd.sharded import zero1_optimizer

        opt = zero1_optimizer(ddp.parameters(), torch.optim.SGD, lr=cfg.lr, momentum=cfg.momentum)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    start_step = 0
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        comp.load_state_dict(checkpoint["hook"])
        start_step = int(checkpoint["step"])
    clock = None
    if predictor is not None and rank == 0:
        from .predict import StepClock

        clock = StepClock(model, cfg, world)
    tx, ty = data.train_x.to(device), data.train_y.to(device)
    steps_per_epoch = max(1, len(tx) // (cfg.batch_size * world))
    loss_fn = torch.nn.CrossEntropyLoss()
    step, last_loss, acc, history = 0, math.nan, None, []
    t_train = time.perf_counter()
    for epoch in range(cfg.epochs):
        perm = torch.from_numpy(np.random.default_rng([cfg.seed, epoch]).permutation(len(tx)))
        shard = perm[rank::world].to(device)
        for i in range(steps_per_epoch):
            if max_steps is not None and step >= max_steps:
                break
            if step < start_step:
                step += 1
                continue
            idx = shard[i * cfg.batch_size:(i + 1) * cfg.batch_size]
            if clock is not None:
                clock.start()
            t0 = time.perf_counter()
            loss = loss_fn(ddp(tx[idx]), ty[idx])
            if clock is not None:
                clock.forward_done()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clock is not None:
                clock.backward_done()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t_end = time.perf_counter()
            iteration_s = t_end - t0
            reduced = loss.detach().clone()
            if world > 1:
                dist.all_reduce(reduced)
            last_loss = float(reduced) / world
            end_of_epoch = i == steps_per_epoch - 1
            evaluate = end_of_epoch or (cfg.eval_every and (step + 1) % cfg.eval_every == 0)
            metrics = {"epoch": epoch, "loss": last_loss, "bytes_sent": comp.bytes_sent(step),
                       "payload_bytes": comp.payload_bytes(step), "iteration_s": iteration_s,
                       "samples_per_s": cfg.batch_size * world / iteration_s if iteration_s > 0 else None}
            if evaluate and rank == 0:
                acc = accuracy(model, data.test_x.to(device), data.test_y.to(device))
                metrics["test_accuracy"] = acc
            if clock is not None:
                stats = getattr(comp.state, "last_stats", None) if cfg.compression == "qsgd" else None
                metrics["predicted_iteration_s"] = predictor(
                    clock.trace(t_end, stats, metrics["payload_bytes"]))
            history.append(metrics)
            if store is not None and rank == 0:
                store.log_step(run_id, step, metrics)
            step += 1
    train_s = time.perf_counter() - t_train
    digest = check_ranks_agree(model, world)
    done = [h for h in history]
    if cfg.parallelism == "zero1":     # the shards' state, gathered on rank 0 for the checkpoint
        opt.consolidate_state_dict(to=0)
    opt_state = opt.state_dict() if cfg.parallelism != "zero1" or rank == 0 else {}
    bytes_steps = [h["bytes_sent"] for h in done]
    summary = {
        "config": asdict(cfg), "world_size": world, "rank": rank, "steps": step,
        "steps_per_epoch": steps_per_epoch, "final_loss": last_loss,
        "final_test_accuracy": accuracy(model, data.test_x.to(device), data.test_y.to(device)),
        "bytes_sent_per_step": float(np.mean(bytes_steps)) if bytes_steps else 0.0,
        "payload_bytes_per_step": float(np.mean([h["payload_bytes"] for h in done])) if done else 0.0,
        "iteration_s": float(np.median([h["iteration_s"] for h in done])) if done else None,
        "predicted_iteration_s": (float(np.median(predicted)) if (predicted := [
            h["predicted_iteration_s"] for h in done
            if h.get("predicted_iteration_s") is not None]) else None),
        "train_s": train_s, "parameter_digest": digest,
        "checkpoint": {"model": model.state_dict(), "optimizer": opt_state,
                       "hook": comp.state_dict(), "step": step},
    }
    return summary
