"""``qsgd-emu dashboard``: serve the Dash dashboard (what-if, topology, live runs, validation).

Binds to 127.0.0.1:8050 by default; pass ``--host 0.0.0.0`` to serve other machines (the
dashboard has no authentication: do that only on a trusted network).
"""
from __future__ import annotations

import argparse


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port: {text!r} is not a whole number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"--port: {port} is outside 1..65535")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=_port, default=8050, help="TCP port")
    parser.add_argument("--store", default=None, metavar="PATH",
                        help="run store the Live page reads (default $QSGD_EMU_STORE or "
                             ".qsgd-emu/runs.sqlite)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="directory for background jobs (default: a temporary directory)")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, dev tools)")


def run(args: argparse.Namespace) -> int:
    from dashboards import create_app

    app = create_app(store_path=args.store, cache_dir=args.cache_dir)
    print(f"qsgd-emu dashboard: serving on http://{args.host}:{args.port}/", flush=True)
    app.run(host=args.host, port=args.port, debug=args.debug, use_reloader=args.debug)
    return 0
