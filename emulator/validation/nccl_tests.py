"""Import NVIDIA nccl-tests logs (``all_reduce_perf``, ``all_gather_perf``, ...) as a MeasuredTrace.

Accepted inputs, as seen in the wild (NVIDIA/nccl-tests, src/util.cu and src/common.cu):

- the text table, with the ``root`` column (newer versions) or without it (older ones, whose
  last column per half is ``error`` instead of ``#wrong``); the columns are read from the
  ``# size count type ...`` header line, so extra columns (timestamps, per-iteration stats) are
  tolerated;
- the same text with ``srun --label`` prefixes (``"3: "`` before every line); the rows of the
  lowest task label that printed a table are used (the others repeat it);
- the ``-J``/``--report_json`` file (JSON version 2: ``config.devices`` and ``results`` with
  ``out_of_place.time`` in microseconds).

The out-of-place time is used (``time`` in us; ``size`` in bytes; per-rank size for allreduce,
the total for allgather and reduce-scatter, as in docs/formats.md). A line that does not parse
raises :class:`emulator.TraceError` naming its line number. The points name ``"nccl"`` as their
algorithm: NCCL chose what it ran, as the emulator's NCCL model does.

A comment line ``# qsgd-emu: op=allreduce world_size=16 topology=cluster:p5x2`` (the header of
the published tables in tests/emulator/data/nccl_tests) supplies what a table copied from a web
page lost. Without a topology, :func:`infer_topology` names the preset the ranks' device names
and hosts point to (``NVIDIA H100 80GB HBM3`` on 2 hosts: ``cluster:dgx_h100x2``).
"""
from __future__ import annotations

import json
import os
import re

from ..errors import TraceError
from .trace import CollectivePoint, MeasuredTrace

__all__ = ["import_nccl_tests", "parse_nccl_tests_text", "parse_nccl_tests_json", "PROGRAMS",
           "infer_topology", "DEVICE_PRESETS"]

#: nccl-tests program name -> our op name.
PROGRAMS = {
    "all_reduce_perf": "allreduce", "all_gather_perf": "allgather",
    "reduce_scatter_perf": "reduce_scatter", "broadcast_perf": "broadcast",
    "reduce_perf": "reduce", "alltoall_perf": "alltoall",
}

#: nccl-tests type names (src/common.cu test_typenames) -> torch-style dtype names.
DTYPES = {
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
    "uint64": "uint64", "half": "float16", "float": "float32", "double": "float64",
    "bfloat16": "bfloat16", "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
}

_LABEL = re.compile(r"^\s*(\d+):\s?(.*)$")
# "Group N" appears from nccl-tests 2.10 on; older logs go straight to "Pid".
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+"
                   r"(\d+)\s+\[[^\]]*\]\s*(.*)$")
_ANNOTATION = re.compile(r"^#\s*qsgd-emu:\s*(.*)$")

#: Device name fragment (as nccl-tests prints it) -> the preset of the usual 8-GPU box, first
#: match wins. A100 and H100 SXM name the NVIDIA DGX; other vendors' boxes of those GPUs share
#: its links (the NICs may differ: pass --topology for a cloud instance, e.g. cluster:p5x2).
DEVICE_PRESETS = (
    ("B200", "hgx_b200"), ("H200", "hgx_h200"), ("H100 80GB HBM3", "dgx_h100"),
    ("H100-SXM", "dgx_h100"), ("A100-SXM", "dgx_a100"), ("V100-SXM2", "dgx1_v100"),
)


def infer_topology(environment: dict) -> str | None:
    """The topology spec the log's devices and hosts point to, or None if they do not.

    Parameters
    ----------
    environment : dict
        A MeasuredTrace environment with ``devices`` (one name per rank) and ``hosts``.

    Returns
    -------
    str or None
        A preset (one host) or ``cluster:PRESETxHOSTS``; None for unknown devices, mixed
        devices, or ranks that do not fill whole 8-GPU machines.

    Examples
    --------
    >>> infer_topology({"devices": ["NVIDIA H100 80GB HBM3"] * 16, "hosts": ["a", "b"]})
    'cluster:dgx_h100x2'
    """
    devices = environment.get("devices") or []
    hosts = environment.get("hosts") or []
    names = {str(d) for d in devices}
    if not devices or len(names) != 1 or not hosts:
        return None
    name = names.pop()
    preset = next((p for frag, p in DEVICE_PRESETS if frag in name), None)
    if preset is None or len(devices) != 8 * len(hosts):
        return None
    return preset if len(hosts) == 1 else f"cluster:{preset}x{len(hosts)}"


