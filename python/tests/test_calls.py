"""Every client call against real daemons, and what each answers."""

from __future__ import annotations

import concurrent.futures
import json
import signal

import grpc
import numpy as np
import pytest
from conftest import LAYOUT, fill, open_bound, settle, state_of

import pdlink
from pdlink import DecodeClient, PrefillClient, Region, RoomState


def test_register_region_is_idempotent_and_a_replaced_file_is_a_new_generation(env):
    again = env.prefill.register_region(env.src)
    assert again.generation == 1
    assert (again.device, again.inode) == env.src.identity()
    replacement = Region.create(str(env.pair.prefill.region_dir), LAYOUT)
    try:
        r = env.prefill.register_region(replacement)
        assert r.generation == 2 and r.rooms_failed == 0
        assert (r.device, r.inode) == replacement.identity()
    finally:
        replacement.close()


def test_unregister_region_fails_its_rooms_and_repeats_as_a_no_op(env):
    open_bound(env, 5, [0])
    gone = env.decode.unregister_region(rank=(0, 1))
    assert gone.unregistered and gone.generation == 1 and gone.rooms_failed == 1
    settle(lambda: state_of(env.decode, 5) == RoomState.FAILED, "decode room failed")
    assert env.decode.status(5).reason == "region_replaced"
    settle(lambda: state_of(env.prefill, 5) == RoomState.FAILED, "prefill room failed")
    assert env.prefill.status(5).reason == "aborted:remote"
    assert env.prefill.status(5).peer_reason == "region_replaced"
    repeat = env.decode.unregister_region()
    assert not repeat.unregistered and repeat.generation == 0


def test_a_room_goes_through_every_state_and_clear_forgets_it(env):
    fill(env.src, 0, 2, seed=1)
    fill(env.src, 1, 2, seed=1)
    env.src.aux()[4] = np.arange(LAYOUT.aux.row_len, dtype=np.uint8)
    d = env.decode.open(42, env.bootstrap)
    assert d.found and d.state == RoomState.BOOTSTRAPPING and d.nonce != 0
    p = env.prefill.open(42)
    assert p.found and p.state == RoomState.BOOTSTRAPPING
    env.decode.send_metadata(42, np.array([9], dtype=np.int32), aux_index=3)
    settle(lambda: state_of(env.prefill, 42) == RoomState.WAITING_FOR_INPUT, "prefill bound")
    assert env.prefill.status(42).nonce == d.nonce
    sent = env.prefill.send(42, [2], last=True, aux_index=4)
    assert sent.room_id == 42 and sent.found
    settle(lambda: state_of(env.decode, 42) == RoomState.SUCCESS, "decode success")
    settle(lambda: state_of(env.prefill, 42) == RoomState.SUCCESS, "prefill success")
    for b in range(2):
        assert np.array_equal(env.dst.pages(b)[9], env.src.pages(b)[2])
    assert np.array_equal(env.dst.aux()[3], env.src.aux()[4])

    # Poll is the daemon's own answer, cache or not.
    [polled] = env.decode.poll([42])
    assert polled.state == RoomState.SUCCESS and polled.nonce == d.nonce
    for client in (env.decode, env.prefill):
        [res] = client.clear([42])
        assert res.cleared and res.error == ""
        assert client.status(42) is None
        [again] = client.clear([42])
        assert not again.cleared and again.error == "NOT_FOUND"
        [gone] = client.poll([42])
        assert not gone.found and gone.state == RoomState.UNSPECIFIED


def test_send_in_chunks_with_runs_and_layer_wise_buffers(env):
    for page in range(4):
        fill(env.src, 0, page, seed=3)
        fill(env.src, 1, page, seed=3)
    open_bound(env, 7, range(20, 24))
    # Layer-wise: buffer 0's first two positions, then buffer 1's, then the rest.
    env.prefill.send(7, range(0, 2), start_position=0, buffers=[0])
    env.prefill.send(7, [0, 1], start_position=0, buffers=[1])
    env.prefill.send(7, range(2, 4), start_position=2, last=True)
    settle(lambda: state_of(env.decode, 7) == RoomState.SUCCESS, "decode success")
    for b in range(2):
        assert np.array_equal(env.dst.pages(b)[20:24], env.src.pages(b)[0:4])


def test_prefill_status_carries_decodes_prefix_len_from_waiting_for_input(env):
    """The cache (fed by Watch), Poll and Send's answer all say how many
    leading positions decode holds, so a scheduler can start its Sends there."""
    for page in range(4):
        fill(env.src, 0, page, seed=5)
        fill(env.src, 1, page, seed=5)
    env.decode.open(9, env.bootstrap)
    assert env.prefill.open(9).prefix_len == 0
    env.decode.send_metadata(9, range(30, 34), prefix_len=3)
    settle(lambda: state_of(env.prefill, 9) == RoomState.WAITING_FOR_INPUT, "prefill bound")
    assert env.prefill.status(9).prefix_len == 3
    assert env.prefill.poll([9])[0].prefix_len == 3
    sent = env.prefill.send(9, [3], start_position=3, last=True)
    assert sent.prefix_len == 3
    settle(lambda: state_of(env.decode, 9) == RoomState.SUCCESS, "decode success")
    for b in range(2):
        assert np.array_equal(env.dst.pages(b)[33], env.src.pages(b)[3])
    assert env.decode.status(9).prefix_len == 0  # a prefill field


