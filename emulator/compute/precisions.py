"""Training precisions: which operators a step runs, on which math units, and what DDP sends.

- ``fp32``: PyTorch's defaults for float32 training. Matrix products run on the FP32 units
  (``torch.backends.cuda.matmul.allow_tf32`` defaults to False since PyTorch 1.12), cuDNN's
  convolutions on TF32 tensor cores where the part has them
  (``torch.backends.cudnn.allow_tf32`` defaults to True): PyTorch's "TensorFloat-32 (TF32) on
  Ampere (and later) devices" notes.
- ``tf32``: both in TF32 (``allow_tf32 = True`` for matmuls too, as NGC containers set it).
- ``amp-fp16`` / ``amp-bf16``: ``torch.autocast`` with float16 / bfloat16 and float32 master
  parameters (the ``amp`` operator family: autocast's casts included); fp16 adds
  ``GradScaler``'s unscale of the gradients (operator kind ``scaler``).
- ``bf16``: parameters, activations and gradients in bfloat16 (the ``bf16`` family).
- ``fp16``: a float16 model (parameters, activations, gradients) whose optimizer steps
  float32 master weights, with loss scaling: apex amp O2 and DeepSpeed's fp16 optimizer (the
  ``half`` family; softmax and normalisation run in float16, as ``model.half()`` runs them).
- ``fp8``: ``amp-bf16`` whose linear layers' products run in FP8 (NVIDIA Transformer
  Engine's recipe; convolutions and attention stay in bf16).

Gradients: DDP all-reduces them in the parameters' dtype: 4 bytes an element for the
autocast and fp32 precisions (float32 parameters), 2 for bf16 and fp16 (2-byte models).
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.errors import ConfigError
from .devices import Device


@dataclass(frozen=True)
class Precision:
    """One training precision.

    Parameters
    ----------
    name : str
        Key in :data:`PRECISIONS`.
    family : str
        The operator family a trace records it in (``fp32``, ``amp``, ``bf16``, ``half``).
    lower : str or None
        The math mode of the family's 2-byte operators (``fp16``, ``bf16``); None for fp32.
    fp32_mm, fp32_conv : str
        Math modes of float32 matrix products and convolutions (``fp32`` or ``tf32``; TF32
        only where the device has it).
    gemm : str or None
        Math mode of linear layers' products when it differs from their dtype's (``fp8``).
    needs : str
        The math mode the device must have units for.
    grad_bytes : int
        Bytes per gradient element DDP all-reduces.
    scaler : bool
        Whether the step scales its loss dynamically: it runs ``GradScaler``'s unscale (the
        family's ``scaler`` kernels) and the host reads the overflow flag before the
        optimizer (``GradScaler.step``; apex's and DeepSpeed's loss scalers do the same).
    description : str
    """

    name: str
    family: str
    lower: str | None
    fp32_mm: str
    fp32_conv: str
    gemm: str | None
    needs: str
    grad_bytes: int
    scaler: bool
    description: str

    def mode(self, kind: str, dtype: str, device: Device) -> str:
        """The math mode an operator of ``kind`` with arithmetic in ``dtype`` runs on.

        >>> from emulator.compute.devices import device
        >>> p = PRECISIONS["fp32"]
        >>> p.mode("conv", "float32", device("A100")), p.mode("gemm", "float32", device("A100"))
        ('tf32', 'fp32')
        >>> p.mode("conv", "float32", device("V100"))
        'fp32'
        """
        if dtype == "float32":
            mode = self.fp32_conv if kind == "conv" else self.fp32_mm
            return mode if device.has(mode) else "fp32"
        if self.gemm is not None and kind == "gemm":
            return self.gemm
        if dtype == "bfloat16":
            return "bf16"
        return self.lower or "fp16"

    def check(self, device: Device) -> None:
        """ConfigError when ``device`` has no units this precision needs."""
        if not device.has(self.needs):
            have = [m for m in ("fp32", "tf32", "fp16", "bf16", "fp8") if device.has(m)]
            fits = [p.name for p in PRECISIONS.values() if device.has(p.needs)]
            raise ConfigError(f"precision {self.name!r} needs {self.needs} units, which "
                              f"{device.name} does not have (it has {have}); choose one of {fits}")


#: The precisions a prediction can take (module docstring).
PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "fp32", None, "fp32", "tf32", None, "fp32", 4, False,
              "float32 with PyTorch's defaults: convolutions in TF32 where the GPU has it"),
    Precision("tf32", "fp32", None, "tf32", "tf32", None, "tf32", 4, False,
              "float32 with TF32 matrix products and convolutions"),
    Precision("amp-fp16", "amp", "fp16", "fp32", "fp32", None, "fp16", 4, True,
              "autocast float16, float32 master weights, GradScaler"),
    Precision("amp-bf16", "amp", "bf16", "fp32", "fp32", None, "bf16", 4, False,
              "autocast bfloat16, float32 master weights"),
    Precision("bf16", "bf16", "bf16", "fp32", "fp32", None, "bf16", 2, False,
              "bfloat16 parameters, activations and gradients"),
    Precision("fp16", "half", "fp16", "fp32", "fp32", None, "fp16", 2, True,
              "float16 model, float32 master weights, loss scaling (apex amp O2, DeepSpeed fp16)"),
    Precision("fp8", "amp", "bf16", "fp32", "fp32", "fp8", "fp8", 4, False,
              "autocast bfloat16 with linear layers' products in FP8 (Transformer Engine)"),
)}


def precision(name: str) -> Precision:
    """The :class:`Precision` called ``name``; ConfigError naming the ones there are."""
    if name not in PRECISIONS:
        raise ConfigError(f"precision must be one of {list(PRECISIONS)}, got {name!r}")
    return PRECISIONS[name]


def default_precision(device: Device) -> Precision:
    """What people train with on ``device``: autocast in bf16 where the part has bf16 units
    (Ampere and later), in fp16 where it has fp16 tensor cores (Volta, Turing), else fp32.

    >>> from emulator.compute.devices import device
    >>> [default_precision(device(d)).name for d in ("H100", "V100", "K80")]
    ['amp-bf16', 'amp-fp16', 'fp32']
    """
    for name in ("amp-bf16", "amp-fp16", "fp32"):
        if device.has(PRECISIONS[name].needs):
            return PRECISIONS[name]
    return PRECISIONS["fp32"]
