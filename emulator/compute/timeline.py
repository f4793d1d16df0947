"""One training step on a GPU from its operator records: eager PyTorch's host and device.

PyTorch in eager mode issues kernels from the host one operator after another, each costing
:data:`HOST_OP_S` of host time (Python, the dispatcher, autograd's bookkeeping, the launch),
and the GPU runs them in order on one stream. The host runs ahead of the GPU; the GPU waits
for the host when kernels are shorter than their issue (the overhead-bound regime of small
batches). So kernel ``i`` starts at ``max(issued_i, end_{i-1})`` and ends
``kernel_seconds`` later; the step's phases end where their last kernel ends, and a
parameter's gradient is ready when the kernel after which its hook fired ends. The step
starts with host and GPU idle (a training loop reads its loss every step), and
``GradScaler.step`` reads the found-inf flag on the host (a synchronisation) before the
optimizer's kernels, as an optimizer that reads a device value first does
(:attr:`qsgd.operators.OperatorSet.host_sync`: DeepLearningExamples' BertAdam).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .attention import DEFAULT_ATTENTION
from .devices import Device
from .precisions import Precision
from .rules import FOREACH_TENSORS, kernel_seconds

#: Host seconds to issue one eager operator: about 8 us for a small CUDA ``add`` on an A100
#: host (Torch-FL PR #27) and 7 us per tiny-tensor op (FlagGems issue #4812), inside the
#: 5-20 us per launch Meta's Holistic Trace Analysis documentation gives.
HOST_OP_S = 8e-6


@dataclass(frozen=True)
class StepTimes:
    """A step's phases on the device (seconds) and where its gradients become ready.

    Attributes
    ----------
    forward_s, backward_s, optimizer_s : float
        Seconds of each phase, end to end (host waits included).
    ready_s : dict
        Parameter name -> seconds from the start of backward until its gradient is ready.
    kernel_s : dict
        ``(phase, kind)`` -> device seconds of those kernels (their sum; no host waits).
    host_bound_s : float
        Seconds the GPU waited for the host to issue work.
    ends : tuple of float
        When each operator's kernel ends, seconds from the start of the step (what a sharded
        step's units are placed by, :meth:`emulator.ComputeModel.unit_times`).
    """

    forward_s: float
    backward_s: float
    optimizer_s: float
    ready_s: dict
    kernel_s: dict = field(default_factory=dict)
    host_bound_s: float = 0.0
    ends: tuple = field(default=(), repr=False, compare=False)

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


def step_times(opset, batch: int, device: Device, precision: Precision,
               seconds=None, *, attention: str = DEFAULT_ATTENTION) -> StepTimes:
    """Time ``opset`` (a :class:`qsgd.operators.OperatorSet` of ``precision``'s family) at
    ``batch`` samples per GPU on ``device``, its fused attention on kernel ``attention``
    (:data:`~emulator.compute.attention.ATTENTION_KERNELS`); ``seconds`` (one per operator)
    replaces the kernels' modelled device seconds (a measured step's).

    Examples
    --------
    >>> import qsgd
    >>> from emulator.compute import device, precision
    >>> ops = qsgd.record_operators(qsgd.build_model("mlp"), families=("fp32",))
    >>> fam = ops.family("fp32")
    >>> t = step_times(fam, 1, device("A100"), precision("fp32"))
    >>> round(t.step_s / (len(fam.ops) * HOST_OP_S), 1)   # a small MLP: the host's issue time
    1.0
    """
    host = dev = waited = 0.0
    ends = []
    kernels: dict = {}
    marks = {}
    for i, op in enumerate(opset.ops):
        if op.kind == "scaler" and not precision.scaler:
            ends.append(dev)
            continue
        launches = max(1, -(-op.tensors // FOREACH_TENSORS)) if op.kind in ("optimizer", "scaler") else 1
        if op.phase == "optimizer" and "optimizer" not in marks and (
                precision.scaler or opset.host_sync):
            # GradScaler.step reads found_inf on the host; BertAdam its gradient norm
            host = max(host, dev)
        marks.setdefault(op.phase, i)
        host += HOST_OP_S * launches
        k = seconds[i] if seconds is not None else \
            kernel_seconds(op, batch, device, precision.mode(op.kind, op.dtype, device), attention)
        start = max(host, dev)
        waited += max(0.0, host - dev)
        dev = start + k
        ends.append(dev)
        kernels[op.phase, op.kind] = kernels.get((op.phase, op.kind), 0.0) + k

    def end_of(phase: str, default: float) -> float:
        idx = [i for i, o in enumerate(opset.ops) if o.phase == phase]
        return ends[idx[-1]] if idx else default

    fwd_end = end_of("forward", 0.0)
    bwd_end = end_of("backward", fwd_end)
    opt_end = end_of("optimizer", bwd_end)
    ready = {name: max(0.0, (ends[k - 1] if k > 0 else 0.0) - fwd_end)
             for name, k in opset.ready.items()}
    return StepTimes(fwd_end, bwd_end - fwd_end, opt_end - bwd_end, ready, kernels, waited,
                     tuple(ends))
