"""Text specs for people and the CLI: ``ring:8``, ``fat_tree:k=8,bw=100Gbit``, ``dgx_a100``.

Grammar: ``family[:item,item,...]`` where an item is ``key=value`` or a positional value
(``ring:8``, ``torus:4x4x4``, ``cluster:dgx_a100x4``). Values with units (``bw=25GB/s``,
``lat=2us``) are parsed here and only here. :data:`FAMILIES` maps each family to its builder
and parameters; errors name the part of the spec that was not understood.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Callable

import networkx as nx

from .cluster import FABRICS, cluster
from .dragonfly import dragonfly
from .errors import SpecError
from .fat_tree import fat_tree
from .generic import fully_connected, ring, switch
from .leaf_spine import leaf_spine
from .machines import PRESETS, pcie_box
from .torus import torus
from .units import parse_bandwidth, parse_time
from .validate import validate_topology

FILE_SUFFIXES = (".json", ".yaml", ".yml", ".graphml")


def _int(text: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", text.strip()):
        raise ValueError("not an integer")
    return int(text)


def _float(text: str) -> float:
    return float(text)


def _onoff(text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise ValueError("expected on or off")


def _dims(text: str) -> tuple:
    parts = text.lower().split("x")
    return tuple(_int(p) for p in parts)


def _str(text: str) -> str:
    if not text:
        raise ValueError("empty")
    return text


def _node_count(text: str) -> tuple:
    """``dgx_a100x4`` -> ("dgx_a100", 4)."""
    m = re.fullmatch(r"(.+?)x(\d+)", text)
    if not m:
        raise ValueError("expected MACHINExCOUNT such as dgx_a100x4")
    return m.group(1), int(m.group(2))


_BW = ("bandwidth", parse_bandwidth)
_LAT = ("latency", parse_time)
_LINK = ("link", _str)
_COMMON = {"bw": _BW, "bandwidth": _BW, "lat": _LAT, "latency": _LAT, "link": _LINK}


@dataclass(frozen=True)
class Family:
    """How a spec family maps onto its builder.

    Attributes
    ----------
    builder : callable
        Returns an ``nx.Graph``.
    params : dict
        spec key -> (builder keyword, converter from text).
    positional : tuple of str
        spec keys taken, in order, by items without ``=``.
    help : str
        An example spec.
    """

    builder: Callable
    params: dict = field(default_factory=dict)
    positional: tuple = ()
    help: str = ""


def _n_family(builder, example):
    return Family(builder, {"n": ("n", _int), **_COMMON}, ("n",), example)


FAMILIES: dict[str, Family] = {
    "ring": _n_family(ring, "ring:8,bw=100Gbit,lat=1us"),
    "fully_connected": _n_family(fully_connected, "fully_connected:4"),
    "switch": _n_family(switch, "switch:16,bw=10Gbit,lat=5us"),
    "torus": Family(torus, {"dims": ("dims", _dims), **_COMMON}, ("dims",), "torus:4x4x4"),
    "fat_tree": Family(fat_tree, {"k": ("k", _int), **_COMMON}, ("k",), "fat_tree:k=8,bw=100Gbit"),
    "leaf_spine": Family(leaf_spine, {
        "leaves": ("leaves", _int), "spines": ("spines", _int),
        "hosts": ("hosts_per_leaf", _int), "hosts_per_leaf": ("hosts_per_leaf", _int),
        "oversub": ("oversubscription", _float), "oversubscription": ("oversubscription", _float),
        "uplink_bw": ("uplink_bandwidth", parse_bandwidth), **_COMMON,
    }, ("leaves", "spines", "hosts"), "leaf_spine:leaves=4,spines=2,hosts=8,oversub=3"),
    "dragonfly": Family(dragonfly, {
        "groups": ("groups", _int), "routers": ("routers", _int), "hosts": ("hosts", _int),
        "global_links": ("global_links", _int), "h": ("global_links", _int),
        "global_bw": ("global_bandwidth", parse_bandwidth),
        "global_lat": ("global_latency", parse_time), **_COMMON,
    }, ("groups",), "dragonfly:groups=9,routers=4,hosts=2,global_links=2"),
    "pcie_box": Family(pcie_box, {
        "gpus": ("gpus", _int), "gpus_per_switch": ("gpus_per_switch", _int),
        "gen": ("pcie_gen", _int), "pcie_gen": ("pcie_gen", _int),
        "nic_bw": ("nic_bandwidth", parse_bandwidth), "nics": ("nics", _int),
        "layout": ("layout", _str), "sockets": ("sockets", _int), "cpu": ("cpu", _str),
        "p2p": ("p2p", _onoff), "gpu": ("gpu_model", _str),
    }, ("gpus",), "pcie_box:gpus=8,gen=4,gpu=RTX4090,layout=root,cpu=zen4,p2p=off"),
    "cluster": Family(cluster, {
        "machines": (("node", "nodes"), _node_count),
        "node": ("node", _str), "nodes": ("nodes", _int), "fabric": ("fabric", _str),
        "nic_bw": ("nic_bandwidth", parse_bandwidth), "lat": _LAT, "latency": _LAT,
        "link": _LINK, "hosts_per_leaf": ("hosts_per_leaf", _int), "spines": ("spines", _int),
        "oversub": ("oversubscription", _float), "oversubscription": ("oversubscription", _float),
        "k": ("k", _int), "nodes_per_unit": ("nodes_per_unit", _int),
        "transport": ("transport", _str), "p2p": ("p2p", _onoff),
    }, ("machines",), "cluster:dgx_a100x4,fabric=leaf_spine"),
}
# Every other preset takes no parameter: the spec is its name.
FAMILIES.update({name: Family(build, help=name) for name, build in PRESETS.items()
                 if name not in FAMILIES})
assert set(PRESETS) <= set(FAMILIES)


def did_you_mean(name: str, known) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to a mistyped ``name``, or ''."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
assert set(FABRICS) == {"leaf_spine", "fat_tree", "rail"}


def parse_spec(spec: str) -> tuple[str, dict]:
    """Split a spec into (family, builder keyword arguments), converting units.

    Raises
    ------
    SpecError
        Naming the family, item or value that was not understood.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"spec {spec!r} is empty; expected e.g. 'ring:8' or 'dgx_a100'")
    text = spec.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    fam = FAMILIES.get(name)
    if fam is None:
        raise SpecError(f"spec {spec!r}: family {name!r} is not known"
                        f"{did_you_mean(name, FAMILIES)}; known: {', '.join(FAMILIES)}")
    kwargs: dict = {}
    positional = list(fam.positional)
    items = [s.strip() for s in rest.split(",")] if rest.strip() else []
    for item in items:
        if not item:
            raise SpecError(f"spec {spec!r}: empty item (a stray comma?)")
        if "=" in item:
            key, _, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if key in positional:
                positional.remove(key)
        else:
            if not positional:
                raise SpecError(f"spec {spec!r}: item {item!r} not understood: {name} takes "
                                f"no more positional values (use key=value; e.g. {fam.help})")
            key, value = positional.pop(0), item
        if key not in fam.params:
            known = ", ".join(fam.params) or "none"
            raise SpecError(f"spec {spec!r}: parameter {key!r} is not known for {name} "
                            f"(known: {known})")
        target, convert = fam.params[key]
        try:
            converted = convert(value)
        except SpecError as exc:
            raise SpecError(f"spec {spec!r}: {key}: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise SpecError(f"spec {spec!r}: {key}={value!r} not understood ({exc})") from None
        if isinstance(target, tuple):
            kwargs.update(zip(target, converted))
        else:
            kwargs[target] = converted
    return name, kwargs


def is_file_spec(spec) -> bool:
    """True if ``spec`` names a topology file rather than a text spec."""
    if isinstance(spec, os.PathLike):
        return True
    return isinstance(spec, str) and (spec.lower().endswith(FILE_SUFFIXES)
                                      or os.path.isfile(spec))


def from_spec(spec) -> nx.Graph:
    """Build (or load) a validated topology from a spec string or a file path.

    Parameters
    ----------
    spec : str or os.PathLike
        A text spec such as ``"fat_tree:k=8,bw=100Gbit"``, ``"cluster:dgx_a100x4,fabric=rail"``
        or a path to a ``.json``, ``.yaml`` or ``.graphml`` topology file.

    Returns
    -------
    nx.Graph
        With graph attribute ``name`` = the spec (files keep their stored name).

    Raises
    ------
    SpecError
        If the spec is not understood; ``ValidationError`` if the result breaks the rules.
    """
    if is_file_spec(spec):
        from .io import load
        return load(spec)
    name, kwargs = parse_spec(spec)
    try:
        G = FAMILIES[name].builder(**kwargs)
    except SpecError as exc:
        raise SpecError(f"spec {spec!r}: {exc}") from None
    G.graph["name"] = spec.strip()
    return validate_topology(G)
