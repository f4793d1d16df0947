"""NCCL's per-channel pipeline: buffers, channel counts, chunks, slices and steps in flight.

A channel moves a collective through fixed-size buffer slots (NCCL 2.30 sources; docs/nccl.md
cites each figure):

- every connection has ``NCCL_STEPS`` = 8 slots (src/include/device.h); a protocol's buffer
  (src/init.cc ``computeBuffSizes``: ``NCCL_BUFFSIZE`` 4 MiB for Simple, the LL and LL128
  line layouts for the others) is cut into 8 steps;
- ``calcCollChunking`` (src/enqueue.cc) gives a chunk per algorithm and protocol: a Simple
  ring's chunk is ``CHUNKSTEPS`` = 4 steps moved as ``SLICESTEPS`` = 2-step slices
  (src/include/collectives.h); LL carries 8 data bytes per 16-byte line, LL128 120 of every
  128; trees, NVLS and NVLS-tree cut their chunks smaller for small and medium messages;
- the device code (src/device/all_reduce.h ``runRing``) moves a channel's share in loops of
  ``nranks`` chunks; the last loop's chunks are the remainder over ``nranks``, 16-byte
  aligned; a Simple slice is at least 1/32 of its two steps (src/device/prims_simple.h), so a
  small chunk travels as one slice and an empty one;
- a connection holds ``NCCL_STEPS / SLICESTEPS`` slices in flight; each step costs its
  transport's handshake (the receiver sees the sender's tail, the sender the receiver's head).

:func:`communicator_channels` reproduces how many channels NCCL's communicator has (the graph
search's speed arrays, src/graph/search.cc, and the duplications of connect.cc), since the
emulator's fluid model merges channels that repeat the same links: the merged flow carries
``copies`` NCCL channels, whose chunk sizes this module computes. Everything here is pure
arithmetic on sizes; the builders and closed forms turn it into waits (:func:`step_wait`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import ConfigError
from . import constants as C

#: src/include/device.h: buffer slots per connection.
NCCL_STEPS = 8
#: src/init.cc DEFAULT_LL_BUFFSIZE (8 lines x 512 threads x 8 steps x 16 B),
#: DEFAULT_LL128_BUFFSIZE (120 x 640 threads x 8 steps x 8 B), DEFAULT_BUFFSIZE (4 MiB).
DEFAULT_BUFFSIZE = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8,
                    "Simple": 1 << 22}
#: src/include/device.h ncclProtoGrainSize: chunks are whole grains (bytes).
GRAIN = {"LL": 16, "LL128": 32 * 8 // 16 * 15 * 8, "Simple": 512}
#: src/include/device.h: LL128 lines hold 15 data words of 16; LL lines 8 data bytes of 16.
LL128_DATA_SHARE = (15, 16)
LL_DATA_SHARE = (1, 2)
#: src/include/collectives.h: a Simple ring's chunk and slice, in steps, per collective.
CHUNK_STEPS = {"allreduce": 4, "allgather": 4, "reduce_scatter": 4, "broadcast": 1}
SLICE_STEPS = {"allreduce": 2, "allgather": 2, "reduce_scatter": 2, "broadcast": 1}
#: src/init.cc: send/recv chunk by path (NCCL_P2P_NET/PCI/NVL_CHUNKSIZE) and
#: src/enqueue.cc NCCL_P2P_LL_THRESHOLD (LL for at most 16 KiB per channel).
P2P_CHUNK = {"net": 1 << 17, "pci": 1 << 17, "nvlink": 1 << 19}
P2P_LL_THRESHOLD = 16384
#: src/transport/nvls.cc: NCCL_NVLS_CHUNKSIZE and NVLS channels per architecture.
NVLS_CHUNK = 128 * 1024
NVLS_CHANNELS = {"hopper": (16, 16), "blackwell": (24, 32)}         # (one node, several)
#: src/graph/search.cc: ring search speeds (GB/s per channel), inside nodes and between.
SPEEDS_INTRA = {
    "volta": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEEDS_INTER = {
    "volta": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
              3.0, 2.4, 1.2, 0.24, 0.12),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
               1.2, 0.24, 0.12),
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0,
                  12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}
#: src/init.cc: the ring graph searches for at most MAXCHANNELS / 2 channels.
SEARCH_MAX_CHANNELS = C.MAX_CHANNELS // 2


def _speeds(table: dict, arch: str) -> tuple:
    return table["volta" if arch in ("volta", "ampere") else arch]


@dataclass(frozen=True)
class Buffers:
    """NCCL's per-protocol connection buffers (bytes): ``NCCL_LL_BUFFSIZE``,
    ``NCCL_LL128_BUFFSIZE``, ``NCCL_BUFFSIZE`` (src/init.cc ``computeBuffSizes``).

    Each must hold ``NCCL_STEPS`` steps of at least one grain of payload: a smaller step
    leaves calcCollChunking a chunk of zero grains.

    Raises
    ------
    ConfigError
        Naming the buffer, its value and the smallest allowed.

    Examples
    --------
    >>> Buffers().simple // NCCL_STEPS
    524288
    >>> Buffers(simple=1024)
    Traceback (most recent call last):
    ...
    emulator.errors.ConfigError: NCCL_BUFFSIZE=1024 is below Simple's minimum of 4096 bytes (8 steps of one 512-byte grain)
    """

    ll: int = DEFAULT_BUFFSIZE["LL"]
    ll128: int = DEFAULT_BUFFSIZE["LL128"]
    simple: int = DEFAULT_BUFFSIZE["Simple"]

    def __post_init__(self):
        for proto, env, value in (("LL", "NCCL_LL_BUFFSIZE", self.ll),
                                  ("LL128", "NCCL_LL128_BUFFSIZE", self.ll128),
                                  ("Simple", "NCCL_BUFFSIZE", self.simple)):
            low = min_buffsize(proto)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(
                    f"{env}={value!r} is below {proto}'s minimum of {low} bytes "
                    f"({NCCL_STEPS} steps of one {GRAIN[proto]}-byte grain)"
                    if isinstance(value, int) and not isinstance(value, bool) else
                    f"{env}={value!r} must be an integer number of bytes >= {low}")

    def of(self, proto: str) -> int:
        """The buffer of ``proto`` (bytes)."""
        return {"LL": self.ll, "LL128": self.ll128, "Simple": self.simple}[proto]

    def step(self, proto: str) -> int:
        """Bytes of one of the buffer's ``NCCL_STEPS`` slots."""
        return self.of(proto) // NCCL_STEPS