def _annotation(text: str) -> dict:
    """``key=value`` pairs of the ``# qsgd-emu:`` comment lines."""
    out = {}
    for line in text.splitlines():
        m = _ANNOTATION.match(line.strip())
        if m:
            for item in m.group(1).split():
                key, _, value = item.partition("=")
                if value:
                    out[key] = value
    return out
_PROGRAM = re.compile(r"#\s*Collective test (?:starting|concluded):\s*(\S+)")
_VERSION = re.compile(r"#\s*nccl-tests version\s+(\S+).*?nccl-library=(\d+)")


def import_nccl_tests(path: str | os.PathLike, *, op: str | None = None,
                      world_size: int | None = None, topology: str | None = None) -> MeasuredTrace:
    """Read a nccl-tests text log or ``-J`` JSON file into a :class:`MeasuredTrace`.

    Parameters
    ----------
    path : path-like
        The log (text or JSON; detected from the content).
    op : str, optional
        The collective (``"allreduce"``, ``"allgather"``, ...); default from the log
        (``# Collective test starting: all_reduce_perf``, the JSON ``args``) or the file name.
    world_size : int, optional
        Number of ranks; default the number of ``#  Rank`` lines.
    topology : str, optional
        A topology spec describing the cluster, kept in the environment for ``compare``;
        default the log's ``# qsgd-emu: topology=`` note, else :func:`infer_topology`.
        ``environment["topology_from"]`` says which (``"argument"``, ``"annotation"`` or
        ``"devices"``).

    Examples
    --------
    >>> import os, tempfile, emulator
    >>> log = "\\n".join([
    ...     "# Collective test starting: all_reduce_perf",
    ...     "#  Rank  0 Group  0 Pid  1 on host0 device  0 [0x07] NVIDIA A100-SXM4-80GB",
    ...     "#  Rank  1 Group  0 Pid  2 on host0 device  1 [0x0b] NVIDIA A100-SXM4-80GB",
    ...     "#       size    count   type  redop  root   time  algbw  busbw #wrong"
    ...     "   time  algbw  busbw #wrong",
    ...     "     1048576   262144  float    sum    -1  20.00  52.43  52.43      0"
    ...     "  19.50  53.77  53.77      0",
    ...     "     2097152   524288  float    sum    -1  30.00  69.91  69.91      0"
    ...     "  29.50  71.09  71.09      0"])
    >>> path = os.path.join(tempfile.mkdtemp(), "all_reduce_perf.log")
    >>> with open(path, "w") as f:
    ...     _ = f.write(log)
    >>> t = emulator.import_nccl_tests(path)
    >>> t.world_size, [(c.op, c.bytes, round(c.time_s * 1e6, 1)) for c in t.collectives]
    (2, [('allreduce', 1048576, 20.0), ('allreduce', 2097152, 30.0)])
    """
    source = "argument" if topology else None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise TraceError(f"{os.fspath(path)}: cannot read: {exc.strerror}") from None
    name = os.path.basename(os.fspath(path))
    if text.lstrip().startswith("{"):
        trace = parse_nccl_tests_json(text, op=op, world_size=world_size, source_name=name)
    else:
        note = _annotation(text)
        if op is None and "op" in note:
            op = note["op"]
        if world_size is None and "world_size" in note:
            try:
                world_size = int(note["world_size"])
            except ValueError:
                raise TraceError(f"{name}: '# qsgd-emu: world_size={note['world_size']}' is not "
                                 f"an integer") from None
        if not topology and note.get("topology"):
            topology, source = note["topology"], "annotation"
        trace = parse_nccl_tests_text(text, op=op, world_size=world_size, source_name=name)
    if not topology:
        topology = infer_topology(trace.environment)
        source = "devices" if topology else None
    if topology:
        trace.environment["topology"] = topology
        trace.environment["topology_from"] = source
    return trace


