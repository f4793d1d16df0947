"""The work behind the pages: studies, simulations, predictions; plain functions, JSON out.

Long jobs (:func:`whatif_job`, :func:`simulate_job`) run inside Dash background callbacks
(one subprocess each, via the app's DiskcacheManager) and report progress through a
callable; everything returns JSON-ready dicts and lists, which is what crosses from the
worker process to the browser. Only the public APIs of ``topologies``, ``emulator`` and
``qsgd`` are used. The Recommend page's job is :mod:`dashboards.recommendjobs`.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import tempfile
from typing import Any, Callable, Mapping, Sequence

from dashboards.errors import DashboardError, UnavailableError

Progress = Callable[[int, int, str], None]


def _no_progress(done: int, total: int, text: str) -> None:
    pass


def api(module: str, name: str):
    """``module.name`` from a package's public API, or :class:`UnavailableError` saying why.

    The packages load their names lazily; a missing or broken part then surfaces here, as a
    message on the one page that needs it, not as a dashboard that does not start.
    """
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UnavailableError(f"{module}.{name} is not available in this installation "
                               f"({type(exc).__name__}: {exc})") from None


# --- topologies ----------------------------------------------------------------------

def build_topology(spec: str | None = None, upload: Mapping[str, Any] | None = None):
    """A validated topology from a spec string or an uploaded file.

    ``upload`` is ``{"filename": str, "text": str}``; it is written to a temporary file with
    its own suffix and read by ``topologies.load`` (JSON node-link, GraphML or YAML).
    """
    import topologies

    if upload:
        name = os.path.basename(upload.get("filename") or "topology.json")
        suffix = os.path.splitext(name)[1].lower() or ".json"
        with tempfile.TemporaryDirectory(prefix="qsgd-emu-topo-") as tmp:
            path = os.path.join(tmp, name if name.lower().endswith(suffix) else name + suffix)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(upload["text"])
            try:
                graph = topologies.load(path)
            except ValueError as exc:
                raise DashboardError(f"topology upload {name!r}: {exc}") from None
        return topologies.validate_topology(graph)
    if not spec or not str(spec).strip():
        raise DashboardError("topology: empty; give a spec such as fat_tree:k=4 or dgx_a100")
    try:
        return topologies.validate_topology(topologies.from_spec(str(spec).strip()))
    except ValueError as exc:
        raise DashboardError(f"topology: {spec!r}: {exc}") from None


def graph_data(G) -> dict:
    """Node-link data of a topology, JSON-ready: ``{"name", "nodes", "links"}``."""
    nodes = []
    for n, attrs in G.nodes(data=True):
        node = {"id": str(n), "kind": attrs.get("kind", "?")}
        if "rank" in attrs:
            node["rank"] = int(attrs["rank"])
        nodes.append(node)
    links = [{"source": str(u), "target": str(v), "bandwidth": float(a["bandwidth"]),
              "latency": float(a["latency"]), "link": a.get("link", "link")}
             for u, v, a in G.edges(data=True)]
    return {"name": str(G.graph.get("name", "")), "nodes": nodes, "links": links}


def topology_summary(G) -> dict:
    """``topologies.summary`` made JSON-ready (numbers and strings only)."""
    import topologies

    out = {}
    for key, value in topologies.summary(G).items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            out[key] = value
        elif isinstance(value, Mapping):
            out[key] = {str(k): v for k, v in value.items()}
        else:
            out[key] = str(value)
    return out


def layout_positions(G, *, method: str = "auto", seed: int = 0) -> dict[str, list[float]]:
    """Deterministic 2-D positions: node id -> [x, y].

    ``"layered"``: GPUs at the bottom, then each node one level above its nearest GPU (by
    hops), a tree-like picture of fabrics; ``"spring"``: Fruchterman-Reingold seeded with
    ``seed``; ``"circular"``; ``"auto"``: layered for graphs with switches or NICs, else spring (up to
    200 nodes) or circular.
    """
    import networkx as nx

    if method == "auto":
        # Fabrics read best as layers (GPUs, edge, aggregation, core); flat graphs (rings,
        # meshes) as a spring drawing, which is O(n^2) per step, hence the size limit.
        has_fabric = any(k in ("switch", "nic") for _, k in G.nodes(data="kind"))
        method = "layered" if has_fabric else ("spring" if G.number_of_nodes() <= 200 else "circular")
    if method == "spring":
        pos = nx.spring_layout(G, seed=int(seed), iterations=100)
    elif method == "circular":
        pos = nx.circular_layout(G)
    elif method == "layered":
        return _layered(G)
    else:
        raise DashboardError(f"layout: unknown method {method!r}; known: auto, layered, spring, circular")
    return {str(n): [float(p[0]), float(p[1])] for n, p in pos.items()}


def _layered(G) -> dict[str, list[float]]:
    """GPUs on the bottom row by rank; each other node one row above its nearest GPU (hops).

    Within a row, nodes sit in the order of the mean position of their neighbours in the
    row below (the barycenter heuristic of Sugiyama et al. 1981), which untangles trees.
    """
    import networkx as nx

    gpus = sorted((n for n, k in G.nodes(data="kind") if k == "gpu"),
                  key=lambda n: G.nodes[n].get("rank", 0))
    sources = gpus or [min(G, key=str)]
    level = nx.multi_source_dijkstra_path_length(G, sources, weight=None)
    rows: dict[int, list] = {}
    for n in G:
        rows.setdefault(level.get(n, 0), []).append(n)
    rows[0] = sources + [n for n in rows.get(0, []) if n not in set(sources)]
    x: dict = {}
    pos: dict[str, list[float]] = {}
    for depth in sorted(rows):
        members = rows[depth]
        if depth > 0:
            def center(n):
                below = [x[m] for m in G[n] if m in x and level.get(m, 0) < depth]
                return (sum(below) / len(below) if below else 0.5, str(n))
            members = sorted(members, key=center)
        count = len(members)
        for i, n in enumerate(members):
            x[n] = (i + 0.5) / count
            pos[str(n)] = [x[n], float(depth)]
    return pos


def simulate_job(spec: str | None, upload: Mapping[str, Any] | None, op: str, algorithm: str,
                 nbytes: int, progress: Progress = _no_progress) -> dict:
    """One collective on the topology: ``CollectiveResult.to_dict()`` plus what was asked."""
    progress(0, 2, "building the topology")
    G = build_topology(spec, upload)
    progress(1, 2, f"simulating {op}/{algorithm} of {nbytes} bytes")
    try:
        result = api("emulator", "run_collective")(G, op, algorithm, nbytes)
    except ValueError as exc:
        raise DashboardError(f"simulation: {exc}") from None
    out = result.to_dict()
    out.update(request={"op": op, "algorithm": algorithm, "bytes": nbytes})
    progress(2, 2, "done")
    return out


# --- validation ----------------------------------------------------------------------

def _measured(trace, name: str | None) -> dict:
    """``{"collectives", "world_size", "topology"}`` of a MeasuredTrace."""
    data = trace.to_dict()
    collectives = [dict(c) for c in data.get("collectives", [])]
    if not collectives:
        raise DashboardError(f"validation-upload: {name!r} holds no collectives to compare")
    env = data.get("environment", {})
    return {"collectives": collectives, "world_size": int(env.get("world_size") or 0) or None,
            "topology": env.get("topology")}


def report_points(data: Mapping[str, Any], filename: str | None) -> list[dict]:
    """The points of a ValidationReport dict, validated by ``emulator.ValidationReport``."""
    import emulator

    try:
        report = emulator.ValidationReport.from_dict(dict(data))
    except ValueError as exc:
        raise DashboardError(f"validation-upload: {filename!r}: {exc}") from None
    return [dict(p) for p in report.to_dict()["points"]]


def measured_collectives(data: Mapping[str, Any], filename: str | None) -> dict:
    """The collectives of a MeasuredTrace dict (validated by ``emulator.MeasuredTrace``)."""
    import emulator

    try:
        trace = emulator.MeasuredTrace.from_dict(dict(data))
    except ValueError as exc:
        raise DashboardError(f"validation-upload: {filename!r}: {exc}") from None
    return _measured(trace, filename)


def nccl_tests_collectives(text: str, filename: str | None) -> dict:
    """The collectives of an nccl-tests log (text or ``-J`` JSON) via ``import_nccl_tests``."""
    import emulator

    name = os.path.basename(filename or "nccl-tests.log")
    with tempfile.TemporaryDirectory(prefix="qsgd-emu-nccl-") as tmp:
        path = os.path.join(tmp, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            trace = emulator.import_nccl_tests(path)
        except ValueError as exc:
            raise DashboardError(
                f"validation-upload: {name!r} is neither a report, a trace nor an nccl-tests log: {exc}"
            ) from None
    return _measured(trace, name)


def predict_points(collectives: Sequence[Mapping[str, Any]], spec: str, algorithm: str,
                   world_size: int | None = None) -> list[dict]:
    """Predict each measured collective on topology ``spec``; points with relative errors.

    ``bytes`` follows nccl-tests (docs/formats.md): per rank for allreduce, the gathered total
    for allgather and reduce-scatter; ``emulator.run_collective`` takes the same convention.
    The collective runs over the first ``world_size`` GPUs (all of them by default).
    """
    import topologies

    G = build_topology(spec)
    ranks = None
    if world_size is not None:
        n = len(topologies.gpus(G))
        if world_size > n:
            raise DashboardError(f"validation-topology: {spec!r} has {n} GPUs, the measurement "
                                 f"used {world_size} ranks")
        ranks = list(range(world_size))
    cache: dict[tuple, float] = {}
    points = []
    for c in collectives:
        op, nbytes = str(c["op"]), int(c["bytes"])
        key = (op, algorithm, nbytes)
        if key not in cache:
            try:
                cache[key] = float(api("emulator", "run_collective")(G, op, algorithm, nbytes,
                                                           ranks=ranks).time_s)
            except ValueError as exc:
                raise DashboardError(f"validation: cannot predict {op} of {nbytes} bytes with "
                                     f"{algorithm!r} on {spec!r}: {exc}") from None
        measured, predicted = float(c["time_s"]), cache[key]
        points.append({"op": op, "bytes": nbytes, "measured_s": measured, "predicted_s": predicted,
                       "rel_error": (predicted - measured) / measured if measured > 0 else None,
                       "held_out": True})
    return points


def stored_reports(store_path: str | None) -> list[dict]:
    """Dropdown options for the ValidationReports saved in the run store."""
    import testbench

    store = testbench.RunStore(store_path)
    return [{"label": f"#{r['id']} report (run {r.get('run_id')})", "value": r["id"]}
            for r in store.results(kind="validation-report")]


def stored_report_points(store_path: str | None, result_id: int) -> list[dict]:
    import testbench

    store = testbench.RunStore(store_path)
    for r in store.results(kind="validation-report"):
        if r["id"] == result_id:
            return report_points(r["payload"], f"stored report #{result_id}")
    raise DashboardError(f"validation-stored: no report #{result_id} in the run store")


# --- what-if studies -----------------------------------------------------------------

def qsgd_transports() -> list[str]:
    """The emulator's QSGD transports (``fp32``/``fp16`` are the bit widths 32 and 16; the
    other methods, PowerSGD and GRACE's, are not QSGD widths)."""
    return sorted(t for t, v in api("emulator", "TRANSPORTS").items() if v.compressed)


