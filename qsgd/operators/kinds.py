"""What each torch operator is, for the compute model: its class, and the products inside it.

torch's operators (ATen, as a dispatch mode sees them below autograd) are named by their
overload packet (``aten.convolution``). :data:`NO_KERNEL` lists those that launch nothing
(allocations, metadata, views: ``OpOverload.is_view`` marks the rest); :data:`KIND` maps the
others to a class of :data:`qsgd.operators.records.KINDS`; an operator missing from it is
recorded as ``"other"`` (timed by the bytes it moves) so that summaries show it.
:data:`GEMMS` gives the matrix products of the compute-bound classes as ``(groups, M, N, K)``:
cuBLAS' view of ``mm``/``bmm``, and cuDNN's implicit GEMM of a convolution (NVIDIA,
"Convolutional Layers User's Guide", Deep Learning Performance documentation: forward
``M = N * P * Q``, ``N = K`` output channels, ``K = C * R * S``; the data gradient and the
weight gradient permute the three).
"""
from __future__ import annotations

import math

#: Operators that launch no kernel: allocation, metadata, aliasing, host-side bookkeeping.
NO_KERNEL = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
    "_unsafe_view", "lift_fresh", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel",
    "_record_function_enter_new", "_record_function_exit", "set_", "resize_", "_reshape_alias",
    "_to_copy_noop",
})

_EW = ("add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_", "threshold_backward",
       "gelu", "gelu_backward", "silu", "silu_", "silu_backward", "tanh", "tanh_backward", "sigmoid",
       "sigmoid_backward", "neg", "pow", "rsqrt", "sqrt", "exp", "log", "reciprocal", "where",
       "masked_fill", "masked_fill_", "native_dropout", "native_dropout_backward", "hardtanh",
       "hardtanh_backward", "leaky_relu", "leaky_relu_backward", "clamp", "clamp_min", "addcmul",
       "addcdiv", "lerp", "cos", "sin", "abs", "sign", "eq", "ne", "lt", "gt", "le", "ge", "bitwise_not",
       "logical_not", "_softmax_backward", "fill_", "mish", "mish_backward", "hardswish",
       "hardswish_backward", "elu", "elu_backward", "expm1", "log1p", "erf", "minimum", "maximum")
_RED = ("sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "std", "norm",
        "linalg_vector_norm", "prod", "argmax", "argmin", "cumsum", "any", "all")
_NORM = ("native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
         "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
         "cudnn_batch_norm", "cudnn_batch_norm_backward", "native_layer_norm",
         "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
         "_fused_rms_norm", "_fused_rms_norm_backward", "batch_norm_backward")
_POOL = ("max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
         "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
         "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "max_pool3d_with_indices",
         "avg_pool3d", "_adaptive_avg_pool3d")
_COPY = ("_to_copy", "copy_", "clone", "cat", "stack", "index_select", "gather", "scatter",
         "scatter_add", "index", "index_put", "index_put_", "index_add", "slice_scatter",
         "select_scatter", "constant_pad_nd", "roll", "repeat", "flip", "_unsafe_index",
         "_unsafe_index_put", "contiguous", "narrow_copy", "split_with_sizes_copy", "unbind_copy",
         "permute_copy", "transpose_copy", "view_copy", "_reshape_copy", "tril", "triu",
         "slice_backward", "select_backward", "index_select_backward", "expand_copy")
_FILL = ("zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "zero_", "new_zeros",
         "new_ones", "new_full", "scalar_tensor", "arange", "randn", "rand", "randint", "bernoulli_",
         "uniform_", "normal_")
_SOFTMAX = ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data")
_LOSS = ("nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
         "mse_loss", "mse_loss_backward", "binary_cross_entropy_with_logits")

#: Fused attention kernels of scaled_dot_product_attention on real devices (CUDA's flash,
#: memory-efficient and cuDNN backends; the CPU's flash kernel), forward and backward.
FUSED_ATTENTION = (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_flash_attention_forward",
    "_flash_attention_backward", "_efficient_attention_forward", "_efficient_attention_backward",
)