def _op_from(program: str | None, source_name: str, op: str | None, where: str) -> str:
    if op is not None:
        if op not in PROGRAMS.values():
            raise TraceError(f"op {op!r} unknown; expected one of {', '.join(PROGRAMS.values())}")
        return op
    for candidate in (program, source_name):
        if candidate:
            base = os.path.basename(candidate)
            for prog, name in sorted(PROGRAMS.items(), key=lambda kv: -len(kv[0])):
                if prog in base:
                    return name
    raise TraceError(f"{where}: cannot tell which collective this log measured (no "
                     "'# Collective test starting' line); pass op='allreduce' or --op")


def _environment(ranks: dict, world_size, version=None, nccl=None) -> dict:
    n = world_size if world_size is not None else len(ranks)
    if not n:
        raise TraceError("world_size: the log has no '#  Rank N ... on HOST device D' lines; "
                         "pass world_size (--world-size)")
    order = sorted(ranks)
    hosts = []
    for r in order:
        if ranks[r][0] not in hosts:
            hosts.append(ranks[r][0])
    env = {"backend": "nccl", "world_size": int(n), "hosts": hosts,
           "devices": [ranks[r][1] for r in order], "source": "nccl-tests"}
    if version:
        env["nccl_tests_version"] = version
    if nccl:
        env["nccl_version"] = nccl
    return env


def _point(op, size, count, typ, time_us, world_size, where, extra) -> CollectivePoint:
    if size <= 0:
        raise TraceError(f"{where}: size {size} must be > 0 bytes")
    if not time_us > 0:
        raise TraceError(f"{where}: out-of-place time {time_us!r} us must be > 0")
    return CollectivePoint.make(op, size, time_us * 1e-6, world_size, count=count,
                                dtype=DTYPES.get(typ, typ), samples_s=(), extra=extra,
                                algorithm="nccl")


def parse_nccl_tests_text(text: str, *, op=None, world_size=None, source_name="log") -> MeasuredTrace:
    """Parse the text output of a nccl-tests binary (see :func:`import_nccl_tests`)."""
    # Group lines by srun label (None when unlabelled), keeping original line numbers.
    groups: dict = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        m = _LABEL.match(raw)
        label, line = (int(m.group(1)), m.group(2)) if m else (None, raw)
        groups.setdefault(label, []).append((lineno, line))
    with_table = [label for label in groups if any(_is_header(line) for _, line in groups[label])]
    if not with_table:
        raise TraceError(f"{source_name}: no nccl-tests result table found (no '#  size  count  "
                         "type ...' header line)")
    # Unlabelled output first, else the lowest task label.
    lines = groups[min(with_table, key=lambda k: -1 if k is None else k)]
    # Rank/device lines may be printed by every task; collect them across all groups.
    ranks, program, version, nccl = {}, None, None, None
    for group in groups.values():
        for _, line in group:
            m = _RANK.match(line.strip())
            if m:
                ranks[int(m.group(1))] = (m.group(2), m.group(4).strip() or f"device {m.group(3)}")
            m = _PROGRAM.search(line)
            if m and program is None:
                program = m.group(1)
            m = _VERSION.search(line)
            if m:
                version, nccl = m.group(1), int(m.group(2))
    op = _op_from(program, source_name, op, source_name)
    env = _environment(ranks, world_size, version, nccl)
    p = env["world_size"]

    columns = None
    points = []
    for lineno, line in lines:
        stripped = line.strip()
        where = f"{source_name}: line {lineno}"
        if not stripped:
            continue
        if stripped.startswith("#"):
            if _is_header(line):
                columns = stripped.lstrip("#").split()
            continue
        if columns is None:
            continue  # NCCL INFO/WARN lines and banners before the table
        tokens = stripped.split()
        if not tokens[0].isdigit():
            if re.match(r"^[\d.]", tokens[0]):
                raise TraceError(f"{where}: not a result row: {stripped[:80]!r}")
            continue  # interleaved NCCL INFO / program output
        points.append(_row(tokens, columns, op, p, where, stripped))
    if not points:
        raise TraceError(f"{source_name}: the result table has no rows")
    return MeasuredTrace(environment=env, collectives=tuple(points))


