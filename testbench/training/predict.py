"""The emulator's predicted iteration time for a training run (logged as ``predicted_iteration_s``).

Every step is replayed (:func:`emulator.replay`, the study's own path) on the run's topology
from what the step measured (:class:`StepClock`): forward, backward until its last gradient was
ready, optimizer seconds, each DDP bucket's ready time and, with QSGD, the hook's own stage
seconds and payload sizes per bucket. What each bucket sends is its :func:`qsgd.wire_plan`
(QSGD's transport, DDP's fp32 allreduce, its fp16 one). PowerSGD has no wire plan: its step is
replayed as an fp32 allreduce of buckets scaled down to the factors it reduces (its
``payload_bytes``), an approximation. With one rank nothing is communicated.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import torch


def _replay_transport(cfg) -> str:
    if cfg.compression == "qsgd":
        return f"qsgd_{cfg.transport}"
    return "fp16" if cfg.compression == "fp16" else "fp32"


def make_predictor(cfg, world_size: int, topology: str | None) -> Callable | None:
    """``predict(trace) -> seconds`` for a :meth:`StepClock.trace` (None when the emulator
    cannot say); None when ``topology`` is ``"none"``."""
    if topology is not None and topology.lower() == "none":
        return None
    import emulator
    import topologies

    G = topologies.from_spec(topology or f"switch:{world_size}")
    # The run's ranks are the first world_size GPUs of the topology.
    gpus = len(topologies.gpus(G))
    if gpus < world_size:
        raise ValueError(f"--topology {topology!r} has {gpus} GPUs, fewer than the {world_size} ranks")
    net = emulator.Network(G, world_size)     # one cache of collective times for the run
    transport = _replay_transport(cfg)
    broken: list[str] = []

    def predict(trace) -> float | None:
        if broken or trace is None:
            return None
        try:
            return float(emulator.replay(trace, G, transport=transport, network=net).iteration_s)
        except (ImportError, AttributeError, ValueError, RuntimeError) as exc:
            broken.append(str(exc))
            print(f"qsgd-emu train: no emulator prediction ({type(exc).__name__}: {exc})",
                  file=sys.stderr)
            return None

    return predict


class StepClock:
    """Times a DDP step as the replay reads it, with a hook per parameter on its gradient.

    Call :meth:`start` before forward, :meth:`forward_done` after the loss, :meth:`backward_done`
    after ``backward()``, then :meth:`trace` after the optimizer step.
    """

    def __init__(self, model: torch.nn.Module, cfg, world_size: int):
        self.model, self.cfg, self.world_size = model, cfg, world_size
        self.ready: dict[str, float] = {}
        self.buckets = None
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(
                    lambda _p, name=name: self.ready.__setitem__(name, time.perf_counter()))

    def start(self) -> None:
        self.ready.clear()
        self.t0 = time.perf_counter()

    def forward_done(self) -> None:
        self.t_fwd = time.perf_counter()

    def backward_done(self) -> None:
        self.t_bwd = time.perf_counter()

    def trace(self, t_end: float, hook_stats: dict | None = None, payload_bytes: int | None = None):
        """A one-iteration :class:`qsgd.PayloadTrace` of the step just timed (None without
        its gradients' times)."""
        import qsgd

        if not self.ready:
            return None
        if self.buckets is None:
            # DDP rebuilds its buckets in the order the first backward produced the gradients
            order = sorted(self.ready, key=self.ready.get)
            self.buckets = qsgd.ddp_buckets(self.model, ready_order=order)
        cfg = self.cfg
        qcfg = qsgd.QSGDConfig.from_bits(cfg.bits, bucket_size=cfg.bucket_size,
                                         codec=cfg.codec if cfg.compression == "qsgd" else "packed")
        stats = hook_stats or {}
        timeline = {r["bucket"]: r for r in stats.get("timeline", [])}
        sizes = stats.get("payload_sizes", {})
        # the hook's own stages ran in backward's thread: the replay adds them back
        hook_before = []
        for b in self.buckets:
            t = max(self.ready.get(n, self.t_fwd) for n in b.names)
            hook_before.append(sum(r["returned"] - r["called"] for r in timeline.values()
                                   if r.get("returned") and r["returned"] <= t))
        last = max(self.ready.values())
        bwd = max(0.0, last - self.t_fwd - (hook_before[-1] if hook_before else 0.0))
        scale = 1.0
        if cfg.compression == "powersgd" and payload_bytes:
            scale = payload_bytes / (4 * sum(b.numel for b in self.buckets))
        tb, timings = [], []
        for b, before in zip(self.buckets, hook_before):
            numels = [max(1, round(n * scale)) for n in b.numels]
            comp = sum(n for n in numels if n >= cfg.min_numel)
            raw = sum(numels) - comp
            rec = timeline.get(b.index, {})
            stages = rec.get("stages", {})
            enc = sum(e - s for n, (s, e) in stages.items() if n == "encode")
            dec = sum(e - s for n, (s, e) in stages.items() if n != "encode") / self.world_size
            # a trace holds one payload per bucket: a packed one's size is the config's (the
            # hook's scatter-reduce chunks each carry a header of their own); Elias's as sent
            payload = (qsgd.payload_nbytes(comp, qcfg) if qcfg.codec == "packed" else
                       sizes.get(b.index) or 0) if comp else 0
            if not comp:
                payload = enc = dec = 0
            t = max(self.ready.get(n, self.t_fwd) for n in b.names) - self.t_fwd - before
            tb.append({"index": b.index, "numel": sum(numels), "params": list(b.names),
                       "compressed_numel": comp, "raw_numel": raw})
            timings.append({"index": b.index, "ready_s": min(max(0.0, t), bwd),
                            "payload_bytes": payload, "raw_bytes": 4 * raw, "encode_s": enc,
                            "decode_s": dec})
        return qsgd.PayloadTrace.from_dict({
            "format": "qsgd-payload-trace", "version": 1, "model": cfg.model,
            "parameters": sum(b["numel"] for b in tb), "device": "cpu", "device_name": "",
            "torch_version": torch.__version__, "batch_size": cfg.batch_size, "input_shape": [1],
            "config": qcfg.to_dict(), "min_numel": cfg.min_numel,
            "bucket_cap_bytes": qsgd.buckets.DEFAULT_BUCKET_CAP_BYTES,
            "first_bucket_bytes": qsgd.buckets.DEFAULT_FIRST_BUCKET_BYTES, "seed": cfg.seed,
            "bucket_assignment": "ready", "buckets": tb,
            "iterations": [{"index": 0, "forward_s": self.t_fwd - self.t0, "backward_s": bwd,
                            "optimizer_s": max(0.0, t_end - self.t_bwd), "buckets": timings}]})
