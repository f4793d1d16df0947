"""The networks of the QSGD paper's experiments and today's transformers, in plain ``torch.nn``.

No downloads and no weights: every model is built from its published shape (see docs/models.md).

:data:`MODELS` maps a name to a constructor; :func:`build_model` takes such a name or the import
path of any user module (``"pkg.mod:Class"``, ``"pkg.mod:factory"``). Each built-in model carries
``input_shape``, ``example_input``, ``example_target``, ``loss`` (:class:`SyntheticWorkload`) and
the parameter count its source publishes (``published_parameters``, cited in its docstring).
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

from torch import nn

from qsgd.errors import ModelError
from qsgd.models.alexnet import AlexNet
from qsgd.models.base import SyntheticWorkload, TokenWorkload, count_parameters
from qsgd.models.bert import Bert
from qsgd.models.bn_inception import BNInception
from qsgd.models.flops import forward_flops
from qsgd.models.gpt2 import GPT2
from qsgd.models.llama import PRESETS as LLAMA_PRESETS, Llama
from qsgd.models.losses import fused_cross_entropy
from qsgd.models.lstm import AN4LSTM
from qsgd.models.mlp import MLP
from qsgd.models.recipes import TRAINING_BATCH, TRAINING_OPTIMIZER
from qsgd.models.resnet import CifarResNet, ResNet
from qsgd.models.vgg import VGG
from qsgd.models.vit import ViT

#: name -> constructor (keyword arguments are passed through by :func:`build_model`).
MODELS: dict[str, Callable[..., nn.Module]] = {
    "alexnet": AlexNet,
    "vgg16": functools.partial(VGG, "vgg16"),
    "vgg19": functools.partial(VGG, "vgg19"),
    "resnet50": functools.partial(ResNet, 50),
    "resnet152": functools.partial(ResNet, 152),
    "resnet110": functools.partial(CifarResNet, 110),
    "resnet20": functools.partial(CifarResNet, 20),
    "bn_inception": BNInception,
    "lstm_an4": AN4LSTM,
    "mlp": MLP,
    "gpt2": functools.partial(GPT2, "gpt2"),
    "gpt2-medium": functools.partial(GPT2, "gpt2-medium"),
    "gpt2-large": functools.partial(GPT2, "gpt2-large"),
    "gpt2-xl": functools.partial(GPT2, "gpt2-xl"),
    "bert-base": functools.partial(Bert, "bert-base"),
    "bert-large": functools.partial(Bert, "bert-large"),
    "vit-b16": functools.partial(ViT, "vit-b16"),
    # the presets before "llama", so that model_name() names a preset's shape by its preset
    **{name: functools.partial(Llama, name) for name in LLAMA_PRESETS},
    "llama": Llama,
}

__all__ = ["MODELS", "build_model", "model_name", "fused_cross_entropy", "SyntheticWorkload", "TokenWorkload", "count_parameters",
           "forward_flops", "AlexNet", "VGG", "ResNet", "CifarResNet", "BNInception", "AN4LSTM", "MLP",
           "GPT2", "Bert", "ViT", "Llama", "TRAINING_BATCH", "TRAINING_OPTIMIZER"]


def build_model(name_or_path: str, **kwargs) -> nn.Module:
    """Build a model by name (:data:`MODELS`) or by import path ``"package.module:attribute"``.

    The attribute may be an ``nn.Module`` subclass or factory (called with ``kwargs``) or a module
    instance (returned as is; ``kwargs`` must then be empty).

    Raises
    ------
    ModelError
        Unknown name, unimportable module, missing attribute, or not an ``nn.Module``.

    Examples
    --------
    >>> import qsgd
    >>> sum(p.numel() for p in qsgd.build_model("mlp").parameters())
    235146
    >>> type(qsgd.build_model("torch.nn:Linear", in_features=4, out_features=2)).__name__
    'Linear'
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ModelError(f"model must be a name in {sorted(MODELS)} or 'pkg.mod:Class', got {name_or_path!r}")
    if name_or_path in MODELS:
        model = MODELS[name_or_path](**kwargs)
        # how it is usually trained (qsgd.models.recipes): the defaults of a prediction
        model.training_batch_size = TRAINING_BATCH.get(name_or_path)
        model.training_optimizer = TRAINING_OPTIMIZER.get(name_or_path, "sgd")
        return model
    if ":" not in name_or_path:
        raise ModelError(f"model {name_or_path!r} is not one of {sorted(MODELS)} "
                         f"nor an import path 'pkg.mod:Class'")
    module_name, _, attr = name_or_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"model {name_or_path!r}: cannot import {module_name!r}: {exc}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelError(f"model {name_or_path!r}: {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, nn.Module):
        if kwargs:
            raise ModelError(f"model {name_or_path!r} is an instance; it takes no arguments, got {kwargs!r}")
        return obj
    if not callable(obj):
        raise ModelError(f"model {name_or_path!r} is neither an nn.Module nor callable: {obj!r}")
    model = obj(**kwargs)
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {name_or_path!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def model_name(model: nn.Module) -> str:
    """The :data:`MODELS` name a built-in model is registered under, else its class path."""
    for name, ctor in MODELS.items():
        cls = ctor.func if isinstance(ctor, functools.partial) else ctor
        if type(model) is cls:
            args = ctor.args if isinstance(ctor, functools.partial) else ()
            # partial(ResNet, 50), partial(VGG, "vgg19"): the variant is kept as depth / config
            if not args or args[0] in (getattr(model, "depth", None), getattr(model, "config", None)):
                return name
    return f"{type(model).__module__}:{type(model).__qualname__}"
