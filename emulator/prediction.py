"""What :func:`emulator.replay` predicts: one iteration's time and each bucket's timeline."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from emulator.errors import ConfigError

__all__ = ["BucketTimeline", "Prediction"]


@dataclass(frozen=True)
class BucketTimeline:
    """One bucket in the predicted iteration (seconds from the start of the iteration).

    ``ready_s`` is when DDP hands the bucket to the hook (backward's clock, delayed by the
    earlier buckets' hook stages); the hook starts at once (``start_s``) and its stages end at
    ``encode_end_s``; the first collective gets the stream at ``comm_start_s`` and the last ends
    at ``comm_end_s``; the last stage ends at ``end_s``. ``comm_s`` is the network time of the
    bucket's collectives (a collective issued on entry runs under the encode, so
    ``comm_end_s - encode_end_s`` can be less than it). ``collectives`` lists each collective as
    ``(name, start_s, end_s)``; ``issued_s`` is when the first was issued (what it waits for
    done), before any wait for the stream; ``wire_bytes`` is what one rank hands the process
    group.
    """

    index: int
    ready_s: float
    start_s: float
    encode_end_s: float
    comm_end_s: float
    end_s: float
    wire_bytes: int
    comm_s: float
    source: str
    comm_start_s: float = 0.0
    collectives: tuple = ()
    issued_s: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one training iteration (seconds) and its breakdown.

    ``exposed_comm_s`` is the part of the iteration not covered by compute:
    ``iteration_s - compute_s`` (it includes the hook's stages that delay backward, any
    communication or decoding that outlasts it, and on a GPU the compute slowed while
    collectives' kernels hold some of its SMs). ``encode_decode_s`` is the total codec time
    of all buckets (hidden or not). ``bytes_per_gpu`` is the mean bytes each GPU sends per
    iteration. ``bits`` is the widest bucket's width; ``bucket_bits`` each bucket's (all equal
    unless per-bucket widths were replayed).
    """

    iteration_s: float
    compute_s: float
    exposed_comm_s: float
    encode_decode_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    bytes_per_gpu: float
    transport: str
    bits: int
    world_size: int
    algorithm: str
    topology: str
    source: str
    buckets: tuple[BucketTimeline, ...] = field(repr=False)
    bucket_bits: tuple[int, ...] = ()

    @property
    def comm_s(self) -> float:
        """Sum of the buckets' collective seconds (exposed or overlapped)."""
        return sum(b.comm_s for b in self.buckets)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["buckets"] = [asdict(b) for b in self.buckets]
        for b in d["buckets"]:
            b["collectives"] = [list(c) for c in b["collectives"]]
        d["comm_s"] = self.comm_s
        d["bucket_bits"] = list(self.bucket_bits)   # JSON's form, so a round trip compares equal
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Prediction":
        """The prediction of :meth:`to_dict`'s output (errors name the missing field)."""
        try:
            buckets = tuple(BucketTimeline(**dict(b, collectives=tuple(
                tuple(c) for c in b.get("collectives", ())))) for b in d["buckets"])
            kw = {f: d[f] for f in cls.__dataclass_fields__ if f != "buckets" and f != "bucket_bits"}
            kw["bucket_bits"] = tuple(d.get("bucket_bits", ()))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"Prediction: {exc} is missing or not a field") from None
        return cls(buckets=buckets, **kw)
