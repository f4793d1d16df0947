"""The operator records a trace carries: what each forward, backward and optimizer kernel does.

A record is torch's operator (``aten.convolution.default``, or ``attention`` for a fused
scaled-dot-product attention) with the numbers a timing model needs, each *affine in the
per-GPU batch*: a pair ``[c, s]`` meaning ``c + s * batch``. Recording a model at two batch
sizes on the meta device gives both (:mod:`qsgd.operators.record`); every count of a dense
model's step is affine in the batch (a batch dimension multiplies activations and their
products, never the weights), and the recorder checks that the two recordings have the same
operators in the same order.

Fields of one record (JSON keys in brackets):

- ``op`` [``op``]: the operator's name; ``kind`` [``kind``]: its class (:data:`KINDS`), which
  picks the timing rule;
- ``phase`` [``phase``]: ``forward``, ``backward`` or ``optimizer``;
- ``dtype`` [``dtype``]: the dtype its arithmetic runs in (``float32``, ``float16``,
  ``bfloat16``);
- ``flops`` [``flops``]: FLOPs (a multiply-add counts 2; torch's ``flop_counter`` formulas),
  0 for the memory-bound kinds;
- ``bytes`` [``bytes``]: bytes read plus bytes written (each distinct tensor element once);
- ``gemms`` [``gemms``]: the matrix products inside (GEMM, convolution as implicit GEMM):
  ``[groups, M, N, K]`` each an affine pair; attention: ``[batch x heads, S_q, S_k, D]``;
- ``tensors`` [``tensors``]: tensors a multi-tensor (``_foreach_``) kernel walks, else 1;
- ``causal`` [``causal``]: attention with a causal mask (half the products are skipped);
- ``reread`` [``reread``]: bytes a second pass reads again (batch normalisation's statistics);
- ``nchw`` [``nchw``]: bytes of a convolution's activations laid out NCHW, which cuDNN
  transposes to NHWC and back around a tensor-core kernel (0 when they are channels-last);
- a convolution's geometry, from the arguments of its aten call (``aten.convolution``,
  ``aten.convolution_backward``; absent in older records and for transposed convolutions, and
  then the compute model times the convolution as implicit GEMM only): ``kernel``
  [``kernel``] the filter's spatial size, ``stride`` [``stride``], ``dilation``
  [``dilation``], ``groups`` [``groups``], and ``spatial`` [``spatial``] the input's and the
  output's spatial sizes ``[[H_in, W_in], [H_out, W_out]]`` (batch-independent), which is
  what cuDNN's algorithm choice depends on (``emulator.compute.convolution``).

Units: FLOPs, bytes. Owned here: the format (``docs/formats.md``, "operators"); the
emulator's compute model reads it (``emulator.compute``), torch is not imported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from qsgd.errors import TraceError
from qsgd._checks import is_int

#: Operator classes, each timed by one rule of the compute model.
KINDS = ("gemm", "conv", "attention", "elementwise", "reduction", "norm", "softmax", "pool",
         "embedding", "copy", "fill", "loss", "optimizer", "scaler", "other")
#: Phases of a training step, in order.
PHASES = ("forward", "backward", "optimizer")
#: Dtypes arithmetic runs in, and their bytes per element.
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: Operator families a model is recorded in: plain fp32 (also TF32, which changes only the
#: math units), automatic mixed precision (torch.autocast's casts; recorded with float16,
#: bfloat16 runs the same operators), pure bf16 parameters, and a float16 model stepped
#: through float32 master weights (``half``: apex amp O2, DeepSpeed's fp16).
FAMILIES = ("fp32", "amp", "bf16", "half")
#: The families a model is recorded in unless others are asked for: those of the precisions
#: people train with by default (fp32/TF32, autocast, bf16); ``half`` is recorded when the
#: ``fp16`` precision asks for it (``qsgd.add_operators(trace, families=("half",))``).
DEFAULT_FAMILIES = ("fp32", "amp", "bf16")
#: Optimizers whose step reads a device value on the host before it updates, so the device
#: drains first (``qsgd.operators.optimizers``: DeepLearningExamples' BertAdam reads its
#: global gradient norm with ``.item()``).
HOST_SYNC_OPTIMIZERS = frozenset({"bertadam"})


def _affine(v, path: str) -> tuple[int, int]:
    if (not isinstance(v, (list, tuple)) or len(v) != 2 or not all(is_int(x) for x in v)
            or v[1] < 0 or v[0] + v[1] < 0):
        raise TraceError(f"{path} must be a pair [c, s] of ints (value c + s * batch, s >= 0, "
                         f"c + s >= 0), got {v!r}")
    return int(v[0]), int(v[1])


def at(pair: tuple[int, int], batch: int) -> int:
    """The value of an affine pair ``(c, s)`` at ``batch`` samples: ``c + s * batch``.

    >>> at((6, 3), 4)
    18
    """
    return pair[0] + pair[1] * batch


@dataclass(frozen=True)
class Operator:
    """One kernel of a training step (see the module docstring for the fields)."""

    op: str
    kind: str
    phase: str
    dtype: str
    flops: tuple[int, int]
    bytes: tuple[int, int]
    gemms: tuple[tuple[tuple[int, int], ...], ...] = ()
    tensors: int = 1
    causal: bool = False
    reread: tuple[int, int] = (0, 0)
    nchw: tuple[int, int] = (0, 0)
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1
    spatial: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise TraceError(f"operator kind must be one of {list(KINDS)}, got {self.kind!r}")
        if self.phase not in PHASES:
            raise TraceError(f"operator phase must be one of {list(PHASES)}, got {self.phase!r}")
        if self.dtype not in DTYPES:
            raise TraceError(f"operator dtype must be one of {list(DTYPES)}, got {self.dtype!r}")

    def flops_at(self, batch: int) -> int:
        """FLOPs at ``batch`` samples per GPU."""
        return at(self.flops, batch)

    def bytes_at(self, batch: int) -> int:
        """Bytes read and written at ``batch`` samples per GPU."""
        return at(self.bytes, batch)

    def gemms_at(self, batch: int) -> list[tuple[int, ...]]:
        """The matrix products ``(groups, M, N, K)`` (attention: ``(BH, S_q, S_k, D)``) at ``batch``."""
        return [tuple(at(d, batch) for d in g) for g in self.gemms]

    @property
    def has_geometry(self) -> bool:
        """Whether the record carries a convolution's geometry (``kernel`` and the rest)."""
        return bool(self.kernel)

    def to_dict(self) -> dict:
        d = {"op": self.op, "kind": self.kind, "phase": self.phase, "dtype": self.dtype,
             "flops": list(self.flops), "bytes": list(self.bytes)}
        if self.gemms:
            d["gemms"] = [[list(x) for x in g] for g in self.gemms]
        if self.tensors != 1:
            d["tensors"] = self.tensors
        if self.causal:
            d["causal"] = True
        for key in ("reread", "nchw"):
            if any(getattr(self, key)):
                d[key] = list(getattr(self, key))
        if self.kernel:
            d.update(kernel=list(self.kernel), stride=list(self.stride),
                     dilation=list(self.dilation), groups=self.groups,
                     spatial=[list(x) for x in self.spatial])
        return d

    @classmethod
    def from_dict(cls, d, path: str) -> "Operator":
        if not isinstance(d, Mapping):
            raise TraceError(f"{path} must be an object, got {d!r}")
        for key in ("op", "kind", "phase", "dtype", "flops", "bytes"):
            if key not in d:
                raise TraceError(f"{path}.{key} is missing")
        if not isinstance(d["op"], str) or not d["op"]:
            raise TraceError(f"{path}.op must be a non-empty string, got {d['op']!r}")
        gemms = d.get("gemms", [])
        if not isinstance(gemms, list):
            raise TraceError(f"{path}.gemms must be a list, got {gemms!r}")
        parsed = []
        for j, g in enumerate(gemms):
            if not isinstance(g, list) or len(g) != 4:
                raise TraceError(f"{path}.gemms[{j}] must be 4 affine pairs, got {g!r}")
            parsed.append(tuple(_affine(x, f"{path}.gemms[{j}][{i}]") for i, x in enumerate(g)))
        tensors = d.get("tensors", 1)
        if not is_int(tensors) or tensors < 1:
            raise TraceError(f"{path}.tensors must be an int >= 1, got {tensors!r}")
        causal = d.get("causal", False)
        if not isinstance(causal, bool):
            raise TraceError(f"{path}.causal must be true or false, got {causal!r}")
        try:
            return cls(d["op"], d["kind"], d["phase"], d["dtype"], _affine(d["flops"], f"{path}.flops"),
                       _affine(d["bytes"], f"{path}.bytes"), tuple(parsed), tensors, causal,
                       _affine(d.get("reread", [0, 0]), f"{path}.reread"),
                       _affine(d.get("nchw", [0, 0]), f"{path}.nchw"), **_geometry(d, path))
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None


