"""A small multilayer perceptron: fast enough for tests and for CPU training runs."""
from __future__ import annotations

import torch
from torch import nn

from qsgd.models.base import SyntheticWorkload


class MLP(SyntheticWorkload, nn.Module):
    """Fully connected ReLU network; 784 -> 256 -> 128 -> 10 has 235,146 parameters.

    The count is ``sum(a * b + b)`` over consecutive widths; the biases (fewer than 10,000
    elements) are the tensors the paper's rule sends uncompressed.

    Parameters
    ----------
    in_features : int
        Inputs per sample (784 = a 28x28 image).
    hidden : tuple of int
        Hidden layer widths.
    num_classes : int
        Output classes.
    """

    def __init__(self, in_features: int = 784, hidden: tuple[int, ...] = (256, 128),
                 num_classes: int = 10) -> None:
        super().__init__()
        widths = (in_features, *hidden, num_classes)
        if any(not isinstance(w, int) or w < 1 for w in widths):
            raise ValueError(f"widths must be positive ints, got {widths!r}")
        self.input_shape = (in_features,)
        self.num_classes = num_classes
        self.published_parameters = sum(a * b + b for a, b in zip(widths, widths[1:]))
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.layers = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.flatten(1))