#: overload packet name -> operator class
KIND: dict[str, str] = {
    **{n: "elementwise" for n in _EW}, **{n: "reduction" for n in _RED},
    **{n: "norm" for n in _NORM}, **{n: "pool" for n in _POOL}, **{n: "copy" for n in _COPY},
    **{n: "fill" for n in _FILL}, **{n: "softmax" for n in _SOFTMAX}, **{n: "loss" for n in _LOSS},
    "embedding": "embedding", "embedding_dense_backward": "embedding",
    "mm": "gemm", "addmm": "gemm", "bmm": "gemm", "baddbmm": "gemm", "addbmm": "gemm",
    "_addmm_activation": "gemm", "addmv": "gemm", "mv": "gemm", "dot": "gemm",
    "convolution": "conv", "convolution_backward": "conv", "cudnn_convolution": "conv",
    "_amp_foreach_non_finite_check_and_unscale_": "scaler", "_amp_update_scale_": "scaler",
    # the fused kernels a real device's scaled_dot_product_attention runs (a measured step)
    **{n: "attention" for n in FUSED_ATTENTION},
}


#: Operators that read some inputs twice: batch normalisation in training needs the whole
#: batch's statistics before it can normalise any element (Ioffe & Szegedy 2015, Algorithm 1),
#: and its backward needs the sums of the gradient and of its product with the normalised
#: input before any input gradient, so a batch of activations larger than the cache is read
#: once for the reduction and again for the element-wise pass. Packet name -> argument
#: positions read twice.
REREAD = {
    "native_batch_norm": (0,), "_native_batch_norm_legit": (0,),
    "_native_batch_norm_legit_functional": (0,), "cudnn_batch_norm": (0,),
    "native_batch_norm_backward": (0, 1), "cudnn_batch_norm_backward": (0, 1),
    "batch_norm_backward": (0, 1),
}
#: Convolutions' activation tensors (argument positions; outputs always count): what cuDNN
#: transposes to NHWC and back when they are laid out NCHW and its tensor-core kernels run
#: (MosaicML Composer, "Channels Last" method card: "the NCHW tensor must be transposed to
#: NHWC before the convolution and transposed back to NCHW after"; NVIDIA, "Convolutional
#: Layers User's Guide": choose layouts "to avoid transposing input and output data").
CONV_ACTIVATIONS = {"convolution": (0,), "convolution_backward": (0, 1)}


#: Where a convolution's aten call keeps its geometry: packet name -> argument positions of
#: (input, weight, output or gradient of the output, stride, dilation, transposed, groups).
#: ``convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
#: groups)``; ``convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
#: dilation, transposed, output_padding, groups, output_mask)`` (ATen's native_functions.yaml).
CONV_GEOMETRY = {"convolution": (0, 1, None, 3, 5, 6, 8),
                 "convolution_backward": (1, 2, 0, 4, 6, 7, 9)}


def conv_geometry(name: str, args, out) -> dict | None:
    """A convolution call's ``kernel``, ``stride``, ``dilation``, ``groups`` and ``spatial``
    (input's and output's spatial sizes), the fields :class:`~qsgd.operators.records.Operator`
    carries; None for other operators and for transposed convolutions (their stride means
    the opposite, and the compute model times them as implicit GEMM).

    >>> import torch
    >>> x, w = torch.empty(2, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta")
    >>> args = (x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    >>> conv_geometry("convolution", args, torch.empty(2, 4, 4, 4, device="meta"))
    {'kernel': (3, 3), 'stride': (2, 2), 'dilation': (1, 1), 'groups': 1, 'spatial': ((8, 8), (4, 4))}
    """
    where = CONV_GEOMETRY.get(name)
    if where is None:
        return None
    i_x, i_w, i_y, i_stride, i_dil, i_tr, i_groups = where
    if bool(args[i_tr]):
        return None
    x, w = args[i_x], args[i_w]
    y = out if i_y is None else args[i_y]
    kernel = tuple(int(d) for d in w.shape[2:])

    def per_dim(v) -> tuple[int, ...]:
        v = tuple(int(d) for d in v)
        return v * len(kernel) if len(v) == 1 else v
    return {"kernel": kernel, "stride": per_dim(args[i_stride]), "dilation": per_dim(args[i_dil]),
            "groups": int(args[i_groups]),
            "spatial": (tuple(int(d) for d in x.shape[2:]), tuple(int(d) for d in y.shape[2:]))}


