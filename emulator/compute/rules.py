"""How long one kernel takes on a GPU: a roofline with achieved-efficiency rules per class.

A kernel's device seconds are ``max(math seconds, memory seconds) + KERNEL_S`` per launch:

- **math** (GEMM, convolution as implicit GEMM, fused attention): the products' FLOPs at the
  math mode's dense peak times an achieved efficiency. A matrix product is cut into output
  tiles, one per SM at a time (NVIDIA, "Matrix Multiplication Background User's Guide": tile
  and wave quantisation; an A100 runs one 256x128 tile per SM); a partly empty tile and a
  partly filled last wave cost whole ones. The faster of the two largest tile shapes cuBLAS
  uses (256x128, 128x128) is taken, as its heuristic would, each no larger than the matrix
  (rounded up to the tensor cores' 16-wide granularity: a one-row product runs a 16-row tile,
  not a 256-row one); when the tiles cannot fill the SMs, the reduction dimension is split
  across them (CUTLASS "split-K"), each part at least :data:`MIN_SPLIT_K` long, and the partial
  products are summed through memory.
- **memory**: the bytes read and written at the memory's achieved streaming bandwidth, plus
  what a second pass reads again (batch normalisation's statistics, ``reread``).
- **layout**: a convolution whose activations are laid out NCHW runs on tensor cores (TF32,
  FP16, BF16) only after cuDNN transposes them to NHWC and back: two more kernels moving those
  activations in and out (``nchw``; ``qsgd.operators.kinds.CONV_ACTIVATIONS`` cites it).
- **convolution algorithms**: each convolution (forward, data and weight gradient) runs the
  fastest of the algorithms cuDNN offers for its geometry and math mode, as
  ``cudnn.benchmark`` picks: implicit GEMM (the rule above) or Winograd
  (:mod:`~emulator.compute.convolution`); a record without geometry (an older trace) runs
  implicit GEMM.

Every constant is cited in ``docs/gpus.md`` (section 2) and none was fitted to a training
run: ``benchmarks/RESULTS.md`` says how the rules do against published throughput.
"""
from __future__ import annotations

import math

from .attention import DEFAULT_ATTENTION, attention_kernel
from .devices import Device

#: Achieved share of the tensor units' dense peak by a large, aligned cuBLAS GEMM. Volta and
#: Turing: 83 of the V100's 125 TFLOP/s (Markidis et al., "NVIDIA Tensor Core Programmability,
#: Performance & Precision", IPDPSW 2018), applied to Turing's tensor cores of the same design;
#: Ampere and later: the lower end of "80-90 % of peak" that FlashAttention-2 (Dao 2023,
#: introduction) gives for optimized GEMMs.
TENSOR_EFFICIENCY = {"volta": 0.66, "turing": 0.66, "ampere": 0.80, "ada": 0.80,
                     "hopper": 0.80, "blackwell": 0.80}
#: Achieved share of the FP32 (SIMT) peak by cuBLAS SGEMM: 0.75 on data-centre parts (Markidis
#: et al.: tensor cores run GEMMs about 7x faster than SGEMM on the V100, 83/7 of 15.7
#: TFLOP/s); 0.60 where the peak counts GA10x/AD10x's dual-issue FP32 datapath (cuBLAS at 23.2
#: of an RTX A6000's 38.7 TFLOP/s, siboehm's SGEMM_CUDA measurements).
SIMT_EFFICIENCY = {False: 0.75, True: 0.60}
#: Achieved share of the memory's peak bandwidth by a streaming kernel: 1.80 of an A100
#: 80 GB's 2.04 TB/s (88 %, NVIDIA developer forums, confirmed by Nsight Compute) for HBM;
#: 0.82 for GDDR, the mean of Habitat's GDDR device bandwidths against their datasheets
#: (RTX 2080 Ti 85 %, RTX 2070 85 %, T4 75 %; geoffxy/habitat devices.yml).
MEMORY_EFFICIENCY = {True: 0.88, False: 0.82}
#: Device seconds a kernel costs beyond its roofline time (launch, ramp-up and drain): about
#: 3 us per launch (an asynchronous launch rate of about 334,000 kernels/s; University of
#: Virginia's "CUDA Kernel Overhead" measurements).
KERNEL_S = 3e-6
#: Math modes that run on tensor cores (whose convolutions want NHWC).
TENSOR_MODES = ("tf32", "fp16", "bf16", "fp8")
#: Output tiles (rows x columns) cuBLAS uses for large products, most efficient first.
TILES = ((256, 128), (128, 128))
#: Shortest reduction a split-K part keeps: four main-loop iterations of a 32-deep tile
#: (CUTLASS's default threadblock K). A modelling choice, not a measured figure: shorter parts
#: would spend their time in prologue and epilogue.
MIN_SPLIT_K = 128
#: Granularity a tile's sides are rounded up to (a tensor-core MMA is 16 rows).
TILE_STEP = 16
#: Tensors one multi-tensor-apply kernel walks (ATen's MultiTensorApply.cuh,
#: depth_to_max_tensors for three lists: parameters, gradients, one state).
FOREACH_TENSORS = 48


