"""Faults under real SGLang servers: every request ends, with pdlink's reason,
within its bound; both KV pools come back; the next request matches the
colocated server with no server restart (except the server that was killed).

What is real: SGLang 0.5.23's launch_server as prefill and decode beside
prefilld and decoded (this module's own stack, so its faults never reach the
main module's), SGLang's own answers to a failed or aborted request (HTTP 500
naming pdlink's reason, or an abort finish_reason), its own /abort_request,
its own pool accounting (/v1/loads); the daemons' own counters
(pdlink_room_failures_total{reason}, pdlink_rooms, pdlink_region_replaced_total);
kill -9 of a daemon (tests/daemons.py) and of a whole server process group.

Bounds (conftest DAEMON_BOUNDS and the harness's server environment):
bootstrap 8 s, waiting 8 s, transfer idle 5 s, heartbeats 1 s x 3 misses,
PDLINK_DAEMON_LOST_TIMEOUT 3 s; SLACK on top for a loaded 2-core machine.
SGLang looks at a chunked request's sender only once its last chunk is
computed, so a prefill request broken mid-prefill ends after its chunks
(CHUNKS on top); the daemons' own view of it is checked against the daemon
bound alone.
"""

from __future__ import annotations

import itertools
import re
import time

import pytest
import tiny_llama
from conftest import MAX_NEW, PROMPTS
from harness import (
    InFlight,
    abort_request,
    grew,
    loads,
    log_lines,
    metric,
    metric_by,
    new_room,
    pd_fields,
    pd_generate,
    wait_pools_empty,
)

from pdlink.client import wait_for

DECODE_EXTRA = ("--disaggregation-decode-retraction-backup", "cpu_tensor")

BOOTSTRAP_TIMEOUT = 8.0
LOST_TIMEOUT = 3.0
PEER_LOSS = 3.0
TRANSFER_IDLE = 5.0
SLACK = 5.0
# The rest of a 1000-token prefill once something broke under it: 16
# chunks of 64, about 1.5 s on an idle machine, several times that on a
# loaded one (SGLang computes them before it polls the sender).
CHUNKS = 25.0
LONG = 1000

FAILURES = "pdlink_room_failures_total"
REREGISTERED = "pdlink region registered again"
# A request's end that names pdlink's reason for a peer it lost.
PEER_GONE = re.compile(r"transfer_error|peer_lost|peer_restarted")

_seeds = itertools.count(7000)


def fresh(n_tokens: int) -> list[int]:
    """A prompt no server has seen: nothing of it in prefill's radix cache, so
    its prefill computes every chunk while the fault lands."""
    return tiny_llama.prompt_ids(n_tokens, next(_seeds))


def start_pd(stack, ids: list[int], max_new: int, tag: str) -> tuple[InFlight, InFlight, int, str]:
    """One disaggregated request on both servers, in flight: (prefill, decode, room, rid)."""
    room = new_room()
    rid = f"{tag}-{room}"
    fields = {**pd_fields(stack.prefill, room), "rid": rid}
    return (
        InFlight(stack.prefill, ids, max_new, **fields),
        InFlight(stack.decode, ids, max_new, **fields),
        room,
        rid,
    )


def wait_mid_prefill(stack) -> None:
    """Prefill holds pages of the request (bootstrapped: decode's metadata is
    bound) and has chunks left to compute."""
    wait_for(
        lambda: loads(stack.prefill)["num_used_tokens"] >= 2 * 64,
        60,
        0.02,
        what="prefill two chunks into the request",
    )


def rooms_held(daemon) -> float:
    return metric(daemon.http, "pdlink_rooms")