def kind_of(name: str) -> str:
    """The class of the operator with overload packet ``name``.

    >>> kind_of("convolution"), kind_of("_foreach_addcmul_"), kind_of("some_new_op")
    ('conv', 'optimizer', 'other')
    """
    if name.startswith(("_foreach_", "_fused_")):
        return "optimizer"
    return KIND.get(name, "other")


def _shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _mm(args, out):
    (m, k), (_, n) = _shape(args[0]), _shape(args[1])
    return [(1, m, n, k)]


def _addmm(args, out):
    return _mm(args[1:], out)


def _bmm(args, out):
    (b, m, k), (_, _, n) = _shape(args[0]), _shape(args[1])
    return [(b, m, n, k)]


def _baddbmm(args, out):
    return _bmm(args[1:], out)


def _mv(args, out):
    m, k = _shape(args[0])
    return [(1, m, 1, k)]


def _conv(args, out):
    x, w = _shape(args[0]), _shape(args[1])
    transposed, groups = bool(args[6]), int(args[8])
    y = _shape(out)
    n, spatial_out = y[0], math.prod(y[2:])
    kernel = math.prod(w[2:])
    c_in = x[1]
    c_out = y[1]
    # implicit GEMM: one output pixel per row, one output channel per column, the input
    # channels times the filter taps as the reduction (a transposed convolution runs the
    # data-gradient kernel, whose reduction is over the input channels the same way)
    del transposed
    return [(groups, n * spatial_out, c_out // groups, (c_in // groups) * kernel)]


def _conv_backward(args, out):
    grad_out, x, w = _shape(args[0]), _shape(args[1]), _shape(args[2])
    groups, mask = int(args[9]), args[10]
    n, c_in, c_out = x[0], x[1], grad_out[1]
    kernel = math.prod(w[2:])
    pix_in, pix_out = math.prod(x[2:]), math.prod(grad_out[2:])
    gemms = []
    if mask[0]:   # data gradient: input pixels x input channels, reduced over C_out * taps
        gemms.append((groups, n * pix_in, c_in // groups, (c_out // groups) * kernel))
    if mask[1]:   # weight gradient: C_out x (C_in * taps), reduced over every output pixel
        gemms.append((groups, c_out // groups, (c_in // groups) * kernel, n * pix_out))
    return gemms


def _fused_attention(args, out):
    q, k = _shape(args[0]), _shape(args[1])
    bh = 1
    for n in q[:-2]:
        bh *= n
    return [(bh, q[-2], k[-2], q[-1])]


#: overload packet name -> function(args, out) giving its products ``[(groups, M, N, K)]``
#: (attention: ``(batch x heads, S_q, S_k, D)``)
GEMMS = {
    **{n: _fused_attention for n in FUSED_ATTENTION},
    "mm": _mm, "addmm": _addmm, "_addmm_activation": _addmm, "bmm": _bmm, "baddbmm": _baddbmm,
    "mv": _mv, "addmv": lambda a, o: _mv(a[1:], o), "convolution": _conv,
    "convolution_backward": _conv_backward,
}


def attention_flops(bh: int, s_q: int, s_k: int, d: int, causal: bool, backward: bool) -> int:
    """FLOPs of fused attention over ``bh`` (batch x heads) heads.

    Forward: two products of ``s_q x s_k x d`` (scores, then the weighted values), 2 FLOPs per
    multiply-add; a causal mask with ``s_q == s_k`` skips the upper triangle (FlashAttention
    skips those blocks): ``s_k (s_k + 1) / 2`` of the ``s_q s_k`` pairs. Backward: five products
    of the same size against the forward's two (it recomputes the scores; Dao, "FlashAttention-2",
    2023, Section 3.1.2: 2.5x the forward's FLOPs).

    >>> attention_flops(1, 4, 4, 8, False, False)
    512
    >>> attention_flops(1, 4, 4, 8, True, True) == attention_flops(1, 4, 4, 8, False, True) * 10 // 16
    True
    """
    pairs = s_q * s_k
    if causal and s_q == s_k:
        pairs = s_k * (s_k + 1) // 2
    products = 5 if backward else 2
    return 2 * products * bh * pairs * d
