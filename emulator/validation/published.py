"""The registry of published multi-GPU training runs (``validate published``): reading it.

One JSON file per experiment (format ``qsgd-published-run``, version 1;
``tests/emulator/data/published_runs/``, whose README names every source and caveat): the
model, per-GPU batch, precision, GPU, GPUs per node, the network as stated, framework,
collective library, the compression methods with their settings, and the measured
throughput (or wall time) per world size and method. :func:`load_run` checks every field and
says, in one line, which file and field are wrong; it also turns the file into what this
project predicts with:

- the model: a zoo name (:data:`qsgd.MODELS`) or a decoder of the stated dimensions
  (:data:`MODEL_MAPS`: MPT is a GPT-2-shaped decoder; ALiBi's missing position table and
  the bias terms MPT drops are the approximation);
- the topology (:func:`topology_spec`, the one place that turns a stated network into a
  cluster);
- each method's transport and settings (:data:`PARALLELISMS` per way of training, then
  :func:`method_transport`): GRACE's compressors and PowerSGD as
  :mod:`qsgd.wiremethods` plans, DDP's and a parameter server's uncompressed gradients as an
  allreduce, the rest not predicted with the reason why.

Predictions live in :mod:`~emulator.validation.publishedrun`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field

from emulator.compute import ALIASES, ATTENTION_KERNELS, DEVICES, PRECISIONS
from emulator.compute.devices import GIB
from emulator.errors import TraceError
from emulator._checks import is_int, is_number

FORMAT = "qsgd-published-run"
#: Where the registry is kept (relative to the repository).
DEFAULT_DIR = os.path.join("tests", "emulator", "data", "published_runs")
PER = ("total", "gpu")
UNITS = {"images/s": "samples", "samples/s": "samples", "tokens/s": "tokens"}
WALL_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
NETWORK_TRANSPORTS = ("tcp", "nvlink", "pcie", "roce", "ib", None)
#: Methods that are the uncompressed baseline of a file.
BASELINE = "none"


@dataclass(frozen=True)
class PublishedPoint:
    """One measured point: ``world_size`` GPUs on ``nodes`` machines running ``method``.

    ``throughput`` is the whole job's (a per-GPU figure is multiplied out), in ``unit``;
    ``wall_time_s`` the end-to-end seconds where the source gives only that (BytePS).
    """

    world_size: int
    nodes: int
    method: str
    throughput: float | None
    unit: str
    wall_time_s: float | None = None
    note: str = field(default="", compare=False)
    #: the source's peak memory per GPU (bytes; its ``memory_gib``), where it prints one
    memory_bytes: float | None = None


@dataclass(frozen=True)
class PublishedRun:
    """One registry file (fields as in the file; see the module docstring)."""

    id: str
    path: str
    source: str
    model: str
    model_args: dict
    batch_size: int
    precision: str
    device: str
    gpus_per_node: int | None
    network: dict
    framework: str
    collective_library: str
    parallelism: str
    methods: dict
    points: tuple
    reference_run: str | None = None
    doubtful: str | None = None
    activation_checkpointing: str = "none"
    #: the GPUs' memory as their maker states it (bytes, GB x 2**30 as the catalogue counts),
    #: where the part run differs from the catalogue's ``device`` in it (``device_memory_gb``)
    device_memory_bytes: float | None = None
    #: the fused attention kernel the run used (``attention_kernel``,
    #: :data:`emulator.compute.ATTENTION_KERNELS`; default FlashAttention-2)
    attention_kernel: str = "flash2"

    @property
    def zoo(self) -> tuple[str, dict]:
        """``(qsgd.MODELS name, keyword arguments)`` of the model."""
        return zoo_model(self.model, self.model_args, self.path)

    def baseline(self, world_size: int) -> PublishedPoint | None:
        """The uncompressed point at ``world_size`` (None if the file has none)."""
        return next((p for p in self.points if p.method == BASELINE
                     and p.world_size == world_size), None)


# ---------------------------------------------------------------- models
def _mpt(args: dict, where: str) -> tuple[str, dict]:
    """MPT (mosaicml/llm-foundry ``mpt_causal_lm``) as the zoo's GPT-2-shaped decoder of the
    same width, depth, heads, vocabulary and sequence (its MLP is 4x wide, as MPT's
    ``expansion_ratio`` 4); ALiBi has no position table and MPT no biases: the decoder has
    both (a few million parameters more than the 7B's 6.66 billion). No dropout: llm-foundry's
    MPT pretraining yamls set ``attn_pdrop``, ``resid_pdrop`` and ``emb_pdrop`` to 0, so no
    dropout masks are saved for the backward pass (the zoo's default keeps GPT-2's 0.1). Its
    loss is flash-attn's fused cross-entropy (``loss_fn: fused_crossentropy``, the default of
    llm-foundry's ``ComposerMPTCausalLM``): ``fused_loss``."""
    need = ("d_model", "n_layers", "n_heads", "seq_len", "vocab")
    missing = [k for k in need if not is_int(args.get(k))]
    if missing:
        raise TraceError(f"{where}: model_args.{missing[0]} is missing or not an int "
                         f"(an MPT model needs {', '.join(need)})")
    if args.get("expansion_ratio", 4) != 4:
        raise TraceError(f"{where}: model_args.expansion_ratio={args['expansion_ratio']!r}: "
                         f"only MPT's 4 maps onto the zoo's decoder")
    return "gpt2", {"n_layer": args["n_layers"], "n_embd": args["d_model"],
                    "n_head": args["n_heads"], "vocab_size": args["vocab"],
                    "seq_len": args["seq_len"], "n_positions": args["seq_len"], "dropout": 0.0,
                    "fused_loss": True}


#: Model names of the registry that are not zoo names, and how they map onto the zoo.
MODEL_MAPS = {re.compile(r"mpt-\d+[mb]"): _mpt}


def zoo_model(name: str, args: dict, where: str = "model") -> tuple[str, dict]:
    """The :data:`qsgd.MODELS` name and arguments of a registry model (module docstring).

    >>> zoo_model("mpt-125m", {"d_model": 768, "n_layers": 12, "n_heads": 12, "seq_len": 2048,
    ...                        "vocab": 50368})[0]
    'gpt2'
    """
    import qsgd

    if name in qsgd.MODELS:
        return name, {}
    for pattern, to_zoo in MODEL_MAPS.items():
        if pattern.fullmatch(name):
            return to_zoo(args, where)
    raise TraceError(f"{where} {name!r} is neither a zoo model ({', '.join(sorted(qsgd.MODELS))}) "
                     f"nor a mapped family (mpt-*)")


# ---------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method:
    """How this project predicts one method of a file: a replay transport and its settings,
    or the reason it predicts nothing."""

    transport: str | None
    config: object | None = None
    note: str = ""
    unpredicted: str = ""
    parallelism: str | None = None


def _rank(value, where: str) -> int:
    m = re.match(r"\s*(\d+)", str(value)) if value is not None else None
    if not m:
        raise TraceError(f"{where}: settings.rank must start with an int, got {value!r}")
    return int(m.group(1))


def _grace(run_path: str, name: str, spec: dict) -> Method:
    import qsgd

    where = f"{run_path}: methods.{name}"
    if name == BASELINE:
        return Method("grace_allreduce", qsgd.CompressorConfig("none"),
                      "GRACE's NoneCompressor through its allreduce communicator")
    settings = spec.get("settings")
    if not isinstance(settings, dict) or "family" not in settings:
        raise TraceError(f"{where}.settings.family is missing (which GRACE compressor)")
    family, ef = settings["family"], bool(settings.get("error_feedback", False))
    if family == "powersgd":
        return Method("powersgd", qsgd.PowerSGDConfig(rank=_rank(settings.get("rank"), where),
                                                      implementation="grace", error_feedback=ef),
                      "GRACE's TensorFlow PowerSGD")
    if family not in qsgd.COMPRESSORS:
        raise TraceError(f"{where}.settings.family={family!r} is not a known GRACE compressor "
                         f"({', '.join(sorted(qsgd.COMPRESSORS))}, powersgd)")
    if qsgd.COMPRESSORS[family].kept == "data":
        return Method(None, unpredicted=f"{family}: the payload's size is decided by the "
                                        f"gradient's values, which a plan from shapes lacks")
    try:
        cfg = qsgd.CompressorConfig(family, ratio=settings.get("ratio"),
                                    levels=settings.get("levels"), error_feedback=ef)
    except ValueError as exc:
        raise TraceError(f"{where}.settings: {exc}") from None
    return Method(f"grace_{cfg.compressor.collective}", cfg, f"GRACE's {family}")


def _uncompressed(note: str, compressed: str):
    def resolve(run_path: str, name: str, spec: dict) -> Method:
        if name != BASELINE:
            return Method(None, unpredicted=f"{name}: {compressed} is not modelled")
        return Method("fp32", None, note)
    return resolve


def _sharded(run_path: str, name: str, spec: dict) -> Method:
    """FSDP's points: predicted by a study that shards (``StudyConfig.parallelism``, issue
    31) once studies have it, else not."""
    from emulator.study import StudyConfig

    if name != BASELINE:
        return Method(None, unpredicted=f"{name}: compression inside FSDP is not modelled")
    if "parallelism" not in {f.name for f in dataclasses.fields(StudyConfig)}:
        return Method(None, unpredicted="needs sharded training (issue 31)")
    return Method("fp32", None, "FSDP FULL_SHARD, a study with parallelism='fsdp'",
                  parallelism="fsdp")


#: Way of training -> how its methods are predicted (module docstring).
PARALLELISMS = {
    "horovod": _grace,
    "ddp": _uncompressed("DDP's allreduce", "compression inside a framework's DDP"),
    "ps": _uncompressed("a parameter server, predicted as an allreduce of the same bytes per "
                        "node (a server shard per worker: each node sends and receives "
                        "2 (N-1)/N of the gradient, as in a ring allreduce)",
                        "compression on parameter servers (BytePS compresses on the host's "
                        "CPU between its push and pull)"),
    "fsdp": _sharded,
}


def method_transport(run: PublishedRun, name: str) -> Method:
    """The :class:`Method` of ``run``'s method ``name``."""
    return PARALLELISMS[run.parallelism](run.path, name, run.methods[name])


# ---------------------------------------------------------------- topologies
def topology_spec(run: PublishedRun, world_size: int, nodes: int) -> str:
    """The cluster ``run`` states, as a topology spec for ``world_size`` GPUs on ``nodes``
    machines (the one place a stated network becomes a topology; ``p2_8xlarge:N`` is built
    by :func:`build_topology`).

    - one GPU per machine on a stated Ethernet: a switch of that rate (``switch:N,bw=10Gbit``);
    - one machine of SXM parts: the vendor's 8-GPU machine of that GPU (the first ranks);
    - K80s: the p2.8xlarge, the first socket of a p2.16xlarge (8 GK210 on PCIe gen3);
    - several 8-GPU machines: a cluster of them on NICs of the stated rate.

    >>> import dataclasses
    >>> run = load_run(os.path.join(_default_dir(), "grace-resnet50-tf-v100-10g-mpi.json"))
    >>> topology_spec(run, 8, 8)
    'switch:8,bw=10Gbit'
    """
    net = run.network
    gbit = net.get("nic_gbit")
    if run.gpus_per_node == 1:
        if gbit is None:
            raise TraceError(f"{run.path}: network.nic_gbit is null; one GPU per machine needs "
                             f"the network's rate")
        return f"switch:{world_size},bw={_num(gbit)}Gbit"
    machine = MACHINES.get(run.device)
    if machine is None:
        raise TraceError(f"{run.path}: device {run.device!r} names no machine to build a "
                         f"multi-GPU topology from (network.as_stated: {net.get('as_stated')!r})")
    if machine == "p2_8xlarge":
        return f"p2_8xlarge:{nodes}" + ("" if nodes == 1 or gbit is None else f",nic_bw={_num(gbit)}Gbit")
    if nodes == 1:
        return machine
    if gbit is None:
        return f"cluster:{machine}x{nodes}"
    import topologies

    if net.get("nic_gbit_per", "node") == "node":
        nics = sum(1 for _, d in topologies.PRESETS[machine]().nodes(data=True)
                   if d.get("kind") == "nic")
        gbit = gbit / max(1, nics)
    return f"cluster:{machine}x{nodes},nic_bw={_num(gbit)}Gbit"


#: The machine a stated GPU comes in, when the source names a multi-GPU server of SXM parts
#: (the vendor's 8-GPU board; p3.16xlarge is wired as a DGX-1) or K80s (a p2.8xlarge).
MACHINES = {"V100": "dgx1_v100", "A100-80GB": "dgx_a100", "A100-40GB": "p4d",
            "H100-SXM": "dgx_h100", "K80": "p2_8xlarge"}


def _num(x: float) -> str:
    return f"{x:g}"


def build_topology(spec: str):
    """The graph of a :func:`topology_spec` spec (``p2_8xlarge:N[,nic_bw=...]`` built here:
    a p2.16xlarge's first eight GPUs, PCIe switches and socket, one NIC; several in a cluster).
    """
    import topologies

    if not spec.startswith("p2_8xlarge:"):
        return topologies.from_spec(spec)
    head, _, rest = spec.partition(",")
    nodes = int(head.split(":")[1])
    G = topologies.PRESETS["p2_16xlarge"]()
    G.remove_nodes_from([f"gpu{g}" for g in range(8, 16)] + [f"k80_{b}" for b in range(4, 8)]
                        + ["pcie2", "pcie3", "cpu1"])
    G.graph["name"] = "p2_8xlarge"
    if nodes == 1:
        return topologies.validate_topology(G)
    nic = topologies.parse_bandwidth(rest.partition("=")[2]) if rest else None
    G = topologies.cluster(G, nodes, nic_bandwidth=nic)
    G.graph["name"] = spec
    return G


# ---------------------------------------------------------------- reading
def _need(d: dict, key: str, where: str):
    if key not in d:
        raise TraceError(f"{where}: field {key} is missing")
    return d[key]


def _text(d: dict, key: str, where: str, *, nullable: bool = False) -> str | None:
    v = _need(d, key, where)
    if v is None and nullable:
        return None
    if not isinstance(v, str) or not v.strip():
        raise TraceError(f"{where}: field {key} must be a non-empty string, got {v!r}")
    return v


def _point(d, where: str, methods: dict) -> PublishedPoint:
    if not isinstance(d, dict):
        raise TraceError(f"{where} must be an object, got {d!r}")
    w, n = _need(d, "world_size", where), _need(d, "nodes", where)
    if not is_int(w) or w < 1:
        raise TraceError(f"{where}.world_size must be an int >= 1, got {w!r}")
    if not is_int(n) or not 1 <= n <= w:
        raise TraceError(f"{where}.nodes must be an int in [1, world_size={w}], got {n!r}")
    method = _text(d, "method", where)
    if method not in methods:
        raise TraceError(f"{where}.method {method!r} is not one of the file's methods "
                         f"({', '.join(methods)})")
    unit = _text(d, "unit", where)
    if "wall_time" in d:
        t = d["wall_time"]
        if not is_number(t) or not math.isfinite(t) or t <= 0 or unit not in WALL_UNITS:
            raise TraceError(f"{where}: wall_time must be a number > 0 in {list(WALL_UNITS)}, "
                             f"got {t!r} {unit!r}")
        return PublishedPoint(w, n, method, None, unit, t * WALL_UNITS[unit], str(d.get("note", "")))
    memory = None
    if "memory_gib" in d:
        m = d["memory_gib"]
        if not is_number(m) or not math.isfinite(m) or m <= 0:
            raise TraceError(f"{where}.memory_gib must be a number > 0 (GiB per GPU), got {m!r}")
        memory = float(m) * 2 ** 30
    rate = _need(d, "throughput", where)
    if not is_number(rate) or not math.isfinite(rate) or rate <= 0:
        raise TraceError(f"{where}.throughput must be a number > 0, got {rate!r}")
    if unit not in UNITS:
        raise TraceError(f"{where}.unit must be one of {list(UNITS)}, got {unit!r}")
    per = _need(d, "per", where)
    if per not in PER:
        raise TraceError(f"{where}.per must be one of {list(PER)}, got {per!r}")
    total = float(rate) * (w if per == "gpu" else 1)
    return PublishedPoint(w, n, method, total, unit, None, str(d.get("note", "")), memory)


def load_run(path: str | os.PathLike) -> PublishedRun:
    """One registry file, every field checked; errors name the file and the field.

    Examples
    --------
    >>> run = load_run(os.path.join(_default_dir(), "grace-resnet50-tf-v100-10g-mpi.json"))
    >>> run.model, run.device, run.batch_size, run.baseline(8).throughput
    ('resnet50', 'V100', 64, 2200.5328)
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{path}: expected a JSON object")
    if doc.get("format") != FORMAT or doc.get("version") != 1:
        raise TraceError(f"{path}: field format/version must be {FORMAT!r} version 1, got "
                         f"{doc.get('format')!r} version {doc.get('version')!r}")
    where = path
    src = _need(doc, "source", where)
    source = src.get("title") if isinstance(src, dict) else src
    if not isinstance(source, str) or not source:
        raise TraceError(f"{where}: field source must name its source (a title), got {src!r}")
    model = _text(doc, "model", where)
    args = doc.get("model_args", {})
    if not isinstance(args, dict):
        raise TraceError(f"{where}: field model_args must be an object, got {args!r}")
    zoo_model(model, args, f"{where}: field model")
    batch = _need(doc, "batch_size", where)
    if not is_int(batch) or batch < 1:
        raise TraceError(f"{where}: field batch_size must be an int >= 1, got {batch!r}")
    precision = _text(doc, "precision", where)
    if precision not in PRECISIONS:
        raise TraceError(f"{where}: field precision {precision!r} is not one of {list(PRECISIONS)}")
    device = _text(doc, "device", where)
    if device not in DEVICES and device not in ALIASES:
        raise TraceError(f"{where}: field device {device!r} is not one of {sorted(DEVICES)}")
    memory_gb = doc.get("device_memory_gb")
    if memory_gb is not None and (not is_number(memory_gb) or not memory_gb > 0):
        raise TraceError(f"{where}: field device_memory_gb must be a number > 0 (GB a GPU), "
                         f"got {memory_gb!r}")
    per_node = _need(doc, "gpus_per_node", where)
    if per_node is not None and (not is_int(per_node) or per_node < 1):
        raise TraceError(f"{where}: field gpus_per_node must be an int >= 1 or null, got {per_node!r}")
    net = _need(doc, "network", where)
    if not isinstance(net, dict) or not isinstance(net.get("as_stated"), str):
        raise TraceError(f"{where}: field network must be an object with as_stated, got {net!r}")
    gbit = _need(net, "nic_gbit", f"{where}: network")
    if gbit is not None and (not is_number(gbit) or not gbit > 0):
        raise TraceError(f"{where}: field network.nic_gbit must be a number > 0 or null, got {gbit!r}")
    if net.get("nic_gbit_per", "node") not in ("node", "gpu"):
        raise TraceError(f"{where}: field network.nic_gbit_per must be 'node' or 'gpu', got "
                         f"{net['nic_gbit_per']!r}")
    if _need(net, "transport", f"{where}: network") not in NETWORK_TRANSPORTS:
        raise TraceError(f"{where}: field network.transport {net['transport']!r} is not one of "
                         f"{list(NETWORK_TRANSPORTS)}")
    parallelism = _text(doc, "parallelism", where)
    if parallelism not in PARALLELISMS:
        raise TraceError(f"{where}: field parallelism {parallelism!r} is not one of "
                         f"{list(PARALLELISMS)}")
    methods = _need(doc, "methods", where)
    if not isinstance(methods, dict) or not methods or \
            not all(isinstance(v, dict) for v in methods.values()):
        raise TraceError(f"{where}: field methods must be an object of method objects")
    points = _need(doc, "points", where)
    if not isinstance(points, list) or not points:
        raise TraceError(f"{where}: field points must be a non-empty list")
    pts = tuple(_point(p, f"{where}: points[{i}]", methods) for i, p in enumerate(points))
    ref = doc.get("reference_run")
    if ref is not None and not isinstance(ref, str):
        raise TraceError(f"{where}: field reference_run must be a registry id, got {ref!r}")
    import qsgd

    ckpt = doc.get("activation_checkpointing", "none")
    if not isinstance(ckpt, str) or ckpt not in qsgd.CHECKPOINTING:
        raise TraceError(f"{where}: field activation_checkpointing must be one of "
                         f"{list(qsgd.CHECKPOINTING)}, got {ckpt!r}")
    kernel = doc.get("attention_kernel", "flash2")
    if not isinstance(kernel, str) or kernel not in ATTENTION_KERNELS:
        raise TraceError(f"{where}: field attention_kernel must be one of "
                         f"{sorted(ATTENTION_KERNELS)}, got {kernel!r}")
    run = PublishedRun(
        id=_text(doc, "id", where), path=path, source=source, model=model, model_args=dict(args),
        batch_size=batch, precision=precision, device=device, gpus_per_node=per_node,
        network=dict(net), framework=_text(doc, "framework", where),
        collective_library=_text(doc, "collective_library", where), parallelism=parallelism,
        methods=dict(methods), points=pts, reference_run=ref,
        doubtful=doc.get("doubtful") if isinstance(doc.get("doubtful"), str) else None,
        activation_checkpointing=ckpt,
        device_memory_bytes=None if memory_gb is None else float(memory_gb) * GIB,
        attention_kernel=kernel)
    for name in methods:                 # an unknown compressor fails here, not mid-run
        method_transport(run, name)
    for i, p in enumerate(pts):
        _check_topology(run, p, f"{where}: points[{i}]")
    return run


def _check_topology(run: PublishedRun, p: PublishedPoint, where: str) -> None:
    if run.gpus_per_node and p.world_size > p.nodes * run.gpus_per_node:
        raise TraceError(f"{where}: world_size {p.world_size} exceeds nodes x gpus_per_node "
                         f"({p.nodes} x {run.gpus_per_node})")
    try:
        topology_spec(run, p.world_size, p.nodes)
    except TraceError as exc:
        raise TraceError(f"{where}: network: {str(exc).removeprefix(run.path + ': ')}") from None


def load_registry(directory: str | os.PathLike | None = None) -> list[PublishedRun]:
    """Every ``*.json`` of the registry directory (default the project's), sorted by name;
    the first unreadable file raises."""
    directory = os.fspath(directory or _default_dir())
    names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    if not names:
        raise TraceError(f"{directory}: no registry files (*.json)")
    runs = [load_run(os.path.join(directory, n)) for n in names]
    ids = {r.id for r in runs}
    for r in runs:
        if r.reference_run is not None and r.reference_run not in ids:
            raise TraceError(f"{r.path}: field reference_run {r.reference_run!r} is not a "
                             f"registry id")
    return runs


def _default_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(os.path.dirname(here)), DEFAULT_DIR)


def replace_points(run: PublishedRun, points) -> PublishedRun:
    """``run`` with other points (the tests' smaller registries)."""
    return dataclasses.replace(run, points=tuple(points))
