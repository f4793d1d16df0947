"""Vision Transformer ViT-B/16 (Dosovitskiy et al., ICLR 2021) for 224x224 ImageNet images.

Table 1 of the paper: ViT-Base has 12 layers, width 768, MLP 3072, 12 heads ("86M" parameters);
"/16" is the 16x16 patch. The patch embedding is a 16x16 convolution of stride 16 (a linear map
of each flattened patch, as the paper's Eq. 1), a learned class token is prepended to the 196
patches, positions are learned (197 of them), layers are pre-LayerNorm (eps 1e-6) with exact GELU,
and the classifier reads the class token after a final LayerNorm, as ``torchvision.models.vit_b_16``
builds it (the attention projection is one fused ``qkv`` matrix, as its ``in_proj``).
"""
from __future__ import annotations

import torch
from torch import nn

from qsgd.errors import ConfigError
from qsgd.models.base import SyntheticWorkload, check_dropout, check_int
from qsgd.models.transformer import Block

#: the ViT-B/16 shape: image side, patch side, layers, width, heads, MLP width
VIT_B16 = (224, 16, 12, 768, 12, 3072)


class ViT(SyntheticWorkload, nn.Module):
    """ViT-B/16 with a 1000-class head: 86,567,656 parameters.

    That is the exact count (``torchvision.models.vit_b_16`` documents ``num_params`` 86567656 for
    its ImageNet-1K weights); the paper's Table 1 gives 86M for ViT-Base.

    Parameters
    ----------
    variant : {"vit-b16"}
        The published shape; the keywords below override it.
    image_size, patch_size : int, optional
        Square input side and patch side in pixels (the patch must divide the image).
    n_layer, n_embd, n_head, ffn_dim : int, optional
        Layers, width, attention heads and MLP width.
    num_classes : int
        Output classes.
    dropout : float
        Dropout after the embedding, on attention weights and on residual branches while
        training (0, as torchvision's default and DeiT-style ImageNet training).

    Examples
    --------
    >>> import qsgd
    >>> tiny = qsgd.build_model("vit-b16", image_size=32, patch_size=8, n_layer=1, n_embd=16,
    ...                         n_head=2, ffn_dim=32, num_classes=10)
    >>> tiny(tiny.example_input(2)).shape
    torch.Size([2, 10])
    """

    def __init__(self, variant: str = "vit-b16", *, image_size: int | None = None,
                 patch_size: int | None = None, n_layer: int | None = None, n_embd: int | None = None,
                 n_head: int | None = None, ffn_dim: int | None = None, num_classes: int = 1000,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if variant != "vit-b16":
            raise ConfigError(f"variant must be 'vit-b16', got {variant!r}")
        given = (image_size, patch_size, n_layer, n_embd, n_head, ffn_dim)
        names = ("image_size", "patch_size", "n_layer", "n_embd", "n_head", "ffn_dim")
        shape = tuple(check_int(n, d if v is None else v) for n, v, d in zip(names, given, VIT_B16))
        image_size, patch_size, n_layer, n_embd, n_head, ffn_dim = shape
        if image_size % patch_size:
            raise ConfigError(f"patch_size must divide image_size={image_size}, got {patch_size}")
        num_classes = check_int("num_classes", num_classes)
        dropout = check_dropout(dropout)
        self.config = variant if shape == VIT_B16 and num_classes == 1000 else None
        self.published_parameters = 86_567_656 if self.config else 0
        self.input_shape = (3, image_size, image_size)
        self.num_classes = num_classes
        n_patches = (image_size // patch_size) ** 2

        self.patch_embed = nn.Conv2d(3, n_embd, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, n_embd))
        self.pos_embed = nn.Parameter(torch.empty(1, n_patches + 1, n_embd))
        nn.init.normal_(self.pos_embed, std=0.02)  # BERT-style, as torchvision; a no-op on meta
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(n_embd, n_head, ffn_dim, norm_first=True, eps=1e-6, dropout=dropout)
            for _ in range(n_layer))
        self.norm = nn.LayerNorm(n_embd, eps=1e-6)
        self.head = nn.Linear(n_embd, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)`` of images ``(batch, 3, image_size, image_size)``."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (batch, patches, width)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.drop(x + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))
