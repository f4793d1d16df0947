"""``qsgd-emu topology SPEC``: build a topology and print the figures users ask first.

SPEC is a text spec (``fat_tree:k=8,bw=100Gbit``, ``cluster:dgx_a100x4,fabric=rail``) or a
topology file (.json, .yaml, .graphml). ``--json`` prints the summary as JSON; ``--save``
writes the graph; ``--route A B`` prints the route between two ranks or node ids.
"""
from __future__ import annotations

import argparse
import json

import topologies


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="topology spec (e.g. ring:8, dgx_a100, "
                        "cluster:dgx_a100x4,fabric=leaf_spine) or a .json/.yaml/.graphml file")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--save", metavar="PATH",
                        help="also write the graph (.json node-link, .graphml or .yaml)")
    parser.add_argument("--route", nargs=2, metavar=("SRC", "DST"),
                        help="print the route between two GPU ranks or node ids")
    parser.add_argument("--flow", default="0", help="flow label for --route (ECMP choice)")


def _gb(value: float) -> str:
    return f"{value / 1e9:,.2f} GB/s"


def _us(value: float) -> str:
    return f"{value * 1e6:.3g} us"


def _resolve(G, order, text: str):
    if text in G:
        return text
    try:
        rank = int(text)
    except ValueError:
        raise topologies.SpecError(f"--route: {text!r} is neither a node id nor a rank") from None
    if not 0 <= rank < len(order):
        raise topologies.SpecError(f"--route: rank {rank} is out of range 0..{len(order) - 1}")
    return order[rank]


def format_summary(s: dict) -> str:
    rows = [
        ("topology", s["name"]),
        ("GPUs", f"{s['gpus']:,}"),
        ("nodes", f"{s['nodes']:,} ({s['switches']:,} switches, {s['nics']:,} NICs, "
                  f"{s['cpus']:,} CPUs)"),
        ("links", f"{s['links']:,}"),
        ("total bandwidth", _gb(s["total_bandwidth"]) + " (sum over links, per direction)"),
        ("bisection bandwidth", _gb(s["bisection_bandwidth"]) + " (min cut between rank halves)"),
        ("diameter", f"{s['diameter']} hops"),
        ("link bandwidth", f"{_gb(s['min_link_bandwidth'])} .. {_gb(s['max_link_bandwidth'])}"),
        ("link latency", f"{_us(s['min_link_latency'])} .. {_us(s['max_link_latency'])}"),
    ]
    for cls, count in s["links_by_class"].items():
        rows.append((f"  {cls} links", f"{count:,} ({_gb(s['bandwidth_by_class'][cls])} in all)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(args: argparse.Namespace) -> int:
    G = topologies.from_spec(args.spec)
    s = topologies.summary(G)
    if args.save:
        s["saved"] = str(topologies.save(G, args.save))
    if args.route:
        order = topologies.gpus(G)
        src, dst = (_resolve(G, order, t) for t in args.route)
        router = topologies.Router(G)
        s["route"] = {"src": src, "dst": dst, "flow": args.flow,
                      "path": list(router.path(src, dst, args.flow)),
                      "latency_s": router.latency(src, dst, args.flow),
                      "equal_cost_paths": len(router.equal_cost_paths(src, dst))}
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(format_summary(s))
    if args.save:
        print(f"saved to {s['saved']}")
    if args.route:
        r = s["route"]
        print(f"route {r['src']} -> {r['dst']} (flow {r['flow']}): {' -> '.join(r['path'])}; "
              f"{_us(r['latency_s'])}; {r['equal_cost_paths']} equal-cost path(s)")
    return 0