def min_buffsize(proto: str) -> int:
    """Smallest buffer (bytes) whose steps hold one grain of ``proto``'s payload: Simple 4096,
    LL 256 (a 16-byte grain in 16-byte lines of 8 data bytes), LL128 16384."""
    num, den = {"LL": LL_DATA_SHARE, "LL128": LL128_DATA_SHARE}.get(proto, (1, 1))
    return NCCL_STEPS * math.ceil(GRAIN[proto] * den / num)


def _data(proto: str, step_bytes: int) -> int:
    """Payload bytes in ``step_bytes`` of ``proto``'s buffer (calcCollChunking)."""
    if proto == "LL":
        return step_bytes // 2
    if proto == "LL128":
        return step_bytes // 16 * 15
    return step_bytes


def _align(n: int, grain: int) -> int:
    return n // grain * grain


@dataclass(frozen=True)
class Chunking:
    """One channel's pipeline for a collective (bytes are payload bytes).

    Attributes
    ----------
    algo, proto : str
    chunk_bytes : int
        A full chunk (calcCollChunking's ``chunkSize``, grain aligned).
    slice_bytes : int
        Buffer bytes of a slice (``stepSize * SLICESTEPS``): a Simple slice carries at least
        1/32 of it (prims_simple.h).
    chunk_steps, slice_steps : int
        Steps per chunk and per slice (a Simple ring 4 and 2; every other case 1 and 1).
    loops : int
        Loops of the channel's share (``ceil(share / (chunks per loop x chunk))``).
    last_chunk : int
        Bytes a step of the last loop moves (the device's remainder rule; ``chunk_bytes`` when
        the share fills its loops).
    """

    algo: str
    proto: str
    chunk_bytes: int
    slice_bytes: int
    chunk_steps: int
    slice_steps: int
    loops: int
    last_chunk: int

    @property
    def window(self) -> int:
        """Slices a connection holds in flight (``NCCL_STEPS / SLICESTEPS``)."""
        return NCCL_STEPS // self.slice_steps

    @property
    def slices_per_chunk(self) -> int:
        return self.chunk_steps // self.slice_steps

    def first_slice(self, chunk: int) -> int:
        """Bytes that must arrive before a receiver forwards any of a ``chunk``-byte step:
        a Simple slice, ``max(chunk / slices rounded to 16 B, slice_bytes / 32)``, posted whole
        after its fence (prims_simple.h); LL and LL128 forward line by line, a grain."""
        if self.proto != "Simple":
            return min(chunk, GRAIN[self.proto])
        k = self.slices_per_chunk
        size = max(math.ceil(chunk / (16 * k)) * 16, self.slice_bytes // 32)
        return min(chunk, size)

    def steps(self):
        """``(chunk bytes, count)`` of the loops: full loops, then the last one."""
        full = self.loops - 1 if self.last_chunk != self.chunk_bytes else self.loops
        out = [(self.chunk_bytes, full)] if full else []
        if self.loops > full:
            out.append((self.last_chunk, 1))
        return out


def ring_chunking(op: str, proto: str, share: int, nranks: int,
                  buffers: Buffers | None = None) -> Chunking:
    """A ring channel moving ``share`` bytes (its part of nccl-tests' size) over ``nranks``.

    Examples
    --------
    >>> c = ring_chunking("allreduce", "Simple", 64 << 20, 8)     # 8 x 2 MiB per loop
    >>> c.chunk_bytes, c.loops, c.last_chunk, c.window
    (2097152, 4, 2097152, 4)
    >>> ring_chunking("allreduce", "Simple", 1 << 20, 8).last_chunk  # one loop of 128 KiB steps
    131072
    """
    buffers = buffers or Buffers()
    step = buffers.step(proto)
    simple = proto == "Simple"
    chunk_steps = CHUNK_STEPS.get(op, 1) if simple else 1
    slice_steps = SLICE_STEPS.get(op, 1) if simple else 1
    chunk = _align(_data(proto, step * chunk_steps), GRAIN[proto])
    loop = nranks * chunk
    share = max(int(share), 1)
    loops = math.ceil(share / loop)
    rem = share - (loops - 1) * loop
    last = min(chunk, math.ceil(math.ceil(rem / nranks) / 16) * 16)
    return Chunking("Ring", proto, chunk, step * slice_steps, chunk_steps, slice_steps, loops,
                    last)


def tree_chunking(proto: str, share: int, nranks: int, nnodes: int,
                  buffers: Buffers | None = None) -> Chunking:
    """A tree channel moving ``share`` bytes: one step per chunk; LL128's chunk halves while
    the channel has fewer than ``nsteps x 64 / ppn`` (then ``x 16``) chunks, nsteps =
    1 + log2(nodes) + ppn / 10 (calcCollChunking).

    Examples
    --------
    >>> tree_chunking("LL128", 1 << 20, 16, 2).chunk_bytes      # 576000 / 8, in grains
    71040
    """
    buffers = buffers or Buffers()
    chunk = _data(proto, buffers.step(proto))
    if proto == "LL128":
        ppn = nranks / nnodes
        nsteps = 1 + (max(nnodes, 1).bit_length() - 1) + 0.1 * ppn
        while share // chunk < nsteps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while share // chunk < nsteps * 16 / ppn and chunk > 32768:
            chunk //= 2
    chunk = _align(chunk, GRAIN[proto])
    loops = math.ceil(max(share, 1) / chunk)
    last = max(share, 1) - (loops - 1) * chunk
    return Chunking("Tree", proto, chunk, buffers.step(proto), 1, 1, loops, last)


def nvls_chunking(algo: str, share: int, heads: int, chunk_max: int = NVLS_CHUNK,
                  tree_max: int | None = None) -> Chunking:
    """An NVLS (or NVLS-tree) channel moving ``share`` bytes with ``heads`` heads: the chunk
    drops from 128 KiB to 64, 32 and 16 KiB as the share falls below 64, 8 and 2 loops of
    ``heads`` chunks (NVLSTree: 256 to 32 KiB below 32, 16, 4 and 1), calcCollChunking.

    Examples
    --------
    >>> nvls_chunking("NVLS", 256 << 10, 8).chunk_bytes
    16384
    >>> nvls_chunking("NVLS", 1 << 30, 8).chunk_bytes
    131072
    """
    ops = max(heads, 1)
    if algo == "NVLS":
        chunk = chunk_max
        for times, size in ((64, 65536), (8, 32768), (2, 16384)):
            if share < times * ops * chunk and chunk > size:
                chunk = size
    else:
        chunk = min(chunk_max, tree_max or chunk_max)
        for times, size in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
            if share < times * ops * chunk and chunk > size:
                chunk = size
    chunk = _align(chunk, GRAIN["Simple"])
    loops = math.ceil(max(share, 1) / (ops * chunk))
    return Chunking(algo, "Simple", chunk, chunk, 1, 1, loops,
                    min(chunk, math.ceil((max(share, 1) - (loops - 1) * ops * chunk) / ops)))


def p2p_chunking(nbytes: int, path: str, *, network: bool, channels: int = 1,
                 buffers: Buffers | None = None, ll: bool = True) -> Chunking:
    """A send of ``nbytes`` to one peer on ``channels`` channels over ``path`` ("nvlink",
    "pci" or "net"; the communicator's: all-NVLink nodes, else PCI, and net on several
    nodes): LL up to 16 KiB per channel, else Simple in ``p2pChunkSize`` steps, quartered
    (below one step) or halved (below 8) over the network (src/enqueue.cc).

    Examples
    --------
    >>> p2p_chunking(512 << 10, "net", network=True).chunk_bytes    # < 8 x 128 KiB: halved
    65536
    >>> p2p_chunking(1 << 24, "nvlink", network=False).chunk_bytes
    524288
    """
    buffers = buffers or Buffers()
    step = min(P2P_CHUNK[path], buffers.simple // NCCL_STEPS)
    proto = "LL" if ll and nbytes <= channels * P2P_LL_THRESHOLD else "Simple"
    if proto == "LL":
        chunk = _data("LL", buffers.step("LL"))
    else:
        chunk = step
        per = math.ceil(nbytes / max(channels, 1))
        if network:
            if per < step:
                chunk //= 4
            elif per < 8 * step:
                chunk //= 2
    per = max(math.ceil(nbytes / max(channels, 1)), 1)
    loops = math.ceil(per / chunk)
    return Chunking("P2P", proto, chunk, chunk, 1, 1, loops, per - (loops - 1) * chunk)


# -- time -----------------------------------------------------------------------------------
def step_wait(chunking: Chunking, latency: float, scale: float = 1.0) -> float:
    """Seconds a channel's handshakes add on one hop over the whole collective: every loop's
    step pays the hop's per-step ``latency`` (times ``scale``: NCCL's ring plateau), as NCCL's
    own cost model adds ``hwLat`` per step (tuning.cc). A ring's step waits for the previous
    step's data anyway, and ``NCCL_STEPS`` slots hold two chunks, so the connection's slots
    never bind a ring.

    The device code would let a Simple step forward its first slice while the second is on
    the wire, and LL / LL128 forward line by line, hiding the handshake behind the chunk's
    other bytes; the published tables do not show that overlap (benchmarks/RESULTS.md,
    "NCCL's pipeline"), so the model keeps the handshake whole.

    Examples
    --------
    >>> round(step_wait(ring_chunking("allreduce", "Simple", 1 << 20, 8), 3.4e-6) * 1e6, 2)
    3.4
    >>> c = ring_chunking("allreduce", "Simple", 64 << 20, 8)       # 4 loops of 2 MiB steps
    >>> round(step_wait(c, 3.4e-6, scale=1.4) * 1e6, 2)
    19.04
    """
    return chunking.loops * scale * latency


def window_wait(chunking: Chunking, latency: float, rate: float) -> float:
    """Seconds a stream of chunks to one peer (a tree edge, a send) waits for slots, beyond
    its bytes at ``rate``: a slot comes back a handshake each way after its chunk left, so a
    connection moves at most ``window`` chunks per ``2 latency + chunk / rate``. The first
    chunk's own latency is the caller's.

    Examples
    --------
    >>> c = p2p_chunking(8 << 20, "net", network=True)            # 64 chunks of 128 KiB
    >>> round(window_wait(c, 1e-6, 50e9) * 1e6, 1)                # slots come back in time
    0.0
    >>> round(window_wait(c, 20e-6, 50e9) * 1e6, 1)               # 8 per 42.6 us: 25 GB/s
    170.5
    """
    total = 0.0
    first = True
    for chunk, count in chunking.steps():
        n = count - 1 if first else count
        first = False
        if n <= 0:
            continue
        t = chunk / rate
        total += n * max(0.0, (2 * latency + t) / chunking.window - t)
    return total


# -- channels -------------------------------------------------------------------------------
def communicator_channels(arch: str, *, nodes: int, nvswitch: bool, gpu_bw: float,
                          nic_bws=(), distinct: int = 1, nvlink: bool = True,
                          unpack: bool = False) -> int:
    """How many channels NCCL's communicator has (src/graph/search.cc ``ncclTopoCompute``,
    ``ncclTopoDupChannels``; src/graph/connect.cc ``ncclTopoPostset``).

    The ring search takes the fastest speed of the architecture's array a channel can run at
    (at most the per-GPU bandwidth NCCL counts inside a node, a NIC's between nodes) and finds
    as many channels as the links carry at it, at most 16: one per NIC between nodes, total
    bandwidth over speed on an NVSwitch, ``distinct`` rings on a mesh or PCIe. The channels
    are then doubled when the speed is at least 25 GB/s (not past 4 channels below 50 GB/s on
    Hopper and newer), doubled again for the collectives (at most 32), doubled on Hopper and
    newer across nodes while under 16 at more than 45 GB/s, and doubled for an unpacking
    network device (GPUDirect-TCPX/O) across nodes while under 16.

    Parameters
    ----------
    arch : str
        NCCL's architecture row (:func:`.constants.arch_of`).
    nodes : int
    nvswitch : bool
        The node's GPUs share an NVSwitch.
    gpu_bw : float
        Bytes/s NCCL counts per GPU inside a node (NVLinks at topo.h rates, or PCIe).
    nic_bws : sequence of float
        Bytes/s of each NIC of a node (several nodes).
    distinct : int
        Distinct rings of a mesh or PCIe node.
    nvlink : bool
        The node is NVLink-connected (else PCIe).
    unpack : bool
        The network plugin is an unpacking device (TCPX, TCPXO).

    Examples
    --------
    >>> communicator_channels("hopper", nodes=1, nvswitch=True, gpu_bw=18 * 20.6e9)
    24
    >>> communicator_channels("blackwell", nodes=2, nvswitch=True, gpu_bw=18 * 40.1e9,
    ...                       nic_bws=[50e9] * 8)
    16
    """
    if nodes > 1 and len(nic_bws):
        bw = min(min(nic_bws), gpu_bw) / 1e9
        speed = next((s for s in _speeds(SPEEDS_INTER, arch) if s <= bw),
                     _speeds(SPEEDS_INTER, arch)[-1])
        per_nic = max(1, int(min(nic_bws) / 1e9 // speed))
        n = min(SEARCH_MAX_CHANNELS, per_nic * len(nic_bws))
    else:
        bw = gpu_bw / 1e9
        speed = next((s for s in _speeds(SPEEDS_INTRA, arch) if s <= bw),
                     _speeds(SPEEDS_INTRA, arch)[-1])
        if nvswitch:
            n = min(SEARCH_MAX_CHANNELS, max(1, int(bw // speed)))
        else:
            n = max(1, min(SEARCH_MAX_CHANNELS, distinct))
    newer = arch in ("hopper", "blackwell")
    if speed >= 25.0 and not (newer and speed < 50.0 and n > 4):
        n, speed = min(2 * n, SEARCH_MAX_CHANNELS), speed / 2
    n = min(C.MAX_CHANNELS, 2 * n)
    if newer and nodes > 1 and speed > 45.0 and n < 16:
        n *= 2
    if unpack and nodes > 1 and n < 16:
        n *= 2
    return n


def nvls_channels(arch: str, nodes: int, nic_bw: float = 0.0) -> int:
    """NVLS channels (src/transport/nvls.cc ``ncclNvlsTuning``): 16 on Hopper; on Blackwell 24
    in one node, across nodes 32 (``ncclNvlsTreeSm100Tuning``: 24 past two nodes on NICs of
    48 GB/s or more)."""
    if arch != "blackwell":
        return NVLS_CHANNELS["hopper"][0]
    if nodes == 1:
        return NVLS_CHANNELS["blackwell"][0]
    if nodes > 2 and nic_bw >= 48e9:
        return 24
    return NVLS_CHANNELS["blackwell"][1]
