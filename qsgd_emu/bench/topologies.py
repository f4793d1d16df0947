"""``qsgd-emu bench topologies``: build big clusters and route every ring neighbour.

For each case the table gives the build time (spec to validated graph), the router set-up
time, and the time to route all N ring-neighbour flows (rank r -> r+1, the pattern of a ring
allreduce) with :class:`topologies.Router`. The baseline, measured in the same run, is
``networkx.shortest_path(G, s, d, weight="latency")`` per pair (a single path, no ECMP) and
``networkx.all_shortest_paths`` (the equal-cost set an ECMP router needs), each on a seeded
sample of ``--baseline-pairs`` pairs and extrapolated to all N; ``speedup`` is baseline /
(router set-up + routing).
"""
from __future__ import annotations

import argparse
import json
import random
import time

import networkx as nx

from topologies import Router, from_spec, gpus

CASES = (
    "fat_tree:k=16",
    "cluster:dgx_a100x128,fabric=leaf_spine",
    "fat_tree:k=32",
    "cluster:dgx_a100x1024,fabric=leaf_spine",
    "cluster:dgx_a100x1024,fabric=rail",
    "cluster:dgx_a100x1024,fabric=fat_tree",
    "cluster:dgx_h100x1024,fabric=rail",
)


def _gpu_count(spec: str) -> int:
    if spec.startswith("fat_tree:k="):
        k = int(spec.split("=")[1])
        return k ** 3 // 4
    return 8 * int(spec.split(":")[1].split(",")[0].rsplit("x", 1)[1])


def bench_case(spec: str, baseline_pairs: int) -> dict:
    t0 = time.perf_counter()
    G = from_spec(spec)
    t1 = time.perf_counter()
    router = Router(G)
    t2 = time.perf_counter()
    order = gpus(G)
    n = len(order)
    hops = 0
    for r in range(n):
        hops += len(router.channels(order[r], order[(r + 1) % n], r))
    t3 = time.perf_counter()
    # A seeded sample of ring pairs: intra-machine and cross-machine pairs in proportion.
    sample = random.Random(0).sample(range(n), min(baseline_pairs, n))
    for r in sample:
        nx.shortest_path(G, order[r], order[(r + 1) % n], weight="latency")
    t4 = time.perf_counter()
    for r in sample:
        list(nx.all_shortest_paths(G, order[r], order[(r + 1) % n], weight="latency"))
    t5 = time.perf_counter()
    route_s = t3 - t2
    baseline_s = (t4 - t3) / len(sample) * n
    ecmp_s = (t5 - t4) / len(sample) * n
    return {"spec": spec, "gpus": n, "nodes": G.number_of_nodes(), "links": G.number_of_edges(),
            "build_s": t1 - t0, "router_s": t2 - t1, "route_s": route_s,
            "mean_hops": hops / n, "baseline_s": baseline_s, "baseline_ecmp_s": ecmp_s,
            "speedup": baseline_s / (route_s + (t2 - t1)),
            "speedup_ecmp": ecmp_s / (route_s + (t2 - t1))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-gpus", type=int, default=8192,
                        help="skip cases with more GPUs")
    parser.add_argument("--baseline-pairs", type=int, default=16,
                        help="pairs routed by the networkx baseline (extrapolated to all)")
    parser.add_argument("--json", action="store_true", help="print rows as JSON")


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':<40} {'gpus':>6} {'nodes':>6} {'links':>6} {'build s':>8} "
            f"{'router s':>8} {'route s':>8} {'hops':>5} {'nx 1-path s':>11} {'nx ECMP s':>10} "
            f"{'speedup 1p/ECMP':>15}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['spec']:<40} {r['gpus']:>6} {r['nodes']:>6} {r['links']:>6} "
                     f"{r['build_s']:>8.2f} {r['router_s']:>8.2f} {r['route_s']:>8.2f} "
                     f"{r['mean_hops']:>5.1f} {r['baseline_s']:>11.1f} {r['baseline_ecmp_s']:>10.1f} "
                     f"{r['speedup']:>7.1f}x/{r['speedup_ecmp']:>6.0f}x")
    lines.append("route s: all N ring-neighbour flows with ECMP. nx 1-path s / nx ECMP s: "
                 "networkx.shortest_path / all_shortest_paths per pair (weight=latency), "
                 "extrapolated from a seeded sample of pairs. speedup = each / (router + route)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.max_gpus < 1 or args.baseline_pairs < 1:
        raise ValueError(f"--max-gpus={args.max_gpus} and --baseline-pairs="
                         f"{args.baseline_pairs} must be >= 1")
    rows = [bench_case(spec, args.baseline_pairs) for spec in CASES
            if _gpu_count(spec) <= args.max_gpus]
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0