def gemm_math_seconds(groups: int, m: int, n: int, k: int, flops_per_s: float, sms: int) -> float:
    """Seconds of ``groups`` products of ``(m x k) @ (k x n)`` at ``flops_per_s`` (already the
    achieved rate), with tile and wave quantisation and split-K (module docstring).

    Examples
    --------
    A product that fills whole waves runs at the given rate; one row more takes three waves of
    half-size tiles (1.5x):

    >>> t = gemm_math_seconds(1, 256 * 108, 128, 4096, 100e12, 108)
    >>> round(t * 100e12 / (2 * 256 * 108 * 128 * 4096), 6)
    1.0
    >>> round(gemm_math_seconds(1, 256 * 108 + 1, 128, 4096, 100e12, 108) / t, 6)
    1.5
    """
    if groups * m * n * k == 0:
        return 0.0
    per_sm = flops_per_s / sms
    best = math.inf
    for tm, tn in _tiles(m, n):
        tiles = groups * math.ceil(m / tm) * math.ceil(n / tn)
        split = 1
        if tiles < sms:
            split = max(1, min(sms // tiles, k // MIN_SPLIT_K))
        waves = math.ceil(tiles * split / sms)
        best = min(best, waves * 2 * tm * tn * math.ceil(k / split) / per_sm)
    return best


def _tiles(m: int, n: int) -> list[tuple[int, int]]:
    """:data:`TILES`, each side no larger than the matrix's rounded up to :data:`TILE_STEP`."""
    def fit(side: int, dim: int) -> int:
        return min(side, TILE_STEP * math.ceil(dim / TILE_STEP))
    return [(fit(tm, m), fit(tn, n)) for tm, tn in TILES]


def split_k_bytes(groups: int, m: int, n: int, k: int, sms: int) -> int:
    """Bytes the split-K reduction of the chosen tiling adds (4-byte partial sums written
    and read back once per extra part), 0 without a split."""
    tm, tn = _tiles(m, n)[0]
    tiles = groups * math.ceil(m / tm) * math.ceil(n / tn)
    if tiles >= sms:
        return 0
    split = max(1, min(sms // max(tiles, 1), k // MIN_SPLIT_K))
    return 2 * 4 * groups * m * n * (split - 1)


def memory_seconds(nbytes: float, device: Device) -> float:
    """Seconds to stream ``nbytes`` through ``device``'s memory.

    >>> from emulator.compute.devices import device
    >>> round(memory_seconds(2.04e12, device("A100-80GB")), 3)
    1.137
    """
    return nbytes / (device.mem_bandwidth * MEMORY_EFFICIENCY[device.hbm])


def math_efficiency(mode: str, device: Device) -> float:
    """Achieved share of ``mode``'s peak by a large matrix product on ``device``."""
    if mode == "fp32":
        return SIMT_EFFICIENCY[device.consumer_fp32]
    return TENSOR_EFFICIENCY.get(device.arch, TENSOR_EFFICIENCY["ampere"])


def kernel_seconds(op, batch: int, device: Device, mode: str,
                   attention: str = DEFAULT_ATTENTION) -> float:
    """Device seconds of operator record ``op`` (:class:`qsgd.operators.Operator`) at
    ``batch`` samples, its math on ``mode``'s units; a fused attention operator runs the
    kernel ``attention`` (:data:`~emulator.compute.attention.ATTENTION_KERNELS`).

    Examples
    --------
    >>> from types import SimpleNamespace as Op
    >>> from emulator.compute.devices import device
    >>> relu = Op(kind="elementwise", flops=(0, 0), bytes=(0, 8_000_000), gemms=(), tensors=1,
    ...           reread=(0, 0), nchw=(0, 0))
    >>> round(kernel_seconds(relu, 100, device("A100-80GB"), "fp32") * 1e6, 1)   # 800 MB
    448.9
    """
    nbytes = op.bytes[0] + op.bytes[1] * batch + op.reread[0] + op.reread[1] * batch
    launches = 1
    serial_s = 0.0
    tensor = mode in TENSOR_MODES
    if op.kind in ("gemm", "conv"):
        dims = [tuple(d[0] + d[1] * batch for d in g) for g in op.gemms]
        launches = max(1, len(dims))
        rate = device.flops(mode) * math_efficiency(mode, device)
        if op.kind == "conv" and dims and dims[0][0] > 1 and min(g[2] for g in dims) < 16:
            # grouped / depthwise: direct kernels on the FP32 pipes, not implicit GEMM tiles
            flops = op.flops[0] + op.flops[1] * batch
            math_s = flops / (device.flops("fp32") * math_efficiency("fp32", device))
        elif op.kind == "conv":
            # each convolution by the algorithm cudnn.benchmark would pick (implicit GEMM or
            # Winograd, emulator.compute.convolution)
            from .convolution import conv_seconds

            math_s, serial_s, extra, tensor = conv_seconds(op, batch, device, mode)
            nbytes += extra
        else:
            math_s = sum(gemm_math_seconds(*g, rate, device.sms) for g in dims)
            nbytes += sum(split_k_bytes(*g, device.sms) for g in dims)
    elif op.kind == "attention":
        flops = op.flops[0] + op.flops[1] * batch
        share = attention_kernel(attention).efficiency(device.arch,
                                                       backward=op.op == "attention_backward")
        math_s = flops / (device.flops(mode) * share)
    else:
        math_s = 0.0
        if op.kind in ("optimizer", "scaler"):
            launches = math.ceil(op.tensors / FOREACH_TENSORS)
    nchw = op.nchw[0] + op.nchw[1] * batch
    if nchw and tensor:
        # the layout change's two kernels: each reads and writes the activations once
        serial_s += memory_seconds(2 * nchw, device) + 2 * KERNEL_S
    return max(math_s, memory_seconds(nbytes, device)) + launches * KERNEL_S + serial_s
