"""Compute as GPUs run it: a per-operator model of a training step at any batch and precision.

- :mod:`~emulator.compute.devices`: the GPUs (:data:`DEVICES`, dense peaks per math mode,
  memory), and :func:`device_of` a topology's GPU;
- :mod:`~emulator.compute.precisions`: fp32, tf32, autocast fp16/bf16, bf16, fp16 with
  master weights, fp8 (:data:`PRECISIONS`): which math units each operator runs on, what DDP
  sends;
- :mod:`~emulator.compute.rules`: one kernel's seconds (roofline, tile and wave
  quantisation, cited efficiencies); :mod:`~emulator.compute.attention`: the fused attention
  kernel a run uses (:data:`ATTENTION_KERNELS`); :mod:`~emulator.compute.convolution`: cuDNN's algorithm
  per convolution as ``cudnn.benchmark`` picks it (implicit GEMM or Winograd);
  :mod:`~emulator.compute.timeline`: a step's phases from
  them through eager PyTorch's host and device; :mod:`~emulator.compute.codec`: QSGD's codec
  on the target; :mod:`~emulator.compute.methods`: the local stages of compression as other
  projects implement it (PowerSGD, GRACE's compressors);
- :class:`ComputeModel`: what the replay asks (phases, bucket ready times, codec seconds).

No torch here: the operator records come from :mod:`qsgd.operators` inside the trace.
"""
from .attention import ATTENTION_KERNELS, DEFAULT_ATTENTION, attention_kernel
from .codec import codec_seconds
from .devices import ALIASES, DEVICES, MODES, Device, device, device_named_as, device_of
from .model import ComputeModel
from .precisions import PRECISIONS, Precision, default_precision, precision
from .rules import kernel_seconds
from .timeline import HOST_OP_S, StepTimes, step_times

__all__ = ["ComputeModel", "DEVICES", "ALIASES", "MODES", "Device", "device", "device_of",
           "device_named_as",
           "PRECISIONS", "Precision", "precision", "default_precision", "kernel_seconds",
           "step_times", "StepTimes", "HOST_OP_S", "codec_seconds", "ATTENTION_KERNELS",
           "DEFAULT_ATTENTION", "attention_kernel"]