def back_to_serving(stack, oracle, name: str, *, rooms_left: float = 0) -> None:
    """Nothing left behind, and the servers serve the next request exactly."""
    for srv in (stack.prefill, stack.decode):
        wait_pools_empty(srv)
    for d in (stack.pair.prefill, stack.pair.decode):
        want = rooms_left if d is stack.pair.decode else 0
        try:
            wait_for(lambda d=d, n=want: rooms_held(d) == n, 10, 0.05)
        except TimeoutError:
            raise AssertionError(f"{d.name} holds {rooms_held(d)} rooms, not {want}") from None
    pre, dec = pd_generate(stack.prefill, stack.decode, PROMPTS[name], MAX_NEW)
    assert not isinstance(pre, Exception), f"prefill failed after the fault: {pre}"
    assert dec["output_ids"] == oracle[name]


def took(req: InFlight, since: float) -> float:
    assert req.ended_at is not None
    return req.ended_at - since


def test_a_prefill_whose_decode_never_comes_ends_at_the_bootstrap_timeout(stack, oracle):
    before = metric_by(stack.pair.prefill.http, FAILURES, "reason")
    room = new_room()
    t0 = time.monotonic()
    req = InFlight(stack.prefill, fresh(40), MAX_NEW, **pd_fields(stack.prefill, room))
    req.wait(BOOTSTRAP_TIMEOUT + SLACK)
    # It waited for decode as long as prefilld's bound, and no longer.
    assert took(req, t0) >= BOOTSTRAP_TIMEOUT - 0.5
    assert "HTTP 500" in req.failure() and "timeout:bootstrapping" in req.failure()
    assert grew(before, metric_by(stack.pair.prefill.http, FAILURES, "reason")) == {
        "timeout:bootstrapping": 1
    }
    logged = log_lines(stack.prefill, f"bootstrap_room={room}")
    assert any("timeout:bootstrapping" in line for line in logged), logged
    print(f"prefill alone: ended after {took(req, t0):.2f}s: {req.failure()[:300]}")
    back_to_serving(stack, oracle, "fresh0")


# The reason the side whose daemon died reports (the backend's own, naming
# the daemon or the room it lost).
KILLED_SIDE = re.compile(
    r"pdlink (daemon at \S+ unreachable|room \d+ is gone from the daemon"
    r"|Send of room \d+ failed: Send: "
    r"(UNAVAILABLE|NOT_FOUND|FAILED_PRECONDITION: no region registered))"
)


@pytest.mark.parametrize("back", ["at_once", "after_the_request_ended"])
@pytest.mark.parametrize("daemon", ["decoded", "prefilld"])
def test_a_daemon_killed_under_a_request_fails_it_with_a_reason_and_the_next_one_matches(
    stack, oracle, daemon, back
):
    """kill -9 of one daemon two chunks into a prefill; it comes back on the
    same addresses at once, or only after the request ended. The backend
    beside it registers its region again when its Watch stream reconnects
    (a restarted daemon holds none and refused every room before)."""
    pair = stack.pair
    killed, peer = (
        (pair.decode, pair.prefill) if daemon == "decoded" else (pair.prefill, pair.decode)
    )
    beside = stack.decode if daemon == "decoded" else stack.prefill
    registered = len(log_lines(beside, REREGISTERED))
    peer_before = metric_by(peer.http, FAILURES, "reason")
    pre, dec, _, _ = start_pd(stack, fresh(LONG), MAX_NEW, f"kill-{daemon}-{back}")
    wait_mid_prefill(stack)
    t0 = time.monotonic()
    if back == "at_once":
        killed.restart()
    else:
        killed.kill()

    # The surviving daemon fails the room within its own bound: a broken data
    # connection (transfer_error) at once, or its peer's heartbeats missed.
    wait_for(
        lambda: sum(grew(peer_before, metric_by(peer.http, FAILURES, "reason")).values()) >= 1,
        max(PEER_LOSS, TRANSFER_IDLE) + SLACK,
        0.05,
        what=f"{peer.name} fails the room",
    )
    peer_failed = grew(peer_before, metric_by(peer.http, FAILURES, "reason"))
    peer_took = time.monotonic() - t0
    assert len(peer_failed) == 1 and sum(peer_failed.values()) == 1, peer_failed
    assert PEER_GONE.fullmatch(next(iter(peer_failed))), peer_failed

    dec.wait(LOST_TIMEOUT + SLACK if daemon == "decoded" else PEER_LOSS + SLACK)
    pre.wait(CHUNKS + max(LOST_TIMEOUT, PEER_LOSS) + SLACK)
    killed_side, peer_side = (dec, pre) if daemon == "decoded" else (pre, dec)
    assert KILLED_SIDE.search(killed_side.failure()), killed_side.failure()
    assert PEER_GONE.search(peer_side.failure()), peer_side.failure()
    for req in (pre, dec):
        assert "HTTP 500" in req.failure()
    print(
        f"{daemon} killed ({back}): {peer.name} failed the room after {peer_took:.2f}s "
        f"{peer_failed}; decode ended after {took(dec, t0):.2f}s: {dec.failure()[:260]}; "
        f"prefill after {took(pre, t0):.2f}s: {pre.failure()[:260]}"
    )

    if back != "at_once":
        killed.start()
    wait_for(
        lambda: len(log_lines(beside, REREGISTERED)) > registered,
        30,
        0.1,
        what=f"{beside.name} registers its region with the new {daemon}",
    )
    back_to_serving(stack, oracle, "fresh1" if daemon == "decoded" else "fresh2")


