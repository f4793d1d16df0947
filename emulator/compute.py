"""How long one training iteration computes: measured seconds, scaled to a target accelerator.

A :class:`qsgd.PayloadTrace` holds the forward, backward and optimizer seconds and each bucket's
encode/decode seconds measured on some machine. :class:`ComputeModel` turns them into the
seconds of another device:

* forward, backward, optimizer and the buckets' ready offsets scale with the ratio of peak
  FLOP/s (measuring device / target device). Dense training is compute bound, so this is the
  first-order model; it ignores that a CPU reaches a larger fraction of its peak than a GPU on
  small batches, which is why a measured host FLOP/s (:func:`qsgd.measure_host`, a large fp32
  matmul, i.e. an *achieved* figure) is used for a CPU rather than a datasheet peak.
* encode and decode are a few passes over the gradient, memory bound, so they scale with the
  ratio of memory bandwidth (measured copy bandwidth on a CPU).

Peak figures are vendor datasheet numbers, tabulated in docs/gpus.md; the ``source`` of each
:class:`Device` says which datasheet.
"""
from __future__ import annotations

import math

from dataclasses import dataclass

from emulator.errors import ConfigError
from ._checks import is_number

TB = 1e12


@dataclass(frozen=True)
class Device:
    """One accelerator's peak figures.

    Parameters
    ----------
    name : str
        Key in :data:`DEVICES`.
    peak_flops_fp32, peak_flops_bf16 : float or None
        Peak dense FLOP/s (fp32 without tensor cores; bf16 dense tensor cores, or None if the
        part has none). None for ``"measured"`` (no scaling).
    mem_bandwidth : float or None
        Peak memory bandwidth, bytes/s.
    source : str
        Where the figures come from.
    """

    name: str
    peak_flops_fp32: float | None
    peak_flops_bf16: float | None
    mem_bandwidth: float | None
    source: str

    def flops(self, dtype: str = "fp32") -> float | None:
        """Peak FLOP/s for ``dtype`` ("fp32" or "bf16"; falls back to fp32 without bf16 units)."""
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        if dtype == "bf16" and self.peak_flops_bf16 is not None:
            return self.peak_flops_bf16
        return self.peak_flops_fp32


DTYPES = ("fp32", "bf16")

#: Target devices. Figures: vendor datasheets (docs/gpus.md).
DEVICES: dict[str, Device] = {
    # One GK210 (half a K80 board): 8.73 TFLOP/s board boost / 2; 480 GB/s board / 2.
    "K80": Device("K80", 4.37e12, None, 240e9, "NVIDIA Tesla K80 datasheet (per GK210 GPU: board/2)"),
    "V100": Device("V100", 15.7e12, None, 900e9, "NVIDIA V100 SXM2 datasheet (no bf16; tensor fp16 125 TFLOP/s)"),
    "A100": Device("A100", 19.5e12, 312e12, 2.0e12, "NVIDIA A100 SXM4 80GB datasheet"),
    "H100": Device("H100", 67e12, 989e12, 3.35e12, "NVIDIA H100 SXM5 datasheet (dense bf16)"),
    "H200": Device("H200", 67e12, 989e12, 4.8e12, "NVIDIA H200 SXM datasheet (compute as H100)"),
    "measured": Device("measured", None, None, None, "the measuring machine itself: no scaling"),
}


