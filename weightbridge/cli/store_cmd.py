"""``weightbridge store [--host H] [--port P] [--port-file F] [--secret-file S]``: host the control store until killed.

The process a launcher starts before any bridge rank, so that no rank (trainer 0 included) takes the
store down when it dies: every rank then connects to it (spec ``sync.store: external``, ``from_spec(host=H,
port=P)``). It prints ``host:port`` on stdout as soon as the store listens (``--port 0``: a free port,
chosen by the OS), writes the same line to ``--port-file`` (atomically: a launcher may poll for the
file), and serves until SIGTERM / SIGINT (exit 0). A port that cannot be bound exits 2 with one line.
The store is bounded (:mod:`weightbridge.transport.store_server`); given the job secret
(``$WEIGHTBRIDGE_SECRET`` or ``--secret-file``), no value written without it displaces the job's keys.
See ``docs/control_store.md``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from weightbridge.cli.common import EXIT_OK, EXIT_USAGE, check_output_path, positive_float


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store", help="host the control store in its own process until killed (sync.store: external)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on and to print (default 127.0.0.1; 0.0.0.0 = every interface)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one, printed)")
    p.add_argument("--port-file", default=None, metavar="FILE", help="also write host:port to FILE (atomically)")
    p.add_argument("--timeout-s", type=positive_float, default=300.0,
                   help="accepted for compatibility (the store has no timeout of its own: clients bound their calls)")
    p.add_argument("--secret-file", default=None, metavar="FILE",
                   help="the job secret (default: $WEIGHTBRIDGE_SECRET if set): values sealed with it are the job's")
    p.set_defaults(func=run)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        print(f"weightbridge store: --port must be in [0, 65535], got {args.port}", file=sys.stderr)
        return EXIT_USAGE
    port_file = check_output_path(args.port_file, "--port-file") if args.port_file else None
    from weightbridge.transport.store import listen_socket
    from weightbridge.transport.store_host import serve

    secret = os.environ.get("WEIGHTBRIDGE_SECRET", "").encode() or None
    if args.secret_file:
        try:
            secret = Path(args.secret_file).expanduser().read_bytes().strip() or None
        except OSError as exc:
            print(f"weightbridge store: --secret-file {args.secret_file}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        listener = socket.socket(fileno=listen_socket(args.host, args.port))
    except OSError as exc:
        print(f"weightbridge store: cannot host the control store: {exc} ({args.host}:{args.port})", file=sys.stderr)
        return EXIT_USAGE

    def ready(server) -> None:
        line = f"{args.host}:{server.port}"
        if port_file is not None:
            _write_atomically(port_file, line + "\n")
        print(line, flush=True)
        print(f"weightbridge store: serving {line} (store id {server.store_id}, "
              f"{'keyed by the job secret' if secret else 'no job secret: one pool for every value'}) until SIGTERM",
              file=sys.stderr, flush=True)

    serve(listener, secret=secret, on_ready=ready)
    return EXIT_OK
