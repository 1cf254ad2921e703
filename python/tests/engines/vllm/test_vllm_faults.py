"""Faults against real vLLM engines beside real daemons: each affected request ends
with a reason within its room's bound, prefill's blocks are back in vLLM's
free pool (vLLM's own kv_cache_usage_perc), and later requests still match
the colocated oracle."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager

from conftest import MAX_TOKENS, SPARES
from harness import (
    complete,
    daemon_metric,
    daemon_rooms,
    decode_with,
    disagg,
    kv_usage,
    prefill_only,
)

from pdlink.client import wait_for

# The daemons' bounds are 5-8 s and the connector's daemon_lost_timeout 3 s;
# this is their sum with a loaded machine's slack.
FREED_BOUND = 25.0


def _idle(server, what: str, bound: float = FREED_BOUND) -> float:
    t0 = time.monotonic()
    wait_for(lambda: kv_usage(server) == 0, bound, 0.2, f"{what}: KV blocks back in the pool")
    return time.monotonic() - t0


def _matches(stack, oracle, name: str) -> None:
    pr = SPARES[name]
    r = disagg(stack.prefill, stack.decode, pr.text, MAX_TOKENS)
    assert (r.error, r.text) == (None, oracle[name]), name


@contextmanager
def _stopped(server):
    """SIGSTOP the server's process group (engine and workers), SIGCONT after."""
    os.killpg(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)


def _in_background(fn, *args):
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except Exception as err:  # the caller asserts on it
            out["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _client_gives_up(server, prompt: str, max_tokens: int, after: float, **more) -> None:
    """A completion whose client closes the connection after seconds (vLLM aborts it)."""
    try:
        complete(server, prompt, max_tokens, timeout=after, **more)
    except (TimeoutError, OSError) as err:
        assert "timed out" in str(err), err
        return
    raise AssertionError(f"answered within {after}s: the abort was not exercised")


def test_a_prefill_request_aborted_by_its_client_frees_its_blocks(stack, oracle):
    pr = SPARES["fresh0"]
    t0 = time.monotonic()
    _client_gives_up(
        stack.prefill, pr.text, 600, 2.0, kv_transfer_params={"do_remote_decode": True}
    )
    _idle(stack.prefill, "aborted prefill")
    assert time.monotonic() - t0 < FREED_BOUND
    assert not daemon_rooms(stack.pair.prefill.http), "an aborted prefill opens no room"
    _matches(stack, oracle, "fresh1")


def test_a_decode_request_aborted_by_its_client_while_loading(stack, oracle):
    """The prefill engine is stopped so the load cannot finish; the decode client
    gives up; decode aborts the room, prefill learns it, both free their blocks."""
    pr = SPARES["fresh2"]
    params = prefill_only(stack.prefill, pr.text)
    failures = daemon_metric(stack.pair.prefill.http, "pdlink_room_failures_total")
    with _stopped(stack.prefill):
        _client_gives_up(stack.decode, pr.text, MAX_TOKENS, 3.0, kv_transfer_params=params)
        _idle(stack.decode, "aborted decode")
    _idle(stack.prefill, "prefill of the aborted decode")
    assert daemon_metric(stack.pair.prefill.http, "pdlink_room_failures_total") > failures
    _matches(stack, oracle, "fresh3")


def test_the_decode_engine_killed_with_rooms_in_flight(stack, oracle):
    prs = [SPARES["fresh4"], SPARES["fresh5"]]
    params = [prefill_only(stack.prefill, p.text) for p in prs]
    with _stopped(stack.prefill):
        threads = [
            _in_background(decode_with, stack.decode, p.text, MAX_TOKENS, prm, 60)
            for p, prm in zip(prs, params, strict=True)
        ]
        wait_for(
            lambda: len(daemon_rooms(stack.pair.decode.http)) >= 2, 30, 0.2, "decode rooms open"
        )
        stack.decode.kill()
    for t, _ in threads:
        t.join(60)
    took = _idle(stack.prefill, "prefill after the decode engine died")
    assert took < FREED_BOUND
    stack.restart_decode()
    stack.decode.wait_ready()
    _matches(stack, oracle, "fresh6")


def _reregistered(srv) -> int:
    # Counted over the whole log: a line from an earlier restart must not
    # pass for this one.
    return srv.log_path.read_text(errors="replace").count("pdlink region registered again")


def test_prefilld_killed_with_a_room_held(stack, oracle):
    pr = SPARES["fresh7"]
    params = prefill_only(stack.prefill, pr.text)
    assert kv_usage(stack.prefill) > 0
    registered = _reregistered(stack.prefill)
    stack.pair.prefill.kill()
    _idle(stack.prefill, "prefill after prefilld died")
    stack.pair.prefill.start()
    # The connector registers its region again when its Watch stream reconnects.
    wait_for(
        lambda: _reregistered(stack.prefill) > registered,
        30,
        0.2,
        "prefill's region registered with the new prefilld",
    )
    text, err = decode_with(stack.decode, pr.text, MAX_TOKENS, params, timeout=30)
    assert text is None and err is not None, "a room of the dead prefilld must not load"
    _matches(stack, oracle, "fresh8")


def test_decoded_killed_then_back(stack, oracle):
    registered = _reregistered(stack.decode)
    stack.pair.decode.kill()
    pr = SPARES["fresh9"]
    params = prefill_only(stack.prefill, pr.text)
    text, err = decode_with(stack.decode, pr.text, MAX_TOKENS, params, timeout=30)
    assert text is None and err is not None, "no decoded: the load fails, with an error"
    _idle(stack.prefill, "prefill whose decode had no decoded")
    stack.pair.decode.start()
    wait_for(
        lambda: _reregistered(stack.decode) > registered,
        30,
        0.2,
        "decode's region registered with the new decoded",
    )
    _matches(stack, oracle, "fresh10")
