"""cuDNN's convolution algorithms, chosen as ``torch.backends.cudnn.benchmark = True`` does.

With ``cudnn.benchmark`` PyTorch asks cuDNN to run every algorithm it offers for a
convolution's shape and keeps the fastest (``cudnnFindConvolution*Algorithm``); the forward,
the data-gradient and the weight-gradient convolution each choose on their own. The model
does the same with its own timing of each candidate in :data:`ALGORITHMS` and takes the
fastest:

- ``implicit_gemm`` (always offered): the product ``(groups, M, N, K)`` the record carries,
  timed by :func:`~emulator.compute.rules.gemm_math_seconds` in the precision's math mode
  (NVIDIA, "Convolutional Layers User's Guide": ``M = N*P*Q``, ``N = K``, ``K = C*R*S``).
- ``winograd``: Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (CVPR
  2016). ``F(m x m, r x r)`` computes an ``m x m`` output tile from an ``(m + r - 1)^2`` input
  tile with ``(m + r - 1)^2`` multiplications instead of ``m^2 r^2``, so a convolution over
  ``T`` tiles is ``(m + r - 1)^2`` independent products, one per point of the transformed
  tile: ``(T x C) @ (C x K)`` forward, ``(T x K) @ (K x C)`` for the data gradient (a
  convolution with the flipped filter), ``(K x T) @ (T x C)`` for the weight gradient (the
  input convolved with the output's gradient). cuDNN offers it only for 3x3 filters, stride
  1, dilation 1 (``cudnnConvolutionForward``'s table of supported configurations; groups 1
  here); its
  non-fused form transforms through memory (``winograd_nonfused::winogradForwardData4x4``,
  ``...Filter4x4``, ``...Output4x4``, and for the weight gradient ``winogradWgradData4x4``,
  ``...Delta4x4``, ``...Output4x4``, beside batched GEMMs 36 deep, in public Nsight and
  TensorFlow profiles): ``F(4x4, 3x3)``, :data:`WINOGRAD_TILE`, a 4x reduction (36 against
  144 multiplications per tile). The transformed input, filter and output tiles are each
  written by one kernel and read by the next: their bytes move at the memory's streaming rate
  (:func:`~emulator.compute.rules.memory_seconds`), serially with the products, in
  :data:`WINOGRAD_KERNELS` more launches. The products run at the math mode's GEMM
  efficiency (:func:`~emulator.compute.rules.math_efficiency`).

Math modes Winograd runs in (:data:`WINOGRAD_MODES`): FP32 on the SIMT units (cuDNN's
``FLOAT_CONFIG``; with TF32 allowed cuDNN may still pick an FP32 FMA algorithm, PyTorch's
``allow_tf32`` permits tensor cores, it does not force them), and FP16 on tensor cores (cuDNN's
"Tensor Core operations": ``*_WINOGRAD_NONFUSED`` is one of the algorithms of
``cudnnConvolutionForward``, ``...BackwardData`` and ``...BackwardFilter`` that can run as
Tensor Core operations; cuDNN developer guide, Legacy API, "Supported Algorithms",
docs.nvidia.com/deeplearning/cudnn/latest/developer/legacy-api.html). No source says it
runs in TF32 or BF16: there it is not offered.

Left out: FFT (``CUDNN_*_ALGO_FFT``, ``FFT_TILING``), for want of a cited cost simple enough
to state (tile sizes, padding to transform lengths and complex products are cuDNN's own),
and Winograd for 5x5 filters (``winogradForwardData9x9_5x5``): cuDNN has it, the issue asked
for 3x3. Every constant is in ``docs/gpus.md`` section 5; none was fitted to a training run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .devices import Device
from .rules import (KERNEL_S, TENSOR_MODES, gemm_math_seconds, math_efficiency,
                    memory_seconds, split_k_bytes)

#: Output tile side ``m`` of Winograd's ``F(m x m, 3 x 3)``: cuDNN's non-fused kernels are
#: ``...4x4`` (module docstring), which time them on 36-deep batched products.
WINOGRAD_TILE = 4
#: The filter Winograd is offered for (cuDNN: 3x3, stride 1, dilation 1).
WINOGRAD_FILTER = (3, 3)
#: The precision's math mode -> the mode cuDNN's Winograd runs in (module docstring).
WINOGRAD_MODES = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16"}
#: Bytes per element of the transformed tiles, per Winograd math mode.
WINOGRAD_BYTES = {"fp32": 4, "fp16": 2}
#: Kernels a Winograd convolution launches beside its product: input, filter, output transforms.
WINOGRAD_KERNELS = 3


@dataclass(frozen=True)
class Product:
    """One convolution cuDNN runs: the forward, the data gradient or the weight gradient.

    Attributes
    ----------
    role : {"forward", "data", "weight"}
    dims : tuple of int
        ``(groups, M, N, K)``, the implicit GEMM the record carries.
    c_in, c_out : int
        Input and output channels per group.
    tiles : int
        ``m x m`` output tiles over the images (over the input gradient's for ``data``),
        :data:`WINOGRAD_TILE`; 0 when the record has no geometry.
    winograd : bool
        Whether cuDNN offers Winograd for its geometry (3x3, stride 1, dilation 1, groups 1).
    """

    role: str
    dims: tuple
    c_in: int
    c_out: int
    tiles: int
    winograd: bool


@dataclass(frozen=True)
class Timing:
    """One algorithm's seconds for a :class:`Product`.

    ``math_s`` overlaps the operator's own reads and writes (the roofline's max); ``serial_s``
    (transforms through memory, their launches) adds to it; ``extra_bytes`` join the
    operator's bytes (split-K partial sums); ``mode`` is the math mode it ran in.
    """

    algorithm: str
    math_s: float
    serial_s: float
    extra_bytes: int
    mode: str

    @property
    def seconds(self) -> float:
        return self.math_s + self.serial_s


def _implicit_gemm(p: Product, device: Device, mode: str) -> Timing | None:
    rate = device.flops(mode) * math_efficiency(mode, device)
    return Timing("implicit_gemm", gemm_math_seconds(*p.dims, rate, device.sms), 0.0,
                  split_k_bytes(*p.dims, device.sms), mode)


def _winograd(p: Product, device: Device, mode: str) -> Timing | None:
    wmode = WINOGRAD_MODES.get(mode)
    if not p.winograd or wmode is None or not device.has(wmode):
        return None
    points = (WINOGRAD_TILE + WINOGRAD_FILTER[0] - 1) ** 2      # 36 for F(4x4, 3x3)
    t, c, k = p.tiles, p.c_in, p.c_out
    gemm = {"forward": (points, t, k, c), "data": (points, t, c, k),
            "weight": (points, k, c, t)}[p.role]
    rate = device.flops(wmode) * math_efficiency(wmode, device)
    math_s = gemm_math_seconds(*gemm, rate, device.sms)
    # transformed input, gradient/output and filter tiles: each written once and read once
    moved = 2 * WINOGRAD_BYTES[wmode] * points * (t * c + t * k + k * c)
    moved += split_k_bytes(*gemm, device.sms)
    return Timing("winograd", math_s, memory_seconds(moved, device) + WINOGRAD_KERNELS * KERNEL_S,
                  0, wmode)


#: Candidate algorithms: name -> function(product, device, math mode) giving its
#: :class:`Timing`, or None where cuDNN does not offer it.
ALGORITHMS: dict[str, Callable[[Product, Device, str], Timing | None]] = {
    "implicit_gemm": _implicit_gemm,
    "winograd": _winograd,
}


def _tiles(sizes: tuple, batch: int) -> int:
    return batch * math.prod(math.ceil(s / WINOGRAD_TILE) for s in sizes)


def products(op, batch: int) -> list[Product]:
    """The convolutions inside operator record ``op`` at ``batch`` samples per GPU.

    A forward record is one; a backward record the data gradient (when the input needs one)
    then the weight gradient (when the weight does), as ``convolution_backward`` computes
    them (:mod:`qsgd.operators.kinds`).

    Examples
    --------
    >>> import qsgd, torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1))
    >>> ops = qsgd.record_operators(net, input_shape=(3, 16, 16), families=("fp32",)).family("fp32")
    >>> [(p.role, p.c_in, p.c_out, p.tiles) for o in ops.ops if o.kind == "conv"
    ...  for p in products(o, 2)]                                   # 2 images of 4x4 tiles
    ... # doctest: +NORMALIZE_WHITESPACE
    [('forward', 3, 8, 32), ('forward', 8, 8, 32), ('data', 8, 8, 32), ('weight', 8, 8, 32),
     ('weight', 3, 8, 32)]
    """
    dims = [tuple(d[0] + d[1] * batch for d in g) for g in op.gemms]
    kernel = tuple(getattr(op, "kernel", ()))
    spatial = tuple(getattr(op, "spatial", ()))
    taps = math.prod(kernel) if kernel else 1
    offered = (bool(kernel) and kernel == WINOGRAD_FILTER and set(op.stride) == {1}
               and set(op.dilation) == {1} and op.groups == 1)
    if "backward" not in op.op:
        roles = ["forward"] * len(dims)
    elif len(dims) == 2:
        roles = ["data", "weight"]
    else:   # one gradient: the weight's reduces over the output pixels, the data's does not
        out_px = batch * math.prod(spatial[1]) if spatial else None
        roles = ["weight" if dims and dims[0][3] == out_px else "data"] * len(dims)
    out = []
    for role, (g, m, n, k) in zip(roles, dims):
        c_in, c_out = {"forward": (k // taps, n), "data": (n, k // taps),
                       "weight": (n // taps, m)}[role]
        tiles = 0
        if spatial:
            tiles = _tiles(spatial[0] if role == "data" else spatial[1], batch)
        out.append(Product(role, (g, m, n, k), c_in, c_out, tiles, offered and tiles > 0))
    return out


def choose(p: Product, device: Device, mode: str) -> Timing:
    """The fastest algorithm of :data:`ALGORITHMS` for ``p`` in math mode ``mode`` (ties go to
    the first registered, implicit GEMM).

    Examples
    --------
    A 3x3 convolution of 256 channels over 56x56 images in FP32 on a V100: Winograd's four
    times fewer products win; with 2 channels its transforms cost more than they save.

    >>> from emulator.compute.devices import device
    >>> big = Product("forward", (1, 64 * 56 * 56, 256, 256 * 9), 256, 256, 64 * 14 * 14, True)
    >>> choose(big, device("V100"), "fp32").algorithm
    'winograd'
    >>> tiny = Product("forward", (1, 64 * 56 * 56, 2, 2 * 9), 2, 2, 64 * 14 * 14, True)
    >>> choose(tiny, device("V100"), "fp32").algorithm
    'implicit_gemm'
    """
    timings = [t for f in ALGORITHMS.values() if (t := f(p, device, mode)) is not None]
    return min(timings, key=lambda t: t.seconds)


def conv_seconds(op, batch: int, device: Device, mode: str) -> tuple[float, float, int, bool]:
    """A convolution record's products, each by the algorithm :func:`choose` picks.

    Parameters
    ----------
    op : qsgd.operators.Operator
        A record of kind ``conv`` (with or without geometry: without, implicit GEMM only).
    batch : int
        Samples per GPU.
    device : Device
    mode : str
        The math mode the precision runs the convolution in (``fp32``, ``tf32``, ``fp16``,
        ``bf16``).

    Returns
    -------
    tuple
        ``(math_s, serial_s, extra_bytes, tensor_cores)``: seconds of math that overlap the
        operator's own memory traffic, seconds that follow it (Winograd's transforms and
        their launches), bytes added to its traffic (split-K partial sums), and whether any
        product ran on tensor cores (which then want NHWC activations).

    Examples
    --------
    >>> import qsgd, torch
    >>> from emulator.compute.devices import device
    >>> conv = torch.nn.Conv2d(256, 256, 3, padding=1, bias=False)
    >>> ops = qsgd.record_operators(conv, input_shape=(256, 56, 56), families=("fp32",))
    >>> fwd = ops.family("fp32").ops[0]
    >>> math_s, serial_s, extra, tensor = conv_seconds(fwd, 64, device("V100"), "fp32")
    >>> round(math_s * 1e3, 2), round(serial_s * 1e3, 2), tensor     # Winograd, ms
    (5.07, 2.37, False)

    Implicit GEMM would take ``2 * 64 * 56 * 56 * 256 * 256 * 9`` FLOPs at 0.75 of 15.7 TFLOP/s:
    20.1 ms.
    """
    math_s = serial_s = 0.0
    extra, tensor = 0, False
    for p in products(op, batch):
        t = choose(p, device, mode)
        math_s += t.math_s
        serial_s += t.serial_s
        extra += t.extra_bytes
        tensor = tensor or t.mode in TENSOR_MODES
    return math_s, serial_s, extra, tensor


def algorithms(op, batch: int, device: Device, mode: str) -> list[str]:
    """The algorithm (a key of :data:`ALGORITHMS`) :func:`choose` picks for each product of
    convolution record ``op`` at ``batch`` samples on ``device`` in math mode ``mode``.

    Examples
    --------
    Forward, then backward in reverse (the first layer's input needs no gradient: its weight's
    alone). A stride-2 convolution is not offered Winograd; on an A100 TF32's tensor cores beat
    FP32 Winograd, and bf16 is not offered it (no source says cuDNN's Winograd runs in bf16):

    >>> import qsgd, torch
    >>> from emulator.compute.devices import device
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1),
    ...                           torch.nn.Conv2d(64, 64, 3, stride=2, padding=1))
    >>> fam = qsgd.record_operators(net, input_shape=(64, 56, 56), families=("fp32",)).family("fp32")
    >>> convs = [o for o in fam.ops if o.kind == "conv"]
    >>> [algorithms(o, 64, device("V100"), "fp32") for o in convs]
    ... # doctest: +NORMALIZE_WHITESPACE
    [['winograd'], ['implicit_gemm'], ['implicit_gemm', 'implicit_gemm'], ['winograd']]
    >>> algorithms(convs[0], 64, device("A100"), "tf32"), algorithms(convs[0], 64, device("A100"), "bf16")
    (['implicit_gemm'], ['implicit_gemm'])
    """
    return [choose(p, device, mode).algorithm for p in products(op, batch)]
