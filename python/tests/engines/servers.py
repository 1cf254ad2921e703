"""Real engine servers as child processes: start, wait until they answer, stop, kill.

Shared by the SGLang and vLLM real-engine suites. A server's output goes to
a log file kept for a failing test's report; every wait is bounded and
fails naming what it waited for and the log's tail; a server that dies
while it is waited on fails the wait at once instead of at its bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

# How long an engine may take to load the tiny model and warm up on a loaded
# 2-core machine (vLLM's CPU engine compiles and profiles before serving).
START_TIMEOUT = float(os.environ.get("PDLINK_ENGINE_START_TIMEOUT", "600"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One engine server child, in its own process group (its workers die with it)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        log_dir: Path,
        env: dict[str, str] | None = None,
        health_path: str = "/health",
    ) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.health_path = health_path
        self.log_path = Path(log_dir) / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        end = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before serving:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + self.health_path, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > end:
                raise TimeoutError(f"{self.name} not serving within {timeout}s:\n{self.tail()}")
            time.sleep(0.5)

    def post(self, path: str, body: dict, timeout: float = 120) -> dict:
        """POSTs JSON and returns the JSON answer; an HTTP error raises with its body."""
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            raise HTTPStatusError(err.code, err.read().decode(errors="replace")) from None

    def get(self, path: str, timeout: float = 30) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read().decode()

    def kill(self) -> None:
        """kill -9 of the whole process group (the server and its workers)."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def stop(self, grace: float = 20) -> None:
        """SIGTERM, then kill -9 of what is left after grace seconds."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body
