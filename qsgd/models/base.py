"""What :func:`qsgd.measure` needs from a model to run it on synthetic data.

A model of :mod:`qsgd.models` mixes in :class:`SyntheticWorkload`: the shape of one sample, the
number of classes, the loss, and the parameter count its source publishes (checked by the tests).
Inputs and labels are drawn on the CPU (from a CPU ``torch.Generator`` when one is given) and then
moved, so a seed gives the same batch on every device, ``"meta"`` included, and drawing works
inside a ``with torch.device("meta"):`` block too. Language models mix in
:class:`TokenWorkload` instead: integer token ids in, logits over the vocabulary out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from qsgd._checks import is_int, is_number
from qsgd.errors import ConfigError


def check_int(name: str, value, low: int = 1) -> int:
    """``value`` if it is an int >= ``low``, else a :class:`ConfigError` naming ``name``."""
    if not is_int(value) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def check_dropout(value) -> float:
    """A dropout probability in ``[0, 1)``, else a :class:`ConfigError`."""
    if not is_number(value) or not 0 <= value < 1:
        raise ConfigError(f"dropout must be a number in [0, 1), got {value!r}")
    return float(value)


def _moved(t: torch.Tensor, device) -> torch.Tensor:
    return t.to(device) if device is not None else t


class SyntheticWorkload:
    """Mixin for an ``nn.Module`` trained by classification on synthetic data.

    Attributes
    ----------
    input_shape : tuple of int
        Shape of one sample (without the batch dimension).
    num_classes : int
        Classes of the output's last dimension.
    published_parameters : int
        The parameter count the cited source gives (see the class docstring).
    parameter_tolerance : float
        Relative difference from ``published_parameters`` the tests accept.
    """

    input_shape: tuple[int, ...] = ()
    num_classes: int = 1000
    published_parameters: int = 0
    parameter_tolerance: float = 0.01

    def example_input(self, batch_size: int, *, generator: torch.Generator | None = None,
                      device=None) -> torch.Tensor:
        """A standard-normal batch of shape ``(batch_size, *input_shape)``, fp32."""
        x = torch.randn((batch_size, *self.input_shape), generator=generator, device="cpu")
        return _moved(x, device)

    def example_target(self, batch_size: int, *, generator: torch.Generator | None = None,
                       device=None) -> torch.Tensor:
        """Uniform random class labels of shape ``(batch_size,)`` (int64)."""
        y = torch.randint(0, self.num_classes, (batch_size,), generator=generator, device="cpu")
        return _moved(y, device)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of logits ``(..., num_classes)`` against labels ``(...)``."""
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


class TokenWorkload(SyntheticWorkload):
    """Mixin for a language model: token ids ``(batch, seq_len)`` in, logits ``(batch, seq_len, vocab)`` out.

    The synthetic task is next-token prediction: the target of position ``t`` is the token at
    ``t + 1`` of a window one token longer than the input (as a loader that cuts ``seq_len + 1``
    tokens from a packed corpus gives it), so every one of the ``seq_len`` positions is predicted
    and the loss is the mean cross-entropy over ``batch * seq_len`` positions. The data are
    uniform random tokens, so the target is drawn on its own; the compute is the same.

    Attributes
    ----------
    seq_len : int
        Tokens per sample; ``input_shape == (seq_len,)``.
    vocab_size : int
        Token ids are in ``[0, vocab_size)``; ``num_classes == vocab_size``.
    """

    seq_len: int = 1
    vocab_size: int = 1

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (self.seq_len,)

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return self.vocab_size

    def example_input(self, batch_size: int, *, generator: torch.Generator | None = None,
                      device=None) -> torch.Tensor:
        """Uniform random token ids of shape ``(batch_size, seq_len)`` (int64)."""
        ids = torch.randint(0, self.vocab_size, (batch_size, self.seq_len), generator=generator,
                            device="cpu")
        return _moved(ids, device)

    def example_target(self, batch_size: int, *, generator: torch.Generator | None = None,
                       device=None) -> torch.Tensor:
        """The next token of every position: uniform random ids ``(batch_size, seq_len)`` (int64)."""
        return self.example_input(batch_size, generator=generator, device=device)


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = True) -> int:
    """Number of parameter elements (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
