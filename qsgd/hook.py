"""QSGD as a ``DistributedDataParallel`` communication hook (Alistarh et al., NeurIPS 2017, sec. 3).

Usage, in the style of ``torch.distributed.algorithms.ddp_comm_hooks``::

    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), transport="allgather")
    ddp_model.register_comm_hook(state, qsgd.qsgd_hook)

Quantized payloads cannot be summed by an allreduce (the sum of two payloads is not a payload),
so the hook moves encoded bytes and decodes at the receiver. What it sends for a bucket, in what
order, is the bucket's :func:`qsgd.wire_plan` (the transports are described there); the hook
checks every collective it hands the process group against that plan.

The hook is asynchronous, as PyTorch's PowerSGD hook: it quantizes and encodes the bucket in the
calling thread, issues the collective with ``async_op=True`` and returns a future; decoding,
averaging and any further collective of the bucket run once the collective is done, on the
state's callback thread (one bucket at a time, so that gloo's own threads keep moving bytes),
while backward goes on. Collectives leave in plan order and buckets in the order DDP hands them over, whatever
thread finishes which collective (see :mod:`qsgd._inflight`): gloo and NCCL match them across
ranks by that order. Packed payload sizes are known to every rank (:func:`qsgd.payload_nbytes`),
so the packed codec needs no exchange of sizes; the elias codec's depend on the data, and each
bucket all-gathers them first (one 16-byte all_gather, asynchronous like the rest; a
scatter-reduce-allgather bucket exchanges them twice).

All ranks average the same decoded tensors in the same order, so they end every step with
identical parameters. Streams are ``(seed, rank, step, bucket)``.

On CUDA, packed payloads are built and checked on the device (:mod:`qsgd.devicecodec`): the
checks (CRC, header, codes, a NaN or Inf gradient) are device flags, read once per step at the
end of backward, so backward never waits for the GPU; a failed one is a :class:`qsgd.HookError`
there, naming the bucket and what the host decoder finds wrong.

Failures. At the first backward the ranks all-gather their settings (:meth:`QSGDState.fingerprint`);
no payload leaves before they agree. A collective that fails (a dead peer; the process group's
own timeout), settings that differ, or a payload that does not decode stop all further
collectives of the state. At the end of backward, before DDP's own wait for the buckets, the
hook waits (bounded by ``timeout_s``, from the end of backward) for the step's buckets and
raises :class:`qsgd.HookError` in the training thread; a rank whose peers never send fails
there after ``timeout_s`` at most. That end-of-backward wait is the only blocking one, and
DDP would wait there anyway. (Outside backward, where no engine callback can be queued, errors
reach DDP as the bucket future's error.)

Per-layer widths. ``bit_policy`` maps parameter names of ``model`` to bit widths (what
``qsgd-emu recommend`` prints); a bucket is one payload, so it is quantized at the widest width
of its compressed parameters (parameters not named keep ``config``'s), never coarser than the
policy asks. Payloads carry their levels (self-describing), the wire plan of each bucket is
built at its width, and the policy is part of the fingerprint the ranks compare.

Parameters with fewer than ``min_numel`` elements travel uncompressed (the paper's rule, sec. 5).
The first ``warmup_steps`` steps use a plain allreduce of the whole bucket. With
``error_feedback`` each rank keeps the part its quantizer dropped (``x - Q(x)`` per bucket) and
adds it to the next step's gradient (Karimireddy et al., ICML 2019, "Error feedback fixes
SignSGD").
"""
import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from qsgd._inflight import Issue, Runner, StepStats, Stream
from qsgd._programs import _ALL_GATHER, PROGRAMS, _Bucket, _group_device, _layout, _warmup
from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError, HookError
from qsgd.wireplan import BucketLayout, WirePlan, wire_plan

from ._checks import is_int, is_number

#: transport name -> program ``(bucket) -> generator`` (:mod:`qsgd._programs`)
TRANSPORTS: dict[str, Any] = {}

