"""Per-operator seconds of a real training step, measured with torch.profiler.

:func:`time_operators` runs one real step of a model on its device (after one unrecorded
warm-up step) under the recorder's dispatch mode with every kernel-launching operator inside a
``torch.profiler.record_function`` range, and reads each range's time back from the profile:
the device time of the kernels it launched on CUDA (the profiler attributes a kernel to the
range that launched it, whatever the host's lead), its own wall time on a CPU. The records
are those of :func:`qsgd.record_operators` at the measured batch (every count a constant), so
the emulator can use the seconds as they are on the same GPU and scale them per operator to
another one (``emulator.compute``). On CUDA the step's attention is the device's own fused
kernel (``aten._scaled_dot_product_flash_attention`` and its kin), recorded as ``attention``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from qsgd.errors import ModelError, TraceError
from qsgd._checks import is_int, is_number
from .records import Operator, OperatorSet

#: precision -> (operator family, torch.autocast dtype or None); the 2-byte families run the
#: model in their dtype (``bf16``; ``fp16``: float16 with float32 master weights)
PRECISIONS = {"fp32": ("fp32", None), "amp-fp16": ("amp", torch.float16),
              "amp-bf16": ("amp", torch.bfloat16), "bf16": ("bf16", None), "fp16": ("half", None)}

METHOD = ("one real step after one warm-up, every kernel-launching ATen operator in a "
          "torch.profiler.record_function range: its kernels' device time on CUDA, its wall "
          "time on a CPU")


@dataclass(frozen=True)
class MeasuredOperators:
    """One measured step's operators and their seconds.

    Parameters
    ----------
    operators : OperatorSet
        The step's records at ``batch_size`` (every affine pair ``(value, 0)``).
    seconds : tuple of float
        Seconds of each operator (device time of its kernels on CUDA).
    batch_size : int
        Samples the step ran.
    device_name : str
        The device it ran on (``torch.cuda.get_device_name``, or the CPU's name).
    precision : str
        A key of :data:`PRECISIONS`: ``"fp32"``, ``"amp-fp16"`` or ``"amp-bf16"``
        (``torch.autocast`` with that dtype), ``"bf16"`` or ``"fp16"`` (a 2-byte model).
    """

    operators: OperatorSet
    seconds: tuple[float, ...]
    batch_size: int
    device_name: str
    precision: str = "fp32"

    def __post_init__(self):
        if len(self.seconds) != len(self.operators.ops):
            raise TraceError(f"operators.measured.seconds: {len(self.seconds)} values for "
                             f"{len(self.operators.ops)} operators")
        for i, s in enumerate(self.seconds):
            if not is_number(s) or not s >= 0:
                raise TraceError(f"operators.measured.seconds[{i}] must be a number >= 0, got {s!r}")
        if not is_int(self.batch_size) or self.batch_size < 1:
            raise TraceError(f"operators.measured.batch_size must be a positive int, got {self.batch_size!r}")

    def to_dict(self) -> dict:
        return {"family": self.operators.family, "batch_size": self.batch_size,
                "device_name": self.device_name, "precision": self.precision, "method": METHOD,
                "seconds": list(self.seconds), **self.operators.to_dict()}

    @classmethod
    def from_dict(cls, d, path: str = "operators.measured") -> "MeasuredOperators":
        if not isinstance(d, Mapping):
            raise TraceError(f"{path} must be an object, got {d!r}")
        for key in ("family", "batch_size", "device_name", "seconds"):
            if key not in d:
                raise TraceError(f"{path}.{key} is missing")
        seconds = d["seconds"]
        if not isinstance(seconds, list):
            raise TraceError(f"{path}.seconds must be a list, got {seconds!r}")
        opset = OperatorSet.from_dict(d["family"], d, path)
        precision = d.get("precision", "fp32")
        if precision not in PRECISIONS:
            raise TraceError(f"{path}.precision must be one of {list(PRECISIONS)}, got {precision!r}")
        return cls(opset, tuple(float(s) if is_number(s) else s for s in seconds), d["batch_size"],
                   str(d["device_name"]), precision)


def time_operators(model: torch.nn.Module, batch_size: int, *, input_shape=None,
                   optimizer: str | None = None, precision: str = "fp32") -> MeasuredOperators:
    """Every kernel of one real training step of ``model`` on its own device, timed.

    Parameters
    ----------
    model : torch.nn.Module
        A model on the device to time (trained by the two steps: it is modified).
    batch_size : int
        Samples per step.
    input_shape : tuple of int, optional
        One sample's shape, for a module without ``example_input``.
    optimizer : {"sgd", "adamw", "bertadam"}, optional
        Default: the model's ``training_optimizer``, else ``"sgd"``.
    precision : {"fp32", "amp-fp16", "amp-bf16", "bf16", "fp16"}
        The step under ``torch.autocast`` of that dtype (fp16 with GradScaler's unscale), or
        of the model in bfloat16, or in float16 stepped through float32 master weights (the
        model is converted to that dtype).

    Returns
    -------
    MeasuredOperators

    Examples
    --------
    >>> import qsgd
    >>> from qsgd.operators.measured import time_operators
    >>> m = time_operators(qsgd.build_model("mlp"), 4)
    >>> len(m.seconds) == len(m.operators.ops) and all(s > 0 for s in m.seconds)
    True
    """
    from .record import _FAMILY, _Recorder, _optimizer, _step

    if not is_int(batch_size) or batch_size < 1:
        raise ModelError(f"batch_size must be a positive int, got {batch_size!r}")
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    family, amp = PRECISIONS[precision]
    if _FAMILY[family][0] != torch.float32:
        model.to(_FAMILY[family][0])
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ModelError(f"model {type(model).__name__} has no trainable parameters")
    device = params[0][1].device
    optimizer = optimizer or getattr(model, "training_optimizer", "sgd")
    input_shape = tuple(input_shape or getattr(model, "input_shape", ()) or ())
    opt = _optimizer(family, optimizer, [p for _, p in params])
    ready: dict[str, int] = {}
    recorder = _Recorder()

    def mark(name):
        def hook(_param) -> None:
            ready.setdefault(name, len(recorder.rows))
        return hook

    hooks = [p.register_post_accumulate_grad_hook(mark(n)) for n, p in params]
    model.train()
    try:
        _step(model, opt, family, batch_size, input_shape, recorder, ready, device=device.type,
              amp_dtype=amp)
        recorder.calls = calls = []
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize(device)
        with torch.profiler.profile(activities=activities) as prof:
            _step(model, opt, family, batch_size, input_shape, recorder, ready,
                  device=device.type, amp_dtype=amp)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        recorder.calls = None
        for h in hooks:
            h.remove()
    seconds = [0.0] * len(recorder.rows)
    for ev in prof.events():
        if ev.name.startswith("qsgd.op."):
            row = calls[int(ev.name.rsplit(".", 1)[1])]
            if row is not None:
                t = ev.device_time_total if device.type == "cuda" else ev.cpu_time_total
                seconds[row] += t * 1e-6
    opset = OperatorSet(family, tuple(_constant(r) for r in recorder.rows), dict(ready), optimizer)
    from qsgd.measurement import device_name

    return MeasuredOperators(opset, tuple(seconds), batch_size, device_name(device), precision)


def _constant(row: dict) -> Operator:
    """A record at one batch: every count an affine pair with no per-sample part."""
    def c(v: int) -> tuple[int, int]:
        return (int(v), 0)
    return Operator(row["op"], row["kind"], row["phase"], row["dtype"], c(row["flops"]),
                    c(row["bytes"]), tuple(tuple(c(d) for d in g) for g in row["gemms"]),
                    row["tensors"], row["causal"], c(row["reread"]), c(row["nchw"]),
                    **row.get("geometry", {}))
