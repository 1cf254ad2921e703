"""A daemon killed and restarted mid-run: the client reconnects, lost rooms show as
lost, new rooms work."""

from __future__ import annotations

import numpy as np
from conftest import LAYOUT, fill, open_bound, settle, state_of

from pdlink import RoomState


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
    env.pair.prefill.restart()

    # The prefill client's watch reconnects and its resync finds the rooms gone.
    settle(lambda: env.prefill.cache.reconnects > reconnects, "prefill watch reconnected")
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
