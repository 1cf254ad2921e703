"""Real prefilld and decoded children on loopback, as the Go e2e testbed runs them.

Each daemon gets its own unix socket, region dir and port-0 listeners; its
JSON log line "serving" names what it bound, and restart() runs it again on
the same addresses (the socket path, the bootstrap and HTTP ports pinned).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("PDLINK_BIN_DIR", REPO / "bin"))

# How long a daemon may take to log "serving" on a loaded machine.
START_TIMEOUT = 30.0


class Daemon:
    """One daemon child; logs are kept for a failing test's report."""

    def __init__(self, name: str, tmp: Path, extra: list[str]) -> None:
        binary = BIN / name
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"{binary} missing: run `make build` first (or set PDLINK_BIN_DIR)")
        self.name = name
        self.region_dir = tmp / f"{name}-regions"
        self.region_dir.mkdir()
        self.socket = tmp / f"{name}.sock"
        self.address = f"unix://{self.socket}"
        self.args = [
            str(binary),
            f"--grpc-listen={self.address}",
            "--http-listen=127.0.0.1:0",
            f"--region-dir={self.region_dir}",
            *extra,
        ]
        self.logs: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.bootstrap = ""
        self.http = ""
        self.start()

    def start(self) -> None:
        self.logs = []
        serving = threading.Event()
        proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.proc = proc

        def scan() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.logs.append(line.rstrip("\n"))
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("msg") == "bootstrap socket bound":
                    self.bootstrap = entry.get("addr", "")
                if entry.get("msg") == "serving":
                    self.http = entry.get("http", "")
                    serving.set()
            serving.set()  # stderr closed: the child exited

        threading.Thread(target=scan, name=f"{self.name} log", daemon=True).start()
        if not serving.wait(START_TIMEOUT) or proc.poll() is not None:
            self.kill()
            raise RuntimeError(f"{self.name} did not start serving:\n" + "\n".join(self.logs))
        # A restart comes back on the same ports.
        self._pin("--http-listen", self.http)
        if self.bootstrap:
            self._pin("--bootstrap-listen", self.bootstrap)

    def _pin(self, flag: str, value: str) -> None:
        self.args = [a for a in self.args if not a.startswith(flag + "=")] + [f"{flag}={value}"]

    def kill(self) -> None:
        """SIGKILL, as a crash: no drain, no goodbye to the peer."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Kill and start again on the same socket and ports."""
        self.kill()
        self.start()


class Pair:
    """A prefilld and a decoded, told about each other only through rooms."""

    def __init__(
        self, tmp: Path, prefill_extra: tuple[str, ...] = (), decode_extra: tuple[str, ...] = ()
    ) -> None:
        self.prefill = Daemon(
            "prefilld", tmp, ["--bootstrap-listen=tcp://127.0.0.1:0", *prefill_extra]
        )
        try:
            self.decode = Daemon("decoded", tmp, ["--data-listen=127.0.0.1:0", *decode_extra])
        except BaseException:
            self.prefill.kill()
            raise

    def kill(self) -> None:
        """The end of a test: no drain (live rooms would hold SIGTERM for --drain-timeout)."""
        self.decode.kill()
        self.prefill.kill()

    def logs(self) -> str:
        return "\n".join(
            ["--- prefilld", *self.prefill.logs[-50:], "--- decoded", *self.decode.logs[-50:]]
        )
