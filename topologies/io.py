"""Topology files: node-link JSON, GraphML and hand-written YAML/JSON descriptions.

- ``.json`` written by :func:`save`: ``networkx.node_link_data`` (edges under ``"links"``) plus
  ``"format": "qsgd-topology"`` and ``"version": 1`` (docs/formats.md).
- ``.graphml``: GraphML with typed keys, so ints, floats and strings come back as such; the
  graph carries ``format`` and ``version`` attributes, removed again on load.
- ``.yaml``/``.yml`` (or ``.json``) descriptions, ``"format": "qsgd-topology-spec"``:
  ``nodes: [{id, kind, rank?, ...}]`` and ``links: [{a, b, bandwidth, latency, link?, ...}]``
  where bandwidth and latency may carry units ("25GB/s", "1us"). :func:`save` writes this
  format for ``.yaml`` paths, with SI numbers.

Every load is validated; an error names the field as a path (``links[3].bandwidth``) or the
node or edge, and the value. A round trip through any of the three gives an identical graph.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import networkx as nx

from .errors import SpecError
from .units import parse_bandwidth, parse_time
from .validate import validate_topology

FORMAT = "qsgd-topology"
SPEC_FORMAT = "qsgd-topology-spec"
VERSION = 1


def _suffix(path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in (".json", ".graphml", ".yaml", ".yml"):
        raise SpecError(f"topology file {str(path)!r}: suffix {suffix!r} not supported "
                        f"(use .json, .graphml, .yaml or .yml)")
    return suffix


def save(G: nx.Graph, path) -> Path:
    """Write ``G`` to ``path`` (format chosen by the suffix) after validating it.

    Parameters
    ----------
    G : nx.Graph
        A valid topology.
    path : str or os.PathLike
        ``.json`` (node-link), ``.graphml`` or ``.yaml``/``.yml`` (a description).

    Returns
    -------
    pathlib.Path
        The path written.
    """
    validate_topology(G)
    path = Path(path)
    suffix = _suffix(path)
    if suffix == ".graphml":
        H = G.copy()
        H.graph["format"], H.graph["version"] = FORMAT, VERSION
        nx.write_graphml(H, path)
        return path
    if suffix == ".json":
        data = {"format": FORMAT, "version": VERSION,
                **nx.node_link_data(G, edges="links")}
        text = json.dumps(data, indent=1)
    else:
        import yaml
        data = {"format": SPEC_FORMAT, "version": VERSION,
                "name": G.graph.get("name", path.stem),
                "graph": {k: v for k, v in G.graph.items() if k != "name"},
                "nodes": [{"id": n, **d} for n, d in G.nodes(data=True)],
                "links": [{"a": a, "b": b, **d} for a, b, d in G.edges(data=True)]}
        text = yaml.safe_dump(data, sort_keys=False)
    path.write_text(text)
    return path


def load(path) -> nx.Graph:
    """Read a topology file written by :func:`save` or a hand-written description.

    Raises
    ------
    SpecError
        If the file cannot be parsed or a field is missing or bad (the message names it).
    ValidationError
        If the graph breaks the topology conventions.
    OSError
        If the file cannot be read.
    """
    suffix = _suffix(path)
    label = os.fspath(path)
    if suffix == ".graphml":
        try:
            G = nx.read_graphml(path)
        except (nx.NetworkXError, SyntaxError, ValueError) as exc:
            raise SpecError(f"topology file {label!r}: not valid GraphML ({exc})") from None
        if G.is_directed() or G.is_multigraph():
            raise SpecError(f"topology file {label!r}: graph must be undirected and simple")
        for key in ("node_default", "edge_default"):  # added by the reader, not ours
            if G.graph.get(key) == {}:
                del G.graph[key]
        fmt = G.graph.pop("format", FORMAT)
        version = G.graph.pop("version", VERSION)
        _check_header(label, fmt, version, (FORMAT,))
        return validate_topology(G)
    text = Path(path).read_text()
    try:
        if suffix == ".json":
            data = json.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        raise SpecError(f"topology file {label!r}: not valid {suffix[1:].upper()} ({exc})") from None
    return from_dict(data, source=label)


def _check_header(label, fmt, version, allowed):
    if fmt not in allowed:
        raise SpecError(f"topology file {label!r}: format={fmt!r} (expected "
                        f"{' or '.join(map(repr, allowed))})")
    if version != VERSION or isinstance(version, bool):
        raise SpecError(f"topology file {label!r}: version={version!r} is not supported "
                        f"(expected {VERSION})")


def from_dict(data, *, source: str = "<dict>") -> nx.Graph:
    """Build a validated graph from a parsed file (node-link or description format)."""
    if not isinstance(data, dict):
        raise SpecError(f"topology file {source!r}: top level must be a mapping, not "
                        f"{type(data).__name__}")
    if "format" not in data:
        raise SpecError(f"topology file {source!r}: format: missing (expected {FORMAT!r} or "
                        f"{SPEC_FORMAT!r})")
    _check_header(source, data["format"], data.get("version"), (FORMAT, SPEC_FORMAT))
    if data["format"] == FORMAT:
        body = {k: v for k, v in data.items() if k not in ("format", "version")}
        try:
            G = nx.node_link_graph(body, edges="links")
        except (KeyError, TypeError, nx.NetworkXError) as exc:
            raise SpecError(f"topology file {source!r}: not a node-link graph ({exc!r})") from None
        if G.is_directed() or G.is_multigraph():
            raise SpecError(f"topology file {source!r}: directed/multigraph must be false")
        return validate_topology(G)
    return _from_description(data, source)


def _from_description(data: dict, source: str) -> nx.Graph:
    def bad(where, msg):
        return SpecError(f"topology file {source!r}: {where}: {msg}")

    G = nx.Graph()
    graph_attrs = data.get("graph", {})
    if not isinstance(graph_attrs, dict):
        raise bad("graph", f"{graph_attrs!r} must be a mapping")
    G.graph.update(graph_attrs)
    G.graph["name"] = str(data.get("name", Path(source).stem))
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise bad("nodes", f"{nodes!r} must be a non-empty list")
    for i, item in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(item, dict):
            raise bad(where, f"{item!r} must be a mapping with id and kind")
        attrs = dict(item)
        node = attrs.pop("id", None)
        if not isinstance(node, str) or not node:
            raise bad(f"{where}.id", f"{node!r} must be a non-empty string")
        if node in G:
            raise bad(f"{where}.id", f"{node!r} is already defined")
        if "kind" not in attrs:
            raise bad(f"{where}.kind", "missing (gpu, switch, nic or cpu)")
        G.add_node(node, **attrs)
    links = data.get("links")
    if not isinstance(links, list):
        raise bad("links", f"{links!r} must be a list")
    for i, item in enumerate(links):
        where = f"links[{i}]"
        if not isinstance(item, dict):
            raise bad(where, f"{item!r} must be a mapping with a, b, bandwidth, latency")
        attrs = dict(item)
        ends = []
        for end in ("a", "b"):
            node = attrs.pop(end, None)
            if node not in G:
                raise bad(f"{where}.{end}", f"{node!r} is not a node")
            ends.append(node)
        if G.has_edge(*ends):
            raise bad(where, f"link {ends[0]!r} - {ends[1]!r} is already defined")
        for field, parse in (("bandwidth", parse_bandwidth), ("latency", parse_time)):
            if field not in attrs:
                raise bad(f"{where}.{field}", "missing")
            try:
                attrs[field] = parse(attrs[field])
            except SpecError as exc:
                raise bad(f"{where}.{field}", str(exc)) from None
        G.add_edge(*ends, **attrs)
    return validate_topology(G)