def test_a_repeated_last_send_answers_ok(env):
    open_bound(env, 8, [1])
    first = env.prefill.send(8, [0], last=True)
    again = env.prefill.send(8, [0], last=True)
    assert first.found and again.found
    settle(lambda: state_of(env.prefill, 8) == RoomState.SUCCESS, "prefill success")


def test_abort_on_either_side_reaches_the_other(env):
    open_bound(env, 11, [0])
    a = env.prefill.abort(11, "client went away")
    assert a.room_id == 11
    settle(lambda: state_of(env.prefill, 11) == RoomState.FAILED, "prefill failed")
    assert env.prefill.status(11).reason == "aborted:local"
    settle(lambda: state_of(env.decode, 11) == RoomState.FAILED, "decode failed")
    assert env.decode.status(11).reason == "aborted:remote"
    assert env.decode.status(11).peer_reason == "aborted:local"

    open_bound(env, 12, [1])
    env.decode.abort(12)
    settle(lambda: state_of(env.prefill, 12) == RoomState.FAILED, "prefill failed")
    assert env.prefill.status(12).reason == "aborted:remote"
    # Abort of a terminal room leaves it as it is (so the client may retry it).
    again = env.decode.abort(12)
    assert again.state == RoomState.FAILED and again.reason == "aborted:local"


def test_clear_refuses_a_live_room(env):
    env.decode.open(13, env.bootstrap)
    [res] = env.decode.clear([13])
    assert not res.cleared and res.error == "NOT_TERMINAL"
    assert env.decode.status(13) is not None


def test_poll_batches_many_rooms_in_order(env):
    ids = [1000 + i for i in range(300)]
    for r in ids[:150]:
        env.decode.open(r, env.bootstrap)
    got = env.decode.poll(list(reversed(ids)))
    assert [s.room_id for s in got] == list(reversed(ids))
    assert [s.found for s in got] == [False] * 150 + [True] * 150


def test_tcp_address(pair, tmp_path):
    # The daemon listens on loopback TCP when --grpc-listen is host:port.
    pair.decode.args = [a for a in pair.decode.args if not a.startswith("--grpc-listen=")]
    pair.decode.args.append("--grpc-listen=127.0.0.1:0")
    pair.decode.restart()
    serving = [ln for ln in pair.decode.logs if '"serving"' in ln][-1]
    addr = json.loads(serving)["grpc"]
    assert addr.startswith("127.0.0.1:")
    with DecodeClient(addr) as dec, PrefillClient(pair.prefill.address) as pre:
        assert dec.wait_connected(10) and pre.wait_connected(10)
        region = Region.create(str(pair.decode.region_dir), LAYOUT)
        assert dec.register_region(region).generation == 1
        assert dec.poll([1])[0].found is False
        region.close()


def test_statuses_answer_in_order_with_none_for_untracked_rooms(env):
    env.decode.open(60, env.bootstrap)
    env.decode.open(61, env.bootstrap)
    got = env.decode.statuses([61, 62, 60])
    assert [s.room_id if s else None for s in got] == [61, None, 60]


def test_open_takes_the_rank_and_sets_it_only_where_the_api_has_it(env):
    from pdlink.v1 import decode_pb2, prefill_pb2

    assert env.prefill.open(70, rank=(0, 1)).found
    assert env.decode.open(70, env.bootstrap, rank=(0, 1)).found
    for req in (prefill_pb2.OpenSenderRequest(), decode_pb2.OpenReceiverRequest()):
        if "rank" in type(req).DESCRIPTOR.fields_by_name:
            env.prefill._set_open_rank(req, (1, 2))
            assert (req.rank.tp_rank, req.rank.tp_size) == (1, 2)
        else:
            # Before the API has a rank on open, only rank 0 of 1 can mean what it says.
            with pytest.raises(ValueError, match="no rank"):
                env.prefill._set_open_rank(req, (1, 2))
    # A request type that has the field gets it set.
    send = prefill_pb2.SendRequest()
    env.prefill._set_open_rank(send, (1, 2))
    assert (send.rank.tp_rank, send.rank.tp_size) == (1, 2)


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_every_call_has_a_deadline(pair):
    # A stopped daemon answers nothing: the call ends at the client's default
    # deadline instead of hanging (a call with no deadline fails the bound below).
    with (
        DecodeClient(pair.decode.address, watch=False, timeout=0.3) as dec,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        assert dec.poll([1])[0].found is False  # connected
        pair.decode.proc.send_signal(signal.SIGSTOP)
        try:
            # kill() returns before the stop takes hold: wait until it has.
            settle(lambda: _proc_state(pair.decode.proc.pid) == "T", "decoded stopped")
            with pytest.raises(pdlink.DeadlineExceeded) as e:
                pool.submit(dec.poll, [1]).result(timeout=10)
            assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            with pytest.raises(pdlink.DeadlineExceeded):
                pool.submit(dec.open, 1, pair.prefill.bootstrap).result(timeout=10)
        finally:
            pair.decode.proc.send_signal(signal.SIGCONT)