def _positive(name: str, value) -> float:
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _seconds(name: str, value) -> float | None:
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ComputeModel:
    """Compute seconds of one iteration, from a trace's measurements.

    Parameters
    ----------
    compute_scale : float
        Multiplies the measured forward/backward/optimizer seconds and the buckets' ready
        offsets (measuring FLOP/s / target FLOP/s). 0 models infinitely fast compute.
    codec_scale : float
        Multiplies the measured encode/decode seconds (measuring bandwidth / target bandwidth).
    forward_s, backward_s, optimizer_s : float or None
        User-given seconds replacing the (scaled) measured ones; the buckets' ready offsets are
        stretched to the given backward time.
    device : str
        Name of the target device (a :data:`DEVICES` key or "custom").
    source : str
        How the scales were obtained (reported in study rows).

    Examples
    --------
    A CPU that reaches 100 GFLOP/s and copies at 10 GB/s, standing in for an A100:

    >>> import emulator, qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> m = emulator.ComputeModel.for_device("A100", trace, host_flops=100e9, host_bandwidth=10e9)
    >>> round(m.compute_scale, 6), round(m.codec_scale, 6), m.device
    (0.005128, 0.005, 'A100')
    """

    compute_scale: float = 1.0
    codec_scale: float = 1.0
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    device: str = "measured"
    source: str = "measured seconds"

    def __post_init__(self):
        for name in ("compute_scale", "codec_scale"):
            v = getattr(self, name)
            if not is_number(v) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"ComputeModel.{name} must be a finite number >= 0, got {v!r}")
        for name in ("forward_s", "backward_s", "optimizer_s"):
            _seconds(f"ComputeModel.{name}", getattr(self, name))

    # ---------------------------------------------------------------- what replay asks
    def phases(self, trace) -> tuple[float, float, float, float]:
        """``(forward_s, backward_s, optimizer_s, ready_scale)`` for ``trace`` (seconds).

        ``ready_scale`` multiplies a bucket's measured ``ready_s`` offset into backward.
        """
        fwd_m = trace.mean_iteration("forward_s")
        bwd_m = trace.mean_iteration("backward_s")
        opt_m = trace.mean_iteration("optimizer_s")
        fwd = fwd_m * self.compute_scale if self.forward_s is None else self.forward_s
        opt = opt_m * self.compute_scale if self.optimizer_s is None else self.optimizer_s
        if self.backward_s is None:
            bwd, ready_scale = bwd_m * self.compute_scale, self.compute_scale
        else:
            bwd = self.backward_s
            ready_scale = bwd / bwd_m if bwd_m > 0 else 0.0
        return fwd, bwd, opt, ready_scale

    def codec_seconds(self, measured_s: float) -> float:
        """Encode or decode seconds on the target, from ``measured_s`` on the measuring device."""
        return measured_s * self.codec_scale

    def to_dict(self) -> dict:
        return {"device": self.device, "source": self.source, "compute_scale": self.compute_scale,
                "codec_scale": self.codec_scale, "forward_s": self.forward_s,
                "backward_s": self.backward_s, "optimizer_s": self.optimizer_s}

    # ---------------------------------------------------------------- constructors
    @classmethod
    def measured(cls) -> "ComputeModel":
        """The trace's seconds as measured."""
        return cls()

    @classmethod
    def given(cls, forward_s: float, backward_s: float, optimizer_s: float = 0.0, *,
              codec_scale: float = 1.0) -> "ComputeModel":
        """User-given compute seconds (encode/decode: measured times times ``codec_scale``)."""
        for name, v in (("forward_s", forward_s), ("backward_s", backward_s), ("optimizer_s", optimizer_s)):
            if v is None:
                raise ConfigError(f"ComputeModel.given: {name} is required, got None")
        return cls(1.0, codec_scale, forward_s, backward_s, optimizer_s, "custom", "user-given seconds")

    @classmethod
    def for_device(cls, target: str, trace, *, host_flops: float | None = None,
                   host_bandwidth: float | None = None, dtype: str = "fp32") -> "ComputeModel":
        """Scale ``trace``'s measured seconds to device ``target`` (a :data:`DEVICES` key).

        The measuring device's figures come from :data:`DEVICES` when the trace's
        ``device_name`` names one of them (e.g. "NVIDIA A100-SXM4-80GB"); otherwise (a CPU)
        from ``host_flops`` (FLOP/s) and ``host_bandwidth`` (bytes/s) when given, else from the
        rates stored with the trace (:attr:`qsgd.PayloadTrace.host`), so that one trace gives
        the same rows on any machine. Only a trace that stores none measures this machine.
        """
        if target not in DEVICES:
            raise ConfigError(f"device must be one of {sorted(DEVICES)}, got {target!r}")
        dev = DEVICES[target]
        if dev.peak_flops_fp32 is None:
            return cls()
        src = source_device(trace.device_name) if trace.device != "cpu" else None
        if src is not None:
            flops, bw, how = src.flops(dtype), src.mem_bandwidth, f"measured on {src.name}"
        else:
            stored = trace.host
            if host_flops is None or host_bandwidth is None:
                if stored is not None:
                    rates, when = stored, "with the trace"
                else:
                    import qsgd

                    rates, when = qsgd.measure_host(), "now on this machine (the trace stores none)"
                host_flops = rates["matmul_flops"] if host_flops is None else host_flops
                host_bandwidth = rates["copy_bandwidth"] if host_bandwidth is None else host_bandwidth
            else:
                when = "as given"
            flops = _positive("host_flops", host_flops)
            bw = _positive("host_bandwidth", host_bandwidth)
            how = f"host measured {when} at {flops / 1e9:.1f} GFLOP/s, {bw / 1e9:.1f} GB/s"
        return cls(flops / dev.flops(dtype), bw / dev.mem_bandwidth, device=target,
                   source=f"{how}, scaled to {target} {dtype} peak ({dev.source})")


def source_device(device_name: str) -> Device | None:
    """The :data:`DEVICES` entry named in a CUDA device name, or None."""
    name = (device_name or "").upper()
    for key in ("H200", "H100", "A100", "V100", "K80"):
        if key in name:
            return DEVICES[key]
    return None
