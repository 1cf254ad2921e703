"""SGLang at TP > 1 through its real classes: one manager per rank per side, one daemon per side.

Each rank's manager is built as that rank's scheduler process builds it:
its own KVArgs (engine_rank, its pool, its heads) under its own place in
the parallel groups (get_parallel().override with its tp/attn_tp rank and
size) and its own ServerArgs tp_size. The managers live in this one
process and thread, because SGLang's CommonKVManager reads the parallel
context once, in its constructor (later calls use the captured
attn_tp_rank/attn_tp_size), so a scoped override per construction gives
each manager exactly its rank's view without subprocesses.

Every request is driven per rank in the schedulers' order (see
test_sglang_transfer.py), and every decode rank's pages are checked
against the heads it holds of the request's whole KV: equal TP, MHA head
slices between TP sizes, MLA's replicated latent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from sglang_harness import Pool, install_config, kv_class, require_sglang, wait_poll

require_sglang()

import msgspec  # noqa: E402
import torch  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: E402
from sglang.srt.disaggregation.common.conn import KVTransferError  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

load_plugins()

BUFFERS = 4  # two layers, K then V
POOL_PAGES = 48
PAGE_SIZE = 4  # tokens per page
HEADS = 4  # the model's KV heads (MHA); MLA has one latent head
HEAD_BYTES = 16
MLA_HEAD_BYTES = 64
AUX_ROWS = 16
STAGING_SLOTS = 40
OTHER_RANKS = {"pp_group": 0, "attn_dcp_rank": 0, "attn_cp_rank": 0, "attn_dp_rank": 0}


@dataclass
class Side:
    tp: int
    mgrs: list
    pools: list[Pool]


@dataclass
class TPServers:
    pre: Side
    dec: Side
    mla: bool
    bootstrap_addr: str
    heads: int  # the model's KV heads (MLA: its one latent)

    def rank_heads(self, tp: int) -> int:
        return max(self.heads // tp, 1)


@contextmanager
def rank_view(tp: int, rank: int):
    """This process as TP rank rank of tp, as that rank's scheduler has it."""
    with get_parallel().override(
        **OTHER_RANKS,
        tp_size=tp,
        moe_tp_size=tp,
        attn_tp_size=tp,
        tp_rank=rank,
        attn_tp_rank=rank,
    ):
        yield