def _ints(v, path: str, low: int) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or not all(is_int(x) and x >= low for x in v):
        raise TraceError(f"{path} must be a non-empty list of ints >= {low}, got {v!r}")
    return tuple(int(x) for x in v)


def _geometry(d, path: str) -> dict:
    """A convolution's optional geometry fields (none: an older record, timed as before)."""
    if "kernel" not in d:
        return {}
    for key in ("stride", "dilation", "groups", "spatial"):
        if key not in d:
            raise TraceError(f"{path}.{key} is missing (a record with a kernel has all of kernel, "
                             f"stride, dilation, groups and spatial)")
    kernel = _ints(d["kernel"], f"{path}.kernel", 1)
    out = {"kernel": kernel, "stride": _ints(d["stride"], f"{path}.stride", 1),
           "dilation": _ints(d["dilation"], f"{path}.dilation", 1)}
    if not is_int(d["groups"]) or d["groups"] < 1:
        raise TraceError(f"{path}.groups must be an int >= 1, got {d['groups']!r}")
    sp = d["spatial"]
    if not isinstance(sp, list) or len(sp) != 2:
        raise TraceError(f"{path}.spatial must be [input sizes, output sizes], got {sp!r}")
    out["spatial"] = tuple(_ints(x, f"{path}.spatial[{i}]", 0) for i, x in enumerate(sp))
    for key in ("stride", "dilation"):
        if len(out[key]) != len(kernel):
            raise TraceError(f"{path}.{key} must have one entry per kernel dimension "
                             f"({len(kernel)}), got {d[key]!r}")
    out["groups"] = int(d["groups"])
    return out


