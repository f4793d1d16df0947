"""Residual networks (He, Zhang, Ren & Sun, CVPR 2016): ImageNet ResNet-50/152 and CIFAR ResNet-110.

ImageNet networks use bottleneck blocks with the stride on the 3x3 convolution ("ResNet v1.5", as
``torchvision.models`` builds them; the parameter count is the same as with the stride on the 1x1)
and projection shortcuts where the shape changes. CIFAR networks (Section 4.2 of the paper) use
three stages of ``n`` basic blocks with 16, 32 and 64 filters and parameter-free shortcuts
(option A: subsample and zero-pad the channels), depth ``6 n + 2``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qsgd.models.base import SyntheticWorkload


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4; BN after each; projection shortcut if needed."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


#: bottleneck blocks per stage (Table 1 of the paper) and the exact parameter counts of the
#: resulting 1000-class networks (the figures torchvision documents for resnet50/101/152).
IMAGENET_DEPTHS: dict[int, tuple[tuple[int, ...], int]] = {
    50: ((3, 4, 6, 3), 25_557_032),
    101: ((3, 4, 23, 3), 44_549_160),
    152: ((3, 8, 36, 3), 60_192_808),
}


class ResNet(SyntheticWorkload, nn.Module):
    """ImageNet bottleneck ResNet: ResNet-50 has 25,557,032 parameters, ResNet-152 60,192,808.

    The paper's Table 1 gives the layouts; the exact counts are those of ``torchvision.models``
    (25.6M and 60.2M in its documentation). The QSGD paper's Table 1 lists 60M for ResNet-152.

    Parameters
    ----------
    depth : {50, 101, 152}
        Network depth (:data:`IMAGENET_DEPTHS`).
    num_classes : int
        Output classes.
    """

    input_shape = (3, 224, 224)

    def __init__(self, depth: int = 50, num_classes: int = 1000) -> None:
        super().__init__()
        if depth not in IMAGENET_DEPTHS:
            raise ValueError(f"depth must be one of {sorted(IMAGENET_DEPTHS)}, got {depth!r}")
        blocks, published = IMAGENET_DEPTHS[depth]
        self.depth = depth
        self.num_classes = num_classes
        self.published_parameters = published if num_classes == 1000 else 0
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        cin = 64
        stages = []
        for i, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512))):
            layers = []
            for j in range(n):
                layers.append(Bottleneck(cin, width, stride=2 if (j == 0 and i > 0) else 1))
                cin = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BN; option-A shortcut (strided identity, zero-padded channels)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = _conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride = stride
        self.pad = cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1 or self.pad:
            shortcut = x[:, :, ::self.stride, ::self.stride]
            shortcut = F.pad(shortcut, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + shortcut)


class CifarResNet(SyntheticWorkload, nn.Module):
    """CIFAR-10 ResNet of depth ``6 n + 2``; ResNet-110 has 1,700,000 parameters ("1.7M").

    He et al. (2016), Table 6, give 0.27M, 0.46M, 0.66M, 0.85M and 1.7M (270,000 to 1,700,000)
    for depths 20, 32, 44, 56 and 110, rounded to two digits; this option-A network has exactly 269,722 and 1,727,962 (projection
    shortcuts, option B, would add 2,752). The tolerance of the check is that rounding, not 1%.
    The QSGD paper trains ResNet-110 on CIFAR-10.

    Parameters
    ----------
    depth : int
        ``6 n + 2``: 20, 32, 44, 56, 110, 1202.
    num_classes : int
        Output classes (10 for CIFAR-10).
    """

    input_shape = (3, 32, 32)
    #: counts of Table 6 of the paper (10 classes), given to two significant digits
    PUBLISHED = {20: 270_000, 32: 460_000, 44: 660_000, 56: 850_000, 110: 1_700_000}
    #: relative tolerance of a comparison with PUBLISHED: half a unit of the last digit given
    parameter_tolerance = 0.03

    def __init__(self, depth: int = 110, num_classes: int = 10) -> None:
        super().__init__()
        if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth must be 6 n + 2 with n >= 1, got {depth!r}")
        n = (depth - 2) // 6
        self.depth = depth
        self.num_classes = num_classes
        self.published_parameters = self.PUBLISHED.get(depth, 0) if num_classes == 10 else 0
        self.conv1 = _conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        cin = 16
        stages = []
        for i, width in enumerate((16, 32, 64)):
            layers = []
            for j in range(n):
                layers.append(BasicBlock(cin, width, stride=2 if (j == 0 and i > 0) else 1))
                cin = width
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(torch.flatten(x, 1))
