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
import sys
import threading
import urllib.request
from pathlib import Path

from servers import Server, free_port

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
    fields = {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room if room is not None else new_room(),
    }
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


def metric(http_addr: str, name: str) -> float:
    """Sum of one metric's samples on a daemon's /metrics."""
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def standin_calls(srv: Server) -> list[str]:
    return [
        line
        for line in srv.log_path.read_text(errors="replace").splitlines()
        if STANDIN_MARK in line
    ]
