"""The concurrent flow on real vLLM engines: prefill and decode asked at once (the room
named by the proxy), decode binding while prefill computes, pages leaving per layer.

Tokens equal the colocated oracle's; pages leave inside prefill's forward when
decode bound first (counted by the connector's log line per room); prefill's
blocks are freed when its prompt is done, not held; a decode of another
prompt or a prefill that never comes ends with an error within its bound,
never with wrong tokens. And once through pdlink.vllm.proxy --flow
concurrent, as a user runs it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sys
import threading
import time
import urllib.request

import tiny_llama
from conftest import MAX_TOKENS, PROMPTS, SPARES
from harness import (
    PYTHON_DIR,
    complete,
    completion_body,
    concurrent,
    concurrent_params,
    daemon_metric,
    daemon_rooms,
    decode_with,
    kv_usage,
)
from servers import Server, free_port

from pdlink.client import wait_for

# prefilld's --bootstrap-timeout is 8 s (conftest.DAEMON_BOUNDS); slack for a
# loaded 2-core machine.
REFUSAL_BOUND = 30.0

_SENT = re.compile(
    r"pdlink room sent: req=\S+ room=(\d+) sends_in_forward=(\d+) sends_after_forward=(\d+)"
)


def _room() -> int:
    return secrets.randbits(63) or 1


def _sent_log(stack, room: int) -> tuple[int, int]:
    """The prefill server's (sends inside the forward, sends after it) for room."""

    def find():
        for m in _SENT.finditer(stack.prefill.log_path.read_text(errors="replace")):
            if int(m.group(1)) == room:
                return int(m.group(2)), int(m.group(3))
        return None

    wait_for(lambda: find() is not None, 10, 0.2, f"prefill's log line for room {room}")
    return find()


def test_every_prompt_matches_the_colocated_oracle(stack, oracle):
    bootstrap = stack.pair.prefill.bootstrap
    for pr in PROMPTS:
        room = _room()
        r = concurrent(stack.prefill, stack.decode, bootstrap, pr.text, MAX_TOKENS, room=room)
        assert r.error is None, f"{pr.name}: {r.error}"
        assert r.text == oracle[pr.name], f"{pr.name}: concurrent tokens differ"
        assert r.params and r.params["pdlink_room"] == room
        assert sum(_sent_log(stack, room)) >= 1


def _worker_pid(server) -> int:
    m = re.search(r"\(Worker pid=(\d+)\)", server.log_path.read_text(errors="replace"))
    assert m, f"{server.name}: no worker pid in its log"
    return int(m.group(1))


def _prefill_room_state(stack, room: int) -> str:
    for r in daemon_rooms(stack.pair.prefill.http):
        if r["room"] == room:
            return r["state"]
    return ""


def test_pages_leave_per_layer_when_decode_bound_before_prefill_ran(stack, oracle):
    """Prefill's worker held (SIGSTOP) while its scheduler takes the request and opens the
    room; decode binds it; the worker then runs the forward: every layer's pages leave
    right after that layer (one Send per layer inside the forward, none after)."""
    pr = SPARES["fresh2"]
    room = _room()
    pre_params, dec_params = concurrent_params(room, stack.pair.prefill.bootstrap)
    worker = _worker_pid(stack.prefill)
    os.kill(worker, signal.SIGSTOP)
    try:
        pre = _in_background(
            lambda: complete(stack.prefill, pr.text, 1, kv_transfer_params=pre_params)
        )
        wait_for(lambda: _prefill_room_state(stack, room) != "", 30, 0.1, "prefill's room open")
        dec = _in_background(
            lambda: decode_with(stack.decode, pr.text, MAX_TOKENS, dec_params, 120)
        )
        wait_for(
            lambda: _prefill_room_state(stack, room) == "WaitingForInput",
            30,
            0.1,
            "decode bound the room",
        )
    finally:
        os.kill(worker, signal.SIGCONT)
    pre[0].join(120)
    dec[0].join(120)
    assert "error" not in pre[1] and "error" not in dec[1], (pre[1], dec[1])
    assert dec[1]["value"] == (oracle[pr.name], None)
    assert _sent_log(stack, room) == (tiny_llama.LAYERS, 0)


