"""VGG (Simonyan & Zisserman, ICLR 2015), configuration E (VGG-19) without batch norm."""
from __future__ import annotations

import torch
from torch import nn

from qsgd.models.base import SyntheticWorkload

#: convolution widths per configuration ("M" is a 2x2 max pool); Table 1 of the paper.
CONFIGS: dict[str, list] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


class VGG(SyntheticWorkload, nn.Module):
    """VGG-19 (configuration E): 143,667,240 parameters.

    Simonyan & Zisserman (2015), Table 2, give 144M for configuration E; 143,667,240 is the exact
    count of that network (as ``torchvision.models.vgg19`` builds it): sixteen 3x3 convolutions and
    fully connected layers 25088 -> 4096 -> 4096 -> 1000. The QSGD paper's Table 1 lists 143M.
    Configuration D (VGG-16, ``config="vgg16"``; 138M in the paper's Table 2) has 138,357,544
    (``torchvision.models.vgg16``): thirteen 3x3 convolutions and the same classifier.

    Parameters
    ----------
    config : {"vgg11", "vgg16", "vgg19"}
        Convolution widths (:data:`CONFIGS`).
    num_classes : int
        Output classes.
    """

    input_shape = (3, 224, 224)
    published_parameters = 143_667_240
    #: exact counts of the other configurations (torchvision's vgg11, vgg16).
    PUBLISHED = {"vgg11": 132_863_336, "vgg16": 138_357_544, "vgg19": 143_667_240}

    def __init__(self, config: str = "vgg19", num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        if config not in CONFIGS:
            raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
        self.config = config
        self.num_classes = num_classes
        self.published_parameters = self.PUBLISHED[config] if num_classes == 1000 else 0
        layers: list[nn.Module] = []
        channels = 3
        for v in CONFIGS[config]:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(p=dropout),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))
