"""Torch-function level of the recorder: autocast's casts, attention and the fused loss as
fused kernels.

Meta tensors take neither ``torch.autocast`` (it acts on CUDA and CPU tensors only) nor the
fused attention kernels (a meta ``scaled_dot_product_attention`` runs its math decomposition:
two ``bmm`` and a softmax with their backward, which no GPU build of PyTorch runs where
FlashAttention or memory-efficient attention applies). A :class:`torch.overrides.TorchFunctionMode`
sees each call above autograd, so it can do both as the GPU would:

* **autocast**, by the op lists of PyTorch's "Automatic Mixed Precision package" documentation
  ("Autocast Op Reference", CUDA): the functions in :data:`LOWER` run in the lower precision
  (their floating inputs cast to it), those in :data:`FP32` in float32, those in
  :data:`WIDEST` in the widest input type, the rest as their inputs come. A parameter's cast
  is cached for the step, as autocast caches casts of leaf tensors that require grad. Autograd
  records the casts, so backward casts the gradients back exactly as under autocast.
* **attention**: ``scaled_dot_product_attention`` becomes one operator forward and one
  backward (kind ``"attention"``), with FLOPs by :func:`qsgd.operators.kinds.attention_flops`;
  with ``fused_attention=False`` it is written out as code that does attention by hand does
  (scores by a batched product, scaled, masked, softmax, dropout, a product with the values),
  each step through autocast's lists as such code goes (the meta device's own math path
  would compute half inputs in float32, as the CPU does).
* **the fused cross-entropy** (:func:`qsgd.models.losses.fused_cross_entropy`) becomes one
  operator forward and one backward (kind ``"softmax"``: a pass over the logits), keeping what
  flash-attn's kernels keep for backward: the logits, the labels, one float32 log-sum-exp a row.
"""
from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from .kinds import attention_flops

#: autocast to the lower precision ("CUDA Ops that can autocast to float16")
LOWER = frozenset({
    "__matmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul",
    "multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "GRUCell", "linear", "LSTMCell", "matmul", "mm", "mv", "prelu",
    "RNNCell", "scaled_dot_product_attention",
})
#: autocast to float32 ("CUDA Ops that can autocast to float32")
FP32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin",
    "binary_cross_entropy_with_logits", "cosh", "cosine_embedding_loss", "cdist",
    "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv", "exp", "expm1",
    "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log", "log_softmax",
    "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss",
    "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist", "poisson_nll_loss", "pow",
    "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss", "softmax",
    "softmin", "softplus", "sum", "renorm", "tan", "triplet_margin_loss",
})
#: autocast to the widest input type ("CUDA Ops that promote to the widest input type")
WIDEST = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample",
                    "index_put", "scatter_add", "tensordot"})

_WIDTH = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}