def _trace_cache_path(cache_dir: str | None, model: str, bits: int, bucket_size: int) -> str | None:
    if not cache_dir:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    return os.path.join(cache_dir, "traces", f"{safe}-{bits}b-d{bucket_size}.json")


#: the largest model the what-if page measures on this CPU: fp32 weights, gradients and SGD
#: momentum take 12 bytes a parameter (4.8 GB here) before any activation; larger models (GPT-2
#: large, Llama) are recorded on the meta device, or measured on a GPU (``qsgd-emu measure``)
#: and their trace uploaded.
CPU_MEASURE_MAX_PARAMETERS = 400_000_000


def model_parameters(model: str, page: str = "whatif") -> int:
    """Parameters of the zoo's (or a user's) ``model``, counted on the meta device (shapes
    only, no memory); 0 for a user's model that cannot be built there. An unknown name is a
    DashboardError naming the page's model field."""
    try:
        return _parameters(model)
    except ValueError as exc:
        raise DashboardError(f"{page}-model: {model!r}: {exc}") from None


@functools.lru_cache(maxsize=64)
def _parameters(model: str) -> int:
    """:func:`model_parameters`, once per name: the Recommend page asks before it measures and
    the measuring asks again (building a 7B model on the meta device takes a second)."""
    import qsgd
    import torch

    try:
        with torch.device("meta"):
            return sum(p.numel() for p in qsgd.build_model(model).parameters())
    except (RuntimeError, NotImplementedError):
        return 0


