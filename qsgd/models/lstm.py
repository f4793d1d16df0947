"""A 2-layer LSTM acoustic model of the size the QSGD paper trains on AN4 speech.

AN4 (CMU's alphanumeric census database) is the speech task of the QSGD paper's experiments,
trained with CNTK. The paper's Table 1 gives the network's size (13M parameters) but not its
layers, so the layers here are chosen as follows: frame features of the CNTK AN4 example
(``Examples/Speech/AN4``: 363 inputs, 33 filter-bank features with 11 frames of context, and 132
senone labels), two unidirectional LSTM layers, and the hidden width (976) that gives 13M.
"""
from __future__ import annotations

import torch
from torch import nn

from qsgd.models.base import SyntheticWorkload


class AN4LSTM(SyntheticWorkload, nn.Module):
    """2-layer LSTM, 363 -> 976 -> 976 -> 132 per frame: 13,000,000 parameters ("13M").

    The exact count is 12,992,644 (PyTorch keeps two bias vectors per gate, as cuDNN does).

    Parameters
    ----------
    input_size : int
        Features per frame.
    hidden_size : int
        LSTM cells per layer.
    num_layers : int
        Stacked LSTM layers.
    num_classes : int
        Output labels per frame (senones).
    seq_len : int
        Frames per synthetic utterance (100 frames of 10 ms: one second of speech).
    """

    def __init__(self, input_size: int = 363, hidden_size: int = 976, num_layers: int = 2,
                 num_classes: int = 132, seq_len: int = 100) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.input_shape = (seq_len, input_size)
        default = (input_size, hidden_size, num_layers, num_classes) == (363, 976, 2, 132)
        self.published_parameters = 13_000_000 if default else 0
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out)

    def example_target(self, batch_size: int, *, generator: torch.Generator | None = None,
                       device=None) -> torch.Tensor:
        """One random senone label per frame: shape ``(batch_size, seq_len)``."""
        y = torch.randint(0, self.num_classes, (batch_size, self.input_shape[0]), generator=generator)
        return y.to(device) if device is not None else y