ABORTED_BY_PEER = re.compile(r"aborted:remote.{0,20}peer(: | reason )aborted:local")


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_a_client_abort_before_the_other_side_arrives_fails_it_at_once(stack, oracle, side):
    """/abort_request while the request waits for its other half (prefill in its
    bootstrap queue, decode in its transfer queue); the other half, arriving
    after, fails at once with the abort as the peer's reason, never its bound."""
    pair = stack.pair
    aborted_srv, other_srv = (
        (stack.prefill, stack.decode) if side == "prefill" else (stack.decode, stack.prefill)
    )
    aborted_d, other_d = (
        (pair.prefill, pair.decode) if side == "prefill" else (pair.decode, pair.prefill)
    )
    queue = "prefill_bootstrap_queue_reqs" if side == "prefill" else "decode_transfer_queue_reqs"
    before = {d.name: metric_by(d.http, FAILURES, "reason") for d in (aborted_d, other_d)}
    room = new_room()
    rid = f"abort-early-{side}-{room}"
    ids = fresh(60)
    fields = pd_fields(stack.prefill, room)
    first = InFlight(aborted_srv, ids, MAX_NEW, **fields, rid=rid)
    wait_for(
        lambda: loads(aborted_srv)["disaggregation"][queue] == 1,
        30,
        0.02,
        what=f"{aborted_srv.name}: the request waits in its {queue}",
    )
    t0 = time.monotonic()
    abort_request(aborted_srv, rid)
    first.wait(SLACK)
    assert "Aborted by AbortReq" in first.failure(), first.failure()

    t1 = time.monotonic()
    late = InFlight(other_srv, ids, MAX_NEW, **fields, rid=rid + "-late")
    late.wait(SLACK)
    assert ABORTED_BY_PEER.search(late.failure()), late.failure()
    assert grew(before[aborted_d.name], metric_by(aborted_d.http, FAILURES, "reason")) == {
        "aborted:local": 1
    }
    assert grew(before[other_d.name], metric_by(other_d.http, FAILURES, "reason")) == {
        "aborted:remote": 1
    }
    print(
        f"abort on {side} before its peer: ended after {took(first, t0):.2f}s; "
        f"the late {other_srv.name} after {took(late, t1):.2f}s: {late.failure()[:260]}"
    )
    back_to_serving(stack, oracle, "fresh3" if side == "prefill" else "fresh4")


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_a_client_abort_mid_prefill_ends_both_sides_and_leaves_no_room(stack, oracle, side):
    """/abort_request two chunks into a prefill, the other half live and
    waiting. SGLang ends a prefill request aborted mid-chunk with an abort
    finish_reason and never calls the sender's clear(): the backend's
    abort() clears the daemon's room itself (it stayed Failed for
    --clear-linger before)."""
    pair = stack.pair
    aborted_d, other_d = (
        (pair.prefill, pair.decode) if side == "prefill" else (pair.decode, pair.prefill)
    )
    before = {d.name: metric_by(d.http, FAILURES, "reason") for d in (aborted_d, other_d)}
    pre, dec, _, rid = start_pd(stack, fresh(LONG), MAX_NEW, f"abort-mid-{side}")
    aborted, other = (pre, dec) if side == "prefill" else (dec, pre)
    wait_mid_prefill(stack)
    t0 = time.monotonic()
    abort_request(aborted.srv, rid)
    aborted.wait(SLACK)
    assert "bort" in aborted.failure(), aborted.failure()  # SGLang's own words for it
    # The other daemon learns it within the abort's round trip (R8), whatever
    # its scheduler is busy with.
    wait_for(
        lambda: (
            grew(before[other_d.name], metric_by(other_d.http, FAILURES, "reason"))
            == {"aborted:remote": 1}
        ),
        SLACK,
        0.05,
        what=f"{other_d.name} fails the room aborted:remote",
    )
    told = time.monotonic() - t0
    other.wait(SLACK if other is dec else CHUNKS + SLACK)
    assert ABORTED_BY_PEER.search(other.failure()), other.failure()
    assert grew(before[aborted_d.name], metric_by(aborted_d.http, FAILURES, "reason")) == {
        "aborted:local": 1
    }
    print(
        f"abort on {side} mid-prefill: ended after {took(aborted, t0):.2f}s "
        f"({aborted.failure()[:120]}); {other_d.name} failed the room after {told:.2f}s; "
        f"the other side ended after {took(other, t0):.2f}s: {other.failure()[:200]}"
    )
    back_to_serving(stack, oracle, "fresh5" if side == "prefill" else "fresh6")