def make_side(pair_side, mode, tp, mla, heads, server_args, monkeypatch, stray_rank=None) -> Side:
    manager_cls = kv_class(KVClassType.MANAGER)
    kv_args_cls = kv_class(KVClassType.KVARGS)
    monkeypatch.setenv("PDLINK_REGION_DIR", str(pair_side.region_dir))
    rank_heads = max(heads // tp, 1)  # SGLang's head_num: replicated below one per rank
    item_len = PAGE_SIZE * rank_heads * (MLA_HEAD_BYTES if mla else HEAD_BYTES)
    total = heads
    rank_args = msgspec.structs.replace(server_args, tp_size=tp)
    mgrs, pools = [], []
    for r in range(tp):
        pool = Pool.make(BUFFERS, POOL_PAGES, item_len, AUX_ROWS)
        args = pool.kv_args(kv_args_cls, PAGE_SIZE, r, rank_heads, total)
        if mode == DisaggregationMode.DECODE:
            # SGLang's decode hands its manager no head counts (decode.py
            # sets them only for its own staging, after the manager exists).
            del args.kv_head_num, args.total_kv_head_num
        if r == stray_rank:
            # This rank advertises another prefilld than its siblings.
            monkeypatch.setenv("PDLINK_PREFILL_BOOTSTRAP", "tcp://127.0.0.1:1")
        with rank_view(tp, r):
            mgrs.append(manager_cls(args, mode, rank_args, mla))
        if r == stray_rank:
            monkeypatch.setenv("PDLINK_PREFILL_BOOTSTRAP", pair_side.bootstrap)
        pools.append(pool)
    return Side(tp, mgrs, pools)


@pytest.fixture
def tp_servers(pair, monkeypatch, request) -> Iterator[TPServers]:
    pre_tp, dec_tp, mla, *rest = request.param
    opts = rest[0] if rest else {}
    heads = 1 if mla else opts.get("heads", HEADS)
    if not opts.get("no_decode_heads"):
        monkeypatch.setenv("PDLINK_TOTAL_KV_HEADS", str(heads))
    override, server_args, port = install_config(monkeypatch, STAGING_SLOTS)
    bootstrap = kv_class(KVClassType.BOOTSTRAP_SERVER)("127.0.0.1", port)
    monkeypatch.setenv("PDLINK_PREFILLD_ADDR", pair.prefill.address)
    monkeypatch.setenv("PDLINK_PREFILL_BOOTSTRAP", pair.prefill.bootstrap)
    pre = make_side(
        pair.prefill,
        DisaggregationMode.PREFILL,
        pre_tp,
        mla,
        heads,
        server_args,
        monkeypatch,
        opts.get("stray_rank"),
    )
    monkeypatch.setenv("PDLINK_DECODED_ADDR", pair.decode.address)
    dec = make_side(
        pair.decode, DisaggregationMode.DECODE, dec_tp, mla, heads, server_args, monkeypatch
    )
    yield TPServers(pre, dec, mla, f"127.0.0.1:{port}", heads)
    for m in pre.mgrs + dec.mgrs:
        m.close()
    bootstrap.close()
    override.restore()


def whole_kv(s: TPServers, room: int, buffer: int, position: int) -> torch.Tensor:
    """The request's KV of one page position, every head: (tokens, heads, head bytes)."""
    hb = MLA_HEAD_BYTES if s.mla else HEAD_BYTES
    t = torch.arange(PAGE_SIZE).view(-1, 1, 1) * 5
    h = torch.arange(s.heads).view(1, -1, 1) * 17
    b = torch.arange(hb).view(1, 1, -1)
    return ((room * 7 + buffer * 31 + position * 13 + t + h + b) % 251).to(torch.uint8)


def heads_of(s: TPServers, tp: int, rank: int, kv: torch.Tensor) -> torch.Tensor:
    """The page rank rank of tp holds of kv: its heads, token-major, as SGLang's pool."""
    if s.mla:
        return kv.reshape(-1)
    n = s.rank_heads(tp)
    first = rank * s.heads // tp  # fewer heads than ranks: rank holds its group's head
    return kv[:, first : first + n, :].reshape(-1)


@dataclass
class Req:
    room: int
    npages: int
    senders: list
    receivers: list
    src: list[list[int]]  # per prefill rank, its pool pages
    dst: list[list[int]]  # per decode rank
    aux_src: int
    aux_dst: int
    prefix: int = 0  # pages decode holds already (its radix cache)


def open_req(s: TPServers, room, npages, src, dst, aux_src, aux_dst, prefix=0) -> Req:
    sender_cls = kv_class(KVClassType.SENDER)
    receiver_cls = kv_class(KVClassType.RECEIVER)
    senders = [sender_cls(m, s.bootstrap_addr, room) for m in s.pre.mgrs]
    receivers = []
    for m in s.dec.mgrs:
        r = receiver_cls(m, s.bootstrap_addr, room)
        assert m.try_ensure_parallel_info(s.bootstrap_addr)
        r.init(0)
        receivers.append(r)
    for d, r in enumerate(receivers):
        wait_poll(r, {KVPoll.WaitingForInput}, f"decode rank {d} handshake")
    return Req(room, npages, senders, receivers, src, dst, aux_src, aux_dst, prefix)


def fill(s: TPServers, req: Req) -> None:
    for rank, pool in enumerate(s.pre.pools):
        for b, t in enumerate(pool.kv):
            for pos, page in enumerate(req.src[rank]):
                t[page] = heads_of(s, s.pre.tp, rank, whole_kv(s, req.room, b, pos))
        # Every TP rank holds the same output (SGLang's ranks agree on it).
        pool.aux[0][req.aux_src] = torch.arange(16, dtype=torch.int32) + req.room
        pool.aux[1][req.aux_src] = req.room


def decode_own(room: int, rank: int, page: int) -> torch.Tensor:
    """A prefix page's bytes on decode: a ramp, which no page of whole_kv equals."""
    return ((torch.arange(PAGE_SIZE * 64) * (rank + 3) + page + room) % 256).to(torch.uint8)


def drive(s: TPServers, req: Req, chunks: int) -> None:
    for d, r in enumerate(req.receivers):
        for t in s.dec.pools[d].kv:
            for pg in req.dst[d][: req.prefix]:
                t[pg] = decode_own(req.room, d, pg)[: t.shape[1]]
        r.send_metadata(
            torch.tensor(req.dst[d][req.prefix :], dtype=torch.int32).numpy(),
            req.aux_dst,
            decode_prefix_len=req.prefix * PAGE_SIZE,
        )
    for rank, snd in enumerate(req.senders):
        wait_poll(snd, {KVPoll.WaitingForInput}, f"prefill rank {rank} bootstrap")
        # finalize_bootstrap: every rank learns decode's prefix, sends the rest.
        assert snd.pop_decode_prefix_len() == req.prefix * PAGE_SIZE, rank
        snd.init(req.npages - req.prefix, req.aux_src)
    fill(s, req)
    step = max(1, -(-req.npages // chunks))
    # The ranks' schedulers run side by side: their chunks interleave.
    for i in range(req.prefix, req.npages, step):
        for rank, snd in enumerate(req.senders):
            snd.send(torch.tensor(req.src[rank][i : i + step], dtype=torch.int32).numpy())


def verify(s: TPServers, req: Req) -> None:
    for d, pool in enumerate(s.dec.pools):
        for b, t in enumerate(pool.kv):
            for pos, page in enumerate(req.dst[d]):
                want = heads_of(s, s.dec.tp, d, whole_kv(s, req.room, b, pos))
                if pos < req.prefix:
                    want = decode_own(req.room, d, page)[: t.shape[1]]
                assert torch.equal(t[page], want), (req.room, "decode rank", d, b, pos)
        assert torch.equal(pool.aux[0][req.aux_dst], torch.arange(16, dtype=torch.int32) + req.room)
        assert int(pool.aux[1][req.aux_dst][0]) == req.room


# GQA with fewer KV heads than ranks: pairs of ranks hold one head (SGLang's
# tp_rank // (tp / heads)). 2 -> 4: each decode rank is fed its head whole by
# the one prefill rank holding it; 4 -> 2: each decode rank reads it from the
# first of the two prefill replicas, the other is a dummy.
GQA_REPLICATED = [(2, 4, False, {"heads": 2}), (4, 2, False, {"heads": 2})]
CASES = [(2, 2, False), (2, 4, False), (4, 2, False), (2, 4, True), (4, 2, True), *GQA_REPLICATED]


@pytest.mark.parametrize(
    "tp_servers",
    [
        pytest.param(
            c, id=f"{'mla' if c[2] else 'mha'}-{c[0]}to{c[1]}" + ("-2heads" if c[3:] else "")
        )
        for c in CASES
    ],
    indirect=True,
)
def test_tp_ranks_move_every_ranks_verified_kv_and_aux_in_scheduler_order(tp_servers):
    s = tp_servers
    rooms = 0
    for wave in range(4):
        gen = torch.Generator().manual_seed(wave)
        free_src = [torch.randperm(POOL_PAGES, generator=gen).tolist() for _ in s.pre.pools]
        free_dst = [torch.randperm(POOL_PAGES, generator=gen).tolist() for _ in s.dec.pools]
        reqs = []
        for k in range(4):
            room = 2000 + wave * 4 + k
            n = 3 + room % 6  # 3..8 pages
            src = [f[k * 8 : k * 8 + n] for f in free_src]
            dst = [f[k * 8 : k * 8 + n] for f in free_dst]
            # Every other request finds a prefix in decode's radix cache.
            prefix = (room % 3) if k % 2 else 0
            reqs.append(open_req(s, room, n, src, dst, k, (k + 5) % AUX_ROWS, prefix))
        for req in reqs:
            drive(s, req, chunks=3)
        for req in reqs:
            # A scheduler acts on a room once every rank polled it Success
            # (SGLang's MIN all-reduce over the ranks), then each rank clears.
            for rank, snd in enumerate(req.senders):
                assert wait_poll(snd, {KVPoll.Success}, f"prefill rank {rank}") == KVPoll.Success
            for snd in req.senders:
                snd.clear()
            for d, r in enumerate(req.receivers):
                assert wait_poll(r, {KVPoll.Success}, f"decode rank {d}") == KVPoll.Success
            verify(s, req)
            for r in req.receivers:
                r.clear()
            rooms += 1
    assert rooms == 16
    for m in s.pre.mgrs + s.dec.mgrs:
        assert m.slots.free == STAGING_SLOTS


@pytest.mark.parametrize("tp_servers", [(2, 4, False, {"no_decode_heads": True})], indirect=True)
def test_mha_between_tp_sizes_without_decode_head_counts_fails_naming_the_variable(tp_servers):
    s = tp_servers
    receiver_cls = kv_class(KVClassType.RECEIVER)
    for d, m in enumerate(s.dec.mgrs):
        assert m.region.layout.attention is None  # SGLang's decode gave no heads
        r = receiver_cls(m, s.bootstrap_addr, 3000)
        assert m.try_ensure_parallel_info(s.bootstrap_addr)
        r.init(0)
        assert r.poll() == KVPoll.Failed, d
        with pytest.raises(KVTransferError, match="PDLINK_TOTAL_KV_HEADS"):
            r.failure_exception()


@pytest.mark.parametrize("tp_servers", [(4, 2, False, {"stray_rank": 1})], indirect=True)
def test_a_decode_rank_whose_prefill_ranks_advertise_two_prefillds_fails_with_a_reason(tp_servers):
    # MHA 4 -> 2: decode rank 0 reads prefill ranks 0 and 1, which disagree
    # on prefilld; decode rank 1 reads ranks 2 and 3, which agree.
    s = tp_servers
    receiver_cls = kv_class(KVClassType.RECEIVER)
    receivers = []
    for m in s.dec.mgrs:
        r = receiver_cls(m, s.bootstrap_addr, 3100)
        assert m.try_ensure_parallel_info(s.bootstrap_addr)
        r.init(0)
        receivers.append(r)
    assert receivers[0].poll() == KVPoll.Failed
    with pytest.raises(KVTransferError, match="one prefilld must serve every prefill rank"):
        receivers[0].failure_exception()
    assert receivers[1].poll() != KVPoll.Failed
    receivers[1].abort()
    receivers[1].clear()
