"""The ``weightbridge store`` command as a child process (the external control store of tests and harnesses).

The test or harness process starts it, may SIGKILL it and start it again on the same port (a store
that comes back empty), and stops it in ``finally``. Bridge ranks connect to ``host:port`` with
the spec's ``sync.store: external``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class StoreProcess:
    """``python -m weightbridge store --port P --port-file F``; ``kill()`` (SIGKILL) and ``start()`` again
    on the same port. Always ``stop()`` it (the tests do, in ``finally``)."""

    def __init__(self, tmp: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.port_file = tmp / f"store-{os.getpid()}-{time.monotonic_ns()}.port"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> int:
        self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "weightbridge", "store", "--host", self.host, "--port", str(self.port),
             "--port-file", str(self.port_file)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        deadline = time.monotonic() + timeout_s
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"weightbridge store did not start (exit {self.proc.returncode})")
            time.sleep(0.05)
        host, port = self.port_file.read_text().strip().rsplit(":", 1)
        assert host == self.host
        self.port = int(port)
        return self.port

    def kill(self) -> None:
        """SIGKILL the store process (every key is lost with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM ``proc`` (a store process), SIGKILL it if it has not exited within 10 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
