"""The optimizers a step is recorded with (:data:`OPTIMIZERS`), as torch runs them on a GPU.

- ``sgd``, ``adamw``: torch's own, with the multi-tensor ``foreach`` implementations torch
  picks for CUDA parameters (a few kernels over every parameter at once).
- ``bertadam``: the Python Adam of NVIDIA DeepLearningExamples' BERT
  (``PyTorch/LanguageModeling/BERT/optimization.py``, ``BertAdam``), which its SQuAD
  fine-tuning steps FP32/TF32 runs with: one multi-tensor L2 norm of every gradient, read on
  the host (``.item()``: the device drains before the update starts), then parameter by
  parameter the moments, an update without bias correction, weight decay on the weights
  (not biases and LayerNorm, ``run_squad.py``'s ``no_decay`` groups: the 1-D tensors) and the
  step: eleven to thirteen small kernels per parameter, each launched by the Python loop.
  Its clipping line (``p = p * max_norm / norm`` when the norm is over ``max_norm``) depends
  on the gradients' values and is not recorded.

Which of them read a device value on the host before updating is
:data:`qsgd.operators.records.HOST_SYNC_OPTIMIZERS` (the timing model needs it without torch).
"""
from __future__ import annotations

import torch

from .records import HOST_SYNC_OPTIMIZERS


class BertAdam(torch.optim.Optimizer):
    """DeepLearningExamples' BERT Adam, kernel for kernel (module docstring).

    Examples
    --------
    >>> w, b = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(3))
    >>> w.grad, b.grad = torch.full((3, 2), 0.5), torch.full((3,), 0.5)
    >>> BertAdam([w, b], lr=0.1).step()
    >>> # 1 - 0.1 * (m / (sqrt(v) + eps) + decay): m = 0.05, v = 0.00025, no bias correction
    >>> round(float(w.detach()[0, 0]), 4), round(float(b.detach()[0]), 4)   # a bias: no decay
    (0.6828, 0.6838)
    """

    def __init__(self, params, lr: float = 5e-5, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return None
        # the global gradient norm (apex's multi_tensor_l2norm); DeepLearningExamples reads it
        # with .item() to decide on clipping, which a meta tensor cannot give
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in params])))
        if norm.device.type != "meta":
            norm.item()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["next_m"] = torch.zeros_like(p)
                    state["next_v"] = torch.zeros_like(p)
                m, v, grad = state["next_m"], state["next_v"], p.grad
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"] > 0 and p.dim() > 1:
                    update += group["weight_decay"] * p
                p.add_(-(group["lr"] * update))
        return None


#: name -> builder of the optimizer over a list of parameters
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=True),
    "bertadam": lambda params: BertAdam(params),
}

assert HOST_SYNC_OPTIMIZERS <= set(OPTIMIZERS)
