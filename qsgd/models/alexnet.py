"""AlexNet (Krizhevsky, Sutskever & Hinton 2012), in torchvision's single-tower variant."""
from __future__ import annotations

import torch
from torch import nn

from qsgd.models.base import SyntheticWorkload


class AlexNet(SyntheticWorkload, nn.Module):
    """AlexNet as ``torchvision.models.alexnet`` builds it: 61,100,840 parameters.

    torchvision follows the one-GPU variant of Krizhevsky's "One weird trick" (arXiv 1404.5997):
    convolutions of 64, 192, 384, 256, 256 filters without grouping, then fully connected layers
    9216 -> 4096 -> 4096 -> 1000. (The grouped two-tower original of 2012 has about 60.9M.) The
    QSGD paper's Table 1 lists 62M for its AlexNet.

    Parameters
    ----------
    num_classes : int
        Output classes (1000 for ImageNet).
    dropout : float
        Dropout probability of the first two fully connected layers.
    """

    input_shape = (3, 224, 224)
    published_parameters = 61_100_840

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(p=dropout), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))