# Bytes of the config fingerprint exchanged on the first call (JSON, zero padded).
_FINGERPRINT_BYTES = 1024


@dataclass
class _Step:
    """One backward's buckets."""

    index: int
    stats: StepStats
    runners: list
    guarded: bool = False
    closed: bool = False     # the last bucket was handed over


class QSGDState:
    """State of :func:`qsgd_hook`: configuration, step counter, residuals and statistics.

    Parameters
    ----------
    config : QSGDConfig
    transport : {"allgather", "scatter_reduce_allgather"}
    min_numel : int
        Parameters with fewer elements are sent uncompressed.
    warmup_steps : int
        Steps of plain allreduce before compression starts.
    error_feedback : bool
        Keep each bucket's quantization error and add it to the next step's gradient.
    process_group : ProcessGroup, optional
        Default: the default group.
    seed : int
        Seed of the random streams (with rank, step and bucket index).
    timeout_s : float
        Longest wait, at the end of backward, for the step's collectives (seconds).
    bit_policy : dict of str to int, optional
        Bit width (2..16) per parameter name of ``model``; a bucket uses the widest of its
        compressed parameters' widths (unnamed parameters: ``config.bits``).
    model : torch.nn.Module, optional
        The module DDP wraps (its ``named_parameters`` names); required with ``bit_policy``.

    Attributes
    ----------
    step : int
        Steps completed (advanced at the end of each backward).
    last_stats : dict
        The finished step's ``payload_bytes`` (this rank's payloads), ``raw_bytes``
        (uncompressed tensors), ``bytes_sent`` (bytes this rank sent to the others, as
        :func:`qsgd.wireplan.wire_bytes` counts them), ``encode_s`` (local work in the hook:
        copies, residuals, encode), ``decode_s`` (local work in callbacks: decode, averaging,
        re-encode), ``hook_s`` (seconds inside the hook), ``wait_s`` (seconds backward's end
        waited for the collectives), ``buckets`` and ``timeline``: per bucket ``bucket``,
        ``called`` and ``returned`` (the hook's entry and exit), ``stages`` (name ->
        ``[start, end]``), ``stages_cpu`` (name -> CPU seconds of the thread that ran it,
        ``time.thread_time``), ``collectives`` (``name``, ``op``, ``dtype``, ``nbytes``, ``issued``,
        ``done``) and ``done``, all ``time.perf_counter()`` seconds; ``payload_sizes``: bucket
        index -> bytes of this rank's payloads of it (before any re-quantization).
    """

    def __init__(self, config: QSGDConfig, transport: str = "allgather", min_numel: int = 10_000,
                 warmup_steps: int = 0, error_feedback: bool = False, process_group=None,
                 seed: int = 0, timeout_s: float = 300.0, bit_policy: dict | None = None, model=None):
        if not isinstance(config, QSGDConfig):
            raise ConfigError(f"config: expected a QSGDConfig, got {type(config).__name__}")
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport: expected one of {sorted(TRANSPORTS)}, got {transport!r}")
        for name, value in (("min_numel", min_numel), ("warmup_steps", warmup_steps), ("seed", seed)):
            if not is_int(value) or value < 0:
                raise ConfigError(f"{name}: expected an int >= 0, got {value!r}")
        if not isinstance(error_feedback, bool):
            raise ConfigError(f"error_feedback: expected a bool, got {error_feedback!r}")
        if not is_number(timeout_s) \
                or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ConfigError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        self.bit_policy, self._param_bits = _check_policy(bit_policy, model)
        self._configs: dict[tuple, QSGDConfig] = {}
        self.config = config
        self.transport = transport
        self.min_numel = min_numel
        self.warmup_steps = warmup_steps
        self.error_feedback = error_feedback
        self.process_group = process_group
        self.seed = seed
        self.timeout_s = float(timeout_s)
        self.step = 0
        self.residuals: dict[int, torch.Tensor] = {}
        self.last_stats: dict = StepStats().as_dict()
        self._checked = False
        self._stream = Stream()
        self._current: _Step | None = None
        self._layouts: dict[tuple, tuple] = {}
        self._plans: dict[tuple, WirePlan] = {}
        self._param_keys: dict[int, int] = {}

    # --- identity and checkpoints --------------------------------------------------------

    def fingerprint(self) -> dict:
        """The settings every rank must share (compared across ranks on the first call)."""
        return {"config": self.config.to_dict(), "transport": self.transport,
                "min_numel": self.min_numel, "warmup_steps": self.warmup_steps,
                "error_feedback": self.error_feedback, "seed": self.seed, "step": self.step,
                "world_size": self.world_size, "bit_policy": _policy_digest(self.bit_policy)}

    @property
    def rank(self) -> int:
        return dist.get_rank(self.process_group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    def state_dict(self) -> dict:
        """Step counter, error-feedback residuals and settings, for ``torch.save``."""
        return {"step": self.step, "config": self.config.to_dict(), "transport": self.transport,
                "min_numel": self.min_numel, "warmup_steps": self.warmup_steps,
                "error_feedback": self.error_feedback, "seed": self.seed,
                "bit_policy": dict(self.bit_policy),
                "residuals": {k: v.detach().clone().cpu() for k, v in self.residuals.items()}}

    def load_state_dict(self, sd: dict) -> None:
        """Resume from :meth:`state_dict`; the settings must match this state's."""
        mine = self.state_dict()
        sd = {"bit_policy": {}, **sd}   # checkpoints from before bit policies: none
        for key in ("config", "transport", "min_numel", "warmup_steps", "error_feedback", "seed",
                    "bit_policy"):
            if key not in sd:
                raise HookError(f"state_dict: missing field {key!r}")
            if sd[key] != mine[key]:
                raise HookError(f"state_dict: field {key!r} is {sd[key]!r} in the checkpoint but "
                                f"{mine[key]!r} in this QSGDState")
        step = sd.get("step")
        if not is_int(step) or step < 0:
            raise HookError(f"state_dict: field 'step' must be an int >= 0, got {step!r}")
        self.step = step
        self.residuals = {int(k): v.clone() for k, v in sd.get("residuals", {}).items()}
        # The new fingerprint (with the restored step) is compared again on the next call.
        self._checked = False

    def bucket_config(self, keys) -> QSGDConfig:
        """The config of a bucket whose compressed parameters have hook keys ``keys``: ``config``
        at the widest width the bit policy gives them (cached)."""
        keys = tuple(keys)
        cfg = self._configs.get(keys)
        if cfg is None:
            if not self._param_bits:
                cfg = self.config
            else:
                ids = {k: i for i, k in self._param_keys.items()}
                bits = max((self._param_bits.get(ids.get(k), self.config.bits) for k in keys),
                           default=self.config.bits)
                cfg = self.config if bits == self.config.bits else QSGDConfig.from_bits(
                    bits, bucket_size=self.config.bucket_size, norm=self.config.norm,
                    codec=self.config.codec)
            self._configs[keys] = cfg
        return cfg

    def plan(self, layout: BucketLayout, warmup: bool = False, config: QSGDConfig | None = None) -> WirePlan:
        """The wire plan of a bucket with ``layout`` on this state's group (cached), at
        ``config`` (default: the state's).

        For the elias codec the payload sizes are unknown until encoded: the plan's payload
        collectives have ``exact=False`` and the hook checks their names and types only.
        """
        config = self.config if config is None else config
        key = (layout, warmup, config)
        plan = self._plans.get(key)
        if plan is None:
            if warmup:
                plan = wire_plan("fp32", BucketLayout((layout.numel,), (True,), layout.element_size),
                                 self.world_size)
            else:
                plan = wire_plan(self.transport, layout, self.world_size, config,
                                 payload_bytes=0 if config.codec != "packed" else None)
            self._plans[key] = plan
        return plan

    # --- the settings check ---------------------------------------------------------------

    def _fingerprint_program(self, run: Runner):
        text = json.dumps(self.fingerprint(), sort_keys=True).encode()
        if len(text) > _FINGERPRINT_BYTES:
            raise HookError(f"fingerprint: {len(text)} bytes exceed {_FINGERPRINT_BYTES}")
        device = _group_device(self.process_group)
        buf = torch.zeros(_FINGERPRINT_BYTES, dtype=torch.uint8)
        buf[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        buf = buf.to(device)
        out = torch.empty(self.world_size * _FINGERPRINT_BYTES, dtype=torch.uint8, device=device)
        yield Issue("config fingerprint all_gather", buf,
                    lambda: _ALL_GATHER(out, buf, group=self.process_group, async_op=True))
        got = out.cpu().view(self.world_size, _FINGERPRINT_BYTES)
        prints = [json.loads(bytes(g.numpy()).rstrip(b"\0")) for g in got]
        _compare_prints(self.fingerprint(), prints, self.rank)
        self._checked = True
        self._stream.open_gate()
        return None

    def _start_check(self) -> Runner:
        stream = self._stream
        ticket = stream.ticket(1)
        stream.gate = ticket
        what = f"rank {self.rank}: config fingerprint at step {self.step}"
        check = _FingerprintPlan(self.world_size)
        run = Runner(stream, ticket, None, check, what, StepStats(), {}, torch.device("cpu"))
        run.program = self._fingerprint_program(run)
        stream.start(run)
        return run

    def check_peers(self) -> None:
        """Compare :meth:`fingerprint` across ranks now (blocking, bounded by ``timeout_s``);
        :class:`HookError` names the first field that differs. The hook does the same
        asynchronously on its first call."""
        run = self._start_check()
        self._stream.finish_step([run], self.timeout_s, run.what)

    # --- steps ----------------------------------------------------------------------------

    def _step_for(self, bucket) -> _Step:
        cur = self._current
        if cur is not None and cur.closed:
            # the previous backward ended without its end-of-backward callback (it raised)
            self._close_step(cur, 0.0)
            cur = None
        if cur is None:
            cur = self._current = _Step(self.step, StepStats(), [])
            try:
                torch.autograd.Variable._execution_engine.queue_callback(
                    lambda step=cur: self._end_of_backward(step))
                cur.guarded = True
            except RuntimeError:
                cur.guarded = False   # not inside backward: nothing to queue on
        if bucket.is_last():
            cur.closed = True
        return cur

    def _end_of_backward(self, step: _Step) -> None:
        what = f"rank {self.rank}: step {step.index}"
        wait_s = self._stream.finish_step(step.runners, self.timeout_s, what)
        self._close_step(step, wait_s)

    def _close_step(self, step: _Step, wait_s: float) -> None:
        step.stats.wait_s = wait_s
        for rec in step.stats.timeline:
            rec["collectives"] = [h.record() if hasattr(h, "record") else h
                                  for h in rec["collectives"]]
        self.last_stats = step.stats.as_dict()
        if self._current is step:
            self._current = None
        self.step = step.index + 1


def _check_policy(policy, model) -> tuple[dict, dict]:
    """``(policy, {id(parameter): bits})`` after checking names and widths against ``model``."""
    if policy is None:
        return {}, {}
    if not isinstance(policy, dict):
        raise ConfigError(f"bit_policy: expected a dict of parameter name -> bits, got {type(policy).__name__}")
    if model is None or not hasattr(model, "named_parameters"):
        raise ConfigError(f"model: a bit_policy needs the module DDP wraps (its parameter names), got {model!r}")
    params = dict(model.named_parameters())
    out = {}
    for name, bits in policy.items():
        if name not in params:
            raise ConfigError(f"bit_policy: {name!r} is not a parameter of the model")
        if not is_int(bits) or not 2 <= bits <= 16:
            raise ConfigError(f"bit_policy[{name!r}]: expected an int in [2, 16], got {bits!r}")
        out[id(params[name])] = bits
    return dict(sorted(policy.items())), out


def _policy_digest(policy: dict) -> str:
    """A short digest of the bit policy: a ResNet's names would overflow the fingerprint buffer."""
    if not policy:
        return "none"
    text = json.dumps(sorted(policy.items())).encode()
    return f"{len(policy)} params, sha256 {hashlib.sha256(text).hexdigest()[:16]}"


def _compare_prints(mine: dict, prints: list, rank: int) -> None:
    for r, theirs in enumerate(prints):
        for key in sorted(set(mine) | set(theirs)):
            a, b = mine.get(key), theirs.get(key)
            if isinstance(a, dict) and isinstance(b, dict):
                diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
                if diff:
                    k = diff[0]
                    raise HookError(f"ranks disagree on QSGDState field '{key}.{k}': rank {rank} "
                                    f"has {a.get(k)!r}, rank {r} has {b.get(k)!r}")
            elif a != b:
                raise HookError(f"ranks disagree on QSGDState field '{key}': rank {rank} has "
                                f"{a!r}, rank {r} has {b!r}")


class _FingerprintPlan:
    """The settings check's one collective, in the shape of a wire plan."""

    def __init__(self, p: int):
        from qsgd.wireplan import Collective, wire_bytes

        n = _FINGERPRINT_BYTES
        self.world_size = p
        self.collectives = (Collective("config fingerprint all_gather", "allgather", "uint8", n,
                                       wire_bytes("allgather", n, p), None),)


TRANSPORTS.update(PROGRAMS)


def _result(fut) -> torch.Tensor:
    # Re-raises a failed bucket's HookError inside DDP's own wait (outside backward).
    return fut.wait()


# DDP checks this exact return annotation (a string annotation would be refused).
def qsgd_hook(state: QSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the mean over ranks of the bucket's QSGD-decoded gradients.

    Parameters
    ----------
    state : QSGDState
    bucket : torch.distributed.GradBucket

    Returns
    -------
    torch.futures.Future[Tensor]
        The averaged flat bucket (written into the bucket's buffer), completed in a callback
        after the bucket's last collective.

    Examples
    --------
    One gloo rank, so the mean is the rank's own decoded gradient:

    >>> import torch, torch.distributed as dist, qsgd
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(100, 100))
    >>> ddp.register_comm_hook(qsgd.QSGDState(qsgd.QSGDConfig.from_bits(8), min_numel=0),
    ...                        qsgd.qsgd_hook)
    >>> ddp(torch.ones(2, 100)).sum().backward()
    >>> ddp.module.bias.grad.tolist()[:3]                        # every output's gradient is 2
    [2.0, 2.0, 2.0]
    >>> dist.destroy_process_group()
    """
    t_enter = time.perf_counter()
    stream = state._stream
    if stream.failure is not None:
        raise HookError(f"rank {state.rank}: an earlier collective of this QSGDState failed: "
                        f"{stream.failure}")
    step = state._step_for(bucket)
    if not state._checked and stream.gate is None:
        state._start_check()
    cruns, ridx, ckeys, cnumels, layout = _layout(state, bucket)
    warm = step.index < state.warmup_steps
    plan = state.plan(layout, warm, state.bucket_config(ckeys))
    index = bucket.index()
    record = {"bucket": index, "called": t_enter}
    step.stats.timeline.append(record)
    step.stats.buckets += 1
    what = f"rank {state.rank}: bucket {index} at step {step.index}"
    runner = Runner(stream, stream.ticket(len(plan.collectives)), None, plan, what, step.stats,
                    record, bucket.buffer().device, deferred=step.guarded)
    b = _Bucket(state, bucket, step.index, runner)
    runner.program = _warmup(b) if warm else TRANSPORTS[state.transport](b)
    step.runners.append(runner)
    stream.start(runner)
    record["returned"] = time.perf_counter()
    step.stats.hook_s += record["returned"] - t_enter
    if step.closed and not step.guarded:
        # outside backward: nothing runs at its end, so the step ends with its last bucket
        state._close_step(step, 0.0)
    return runner.result.then(_result)


__all__ = ["QSGDState", "qsgd_hook", "TRANSPORTS"]
