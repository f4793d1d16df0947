"""BN-Inception (Ioffe & Szegedy, "Batch Normalization", ICML 2015, Figure 5 / Appendix).

GoogLeNet with batch normalization after every convolution, the 5x5 branches replaced by two
3x3 convolutions, and stride-2 modules 3c and 4e that concatenate a max pool instead of a
projection. Layer widths are those of the paper's table (its Figure 5).
"""
from __future__ import annotations

import torch
from torch import nn

from qsgd.models.base import SyntheticWorkload


class ConvBN(nn.Sequential):
    """Convolution (with bias, as in the reference Caffe model), batch norm, ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0) -> None:
        super().__init__(nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class InceptionBN(nn.Module):
    """One module: 1x1 | 1x1 -> 3x3 | 1x1 -> 3x3 -> 3x3 | pool (-> 1x1); outputs concatenated.

    Parameters
    ----------
    cin : int
        Input channels.
    c1 : int
        1x1 branch width (0: no such branch, as in the stride-2 modules).
    c3r, c3 : int
        3x3 branch: reduction and output widths.
    d3r, d3 : int
        Double-3x3 branch: reduction and output widths.
    pool : {"avg", "max"}
        Pooling branch.
    proj : int
        1x1 projection after the pool (0: none, the pool passes through).
    stride : int
        1, or 2 for the grid-reducing modules 3c and 4e.
    """

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, d3r: int, d3: int, pool: str,
                 proj: int, stride: int = 1) -> None:
        super().__init__()
        self.branch1 = ConvBN(cin, c1, 1) if c1 else None
        self.branch3 = nn.Sequential(ConvBN(cin, c3r, 1), ConvBN(c3r, c3, 3, stride, 1))
        self.branchd = nn.Sequential(ConvBN(cin, d3r, 1), ConvBN(d3r, d3, 3, 1, 1),
                                     ConvBN(d3, d3, 3, stride, 1))
        pooling = (nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=True) if pool == "avg"
                   else nn.MaxPool2d(3, stride=stride, padding=1))
        self.branchp = nn.Sequential(pooling, ConvBN(cin, proj, 1)) if proj else pooling
        self.out_channels = c1 + c3 + d3 + (proj or cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [] if self.branch1 is None else [self.branch1(x)]
        outs += [self.branch3(x), self.branchd(x), self.branchp(x)]
        return torch.cat(outs, 1)


#: (name, c1, c3r, c3, d3r, d3, pool, proj, stride) of Ioffe & Szegedy (2015), Figure 5.
MODULES = (
    ("3a", 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 0, 128, 160, 64, 96, "max", 0, 2),
    ("4a", 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 0, 128, 192, 192, 256, "max", 0, 2),
    ("5a", 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 352, 192, 320, 192, 224, "max", 128, 1),
)


class BNInception(SyntheticWorkload, nn.Module):
    """BN-Inception for 224x224 ImageNet: 11,300,000 parameters ("11.3M").

    The paper gives no count; 11.3M is the figure of Bianco et al., "Benchmark analysis of
    representative deep neural network architectures", IEEE Access 6 (2018), Table 1, for the
    reference Caffe model (convolutions with bias), which this reproduces with 11,295,240
    parameters. The QSGD paper's Table 1 lists 11M.

    Parameters
    ----------
    num_classes : int
        Output classes.
    """

    input_shape = (3, 224, 224)

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.published_parameters = 11_300_000 if num_classes == 1000 else 0
        self.stem = nn.Sequential(
            ConvBN(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, ceil_mode=True),
            ConvBN(64, 64, 1), ConvBN(64, 192, 3, 1, 1), nn.MaxPool2d(3, 2, ceil_mode=True),
        )
        cin = 192
        blocks = []
        for name, *widths in MODULES:
            block = InceptionBN(cin, *widths)
            blocks.append((name, block))
            cin = block.out_channels
        self.inception = nn.ModuleDict(blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.inception.values():
            x = block(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))
