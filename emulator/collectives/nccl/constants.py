"""NCCL's published cost-model constants, each with the NCCL source file it comes from.

Sources (NVIDIA/nccl on GitHub, read through the project's search tool; docs/nccl.md lists
every figure with its file and the version it was read at):

- ``src/graph/tuning.cc`` of NCCL 2.23+ (the version with the PAT algorithm and Blackwell
  rows): ``baseLat`` and ``hwLat`` (latencies in us per algorithm and protocol, per link type
  NVLink / PCI / network), the protocol bandwidth factors (LL x0.5, LL128 x0.92, Tree x0.92)
  and the per-architecture LL128 and tree caps.
- ``src/graph/topo.h``: the bandwidth NCCL assumes it can drive over one NVLink per
  architecture (``SM70_NVLINK_BW`` ... ``SM100_NVLINK_BW``), 12 GB/s for a PCIe gen3 x16
  link (``PCI_BW``; gen4 and gen5 scale with the link rate in ``topo.cc``).
- ``src/tuning/nvls.cc`` (newest NCCL): ``nvlsEfficiency``, the fraction of the NVLink rate
  that NVLink SHARP reductions sustain (0.85 Hopper, 0.74 Blackwell).
- ``src/graph/tuning.cc`` ``getNetOverhead``: 1 us per network step on Intel and most CPUs
  (2 us on AMD; the presets do not say which CPU, NCCL's default applies), x3 for Simple.
- aws/aws-ofi-nccl (the network plugin NCCL loads on AWS EFA) ``include/nccl_ofi_tuner.h``:
  the per-step network latency its tuner uses for EFA in place of tuning.cc's InfiniBand
  figures, and ``src/platform-aws.c``: the plugin sets ``NCCL_PROTO=simple`` when the EFA
  endpoint cannot deliver 128-byte aligned writes in order (p4d, p4de), which LL and LL128
  need.

All latencies here are seconds, bandwidths bytes/s, factors plain ratios.
"""
from __future__ import annotations

US = 1e-6
GB = 1e9

#: Protocols, in NCCL's order (NCCL_PROTO_LL, NCCL_PROTO_LL128, NCCL_PROTO_SIMPLE).
PROTOCOLS = ("LL", "LL128", "Simple")
#: Algorithms this model builds, in NCCL's spelling (NCCL_ALGO values).
ALGOS = ("Tree", "Ring", "NVLS", "NVLSTree")

#: tuning.cc ``baseLat[algo][proto]``: fixed cost of one collective launch, s.
BASE_LATENCY = {
    "Tree": {"LL": 6.8 * US, "LL128": 14.0 * US, "Simple": 8.4 * US},
    "Ring": {"LL": 6.6 * US, "LL128": 14.0 * US, "Simple": 8.4 * US},
    "NVLS": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
    "NVLSTree": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
}

#: tuning.cc ``hwLat[hw][algo][proto]``: latency of one step (one hop) over NVLink, PCI or
#: the network, s. NVLS and NVLSTree run only with Simple.
HOP_LATENCY = {
    "nvlink": {
        "Tree": {"LL": 0.6 * US, "LL128": 1.25 * US, "Simple": 4.0 * US},
        "Ring": {"LL": 0.6 * US, "LL128": 1.9 * US, "Simple": 3.4 * US},
        "NVLS": {"Simple": 25.0 * US},
        "NVLSTree": {"Simple": 25.0 * US},
    },
    "pci": {
        "Tree": {"LL": 1.0 * US, "LL128": 1.9 * US, "Simple": 4.0 * US},
        "Ring": {"LL": 1.0 * US, "LL128": 2.5 * US, "Simple": 5.7 * US},
    },
    "net": {
        "Tree": {"LL": 5.0 * US, "LL128": 8.5 * US, "Simple": 14.0 * US},
        "Ring": {"LL": 2.7 * US, "LL128": 4.0 * US, "Simple": 14.0 * US},
        "NVLS": {"Simple": 18.0 * US},
        "NVLSTree": {"Simple": 14.0 * US},
    },
}

#: aws-ofi-nccl nccl_ofi_tuner.h, per network plugin (the NICs' ``protocol``): the latency of
#: one network step for every algorithm and protocol, s (``TUNER_NET_LATENCY`` 20 us), and what
#: Simple adds for its completions (``TUNER_NET_COMP_OVERHEAD`` 3 us: ~2 us in the device,
#: ~1 us to write the completion up to the host). Fabrics without an entry take ``hwLat``.
PLUGIN_NET_LATENCY = {"efa": (20.0 * US, 3.0 * US)}

#: tuning.cc getNetOverhead: per network step on the host CPU (Intel, and NCCL's default), s;
#: Simple pays it three times.
NET_OVERHEAD = 1.0 * US
NET_OVERHEAD_SIMPLE_FACTOR = 3

#: tuning.cc protocol bandwidth factors: LL moves 8 data bytes in a 16-byte line with its
#: flags (ring LL busBw x 0.5), LL128 120 data bytes in a 128-byte line (x 0.92 in NCCL's
#: model, which also counts its flag checks), Simple moves raw data.
PROTOCOL_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}

#: tuning.cc: Tree's bandwidth factor (busBw x 0.92) on top of the protocol's, and the tree's
#: own protocol factors: LL 1/3.8, LL128 7/9 inside one node and 120/128 across nodes.
TREE_EFFICIENCY = 0.92
TREE_PROTOCOL_EFFICIENCY = {"LL": 1 / 3.8, "LL128": (7 / 9, 120 / 128), "Simple": 1.0}

