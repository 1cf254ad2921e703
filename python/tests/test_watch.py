"""The Watch-fed status cache: a slow consumer, missed transitions, early transitions."""

from __future__ import annotations

import sys
import threading
import time
from concurrent import futures

import grpc
from conftest import LAYOUT, settle, state_of

from pdlink import DecodeClient, Region, RoomState, RoomStatus
from pdlink.client import StatusCache
from pdlink.v1 import common_pb2, decode_pb2_grpc

# A receive window this small makes the daemon's send block after a few
# dozen events instead of megabytes (gRPC's BDP probing would grow it), so
# a stalled reader fills the daemon's subscription buffer (1024) quickly.
SMALL_WINDOW = (("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024))

# Rooms (two transitions each) the flood makes while the reader is stalled:
# about 2.5x what the buffers above hold (drops start near 2500 transitions).
FLOOD_ROOMS = 3000


def _tr(room, nonce, frm, to, reason=""):
    return common_pb2.Transition(
        room_id=room, nonce=nonce, to=to.to_proto(), reason=reason, **{"from": frm.to_proto()}
    )


def test_cache_takes_only_forward_transitions_of_its_own_nonce():
    c = StatusCache()
    c.put(RoomStatus(1, nonce=7, found=True, state=RoomState.BOOTSTRAPPING))
    c.transition(_tr(1, 7, RoomState.BOOTSTRAPPING, RoomState.TRANSFERRING))
    c.transition(_tr(1, 7, RoomState.BOOTSTRAPPING, RoomState.WAITING_FOR_INPUT))  # late
    assert c.get(1).state == RoomState.TRANSFERRING
    c.transition(_tr(1, 8, RoomState.TRANSFERRING, RoomState.FAILED, "collision"))  # not ours
    assert c.get(1).state == RoomState.TRANSFERRING
    c.transition(_tr(1, 7, RoomState.TRANSFERRING, RoomState.FAILED, "peer_lost"))
    c.transition(_tr(1, 7, RoomState.TRANSFERRING, RoomState.SUCCESS))  # terminal is sticky
    assert c.get(1) == RoomStatus(1, 7, True, RoomState.FAILED, "peer_lost")
    c.transition(_tr(2, 9, RoomState.BOOTSTRAPPING, RoomState.FAILED))  # untracked
    assert c.get(2) is None


def test_cache_keeps_a_transition_that_arrives_before_its_open_answer():
    c = StatusCache()
    c.transition(_tr(3, 5, RoomState.BOOTSTRAPPING, RoomState.WAITING_FOR_INPUT))
    c.put(RoomStatus(3, nonce=5, found=True, state=RoomState.BOOTSTRAPPING))
    assert c.get(3).state == RoomState.WAITING_FOR_INPUT


def test_a_resync_poll_does_not_overwrite_a_newer_answer():
    c = StatusCache()
    c.put(RoomStatus(4, nonce=1, found=True, state=RoomState.BOOTSTRAPPING))
    since = c.mark()
    c.put(RoomStatus(5, nonce=2, found=True, state=RoomState.BOOTSTRAPPING))  # opened meanwhile
    c.resynced([RoomStatus(4, 1, True, RoomState.SUCCESS), RoomStatus(5)], since)
    assert c.get(4).state == RoomState.SUCCESS
    assert c.get(5).found  # the Poll was sent before room 5 opened


def _flood(drive: DecodeClient, bootstrap: str, first: int, rooms: int) -> None:
    for start in range(first, first + rooms, 100):
        ids = list(range(start, min(start + 100, first + rooms)))
        for r in ids:
            drive.open(r, bootstrap)
            drive.abort(r)
        drive.clear(ids)


def test_missed_transitions_resync_the_cache_with_one_poll(pair):
    drive = DecodeClient(pair.decode.address, watch=False)
    region = Region.create(str(pair.decode.region_dir), LAYOUT)
    drive.register_region(region)
    slow = DecodeClient(pair.decode.address, channel_options=SMALL_WINDOW)
    try:
        assert slow.wait_connected(10)
        tracked = list(range(10**6, 10**6 + 50))
        for r in tracked:
            slow.open(r, pair.prefill.bootstrap)
        gate = threading.Event()
        slow._watch_hook = gate.wait
        resyncs = slow.cache.resyncs
        _flood(drive, pair.prefill.bootstrap, 1, FLOOD_ROOMS)
        # The tracked rooms fail once the buffers are full: their
        # transitions are among those dropped.
        for r in tracked:
            drive.abort(r)
        gate.set()
        settle(
            lambda: all(state_of(slow, r) == RoomState.FAILED for r in tracked),
            "every tracked room Failed in the cache",
        )
        assert slow.cache.missed > 0
        assert slow.cache.resyncs > resyncs
        assert all(slow.status(r).reason == "aborted:local" for r in tracked)
    finally:
        slow._watch_hook = None
        slow.close()
        drive.close()
        region.close()


def test_a_slow_consumer_still_sees_every_room_end(env):
    # The watch thread takes 1 ms per event while rooms run: the stream's
    # buffers absorb it, nothing is missed, and every status is final.
    env.decode._watch_hook = lambda: time.sleep(0.001)
    rooms = range(100, 160)
    for r in rooms:
        env.decode.open(r, env.bootstrap)
        env.prefill.open(r)
        env.decode.send_metadata(r, [r % LAYOUT.buffers[0].pages])
    for r in rooms:
        settle(lambda r=r: state_of(env.prefill, r) == RoomState.WAITING_FOR_INPUT, "bound")
        env.prefill.send(r, [0], last=True)
    settle(
        lambda: all(state_of(env.decode, r) == RoomState.SUCCESS for r in rooms),
        "every decode room Success in the slow cache",
    )
    assert env.decode.cache.missed == 0
    assert [s.state for s in env.decode.poll(rooms)] == [RoomState.SUCCESS] * len(rooms)


def test_a_cleared_rooms_late_transitions_do_not_reach_the_next_room_with_its_id():
    c = StatusCache()
    # Room 6 ends Success by a call's answer; its transitions are still on
    # the stream when the scheduler clears it and opens room 6 again.
    c.put(RoomStatus(6, nonce=11, found=True, state=RoomState.SUCCESS))
    c.drop(6)
    c.transition(_tr(6, 11, RoomState.WAITING_FOR_INPUT, RoomState.TRANSFERRING))
    c.put(RoomStatus(6, nonce=0, found=True, state=RoomState.BOOTSTRAPPING))  # reopened, unbound
    c.transition(_tr(6, 11, RoomState.TRANSFERRING, RoomState.SUCCESS))
    assert c.get(6) == RoomStatus(6, 0, True, RoomState.BOOTSTRAPPING)
    c.transition(_tr(6, 12, RoomState.BOOTSTRAPPING, RoomState.WAITING_FOR_INPUT))  # the new room's
    assert c.get(6).state == RoomState.WAITING_FOR_INPUT and c.get(6).nonce == 12


def test_a_room_lost_in_a_restart_takes_the_transitions_of_its_reopening():
    c = StatusCache()
    c.put(RoomStatus(7, nonce=3, found=True, state=RoomState.TRANSFERRING))
    c.resynced([RoomStatus(7)], c.mark())  # the daemon restarted: lost
    assert not c.get(7).found
    c.transition(_tr(7, 9, RoomState.BOOTSTRAPPING, RoomState.WAITING_FOR_INPUT))
    c.put(RoomStatus(7, nonce=9, found=True, state=RoomState.BOOTSTRAPPING))
    assert c.get(7).state == RoomState.WAITING_FOR_INPUT


def _in_watch_header_wait(client) -> bool:
    frame = sys._current_frames().get(client._watch_thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "initial_metadata":
            return True
        frame = frame.f_back
    return False


class _SilentWatch(decode_pb2_grpc.DecodeServiceServicer):
    """A daemon stand-in whose Watch never sends its headers until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def Watch(self, request, context):
        self.entered.set()
        self.release.wait(WAIT_BOUND)
        return iter(())


WAIT_BOUND = 30.0


def test_close_returns_while_the_watch_waits_for_headers_that_never_come(tmp_path):
    """The Watch stream is single-threaded: while it waits for the daemon's
    headers it holds the call's lock, so close() must not go through it."""
    servicer = _SilentWatch()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, server)
    address = f"unix://{tmp_path}/silent.sock"
    server.add_insecure_port(address)
    server.start()
    try:
        dec = DecodeClient(address)
        assert servicer.entered.wait(WAIT_BOUND)
        settle(lambda: _in_watch_header_wait(dec), "watch thread waiting for headers")
        closer = threading.Thread(target=dec.close, name="closer")
        closer.start()
        closer.join(timeout=10)
        assert not closer.is_alive(), "close() waited on the Watch call's headers"
        assert not dec._watch_thread.is_alive()
    finally:
        servicer.release.set()
        server.stop(grace=None).wait(WAIT_BOUND)