def _in_background(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as err:  # the caller asserts on it
            out["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_prefill_frees_its_blocks_at_once_and_a_decode_that_never_came_ends_at_the_bound(
    stack, oracle
):
    """Prefill alone (the proxy lost decode's request): its answer comes with every
    block already free (pages are in staging), its room fails at prefilld's bootstrap
    bound with the reason counted, and the next request still matches."""
    pr = SPARES["fresh3"]
    room = _room()
    failures = daemon_metric(
        stack.pair.prefill.http, "pdlink_room_failures_total", reason="timeout:bootstrapping"
    )
    ans = stack.prefill.post(
        "/v1/completions",
        completion_body(
            pr.text, 1, kv_transfer_params={"do_remote_decode": True, "pdlink_room": room}
        ),
    )
    assert ans["kv_transfer_params"]["pdlink_room"] == room
    assert kv_usage(stack.prefill) == 0, "prefill holds blocks for a room whose pages are staged"
    wait_for(
        lambda: (
            daemon_metric(
                stack.pair.prefill.http,
                "pdlink_room_failures_total",
                reason="timeout:bootstrapping",
            )
            > failures
        ),
        REFUSAL_BOUND,
        0.25,
        "prefilld's room failed timeout:bootstrapping",
    )
    ok = SPARES["fresh4"]
    r = concurrent(
        stack.prefill, stack.decode, stack.pair.prefill.bootstrap, ok.text, MAX_TOKENS, room=_room()
    )
    assert (r.error, r.text) == (None, oracle[ok.name])


def test_decode_of_another_prompt_length_gets_an_error_not_tokens(stack, oracle):
    """A proxy that sent decode a prompt one block longer than prefill's: the room's
    page counts differ, prefilld refuses the last Send, decode's load fails."""
    pre, longer = SPARES["fresh5"], SPARES["fresh6"]
    t0 = time.monotonic()
    r = concurrent(
        stack.prefill,
        stack.decode,
        stack.pair.prefill.bootstrap,
        pre.text,
        MAX_TOKENS,
        room=_room(),
        decode_prompt=longer.text + " w7" * 40,
    )
    assert r.text is None and r.error, r
    assert time.monotonic() - t0 < REFUSAL_BOUND
    ok = SPARES["fresh7"]
    r = concurrent(
        stack.prefill, stack.decode, stack.pair.prefill.bootstrap, ok.text, MAX_TOKENS, room=_room()
    )
    assert (r.error, r.text) == (None, oracle[ok.name])


def test_the_proxy_runs_the_concurrent_flow(stack, oracle, log_dir):
    """As a user runs it: pdlink.vllm.proxy --flow concurrent, a streamed answer."""
    port = free_port()
    proxy = Server(
        "proxy-concurrent",
        [
            sys.executable,
            str(PYTHON_DIR / "pdlink" / "vllm" / "proxy.py"),
            "--prefill",
            stack.prefill.url,
            "--decode",
            stack.decode.url,
            "--port",
            str(port),
            "--flow",
            "concurrent",
            "--prefill-bootstrap",
            stack.pair.prefill.bootstrap,
        ],
        port=port,
        log_dir=log_dir,
        health_path="/health",
    )
    try:
        proxy.wait_ready(60)
        for name in ("fresh8", "fresh9"):
            pr = SPARES[name]
            req = urllib.request.Request(
                proxy.url + "/v1/completions",
                data=json.dumps(completion_body(pr.text, MAX_TOKENS, stream=True)).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=300) as resp:
                events = [
                    line[len(b"data: ") :].strip() for line in resp if line.startswith(b"data: ")
                ]
            assert events[-1] == b"[DONE]"
            text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
            assert text == oracle[name], name
    finally:
        proxy.stop()
