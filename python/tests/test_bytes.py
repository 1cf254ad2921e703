"""Many rooms end to end: prefill writes a pattern through numpy views, decode reads
the same bytes after Success."""

from __future__ import annotations

import numpy as np
from conftest import LAYOUT, settle, state_of

from pdlink import RoomState

WAVES = 25
ROOMS_PER_WAVE = 8  # 8 rooms x 8 pages fill the 64 pages of each buffer
PAGES = 8


def test_many_rooms_move_the_bytes_prefill_wrote(env):
    rng = np.random.default_rng(13)
    pages = LAYOUT.buffers[0].pages
    rows = LAYOUT.aux.rows
    room = 1
    for _wave in range(WAVES):
        src_perm = rng.permutation(pages)
        dst_perm = rng.permutation(pages)
        aux_src = rng.permutation(rows)
        aux_dst = rng.permutation(rows)
        wave = []
        for i in range(ROOMS_PER_WAVE):
            src = src_perm[i * PAGES : (i + 1) * PAGES].astype(np.int32)
            dst = dst_perm[i * PAGES : (i + 1) * PAGES].astype(np.int32)
            for b in range(len(LAYOUT.buffers)):
                env.src.pages(b)[src] = rng.integers(0, 256, (PAGES, LAYOUT.buffers[b].item_len))
            env.src.aux()[aux_src[i]] = rng.integers(0, 256, LAYOUT.aux.row_len)
            env.dst.pages(0)[dst] = 0
            env.decode.open(room, env.bootstrap)
            env.prefill.open(room)
            env.decode.send_metadata(room, dst, aux_index=int(aux_dst[i]))
            wave.append((room, src, dst, int(aux_src[i]), int(aux_dst[i])))
            room += 1
        for r, src, _, a_src, _ in wave:
            settle(lambda r=r: state_of(env.prefill, r) == RoomState.WAITING_FOR_INPUT, "bound")
            # Two chunks: the first half, then the rest with the aux row.
            env.prefill.send(r, src[: PAGES // 2], start_position=0)
            env.prefill.send(
                r, src[PAGES // 2 :], start_position=PAGES // 2, last=True, aux_index=a_src
            )
        ids = [w[0] for w in wave]
        settle(
            lambda ids=ids: all(state_of(env.decode, r) == RoomState.SUCCESS for r in ids),
            "decode rooms Success",
        )
        for _r, src, dst, a_src, a_dst in wave:
            for b in range(len(LAYOUT.buffers)):
                assert np.array_equal(env.dst.pages(b)[dst], env.src.pages(b)[src])
            assert np.array_equal(env.dst.aux()[a_dst], env.src.aux()[a_src])
        settle(
            lambda ids=ids: all(state_of(env.prefill, r) == RoomState.SUCCESS for r in ids),
            "prefill rooms Success",
        )
        assert all(res.cleared for res in env.decode.clear(ids))
        assert all(res.cleared for res in env.prefill.clear(ids))