def workload(params: Mapping[str, Any], progress: Progress = _no_progress, *,
             run: bool = False, variance: bool = True, page: str = "whatif"):
    """The PayloadTrace of a study: the uploaded one, else the model's.

    The model's is its layout and operators recorded on the meta device (no step runs, any
    size; the compute model times it on the GPU), or, with ``run`` or the device
    ``"measured"``, ``qsgd.measure`` of real steps on this CPU (real gradients: their
    variance, the codec's seconds here), kept under ``params["cache_dir"]/traces`` so that
    the next study of the same model, bit width and bucket size starts at once.
    ``variance=False`` skips the per-bucket quantization-variance records of a measurement
    (half of measuring ResNet-50 on a CPU; a study does not read them, a recommendation does):
    such a trace is cached under its own name, and a cached trace with the records serves too.
    Errors name ``page``'s fields.
    """
    import qsgd

    if params.get("trace"):
        try:
            return qsgd.PayloadTrace.from_dict(params["trace"])
        except ValueError as exc:
            raise DashboardError(f"{page}-trace-upload: {exc}") from None
    qsgd_bits = [b for b in params["bits"] if b < 16]
    bits = min(qsgd_bits) if qsgd_bits else 8
    if not run and params.get("device") != "measured":
        progress(0, 1, f"recording {params['model']}'s layout and operators (meta device)")
        try:
            cfg = qsgd.QSGDConfig.from_bits(bits, bucket_size=int(params["bucket_size"]))
            return qsgd.measure(params["model"], cfg, device="meta")
        except ValueError as exc:
            raise DashboardError(f"{page}-model: {params['model']!r}: {exc}") from None
    cache = _trace_cache_path(params.get("cache_dir"), params["model"], bits, params["bucket_size"])
    if cache and os.path.exists(cache):
        return qsgd.PayloadTrace.load(cache)
    if cache and not variance:
        cache = cache[:-len(".json")] + "-novariance.json"
        if os.path.exists(cache):
            return qsgd.PayloadTrace.load(cache)
    progress(0, 1, f"measuring {params['model']} gradients with {bits}-bit QSGD on this CPU")
    import torch

    try:
        cfg = qsgd.QSGDConfig.from_bits(bits, bucket_size=int(params["bucket_size"]))
    except ValueError as exc:
        raise DashboardError(f"{page}-model: {params['model']!r}: {exc}") from None
    size = model_parameters(params["model"], page)
    if size > CPU_MEASURE_MAX_PARAMETERS:
        raise DashboardError(f"{page}-model: {params['model']!r} has {size:,} parameters, more than the "
                             f"{CPU_MEASURE_MAX_PARAMETERS:,} this page measures on a CPU; measure it on "
                             f"a GPU with 'qsgd-emu measure' and upload the trace")
    model = qsgd.build_model(params["model"])
    trace = qsgd.measure(model, cfg, iterations=2, batch_size=2, device="cpu", seed=0,
                         **({} if variance else {"variance_bits": ()}))
    if cache:
        trace.save(cache)  # atomic: two tabs measuring at once never read half a file
    return trace


