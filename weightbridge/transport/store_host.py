"""Where the bounded control store runs: this process (``weightbridge store``), or a child that exits with it.

:func:`serve` runs :class:`~weightbridge.transport.store_server.StoreServer` in this process until
SIGTERM / SIGINT. :func:`spawn` starts it in a child process (``python -m
weightbridge.transport.store_host FD``) on a socket this process bound (so the port is known, and
bound where the caller said, before the child runs); the child reads its config (limits, the job
secret) from its stdin, never its command line, and exits when its stdin closes or its parent dies
(trainer rank 0 killed takes its store with it, as ``sync.store: trainer0`` says).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import sys
from dataclasses import asdict
from typing import Any

from weightbridge.transport.store_server import Limits, StoreServer


def serve(listener: socket.socket, *, secret: bytes | None = None, limits: Limits = Limits(),
          on_ready: Any = None) -> None:
    """Serve on ``listener`` in this process until SIGTERM / SIGINT (``weightbridge store``)."""
    import signal

    server = StoreServer(listener, secret=secret, limits=limits)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    if on_ready is not None:
        on_ready(server)
    server.run()


def spawn(listener: socket.socket, *, secret: bytes | None = None, limits: Limits = Limits()) -> Any:
    """Serve on ``listener`` in a child process that exits with this one; returns the ``Popen`` (the
    caller keeps it, and the pipe to its stdin, for as long as the store must live). ``listener``
    is handed over (closed here). The secret travels on the child's stdin, never its command line."""
    import subprocess

    import weightbridge

    fd = listener.fileno()
    here = os.path.dirname(os.path.dirname(os.path.abspath(weightbridge.__file__)))  # this weightbridge, not another
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightbridge.transport.store_host", str(fd)],
        stdin=subprocess.PIPE, pass_fds=(fd,), close_fds=True, env={**os.environ, "PYTHONPATH": path},
    )
    listener.close()
    config = {"secret": None if not secret else secret.decode("latin-1"), "limits": asdict(limits)}
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(config) + "\n").encode())
    proc.stdin.flush()
    return proc


def _child_main(fd: int) -> None:
    """The child of :func:`spawn`: read the config line, then serve until stdin closes or the parent dies."""
    parent = os.getppid()
    line = sys.stdin.buffer.readline()
    config = json.loads(line) if line else {}
    secret = config.get("secret")
    server = StoreServer(socket.socket(fileno=fd), secret=None if secret is None else secret.encode("latin-1"),
                         limits=Limits(**config.get("limits", {})))
    os.set_blocking(0, False)

    def stdin_readable() -> None:
        try:
            if not os.read(0, 4096):
                server.stop()  # the parent closed the pipe (or died)
        except BlockingIOError:
            pass
        except OSError:
            server.stop()

    server.sel.register(0, selectors.EVENT_READ, stdin_readable)
    server.run(until=lambda: os.getppid() != parent)


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
