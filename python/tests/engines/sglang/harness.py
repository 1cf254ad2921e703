"""Real SGLang servers for the suite: the colocated oracle and PD servers beside daemons.

Every server runs SGLang 0.5.23's own `python -m sglang.launch_server` on
its CPU engine with the tiny Llama (float32, pages of 16 tokens,
torch_native attention). A disaggregated request goes to the prefill and
the decode server at once with the same bootstrap host, port and room, as
SGLang's router sends it (0.5.23 ships no mini_lb; the router is a
separate package).
"""

from __future__ import annotations

import json
import random
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

from servers import Server, free_port

from pdlink.client import wait_for

HERE = Path(__file__).resolve().parent
REPO_PYTHON = HERE.parents[2]  # python/: the worktree's pdlink
STANDINS = HERE / "kernel_standins"
PAGE = 16
MAX_TOTAL_TOKENS = 4096
STANDIN_MARK = "sgl_kernel stand-in called"


def base_argv(model_dir: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--disable-cuda-graph",
        "--dtype",
        "float32",
        "--page-size",
        str(PAGE),
        "--max-total-tokens",
        str(MAX_TOTAL_TOKENS),
        # On CPU SGLang sizes pools from host memory: without these it takes
        # gigabytes per server.
        "--mem-fraction-static",
        "0.1",
        "--context-length",
        "2048",
    ]


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_HOST_IP": "127.0.0.1",
        "PYTHONPATH": f"{STANDINS}:{REPO_PYTHON}",
        **(extra or {}),
    }


def colocated(name: str, model_dir: Path, log_dir: Path) -> Server:
    port = free_port()
    return Server(name, base_argv(model_dir, port), port=port, log_dir=log_dir, env=server_env())


def prefill_server(
    name: str, model_dir: Path, log_dir: Path, daemon, *, extra: tuple[str, ...] = ()
) -> Server:
    """A prefill server beside prefilld `daemon`; .bootstrap_port is SGLang's bootstrap server."""
    port, bport = free_port(), free_port()
    argv = [
        *base_argv(model_dir, port),
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-transfer-backend",
        "pdlink",
        "--disaggregation-bootstrap-port",
        str(bport),
        *extra,
    ]
    env = server_env(
        {
            "PDLINK_PREFILLD_ADDR": daemon.address,
            "PDLINK_REGION_DIR": str(daemon.region_dir),
            "PDLINK_PREFILL_BOOTSTRAP": daemon.bootstrap,
            "PDLINK_STAGING_SLOTS": "512",
            "PDLINK_DAEMON_LOST_TIMEOUT": "3",
            # SGLang 0.5.23 sends a chunked request's already-computed pages
            # early and, under its overlap scheduler, records a
            # torch.cuda.Event on the forward stream for that, which raises on
            # CPU ("expected stream to be a torch.Stream"). SGLang's own switch
            # for the optional early send; the chunks still go as they finish.
            "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "false",
        }
    )
    srv = Server(name, argv, port=port, log_dir=log_dir, env=env)
    srv.bootstrap_port = bport
    return srv


def decode_server(
    name: str, model_dir: Path, log_dir: Path, daemon, *, extra: tuple[str, ...] = ()
) -> Server:
    port = free_port()
    argv = [
        *base_argv(model_dir, port),
        "--disaggregation-mode",
        "decode",
        "--disaggregation-transfer-backend",
        "pdlink",
        *extra,
    ]
    env = server_env(
        {
            "PDLINK_DECODED_ADDR": daemon.address,
            "PDLINK_REGION_DIR": str(daemon.region_dir),
            "PDLINK_STAGING_SLOTS": "512",
            "PDLINK_DAEMON_LOST_TIMEOUT": "3",
        }
    )
    return Server(name, argv, port=port, log_dir=log_dir, env=env)


def sampling(max_new: int) -> dict:
    return {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}


def generate(srv: Server, ids: list[int], max_new: int, **fields) -> dict:
    return srv.post("/generate", {"input_ids": ids, "sampling_params": sampling(max_new), **fields})


def new_room() -> int:
    return random.getrandbits(62) or 1


