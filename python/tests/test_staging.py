"""Host staging's page runs: the copies a chunk's pages become."""

from __future__ import annotations

import numpy as np
import pytest

from pdlink.sglang import staging


def _runs_by_page(src, dst):
    """The runs, one page at a time: the definition the fast paths must match."""
    out = []
    for s, d in zip(src, dst, strict=True):
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((int(s), int(d), 1))
    return out


@pytest.mark.parametrize("pages", [0, 1, 2, 63, 64, 65, 500, 8192])
def test_runs_of_a_chunk_match_the_page_by_page_runs_on_both_paths(pages):
    rng = np.random.default_rng(pages)
    slots = np.arange(pages, dtype=np.int64)
    contiguous = np.arange(7, 7 + pages, dtype=np.int32)
    scattered = rng.permutation(2 * pages + 1)[:pages].astype(np.int32)
    # Contiguous source pages whose staging slots break: runs end on either side.
    broken = slots.copy()
    broken[pages // 2 :] += 3
    for src, dst in ((contiguous, slots), (scattered, slots), (contiguous, broken)):
        assert staging._runs(src, dst) == _runs_by_page(src.tolist(), dst.tolist())
    if pages >= staging._VECTOR_RUNS_FROM:
        assert len(staging._runs(contiguous, slots)) == 1


def test_runs_refuse_page_lists_of_different_lengths():
    with pytest.raises(ValueError, match="3 source pages for 2 destination pages"):
        staging._runs(np.arange(3), np.arange(2))
    with pytest.raises(ValueError, match="70 source pages for 69"):
        staging._runs(np.arange(70), np.arange(69))


def test_copy_pages_moves_every_buffers_pages_to_their_slots():
    pool = [np.random.default_rng(b).integers(0, 255, (300, 16), dtype=np.uint8) for b in range(3)]
    region = [np.zeros((200, 16), dtype=np.uint8) for _ in range(3)]
    src = np.concatenate((np.arange(10, 110), [5, 3, 250]))  # a run of 100, then scattered
    dst = np.arange(103)
    staging.copy_pages(
        staging.copier(on_device=False),
        [int(a.ctypes.data) for a in pool],
        [int(a.ctypes.data) for a in region],
        [16, 16, 16],
        src,
        dst,
    )
    for p, r in zip(pool, region, strict=True):
        assert np.array_equal(r[dst], p[src])
        assert not r[103:].any()