@dataclass(frozen=True)
class OperatorSet:
    """One family's step: its operators in issue order and when each gradient is ready.

    Parameters
    ----------
    family : str
        One of :data:`FAMILIES`.
    ops : tuple of Operator
        Forward, backward, then optimizer operators, in the order the step issues them.
    ready : dict
        Parameter name -> number of operators issued (from the start of the step) when its
        gradient is ready (torch's post-accumulate-grad hook fired).
    optimizer : str
        The optimizer recorded (``"sgd"``: momentum SGD; ``"adamw"``; ``"bertadam"``).
    first_use : dict
        Parameter name -> ``(forward, backward)``: how many operators were issued before the
        first one that reads it in each phase (None where none does). What a sharded step
        (FSDP) gathers the parameter before.
    saved : tuple of int
        Bytes autograd keeps from forward for backward (the activations), an affine pair in
        the batch: every distinct tensor saved once, parameters, their views and autocast's
        copies of them left out, a fused attention's log-sum-exp in. What the step's
        activations hold at the end of forward (``emulator.memory``); ``(0, 0)`` in
        records older than it.
    transient : tuple of int
        Bytes backward's own tensors rise to above the end of forward at their highest (the
        loss's gradients first), the parameters' gradients left out (:mod:`.liveness`), an
        affine pair in the batch; ``(0, 0)`` in records older than it.
    """

    family: str
    ops: tuple[Operator, ...]
    ready: Mapping[str, int]
    optimizer: str
    first_use: Mapping[str, tuple] = field(default_factory=dict)
    saved: tuple[int, int] = (0, 0)
    transient: tuple[int, int] = (0, 0)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise TraceError(f"operators family must be one of {list(FAMILIES)}, got {self.family!r}")
        n = len(self.ops)
        for name, k in self.ready.items():
            if not is_int(k) or not 0 <= k <= n:
                raise TraceError(f"operators.{self.family}.ready[{name!r}] must be an int in "
                                 f"[0, {n}], got {k!r}")
        for name, pair in self.first_use.items():
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or any(k is not None and (not is_int(k) or not 0 <= k < n) for k in pair)):
                raise TraceError(f"operators.{self.family}.first_use[{name!r}] must be two "
                                 f"operator indices (or null) below {n}, got {pair!r}")

    @property
    def host_sync(self) -> bool:
        """Whether the optimizer reads a device value on the host before its update
        (:data:`HOST_SYNC_OPTIMIZERS`)."""
        return self.optimizer in HOST_SYNC_OPTIMIZERS

    def phase_span(self, phase: str) -> tuple[int, int]:
        """``(first, end)`` indices of ``phase``'s operators (phases are contiguous)."""
        idx = [i for i, o in enumerate(self.ops) if o.phase == phase]
        return (idx[0], idx[-1] + 1) if idx else (0, 0)

    def to_dict(self) -> dict:
        d = {"optimizer": self.optimizer, "ready": dict(self.ready),
             "first_use": {k: list(v) for k, v in self.first_use.items()},
             "ops": [o.to_dict() for o in self.ops]}
        if any(self.saved):
            d["saved"] = list(self.saved)
        if any(self.transient):
            d["transient"] = list(self.transient)
        return d

    @classmethod
    def from_dict(cls, family: str, d, path: str) -> "OperatorSet":
        if not isinstance(d, Mapping):
            raise TraceError(f"{path} must be an object, got {d!r}")
        for key in ("optimizer", "ready", "ops"):
            if key not in d:
                raise TraceError(f"{path}.{key} is missing")
        ops = d["ops"]
        if not isinstance(ops, list) or not ops:
            raise TraceError(f"{path}.ops must be a non-empty list, got {type(ops).__name__}")
        parsed = tuple(Operator.from_dict(o, f"{path}.ops[{i}]") for i, o in enumerate(ops))
        order = [PHASES.index(o.phase) for o in parsed]
        if order != sorted(order):
            i = next(i for i in range(1, len(order)) if order[i] < order[i - 1])
            raise TraceError(f"{path}.ops[{i}].phase {parsed[i].phase!r} comes after "
                             f"{parsed[i - 1].phase!r}: phases must run forward, backward, optimizer")
        ready = d["ready"]
        if not isinstance(ready, Mapping):
            raise TraceError(f"{path}.ready must be an object, got {ready!r}")
        if not isinstance(d["optimizer"], str) or not d["optimizer"]:
            raise TraceError(f"{path}.optimizer must be a non-empty string, got {d['optimizer']!r}")
        uses = d.get("first_use", {})
        if not isinstance(uses, Mapping):
            raise TraceError(f"{path}.first_use must be an object, got {uses!r}")
        return cls(family, parsed, dict(ready), d["optimizer"],
                   {k: tuple(v) if isinstance(v, list) else v for k, v in uses.items()},
                   _affine(d.get("saved", [0, 0]), f"{path}.saved"),
                   _affine(d.get("transient", [0, 0]), f"{path}.transient"))