def pd_generate(
    prefill: Server, decode: Server, ids: list[int], max_new: int, room: int | None = None
) -> tuple[dict, dict]:
    """One disaggregated request, sent to both servers at once as SGLang's router does.

    Returns (prefill's answer or the exception it raised, decode's answer);
    decode's error raises.
    """
    fields = pd_fields(prefill, room if room is not None else new_room())
    out: dict = {}

    def send_prefill() -> None:
        try:
            out["prefill"] = generate(prefill, ids, max_new, **fields)
        except Exception as err:  # reported to the caller
            out["prefill"] = err

    t = threading.Thread(target=send_prefill, name="pd-prefill")
    t.start()
    try:
        dec = generate(decode, ids, max_new, **fields)
    finally:
        t.join(180)
    return out.get("prefill", TimeoutError("prefill answer")), dec


def loads(srv: Server) -> dict:
    """The server's own view of its KV pool and disaggregation queues (/v1/loads)."""
    body = json.loads(srv.get("/v1/loads"))
    return body["loads"][0]


def _samples(http_addr: str, name: str) -> list[tuple[dict[str, str], float]]:
    """One metric's samples on a daemon's /metrics: (labels, value) each."""
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        if not (line.startswith(name + " ") or line.startswith(name + "{")):
            continue
        head, value = line.rsplit(" ", 1)
        labels = dict(LABEL.findall(head[len(name) :]))
        out.append((labels, float(value)))
    return out


LABEL = re.compile(r'(\w+)="([^"]*)"')


def metric(http_addr: str, name: str, **labels: str) -> float:
    """Sum of one metric's samples on a daemon's /metrics (those with labels, if given)."""
    return sum(
        v
        for have, v in _samples(http_addr, name)
        if all(have.get(k) == want for k, want in labels.items())
    )


def metric_by(http_addr: str, name: str, label: str) -> dict[str, float]:
    """One metric's samples by the value of one label, e.g. failures by reason."""
    out: dict[str, float] = {}
    for have, v in _samples(http_addr, name):
        out[have.get(label, "")] = out.get(have.get(label, ""), 0.0) + v
    return out


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The labels whose counter grew between two metric_by answers, and by how much."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}


def pd_fields(prefill: Server, room: int) -> dict:
    """The bootstrap fields a router gives both servers for one request."""
    return {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room,
    }


class InFlight:
    """One /generate call in its own thread: its answer (or error) and when it ended.

    The fault tests start a request, break something under it, and check that
    it ends, how, and how soon.
    """

    def __init__(self, srv: Server, ids: list[int], max_new: int, **fields) -> None:
        self.srv = srv
        self.answer: dict | None = None
        self.error: Exception | None = None
        self.ended_at: float | None = None
        self._done = threading.Event()

        def run() -> None:
            try:
                self.answer = generate(srv, ids, max_new, **fields)
            except Exception as err:  # what the client got: the test reads it
                self.error = err
            self.ended_at = time.monotonic()
            self._done.set()

        threading.Thread(target=run, name=f"generate {srv.name}", daemon=True).start()

    def wait(self, timeout: float) -> InFlight:
        wait_for(self._done.is_set, timeout, 0.01, what=f"the request on {self.srv.name} ended")
        return self

    def done(self) -> bool:
        return self._done.is_set()

    def failure(self) -> str:
        """How the request ended short of its tokens: the HTTP error's body, or an
        abort finish_reason's message; "" if it finished normally."""
        if self.error is not None:
            return str(self.error)
        assert self.answer is not None
        reason = self.answer["meta_info"]["finish_reason"]
        if isinstance(reason, dict) and reason.get("type") == "abort":
            return f"finish_reason abort: {reason.get('message', '')}"
        return ""


def abort_request(srv: Server, rid: str) -> None:
    """SGLang's own /abort_request for one request id (its answer has no body)."""
    req = urllib.request.Request(
        srv.url + "/abort_request",
        data=json.dumps({"rid": rid}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def wait_pools_empty(srv: Server, timeout: float = 30) -> None:
    """SGLang's own accounting (/v1/loads): every KV page a request held came
    back, and no request waits in a PD queue."""

    def empty() -> bool:
        load = loads(srv)
        queues = load["disaggregation"]
        return load["num_used_tokens"] == 0 and all(
            v == 0 for k, v in queues.items() if k.endswith("_reqs")
        )

    wait_for(empty, timeout, 0.05, what=f"{srv.name}: KV pool empty and PD queues 0")


def log_lines(srv: Server, text: str) -> list[str]:
    """The server's log lines that contain text."""
    return [line for line in srv.log_path.read_text(errors="replace").splitlines() if text in line]


def standin_calls(srv: Server) -> list[str]:
    return [
        line
        for line in srv.log_path.read_text(errors="replace").splitlines()
        if STANDIN_MARK in line
    ]