def _is_header(line: str) -> bool:
    tokens = line.strip().lstrip("#").split()
    return len(tokens) >= 4 and tokens[0] == "size" and tokens[1] == "count" and "type" in tokens


def _row(tokens, columns, op, p, where, stripped) -> CollectivePoint:
    time_cols = [i for i, c in enumerate(columns) if c in ("time", "cputime")]
    if not time_cols:
        raise TraceError(f"{where}: header has no 'time' column")
    expected = len(columns) - (1 if columns[-1] == "timestamp" else 0)
    # A timestamp column holds 'YYYY-mm-dd HH:MM:SS': two tokens for one header word.
    n = len(tokens)
    if not (n == expected or (columns[-1] == "timestamp" and n == expected + 2)):
        raise TraceError(f"{where}: {n} fields where the header has {expected}: {stripped[:80]!r}")
    try:
        size = int(tokens[columns.index("size")])
        count = int(tokens[columns.index("count")])
        time_us = float(tokens[time_cols[0]])
        extra = {}
        if len(time_cols) > 1 and tokens[time_cols[1]] not in ("N/A",):
            extra["in_place_time_s"] = float(tokens[time_cols[1]]) * 1e-6
        for name in ("#wrong", "error"):
            if name in columns:
                value = tokens[columns.index(name)]
                if value != "N/A":
                    extra["wrong" if name == "#wrong" else "error"] = float(value)
                break
    except ValueError:
        raise TraceError(f"{where}: a number does not parse: {stripped[:80]!r}") from None
    typ = tokens[columns.index("type")]
    return _point(op, size, count, typ, time_us, p, where, extra)


def parse_nccl_tests_json(text: str, *, op=None, world_size=None, source_name="log.json") -> MeasuredTrace:
    """Parse the ``-J`` JSON report of a nccl-tests binary (JSON version 2)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{source_name}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{source_name}: top level is not an object")
    args = doc.get("args") or []
    program = args[0] if args and isinstance(args[0], str) else None
    op = _op_from(program, source_name, op, source_name)
    config = doc.get("config") or {}
    ranks = {}
    for i, d in enumerate(config.get("devices") or []):
        if not isinstance(d, dict) or "rank" not in d:
            raise TraceError(f"{source_name}: config.devices[{i}]: not a device record")
        ranks[int(d["rank"])] = (str(d.get("hostname", "?")),
                                 str(d.get("device_info") or f"device {d.get('device')}"))
    env = _environment(ranks, world_size, None, doc.get("nccl_version"))
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise TraceError(f"{source_name}: results: missing or empty")
    points = []
    for i, r in enumerate(results):
        where = f"{source_name}: results[{i}]"
        if not isinstance(r, dict):
            raise TraceError(f"{where}: not an object")
        oop = r.get("out_of_place")
        if not isinstance(oop, dict):
            raise TraceError(f"{where}.out_of_place: {oop!r} has no time")
        time_us = oop.get("time", oop.get("cpu_time"))
        try:
            size, count, time_us = int(r["size"]), int(r["count"]), float(time_us)
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"{where}: size/count/out_of_place.time missing or not numbers") from None
        extra = {}
        ip = r.get("in_place")
        if isinstance(ip, dict) and isinstance(ip.get("time"), (int, float)):
            extra["in_place_time_s"] = ip["time"] * 1e-6
        if isinstance(oop.get("nwrong"), (int, float)):
            extra["wrong"] = oop["nwrong"]
        points.append(_point(op, size, count, str(r.get("type", "float")), time_us,
                             env["world_size"], where, extra))
    return MeasuredTrace(environment=env, collectives=tuple(points))