def test_a_decode_server_killed_mid_request_leaves_prefill_whole_and_a_new_one_serves(
    stack, oracle
):
    """kill -9 of the decode server (its process group) two chunks into a
    prefill. decoded lives on and its room is bound to the dead server's
    staging region: it takes every page and reports Success, so prefill's
    request finishes as one whose KV reached decode. Nothing stays in
    flight; the dead server's terminal room waits on decoded for a clear
    that never comes (reaped after --clear-linger, counted uncleared). The
    new decode server's region replaces the dead one's (region_replaced)."""
    pair = stack.pair
    replaced = metric(pair.decode.http, "pdlink_region_replaced_total")
    rooms_before = rooms_held(pair.decode)
    pre, dec, _, _ = start_pd(stack, fresh(LONG), 200, "kill-decode-server")
    wait_mid_prefill(stack)
    t0 = time.monotonic()
    stack.decode.kill()
    dec.wait(SLACK)
    assert dec.error is not None and "HTTP" not in str(dec.error), dec.error  # connection gone
    pre.wait(CHUNKS + TRANSFER_IDLE + SLACK)
    assert pre.failure() == "", pre.failure()
    wait_pools_empty(stack.prefill)
    wait_for(lambda: rooms_held(pair.prefill) == 0, 10, 0.05, what="prefilld holds no room")
    assert metric(pair.decode.http, "pdlink_inflight_rooms") == 0
    left = rooms_held(pair.decode) - rooms_before
    assert left == 1 and metric(pair.decode.http, "pdlink_rooms", state="Success") >= 1
    print(
        f"decode server killed: prefill ended after {took(pre, t0):.2f}s "
        f"(finish_reason {pre.answer['meta_info']['finish_reason']}); decoded keeps "
        f"{left:.0f} terminal room of the dead server"
    )

    stack.restart_decode()
    assert metric(pair.decode.http, "pdlink_region_replaced_total") == replaced + 1
    back_to_serving(stack, oracle, "fresh7", rooms_left=rooms_before + left)
