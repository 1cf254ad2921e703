"""A bare Python scheduler pair: one request's KV pages from prefill to decode.

python bare_scheduler.py PREFILLD DECODED BOOTSTRAP PREFILL_DIR DECODE_DIR
"""

import sys

import numpy as np

from pdlink import DecodeClient, PrefillClient, Region, RegionLayout, RoomState
from pdlink.client import wait_for

prefilld, decoded, bootstrap, prefill_dir, decode_dir = sys.argv[1:6]
# 2 buffers (say one layer's K and V) of 64 pages of 4 KiB, 8 aux rows of 64 B.
layout = RegionLayout.uniform(buffers=2, pages=64, item_len=4096, aux_rows=8, aux_row_len=64)

with (
    PrefillClient(prefilld) as pre,  # "unix:///run/pdlink/prefilld.sock" or "host:port"
    DecodeClient(decoded) as dec,
    Region.create(prefill_dir, layout) as src,  # files under each daemon's --region-dir
    Region.create(decode_dir, layout) as dst,
):
    pre.keep_region(src, rank=(0, 1))  # registered again after a daemon restart
    dec.keep_region(dst, rank=(0, 1))

    room = 1  # the router gives both engines the same room id
    src.pages(0)[[3, 4]] = np.arange(4096, dtype=np.uint8)  # "the KV": engine writes
    src.pages(1)[[3, 4]] = 7
    src.aux()[0] = 1

    dec.open(room, bootstrap)  # decode first, as a router does; bootstrap: prefilld's tcp://
    pre.open(room)
    dec.send_metadata(room, [10, 11], aux_index=2)  # where the pages go on decode

    # A scheduler step looks its rooms up in the Watch-fed cache: no RPC.
    wait_for(lambda: pre.status(room).state == RoomState.WAITING_FOR_INPUT, 10)
    pre.send(room, [3, 4], last=True, aux_index=0)  # the last chunk carries aux row 0
    wait_for(lambda: dec.status(room).state.terminal, 10)

    st = dec.status(room)
    if st.state == RoomState.FAILED:
        sys.exit(f"room {room} failed: {st.reason} {st.peer_reason}")
    assert np.array_equal(dst.pages(0)[[10, 11]], src.pages(0)[[3, 4]])
    assert np.array_equal(dst.aux()[2], src.aux()[0])
    wait_for(lambda: pre.status(room).state.terminal, 10)
    pre.clear([room])
    dec.clear([room])
    print(f"room {room}: {st.state.name}, {2 * 2 * 4096} bytes moved")

    pre.unregister_region(rank=(0, 1))  # before the engine deletes its region file
    dec.unregister_region(rank=(0, 1))
    src.unlink()
    dst.unlink()
