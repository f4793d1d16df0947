"""Forward FLOPs of a model, for scaling measured compute times to another accelerator.

Counted by ``torch.utils.flop_counter.FlopCounterMode`` (matrix products and convolutions, a
multiply-add counts 2; elementwise layers such as BN, ReLU and pooling are not counted: they are
bounded by memory bandwidth, not by FLOP/s). The pass runs on the ``meta`` device through
``torch.func.functional_call``: shapes only, no arithmetic and no copy of the weights. That also
counts recurrent layers, whose CPU kernels (oneDNN) the counter does not see.
"""
from __future__ import annotations

import torch
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode


def forward_flops(model: torch.nn.Module, input_shape: tuple[int, ...], *, batch_size: int = 1) -> int:
    """FLOPs of one forward pass of ``model`` on a batch of ``batch_size`` samples.

    Parameters
    ----------
    model : torch.nn.Module
        Any module; it is not modified and its weights are not read.
    input_shape : tuple of int
        Shape of one sample (without the batch dimension), for a float input; a model with an
        ``example_input`` (:class:`~qsgd.models.SyntheticWorkload`, e.g. token ids of a language
        model) gets its own batch instead, drawn from a private generator.
    batch_size : int
        Samples in the batch.

    Returns
    -------
    int
        FLOPs (2 per multiply-add) of the counted operators.
    """
    tensors = {name: torch.empty_like(t, device="meta")
               for name, t in (*model.named_parameters(), *model.named_buffers())}
    if hasattr(model, "example_input"):
        # its own dtype and value range (token ids must be ints below the vocabulary size); a
        # private generator leaves the global RNG as it was
        x = model.example_input(batch_size, generator=torch.Generator().manual_seed(0), device="meta")
    else:
        x = torch.empty((batch_size, *input_shape), device="meta")
    was_training = model.training
    model.eval()  # no running-statistics updates of BN buffers: the pass must leave no trace
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            functional_call(model, tensors, (x,), strict=False)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())
