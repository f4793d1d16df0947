"""The GPUs a compute model can target: dense peak FLOP/s per math mode, memory, SM count.

Figures are the vendors' datasheets and architecture whitepapers as tabulated, with their
sources and verification marks, in ``docs/gpus.md`` (section 1); tensor figures are *dense*
(NVIDIA prints the 2:4-sparse ones beside them: half of those). On GeForce parts the rate
with FP32 accumulation, the one PyTorch's autocast uses, is half the FP16-accumulate rate;
that is the figure here. A topology's GPU nodes name their part (``model``, set by the machine
presets); :func:`device_of` maps it to a key of :data:`DEVICES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from emulator.errors import ConfigError

T = 1e12
#: Bytes in a datasheet's gigabyte of GPU memory (:attr:`Device.memory_bytes`).
GIB = 2 ** 30
#: Math modes a device can have units for, in the order PyTorch would pick them.
MODES = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class Device:
    """One GPU's datasheet figures.

    Parameters
    ----------
    name : str
        Key in :data:`DEVICES`.
    arch : str
        Architecture (``volta``, ``ampere``, ...), which picks efficiency rules.
    sms : int
        Streaming multiprocessors (the waves of a GEMM's tiles).
    peak : dict
        Math mode (:data:`MODES`) -> dense peak FLOP/s; a mode the part has no units for is
        absent.
    mem_bandwidth : float
        Peak memory bandwidth, bytes/s.
    memory_bytes : float
        Memory, bytes: the datasheet's "GB", which for GPU memory are binary (DRAM comes in
        powers of two: an "A100 40GB" is five 8 GiB HBM2 stacks, and ``nvidia-smi`` gives its
        total as 40,960 MiB, an "A100 80GB" 81,920 MiB), so 2**30 bytes each.
    hbm : bool
        HBM (True) or GDDR (False) memory (their streaming kernels reach different shares).
    consumer_fp32 : bool
        FP32 peak counts the dual-issue FP32 datapath of GA10x/AD10x/GB20x parts, which SGEMM
        rarely keeps both busy.
    source : str
        The datasheet or whitepaper of the figures (docs/gpus.md).
    """

    name: str
    arch: str
    sms: int
    peak: Mapping[str, float]
    mem_bandwidth: float
    memory_bytes: float
    hbm: bool
    source: str
    consumer_fp32: bool = False

    def flops(self, mode: str) -> float:
        """Dense peak FLOP/s of math mode ``mode``; ConfigError naming the modes it has."""
        if mode not in MODES:
            raise ConfigError(f"math mode must be one of {list(MODES)}, got {mode!r}")
        if mode not in self.peak:
            raise ConfigError(f"device {self.name} has no {mode} units (it has "
                              f"{[m for m in MODES if m in self.peak]})")
        return self.peak[mode]

    def has(self, mode: str) -> bool:
        """Whether the part has units for math mode ``mode``."""
        return mode in self.peak

    # figures the first compute model exposed, kept for its readers
    @property
    def peak_flops_fp32(self) -> float:
        return self.peak["fp32"]

    @property
    def peak_flops_bf16(self) -> float | None:
        return self.peak.get("bf16")

    @property
    def memory_label(self) -> str:
        """The memory as the datasheet names it and in decimal GB (:func:`memory_label`).

        >>> DEVICES["H100-SXM"].memory_label
        '80 GiB (85.9 GB)'
        """
        return memory_label(self.memory_bytes)


def memory_label(nbytes: float) -> str:
    """A GPU's memory of ``nbytes`` bytes for messages: as its datasheet names it (binary
    GB, :data:`GIB`) and in decimal GB, the unit of the memory model's figures.

    >>> memory_label(96 * 2 ** 30)
    '96 GiB (103.1 GB)'
    """
    return f"{nbytes / GIB:.0f} GiB ({nbytes / 1e9:.1f} GB)"



def _d(name, arch, sms, fp32, tf32, fp16, bf16, fp8, bw, mem_gb, hbm, source, consumer=False):
    peak = {m: v * T for m, v in zip(MODES, (fp32, tf32, fp16, bf16, fp8)) if v is not None}
    return Device(name, arch, sms, peak, bw, mem_gb * GIB, hbm, source, consumer)


#: Target GPUs (docs/gpus.md, tables 1a and 1b; dense TFLOP/s, bytes/s).
DEVICES: dict[str, Device] = {d.name: d for d in (
    _d("K80", "kepler", 13, 4.37, None, None, None, None, 240e9, 12, False,
       "Tesla K80 board specification, one GK210 (half the board: 8.74 TFLOP/s, 480 GB/s)"),
    _d("T4", "turing", 40, 8.1, None, 65, None, None, 320e9, 16, False, "NVIDIA T4 datasheet"),
    _d("V100", "volta", 80, 15.7, None, 125, None, None, 900e9, 16, True,
       "NVIDIA Tesla V100 SXM2 datasheet; Ampere whitepaper table 1"),
    _d("A10", "ampere", 72, 31.2, 62.5, 125, 125, None, 600e9, 24, False,
       "NVIDIA A10 datasheet (sparse figures halved)", consumer=True),
    _d("A100-40GB", "ampere", 108, 19.5, 156, 312, 312, None, 1555e9, 40, True,
       "NVIDIA A100 datasheet; Ampere GA100 whitepaper table 1"),
    _d("A100-80GB", "ampere", 108, 19.5, 156, 312, 312, None, 2039e9, 80, True,
       "NVIDIA A100 80GB SXM4 datasheet"),
    _d("L40S", "ada", 142, 91.6, 183, 362, 362, 733, 864e9, 48, False,
       "NVIDIA L40S datasheet (sparse figures halved)", consumer=True),
    _d("H100-SXM", "hopper", 132, 66.9, 494.7, 989.4, 989.4, 1978.9, 3.35e12, 80, True,
       "NVIDIA H100 Tensor Core GPU architecture whitepaper, SXM5 column"),
    _d("H100-PCIe", "hopper", 114, 51, 378, 756, 756, 1513, 2.0e12, 80, True,
       "NVIDIA H100 Tensor Core GPU architecture whitepaper, PCIe column (sparse halved)"),
    _d("H200", "hopper", 132, 66.9, 494.7, 989.4, 989.4, 1978.9, 4.8e12, 141, True,
       "NVIDIA H200 datasheet (compute as H100 SXM5)"),
    _d("B200", "blackwell", 148, 75, 1100, 2250, 2250, 4500, 7.7e12, 180, True,
       "NVIDIA HGX B200 specification, per GPU (sparse figures halved; SM count unverified)"),
    _d("RTX3090", "ampere", 82, 35.6, 35.6, 71, 71, None, 936e9, 24, False,
       "NVIDIA Ampere GA102 whitepaper, appendix (FP32-accumulate tensor rate)", consumer=True),
    _d("RTX4090", "ada", 128, 82.6, 82.6, 165.2, 165.2, 330.3, 1008e9, 24, False,
       "NVIDIA Ada whitepaper v2.1, appendix A (FP32-accumulate tensor rates)", consumer=True),
    _d("RTX5090", "blackwell", 170, 104.8, 104.8, 209.5, 209.5, 419, 1792e9, 32, False,
       "RTX Blackwell whitepaper (FP32-accumulate rates unverified: half the FP16-accumulate)",
       consumer=True),
)}

#: Other names of a device: the first compute model's keys, and the GPU models the topology
#: presets put on their nodes (``topologies.machines.parts.COMPUTE_CAPABILITY``'s keys).
ALIASES: dict[str, str] = {
    "A100": "A100-80GB", "H100": "H100-SXM",
    "K80-GK210": "K80", "V100-SXM2": "V100", "A100-SXM4": "A100-80GB",
    "A100-SXM4-40GB": "A100-40GB", "A100-SXM4-80GB": "A100-80GB", "H100-SXM5": "H100-SXM",
    "H200-SXM": "H200", "B200-SXM": "B200", "V100-PCIe": "V100",
}


def device(name: str) -> Device:
    """The :class:`Device` called ``name`` (a :data:`DEVICES` key or an alias).

    >>> device("A100").name, device("H100-SXM5").sms
    ('A100-80GB', 132)
    """
    key = ALIASES.get(name, name)
    if key not in DEVICES:
        raise ConfigError(f"device must be one of {sorted(DEVICES)} (or {sorted(ALIASES)}), "
                          f"got {name!r}")
    return DEVICES[key]


#: Words of a device's marketing name (``torch.cuda.get_device_name``) -> its key, most
#: specific first ("NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA H100 PCIe" the PCIe one).
_NAMES = (("H200", "H200"), ("H100 PCIE", "H100-PCIe"), ("H100", "H100-SXM"),
          ("A100-SXM4-40GB", "A100-40GB"), ("A100-PCIE-40GB", "A100-40GB"), ("A100", "A100-80GB"),
          ("B200", "B200"), ("V100", "V100"), ("L40S", "L40S"), ("A10", "A10"), ("T4", "T4"),
          ("K80", "K80"), ("3090", "RTX3090"), ("4090", "RTX4090"), ("5090", "RTX5090"))


def device_named_as(name: str) -> Device | None:
    """The catalogue's device a CUDA device name stands for, or None (a CPU, an unknown part).

    >>> device_named_as("NVIDIA H100 80GB HBM3").name, device_named_as("NVIDIA A10").name
    ('H100-SXM', 'A10')
    >>> device_named_as("Intel(R) Xeon(R) Processor") is None
    True
    """
    upper = (name or "").upper()
    for word, key in _NAMES:
        if word.upper() in upper:
            return DEVICES[key]
    return None


def device_of(G) -> Device | None:
    """The GPU of topology ``G`` (its GPU nodes' ``model``), or None when it names none.

    A graph mixing parts raises ConfigError: a study times one kind of GPU.

    >>> import topologies
    >>> device_of(topologies.from_spec("cluster:dgx_h100x2")).name
    'H100-SXM'
    >>> device_of(topologies.from_spec("switch:4")) is None
    True
    """
    models = {d.get("model") for _, d in G.nodes(data=True) if d.get("kind") == "gpu"}
    models.discard(None)
    known = {ALIASES.get(m, m) for m in models if ALIASES.get(m, m) in DEVICES}
    if len(known) > 1:
        raise ConfigError(f"topology {G.graph.get('name', '?')!r} mixes GPUs {sorted(models)}; "
                          f"a compute model times one kind")
    return DEVICES[known.pop()] if known else None