@dataclass(frozen=True)
class Operators:
    """A model's operator records in every family (``PayloadTrace.operators``).

    Parameters
    ----------
    families : dict
        Family name (:data:`FAMILIES`) -> :class:`OperatorSet`.
    method : str
        How they were recorded (stored with them).
    training_batch_size : int or None
        The per-GPU batch the model is usually trained with (its ``training_batch_size``),
        the default of a prediction.
    measured : qsgd.operators.measured.MeasuredOperators or None
        One real step's operators with their measured seconds (a trace measured on a GPU).
    extra : dict
        Unknown fields, written back unchanged.
    parameters : dict
        Parameter name -> elements, in registration order (``model.named_parameters()``,
        shared ones once): what a sharded step's units hold. Empty in older records.
    """

    families: Mapping[str, OperatorSet]
    method: str = ""
    training_batch_size: int | None = None
    measured: object = None
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    parameters: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self):
        for name, n in self.parameters.items():
            if not isinstance(name, str) or not is_int(n) or n < 1:
                raise TraceError(f"operators.parameters[{name!r}] must be an int >= 1, got {n!r}")

    def family(self, name: str) -> OperatorSet:
        """The :class:`OperatorSet` of family ``name``; TraceError naming the recorded ones."""
        if name not in self.families:
            raise TraceError(f"operators: family {name!r} was not recorded; have "
                             f"{sorted(self.families)} (qsgd.add_operators(trace, "
                             f"families=({name!r},)) records it from the model)")
        return self.families[name]

    @property
    def without_transients(self) -> tuple[str, ...]:
        """Families recorded before backward's transient memory was (saved bytes, but a
        ``transient`` of ``(0, 0)``): :func:`qsgd.add_operators` ``(transients=True)`` records
        it for them."""
        return tuple(f for f, o in self.families.items() if any(o.saved) and not any(o.transient))

    def to_dict(self) -> dict:
        d = {**self.extra, "method": self.method,
             "families": {k: v.to_dict() for k, v in self.families.items()}}
        if self.training_batch_size is not None:
            d["training_batch_size"] = self.training_batch_size
        if self.measured is not None:
            d["measured"] = self.measured.to_dict()
        if self.parameters:
            d["parameters"] = dict(self.parameters)
        return d

    @classmethod
    def from_dict(cls, d, path: str = "operators") -> "Operators":
        if not isinstance(d, Mapping):
            raise TraceError(f"{path} must be an object, got {d!r}")
        fams = d.get("families")
        if not isinstance(fams, Mapping) or not fams:
            raise TraceError(f"{path}.families must be a non-empty object, got {fams!r}")
        families = {}
        for name, v in fams.items():
            if name not in FAMILIES:
                raise TraceError(f"{path}.families: {name!r} is not one of {list(FAMILIES)}")
            families[name] = OperatorSet.from_dict(name, v, f"{path}.families.{name}")
        method = d.get("method", "")
        if not isinstance(method, str):
            raise TraceError(f"{path}.method must be a string, got {method!r}")
        tb = d.get("training_batch_size")
        if tb is not None and (not is_int(tb) or tb < 1):
            raise TraceError(f"{path}.training_batch_size must be a positive int, got {tb!r}")
        measured = None
        if d.get("measured") is not None:
            from .measured import MeasuredOperators

            measured = MeasuredOperators.from_dict(d["measured"], f"{path}.measured")
        params = d.get("parameters", {})
        if not isinstance(params, Mapping):
            raise TraceError(f"{path}.parameters must be an object, got {params!r}")
        known = ("method", "families", "training_batch_size", "measured", "parameters")
        return cls(families, method, tb, measured, {k: v for k, v in d.items() if k not in known},
                   dict(params))


def affine_fit(v1: int, v2: int, b1: int, b2: int, what: str) -> tuple[int, int]:
    """``(c, s)`` with ``c + s * b1 == v1`` and ``c + s * b2 == v2``, integers, or ValueError.

    >>> affine_fit(10, 16, 2, 4, "bytes")
    (4, 3)
    """
    s, r = divmod(v2 - v1, b2 - b1)
    if r or s < 0:
        raise ValueError(f"{what} is not affine in the batch: {v1} at batch {b1}, {v2} at {b2}")
    return v1 - s * b1, s


def total(values, batch: int) -> int:
    """Sum of affine pairs at ``batch`` (a helper for tests and summaries).

    >>> total([(1, 2), (0, 5)], 3)
    22
    """
    return sum(at(v, batch) for v in values)
