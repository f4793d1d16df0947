"""QSGD gradient quantization and encoding in PyTorch (Alistarh et al., NeurIPS 2017).

:func:`quantize` is the paper's stochastic quantizer Q_s with per-bucket scales;
:func:`encode` and :func:`decode` put it on the wire (fixed-width packing or Elias coding) in
a self-describing payload; :func:`qsgd_hook` uses them in PyTorch DDP, issuing the collectives of each bucket's
:func:`wire_plan`; :func:`measure` times
them on a real model's gradients into a :class:`PayloadTrace`.

>>> import torch, qsgd
>>> cfg = qsgd.QSGDConfig.from_bits(4, bucket_size=512)
>>> payload = qsgd.encode(torch.ones(1000), cfg, seed=0)
>>> len(payload) == qsgd.payload_nbytes(1000, cfg), qsgd.decode(payload).shape
(True, torch.Size([1000]))
"""
from .buckets import BucketSpec, ddp_buckets
from .codec import decode, encode, payload_nbytes
from .config import QSGDConfig
from .errors import ConfigError, HookError, ModelError, PayloadError, QSGDError, TraceError
from .hook import QSGDState, qsgd_hook
from .host import measure_host
from .measurement import measure
from .traceops import add_operators
from .models import MODELS, build_model
from .operators import CHECKPOINTING, OPTIMIZERS, Operators, record_operators
from .quantizer import Quantized, dequantize, quantize
from .shardplan import (STRATEGIES, GroupCollective, ShardPlan, Strategy, Unit, UnitPlan,
                        shard_plan, units_of, zero_buckets)
from .trace import PayloadTrace
from .tracevariance import BucketVariance
from .variance import lemma31_bound, variance_ratios
from .wireplan import BucketLayout, Collective, Stage, WirePlan, wire_plan
from .wiremethods import COMPRESSORS, CompressorConfig, PowerSGDConfig

__all__ = [
    "QSGDConfig", "Quantized", "quantize", "dequantize", "encode", "decode", "payload_nbytes",
    "QSGDError", "ConfigError", "PayloadError", "TraceError", "HookError", "ModelError",
    "QSGDState", "qsgd_hook", "MODELS", "build_model", "BucketSpec", "ddp_buckets", "measure",
    "add_operators", "record_operators", "Operators", "OPTIMIZERS", "CHECKPOINTING",
    "measure_host", "PayloadTrace", "BucketLayout", "Collective", "Stage", "WirePlan", "wire_plan",
    "PowerSGDConfig", "CompressorConfig", "COMPRESSORS", "BucketVariance", "lemma31_bound",
    "variance_ratios",
    "STRATEGIES", "Strategy", "Unit", "UnitPlan", "ShardPlan", "GroupCollective", "shard_plan",
    "units_of", "zero_buckets",
]
