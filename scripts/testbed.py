#!/usr/bin/env python3
"""The namespace testbed from a shell (root): check it works, run a command per host, clean up.

    scripts/testbed.py check
    scripts/testbed.py run --hosts 4 --rate 1Gbit [--timeout 120] -- python -m testbench.harness --out t.json
    scripts/testbed.py cleanup          # namespaces left by killed runs (their pid is gone)

``run`` starts the command once per host, inside its namespace, with RANK, WORLD_SIZE,
MASTER_ADDR (host 0), MASTER_PORT and GLOO_SOCKET_IFNAME set; it prints each rank's output and
exits non-zero if a rank failed or timed out. Everything is torn down on exit, error or Ctrl-C.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="network-namespace testbed")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("check", help="say whether a testbed can be built here")
    sub.add_parser("cleanup", help="delete testbed namespaces of dead processes")
    r = sub.add_parser("run", help="run a command in every host namespace")
    r.add_argument("--hosts", type=int, default=2)
    r.add_argument("--rate", default=None, help="link rate per host and direction, e.g. 1Gbit")
    r.add_argument("--shaper", default="tbf", choices=("tbf", "htb"))
    r.add_argument("--timeout", type=float, default=300.0, help="bound on the run, seconds")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and arguments")
    args = ap.parse_args(argv)

    from testbench.testbed import Testbed, TestbedConfig, available, cleanup_stale

    if args.action == "check":
        ok, why = available()
        print("testbed available" if ok else f"testbed unavailable: {why}")
        return 0 if ok else 1
    if args.action == "cleanup":
        removed = cleanup_stale()
        print(f"removed {len(removed)} namespaces" + (": " + " ".join(removed) if removed else ""))
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("run: give the command after --")
    rate = None
    if args.rate:
        import topologies
        rate = topologies.parse_bandwidth(args.rate)
    try:
        with Testbed(TestbedConfig(hosts=args.hosts, rate=rate, shaper=args.shaper)) as tb:
            results = tb.run(cmd, timeout_s=args.timeout, cwd=os.getcwd())
    except ValueError as exc:
        print(f"testbed: error: {exc}", file=sys.stderr)
        return 2
    rc = 0
    for res in results:
        status = "timed out" if res.timed_out else f"exit {res.returncode}"
        print(f"--- rank {res.rank} ({status}, {res.wall_s:.1f} s)")
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        rc = rc or (1 if res.timed_out or res.returncode else 0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