def check_operators(params: Mapping[str, Any], page: str = "whatif") -> None:
    """Refuse, in one line naming ``page``'s field, activation checkpointing with the device
    "measured" (the trace's own seconds, which cannot be re-recorded): before any measuring."""
    ckpt = params.get("checkpointing") or None
    if ckpt is not None and params.get("device") == "measured":
        raise DashboardError(f"{page}-checkpointing: {ckpt!r} re-records the step for the "
                             f"compute model; the device 'measured' replays the trace's own "
                             f"seconds")


def with_operators(trace, params: Mapping[str, Any], page: str = "whatif"):
    """``trace`` with the operator records the form asks for: the family of its precision (a
    cached or uploaded trace recorded before that family existed gets it recorded from its
    model), its activation checkpointing (recorded again the other way when it differs) and,
    where a sharded strategy reports memory, backward's transients (a trace recorded before
    them): :func:`qsgd.add_operators`, one recording for all. Errors name ``page``'s fields."""
    check_operators(params, page)
    prec = api("emulator", "PRECISIONS").get(params.get("precision") or "")
    ckpt = params.get("checkpointing") or None
    memory = (params.get("parallelism") or "ddp") != "ddp"
    if trace.operators is None or (prec is None and ckpt is None and not memory):
        return trace
    try:
        return api("qsgd", "add_operators")(
            trace, families=None if prec is None else (prec.family,), checkpointing=ckpt,
            transients=memory)
    except ValueError as exc:
        field = f"{page}-checkpointing {ckpt!r}" if ckpt else f"{page}-precision {prec.name!r}"
        raise DashboardError(f"{field}: {exc}") from None


