"""What :func:`qsgd.measure` needs from a model to run it on synthetic data.

A model of :mod:`qsgd.models` mixes in :class:`SyntheticWorkload`: the shape of one sample, the
number of classes, the loss, and the parameter count its source publishes (checked by the tests).
Inputs and labels are drawn from a CPU ``torch.Generator`` and then moved, so a seed gives the same
batch on every device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
        x = torch.randn((batch_size, *self.input_shape), generator=generator)
        return x.to(device) if device is not None else x

    def example_target(self, batch_size: int, *, generator: torch.Generator | None = None,
                       device=None) -> torch.Tensor:
        """Uniform random class labels of shape ``(batch_size,)`` (int64)."""
        y = torch.randint(0, self.num_classes, (batch_size,), generator=generator)
        return y.to(device) if device is not None else y

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of logits ``(..., num_classes)`` against labels ``(...)``."""
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = True) -> int:
    """Number of parameter elements (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
