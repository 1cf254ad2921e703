"""A daemon killed and restarted mid-run: the client reconnects, lost rooms show as
lost, new rooms work."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import LAYOUT, fill, open_bound, settle, state_of

from pdlink import DecodeClient, FailedPrecondition, PrefillClient, Region, RoomState


def _complete(env, room: int, src_page: int, dst_page: int) -> None:
    fill(env.src, 0, src_page, seed=room)
    fill(env.src, 1, src_page, seed=room)
    open_bound(env, room, [dst_page])
    env.prefill.send(room, [src_page], last=True)
    settle(lambda: state_of(env.decode, room) == RoomState.SUCCESS, f"decode room {room} Success")
    for b in range(len(LAYOUT.buffers)):
        assert np.array_equal(env.dst.pages(b)[dst_page], env.src.pages(b)[src_page])


def test_prefilld_restart_mid_run(env):
    _complete(env, 1, 0, 0)
    live = [10, 11, 12]
    for i, r in enumerate(live):
        open_bound(env, r, [10 + i])
    reconnects = env.prefill.cache.reconnects
    assert env.prefill.cache.disconnected_since is None
    env.pair.prefill.kill()
    settle(lambda: not env.prefill.cache.connected.is_set(), "prefill watch sees the daemon gone")
    assert env.prefill.cache.disconnected_since is not None
    env.pair.prefill.start()

    # The prefill client's watch reconnects and its resync finds the rooms gone.
    settle(lambda: env.prefill.cache.reconnects > reconnects, "prefill watch reconnected")
    settle(lambda: env.prefill.cache.disconnected_since is None, "prefill watch resynced")
    settle(
        lambda: all(not env.prefill.status(r).found for r in live),
        "prefill rooms lost in the restart show found=False",
    )
    # decoded learns its peer restarted and fails the rooms bound to it.
    settle(
        lambda: all(state_of(env.decode, r) == RoomState.FAILED for r in live),
        "decode rooms Failed after the prefill restart",
    )
    assert {env.decode.status(r).reason for r in live} <= {"peer_restarted", "peer_lost"}
    for client in (env.prefill, env.decode):
        client.clear(live)

    # The new daemon has no region until the engine registers it again.
    env.prefill.register_region(env.src)
    for r in range(20, 25):
        _complete(env, r, r - 20, r - 20 + 30)


def test_decoded_restart_mid_run(env):
    live = [30, 31]
    for i, r in enumerate(live):
        open_bound(env, r, [i])
    reconnects = env.decode.cache.reconnects
    env.pair.decode.restart()
    settle(lambda: env.decode.cache.reconnects > reconnects, "decode watch reconnected")
    settle(
        lambda: all(not env.decode.status(r).found for r in live),
        "decode rooms lost in the restart show found=False",
    )
    settle(
        lambda: all(state_of(env.prefill, r) == RoomState.FAILED for r in live),
        "prefill rooms Failed after the decode restart",
    )
    for client in (env.prefill, env.decode):
        client.clear(live)
    env.decode.register_region(env.dst)
    for r in range(40, 44):
        _complete(env, r, r - 40, r - 40 + 20)


def _keep(env) -> None:
    # What an engine does at start: the env fixture registered once; keeping
    # is idempotent for the same file and layout.
    env.prefill.keep_region(env.src)
    env.decode.keep_region(env.dst)


def test_a_kept_region_is_registered_again_when_the_watch_stream_comes_back(env):
    """A restarted daemon holds no region: with keep_region the client
    registers it again before its stream reports connected, with no open
    needed to notice (an idle engine makes none), and the next rooms move."""
    _keep(env)
    for client, daemon in ((env.prefill, env.pair.prefill), (env.decode, env.pair.decode)):
        restores, reconnects = client.region_restores, client.cache.reconnects
        daemon.restart()
        settle(
            lambda c=client, n=reconnects: c.cache.reconnects > n and c.cache.connected.is_set(),
            f"{daemon.name} watch back",
        )
        # Registered before connected.set(), so already counted now.
        assert client.region_restores > restores
    for r in range(50, 54):
        _complete(env, r, r - 50, r - 50 + 40)


class _Down(grpc.RpcError):
    pass


def test_an_open_while_the_watch_stream_is_down_registers_the_kept_region_first(env):
    """prefilld takes an OpenSender with no region and binds no decode to it:
    an open on a restarted daemon that the stream has not yet seen come back
    registers the kept region first, and the room moves its page."""
    _keep(env)
    watch = env.prefill._stub.Watch

    def refuse(*args, **kwargs):
        raise _Down()

    env.prefill._stub.Watch = refuse
    env.pair.prefill.restart()
    settle(lambda: not env.prefill.cache.connected.is_set(), "prefill watch sees the restart")
    restores = env.prefill.region_restores
    env.prefill.open(60)
    assert env.prefill.region_restores == restores + 1
    assert not env.prefill.cache.connected.is_set(), "the Watch stream stayed down"
    env.prefill._stub.Watch = watch

    fill(env.src, 0, 3, seed=60)
    fill(env.src, 1, 3, seed=60)
    env.decode.open(60, env.bootstrap)
    env.decode.send_metadata(60, [33])
    settle(
        lambda: env.prefill.poll([60])[0].state == RoomState.WAITING_FOR_INPUT,
        "prefill room 60 bound",
    )
    env.prefill.send(60, [3], last=True)
    settle(lambda: env.decode.poll([60])[0].state == RoomState.SUCCESS, "decode room 60 Success")
    for b in range(len(LAYOUT.buffers)):
        assert np.array_equal(env.dst.pages(b)[33], env.src.pages(b)[3])


def test_an_open_refused_for_want_of_a_kept_region_registers_it_and_opens_again(pair):
    """decoded can answer an OpenReceiver before the Watch stream saw it
    restart ("no region registered"): the client registers the kept region and
    opens once more. A region not kept gets the refusal."""
    pre = PrefillClient(pair.prefill.address)
    dec = DecodeClient(pair.decode.address, watch=False)  # no stream to notice the restart
    src = Region.create(str(pair.prefill.region_dir), LAYOUT)
    dst = Region.create(str(pair.decode.region_dir), LAYOUT)
    try:
        pre.keep_region(src)
        dec.register_region(dst)
        pair.decode.restart()
        with pytest.raises(FailedPrecondition, match="no region registered"):
            dec.open(70, pair.prefill.bootstrap)
        dec.keep_region(dst)
        pair.decode.restart()
        st = dec.open(71, pair.prefill.bootstrap)
        assert st.found and dec.region_restores == 1
    finally:
        pre.close()
        dec.close()