class _Attention(torch.autograd.Function):
    """Fused attention on meta tensors: records its forward and backward kernels, returns
    outputs of the right shape and dtype."""

    @staticmethod
    def forward(ctx, recorder, causal, q, k, v):
        ctx.recorder, ctx.causal = recorder, causal
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        # FlashAttention keeps Q, K, V, the output and one float32 log-sum-exp per query row
        # for its backward (Dao et al. 2022, Algorithm 2)
        ctx.save_for_backward(q, k, v, out)
        recorder.saved_extra(out.numel() // out.shape[-1] * 4)
        recorder.attention(q, k, v, out, causal, backward=False)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _ = ctx.saved_tensors
        ctx.recorder.attention(q, k, v, grad, ctx.causal, backward=True)
        return None, None, q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class _FusedCrossEntropy(torch.autograd.Function):
    """The fused cross-entropy's kernels on meta tensors: per-row float32 losses forward (their
    mean is taken after, as flash-attn's ``CrossEntropyLoss`` does), the logits' gradient in
    their own dtype backward."""

    @staticmethod
    def forward(ctx, recorder, logits, target):
        ctx.recorder = recorder
        rows = logits.shape[0]
        ctx.save_for_backward(logits, target)
        recorder.saved_extra(rows * 4)                      # the log-sum-exp
        recorder.fused_loss(logits, backward=False)
        return logits.new_empty(rows, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad):
        logits, _ = ctx.saved_tensors
        ctx.recorder.fused_loss(logits, backward=True)
        return None, logits.new_empty(logits.shape), None


def fused_loss_record(logits, backward: bool) -> dict:
    """Bytes of one fused cross-entropy kernel over ``(N, V)`` logits: forward reads them and
    writes a float32 loss and log-sum-exp a row; backward reads them, the log-sum-exp and the
    rows' gradient, and writes the logits' gradient (flash-attn's ``cross_entropy_fwd_kernel``
    and ``cross_entropy_bwd_kernel``)."""
    size, rows = logits.numel() * logits.element_size(), int(logits.shape[0])
    return {"bytes": 2 * size + 8 * rows if backward else size + 8 * rows}


def attention_record(q, k, v, out_or_grad, causal: bool, backward: bool) -> dict:
    """FLOPs, bytes and product of one fused attention kernel over ``(B, H, S, D)`` tensors.

    Bytes: the forward reads Q, K, V and writes the output and one float32 log-sum-exp per
    query row; the backward reads those and the output's gradient and writes the gradients of
    Q, K and V (FlashAttention's traffic: no S x S matrix is stored).
    """
    *lead, s_q, d = q.shape
    s_k = k.shape[-2]
    bh = 1
    for n in lead:
        bh *= int(n)
    size = {t: t.numel() * t.element_size() for t in (q, k, v, out_or_grad)}
    lse = bh * s_q * 4
    qkv = size[q] + size[k] + size[v]
    nbytes = qkv + size[out_or_grad] + lse if not backward else \
        2 * qkv + 2 * size[out_or_grad] + lse
    return {"flops": attention_flops(bh, int(s_q), int(s_k), int(d), causal, backward),
            "bytes": nbytes, "gemms": [(bh, int(s_q), int(s_k), int(d))]}


class Functions(TorchFunctionMode):
    """The recorder's torch-function mode: autocast to ``amp_dtype`` (None: off) and fused
    attention recorded into ``recorder``."""

    def __init__(self, recorder, amp_dtype: torch.dtype | None = None, fused_attention: bool = True):
        super().__init__()
        self.recorder, self.amp_dtype, self.fused = recorder, amp_dtype, fused_attention
        self._cache: dict[int, torch.Tensor] = {}

    def _cast(self, value, dtype):
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point() or value.dtype == dtype:
                return value
            if value.is_leaf and value.requires_grad:
                key = id(value)
                if key not in self._cache or self._cache[key].dtype != dtype:
                    self._cache[key] = value.to(dtype)
                    self.recorder.cast_of_parameter(self._cache[key])
                return self._cache[key]
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v, dtype) for v in value)
        return value

    def _autocast(self, name, args, kwargs):
        if name in LOWER:
            dtype = self.amp_dtype
        elif name in FP32:
            dtype = torch.float32
        elif name in WIDEST:
            floats = [a.dtype for a in (*args, *kwargs.values())
                      if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if not floats:
                return args, kwargs
            dtype = max(floats, key=lambda t: _WIDTH.get(t, 4))
        else:
            return args, kwargs
        return self._cast(tuple(args), dtype), {k: self._cast(v, dtype) for k, v in kwargs.items()}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if self.amp_dtype is not None:
            args, kwargs = self._autocast(name, args, kwargs)
        if name == "scaled_dot_product_attention":
            return self._sdpa(*args, **kwargs) if self.fused else self._by_hand(*args, **kwargs)
        if name == "fused_cross_entropy":
            return _FusedCrossEntropy.apply(self.recorder, *args, **kwargs).mean()
        return func(*args, **kwargs)

    def _call(self, name: str, fn, *args, **kwargs):
        """``fn`` as autocast would run the torch function ``name``."""
        if self.amp_dtype is not None:
            args, kwargs = self._autocast(name, args, kwargs)
        return fn(*args, **kwargs)

    def _by_hand(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            reps = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(reps, dim=-3), v.repeat_interleave(reps, dim=-3)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = self._call("matmul", torch.matmul, q, k.transpose(-2, -1)) * scale
        if is_causal:
            s_q, s_k = q.shape[-2], k.shape[-2]
            mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        if attn_mask is not None:
            scores = scores + attn_mask
        probs = self._call("softmax", torch.softmax, scores, dim=-1)
        if dropout_p > 0:
            probs = torch.nn.functional.dropout(probs, dropout_p)
        return self._call("matmul", torch.matmul, probs, v)

    def _sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        # dropout and the scale change no kernel's traffic; a mask adds its bytes to the reads
        del dropout_p, scale, enable_gqa
        if attn_mask is not None:
            self.recorder.extra_read(attn_mask)
        return _Attention.apply(self.recorder, bool(is_causal), q, k, v)

    def clear_cache(self) -> None:
        """Forget the cached parameter casts (autocast clears them when its region ends)."""
        self._cache.clear()