#: tuning.cc treeCorrectionFactor[proto][log2(nBytes / 64)] (NCCL 2.19+, 64 B .. 256 MiB):
#: "Trees are not perfectly sticking to the model for medium sizes", so NCCL scales a tree's
#: bandwidth by this share of what its model gives; 1 from 512 MiB on.
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}

#: tuning.cc ncclTopoGetAlgoTime, "Plateau effect of ring": a Simple ring allreduce across
#: nodes (at least 64 bytes per channel and rank) takes its latency times 1.9 on GPUs older
#: than compute capability 8.0 and 1.4 on newer ones.
RING_PLATEAU = {"volta": 1.9, "ampere": 1.4, "hopper": 1.4, "blackwell": 1.4}

#: tuning.cc llMaxBws[row][nodes]: most bus bandwidth LL reaches (bytes/s), rows by the GPU
#: architecture on one node and by the CPU vendor across nodes (Intel, NCCL's default, here);
#: columns 1 node, 2 nodes, more.
LL_MAX_BW = {
    "volta": (39.0 * GB, 39.0 * GB, 20.4 * GB), "ampere": (87.7 * GB, 22.5 * GB, 19.0 * GB),
    "hopper": (141.0 * GB, 45.0 * GB, 35.0 * GB), "blackwell": (282.0 * GB, 90.0 * GB, 70.0 * GB),
    "intel": (39.0 * GB, 39.0 * GB, 20.4 * GB),
}

#: topo.h: bandwidth NCCL drives over one NVLink, per compute capability (bytes/s), against
#: the 25 GB/s line rate of NVLink 2-4 (50 GB/s for NVLink 5): sm60 18, sm70 20, sm80 20,
#: sm86 12, sm90 20.6, sm100 40.1 GB/s.
NVLINK_BW = {60: 18.0 * GB, 70: 20.0 * GB, 80: 20.0 * GB, 86: 12.0 * GB, 90: 20.6 * GB,
             100: 40.1 * GB}
NVLINK_LINE_RATE = {60: 20.0 * GB, 70: 25.0 * GB, 80: 25.0 * GB, 86: 14.0625 * GB,
                    90: 25.0 * GB, 100: 50.0 * GB}

#: topo.h PCI_BW: 12 GB/s for a gen3 x16 link whose line rate is 15.75 GB/s; topo.cc scales it
#: with the link rate (gen4 24, gen5 48 GB/s), the same 0.76 of line rate.
PCI_EFFICIENCY = 12.0 / 15.75

#: nvls.cc nvlsEfficiency per architecture: NVLS is unavailable before Hopper.
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}

#: device.h: NCCL_STEPS = 8 slots per connection buffer; the default buffer of Simple is
#: 4 MiB (NCCL_BUFFSIZE), so one pipelined step moves 512 KiB. LL's buffer carries 8 data
#: bytes per 16-byte line over 8 x 512 x 8 lines (32 KiB of data per step); LL128's step
#: holds 120 of every 128 bytes of 8 x 640 x 120 x 8 bytes / 8.
CHUNK_BYTES = {"LL": 32 * 1024, "LL128": 576 * 1024, "Simple": 512 * 1024}

#: src/include/comm.h "Channels / LL tuning": bytes each thread should have before NCCL adds
#: another channel (NCCL_LL_THREAD_THRESHOLD, NCCL_LL128_THREAD_THRESHOLD,
#: NCCL_SIMPLE_THREAD_THRESHOLD); tuning.cc multiplies the ring LL one by the number of ranks.
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}

#: src/include/device.h: threads per channel NCCL starts from (NCCL_LL_MAX_NTHREADS,
#: NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS; tuning.cc gives a ring 256 Simple threads
#: instead when its channels together carry no more than PCI_BW, which matters only below
#: 16 KiB per channel and is not modelled).
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}

#: src/include/device.h MAXCHANNELS (32 up to NCCL 2.18; newer versions allow 64 only on
#: systems with more SMs than the presets have).
MAX_CHANNELS = 32


def tree_correction(proto: str, nbytes: int) -> float:
    """Share of the model's tree bandwidth NCCL's trees reach for a message of ``nbytes``
    bytes (:data:`TREE_CORRECTION`, indexed as tuning.cc's ``log2i(nBytes >> 6)``).

    Examples
    --------
    >>> tree_correction("Simple", 1 << 20), tree_correction("Simple", 1 << 30)
    (0.5, 1.0)
    """
    row = TREE_CORRECTION[proto]
    i = max(int(nbytes) >> 6, 1).bit_length() - 1
    return row[i] if i < len(row) else 1.0


def arch_of(sm: int | None) -> str:
    """NCCL's architecture row of compute capability ``sm`` x 10 (tuning.cc compCapIndex)."""
    if sm is None:
        return "ampere"
    if sm >= 100:
        return "blackwell"
    if sm >= 90:
        return "hopper"
    if sm >= 80:
        return "ampere"
    return "volta"


def nvlink_efficiency(sm: int | None) -> float:
    """Fraction of an NVLink's line rate NCCL drives on ``sm`` (topo.h figures)."""
    key = 80 if sm is None else max((k for k in NVLINK_BW if k <= sm), default=60)
    return NVLINK_BW[key] / NVLINK_LINE_RATE[key]
