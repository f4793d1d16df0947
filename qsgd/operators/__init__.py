"""A model's training step as operators, recorded on the meta device for the compute model.

:func:`record_operators` gives :class:`Operators`: per precision family (fp32, autocast,
pure bf16) every kernel of forward, backward and the optimizer step with its class, dtype,
FLOPs, bytes and matrix products, each affine in the per-GPU batch, and where in backward
each parameter's gradient is ready. The format is in :mod:`qsgd.operators.records` and
``docs/formats.md``; timing them on a GPU is the emulator's (``emulator.compute``).
"""
from .checkpoint import CHECKPOINTING
from .record import BATCHES, OPTIMIZERS, record_operators
from .records import DTYPES, FAMILIES, KINDS, PHASES, Operator, Operators, OperatorSet, at

__all__ = ["record_operators", "Operator", "OperatorSet", "Operators", "KINDS", "FAMILIES",
           "PHASES", "DTYPES", "BATCHES", "OPTIMIZERS", "CHECKPOINTING", "at"]