def _topology_spec(params: Mapping[str, Any]) -> str:
    """The topology for the study: an uploaded file is saved and named by its path."""
    upload = params.get("topology_upload")
    if not upload:
        return str(params["topology"])
    G = build_topology(None, upload)
    import topologies

    folder = os.path.join(params.get("cache_dir") or tempfile.gettempdir(), "topologies")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"upload-{os.getpid()}.json")
    topologies.save(G, path)
    return path


def study_workers() -> int:
    """Local processes of a What-if study: one per core this process may use, at most 2 (a
    study at 8,192 GPUs is four tasks of 10-50 s; two tabs may run studies at once)."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


def whatif_job(params: Mapping[str, Any], progress: Progress = _no_progress) -> dict:
    """Run a what-if study: ``{"rows": [...], "gantt": Prediction dict, "params": ...}``.

    ``params`` comes from :func:`dashboards.pages.whatif.params_from_form` (plus
    ``cache_dir``). The timeline is the one the study kept of its best configuration
    (:meth:`emulator.Study.best`).
    """
    check_operators(params)  # before measuring
    trace = with_operators(workload(params, progress, variance=False), params)
    spec = _topology_spec(params)
    # The form's 32 and 16 are the dense transports; its transports are the QSGD ones.
    dense = [t for t, b in (("fp32", 32), ("fp16", 16)) if b in params["bits"]]
    parallelism = params.get("parallelism") or "ddp"
    qsgd_transports = list(params["transports"])
    if parallelism != "ddp" and api("qsgd", "STRATEGIES")[parallelism].grads == "reduce_scatter":
        # a strategy that reduce-scatters takes QSGD's quantized reduce-scatter only
        qsgd_transports = [t for t in qsgd_transports if t in api("emulator", "SHARDED_TRANSPORTS")]
    try:
        config = api("emulator", "StudyConfig")(
            world_sizes=tuple(params["world_sizes"]), bits=tuple(params["bits"]),
            transports=tuple(dense + qsgd_transports), topologies=(spec,), trace=trace,
            device=params.get("device") or "auto", batch_size=params.get("batch_size"),
            precision=params.get("precision"), parallelism=parallelism,
            attention=params.get("attention"))
        # one compute model per topology, resolved once as the CLI does, and said
        models = api("emulator", "resolve_compute")(config)
        config = dataclasses.replace(config, compute=models)
    except ValueError as exc:
        raise DashboardError(f"study: {exc}") from None
    total = [1]

    def on_progress(done, todo=None, *_):
        total[0] = max(total[0], int(todo or 1))
        progress(int(done), total[0], f"study: {int(done)} of {total[0]} configurations")

    try:
        study = api("emulator", "run_study")(config, progress=on_progress,
                                              workers=study_workers())
    except ValueError as exc:
        raise DashboardError(f"study: {exc}") from None
    best = study.best()
    pred = study.prediction(best)
    gantt = None if pred is None else dict(
        pred.to_dict(), label=f"{best.label} at {best.world_size} GPUs on {best.topology_name}")
    # what the compute model assumed (device, precision, batch, checkpointing, attention
    # kernel), as the CLI prints it: the page's rows would otherwise not say it
    said = [f"compute assumed on {spec}: {m.source}" for spec, m in models.items()]
    return {"rows": [r.to_dict() for r in study.rows], "gantt": gantt,
            "conclusions": said + study.conclusions(),
            "params": {k: v for k, v in params.items() if k not in ("trace", "topology_upload")}}
