"""SGLang 0.5.23's own disaggregation queues driving the pdlink backend, on real daemons.

test_sglang_transfer.py calls pdlink's KVSender/KVReceiver in SGLang's
order by hand; here SGLang's queue code makes every call itself.

Real (SGLang's code, called unmodified):
- the backend: get_kv_class(TransferBackend("pdlink"), ...) after SGLang's
  load_plugins(), the KVArgs and manager built by each queue's own
  _init_kv_manager from the pools below, SGLang's bootstrap server;
- prefill: PrefillBootstrapQueue (add -> create_sender, pop_bootstrapped ->
  finalize_bootstrap -> sender.init), and the prefill scheduler mixin's
  process_prefill_chunk and send_kv_chunk (middle chunks),
  send_kv_chunk(last_chunk=True) with MetadataBuffers.set_buf,
  process_disagg_prefill_inflight_queue (poll, clear, release),
  handle_bootstrap_failure and handle_inflight_transfer_failure;
- decode: DecodePreallocQueue (add, pop_preallocated: try_ensure_parallel_info
  against the bootstrap server, receiver.init, the handshake poll, the
  admission budget, _pre_alloc from the real allocator, send_metadata) and
  DecodeTransferQueue (pop_transferred: poll with its metadata gate, the
  commit of the first token from the aux row, clear, failure handling);
- the memory: MHATokenToKVPool on device="cpu", PagedTokenToKVPoolAllocator,
  ReqToTokenPool / DecodeReqToTokenPool, UnifiedRadixCache built disabled
  (as --disable-radix-cache builds it), MetadataBuffers,
  ReqToMetadataIdxAllocator, Req and SamplingParams; the attention-TP group
  a real GroupCoordinator over a single-process gloo group on loopback.

Stood in (each named *StandIn below, with what it holds and why):
- the Scheduler object the queues and mixin methods read attributes from;
- the model forward: it writes a known pattern into the real KV pool at the
  token slots the real allocator handed out, chunk by chunk;
- the last-chunk lines of process_batch_result_disagg_prefill (that method
  needs a whole batch result: logits, sampling, grammar);
- the output streamer (records what SGLang would stream to the tokenizer);
- Scheduler.abort_request's disaggregation lines (the rest of it walks
  batches this test has none of).
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
from sglang_harness import WAIT, free_port, kv_class, require_sglang, sglang_process, wait_poll

from pdlink import RoomState
from pdlink.client import wait_for

require_sglang()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: E402
from sglang.srt.disaggregation.decode import (  # noqa: E402
    DecodePreallocQueue,
    DecodeReqToTokenPool,
    DecodeTransferQueue,
)
from sglang.srt.disaggregation.prefill import (  # noqa: E402
    PrefillBootstrapQueue,
    SchedulerDisaggregationPrefillMixin,
)
from sglang.srt.disaggregation.utils import (  # noqa: E402
    KVClassType,
    MetadataBuffers,
    ReqToMetadataIdxAllocator,
    TransferBackend,
)
from sglang.srt.distributed.parallel_state import GroupCoordinator  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

# As SGLang's launcher does first: pdlink's entry point registers its hooks,
# and the patched get_kv_class reaches every module that imported it.
load_plugins()

LAYERS = 2
HEAD_NUM = 1
HEAD_DIM = 32
DTYPE = torch.bfloat16
PAGE_SIZE = 4
POOL_TOKENS = 256  # 64 pages a side
MAX_CONTEXT = 128
REQ_SLOTS = 6  # rows of req_to_token: at most this many requests hold KV at once
METADATA_ROWS = 6
MAX_NEW_TOKENS = 4
HIDDEN = 16
# Staging pages per buffer, fewer than the pool: rooms borrow and give back.
STAGING_SLOTS = 48


def pattern(room: int, layer: int, which: int, positions: torch.Tensor) -> torch.Tensor:
    """The KV the model stand-in writes for token positions: small integers,
    exact in bfloat16, different for every room, layer, K/V and position."""
    base = (room * 7 + layer * 3 + which * 5 + positions.to(torch.int64) * 11) % 97
    d = torch.arange(HEAD_DIM, dtype=torch.int64)
    rows = (base[:, None] + d[None, :]) % 128 - 64
    return rows.to(DTYPE).reshape(len(positions), HEAD_NUM, HEAD_DIM)


CACHED_TOKEN_FIELDS = (
    "cached_tokens",
    "cached_tokens_device",
    "cached_tokens_host",
    "cached_tokens_storage",
)


def first_token(room: int) -> int:
    return 1000 + room % 5000


class OutputStreamerStandIn:
    """SchedulerOutputStreamer's one method the queues call: records the
    requests SGLang would stream to the tokenizer (finished or aborted)."""

    def __init__(self) -> None:
        self.streamed: list = []

    def stream_output(self, reqs, return_logprob, *args, **kwargs) -> None:
        self.streamed.extend(reqs)


class RunningBatchStandIn:
    """ScheduleBatch as the queues read it between forwards: no running
    requests (nothing to retract, nothing to reserve for), not full."""

    def __init__(self) -> None:
        self.reqs: list = []
        self.batch_is_full = False


def _model_config_stand_in():
    # ModelConfig fields the queues' _init_kv_manager read: layer count for
    # the layer ids, KV heads for KVArgs, hf_text_config (read only for
    # hybrid-linear pools, but evaluated eagerly).
    return SimpleNamespace(
        num_hidden_layers=LAYERS,
        hf_text_config=SimpleNamespace(),
        get_total_num_kv_heads=lambda: HEAD_NUM,
    )


def _tp_worker_stand_in():
    # TpModelWorker / ModelRunner fields: the pool's capacity in tokens, its
    # dtype name for KVArgs, and no hybrid SWA.
    return SimpleNamespace(
        is_hybrid_swa=False,
        model_runner=SimpleNamespace(
            effective_logical_max_total_num_tokens=POOL_TOKENS,
            kv_cache_dtype_str="bfloat16",
        ),
    )


class Memory:
    """One server's real pools, on CPU."""

    def __init__(self, req_to_token_pool) -> None:
        self.kv = MHATokenToKVPool(
            size=POOL_TOKENS,
            page_size=PAGE_SIZE,
            dtype=DTYPE,
            head_num=HEAD_NUM,
            head_dim=HEAD_DIM,
            layer_num=LAYERS,
            device="cpu",
            enable_memory_saver=False,
        )
        self.allocator = PagedTokenToKVPoolAllocator(
            POOL_TOKENS, PAGE_SIZE, DTYPE, "cpu", self.kv, need_sort=False
        )
        self.req_to_token = req_to_token_pool
        self.tree_cache = UnifiedRadixCache(
            CacheInitParams(
                disable=True,
                req_to_token_pool=self.req_to_token,
                token_to_kv_pool_allocator=self.allocator,
                page_size=PAGE_SIZE,
                tree_components=(ComponentType.FULL,),
            )
        )
        self.metadata = MetadataBuffers(METADATA_ROWS, HIDDEN, DTYPE, 16)
        self.metadata_rows = ReqToMetadataIdxAllocator(METADATA_ROWS)
        self.req_rows = self.req_to_token.available_size()


class SchedulerStandIn:
    """What both servers' Scheduler objects hold for the queues: the server
    args, the model worker and config stand-ins, no metrics, the recording
    output streamer."""

    def __init__(self, server_args) -> None:
        self.server_args = server_args
        self.tp_worker = _tp_worker_stand_in()
        self.model_config = _model_config_stand_in()
        self.output_streamer = OutputStreamerStandIn()
        self.metrics_reporter = SimpleNamespace(enable_metrics=False)

    def retire_unadmitted_request(self, req) -> None:
        raise AssertionError(f"request {req.rid} was rejected at intake")


class PrefillSchedulerStandIn(SchedulerStandIn, SchedulerDisaggregationPrefillMixin):
    """The prefill Scheduler as SGLang's prefill queue and mixin methods see it.

    The methods are SGLang's own mixin's; the attributes are what they
    read: the real pools, the queues, a non-overlap single-rank scheduler
    with no metrics, staging, checksums or speculative decoding.
    """

    def __init__(self, server_args, group, mem: Memory, bootstrap_port: int) -> None:
        super().__init__(server_args)
        self.kv_shard_widening = 1
        self.rust_server = None
        self.token_to_kv_pool_allocator = mem.allocator
        self.req_to_token_pool = mem.req_to_token
        self.tree_cache = mem.tree_cache
        self.req_to_metadata_buffer_idx_allocator = mem.metadata_rows
        self.disagg_metadata_buffers = mem.metadata
        self.attn_cp_cpu_group = group.cpu_group
        self.attn_tp_cpu_group = group.cpu_group
        self.scheduler_stage_metrics = None
        self.enable_overlap = False
        self.enable_staging = False
        self.chunked_req = None
        self.waiting_queue: list = []
        self.processed_tokens_counter = 0
        self.disagg_prefill_inflight_queue: list = []
        self.disagg_prefill_pending_chunk_rids: set = set()
        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue(
            token_to_kv_pool=mem.kv,
            draft_token_to_kv_pool=None,
            req_to_metadata_buffer_idx_allocator=mem.metadata_rows,
            metadata_buffers=mem.metadata,
            gpu_id=0,
            bootstrap_port=bootstrap_port,
            max_total_num_tokens=POOL_TOKENS,
            scheduler=self,
            scheduler_stage_metrics=None,
            transfer_backend=TransferBackend("pdlink"),
        )

    def _release_aborted_request(self, req) -> None:
        # Scheduler._release_aborted_request's body (sglang.srt.managers.
        # scheduler imports setproctitle, which the pinned venv lacks).
        req.release_mm_inputs_on_abort()
        self.tree_cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)

    def abort_request_stand_in(self, rid: str) -> None:
        """Scheduler.abort_request's lines for the disaggregated prefill queues."""
        for req in self.disagg_prefill_bootstrap_queue.queue:
            if req.rid == rid:
                self._release_aborted_request(req)
                req.disagg_kv_sender.abort()
        for req in self.disagg_prefill_inflight_queue:
            if req.rid == rid:
                req.disagg_kv_sender.abort()


class DecodeSchedulerStandIn(SchedulerStandIn):
    """The decode Scheduler as SGLang's prealloc and transfer queues see it:
    the real pools and queues, an empty running batch, single rank, no LoRA,
    HiCache, HiSparse, priorities, metrics or speculative decoding."""

    def __init__(self, server_args, mem: Memory, bootstrap_port: int) -> None:
        super().__init__(server_args)
        self.random_seed = 0
        self.enable_hisparse = False
        self.enable_lora = False
        self.enable_decode_hicache = False
        self.enable_priority_scheduling = False
        self.sliding_window_size = None
        self.running_batch = RunningBatchStandIn()
        self.last_batch = None
        self.waiting_queue: list = []
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        # BatchResultProcessor's hook for reasoning-token counting: no
        # reasoning parser here, so nothing to count.
        self.batch_result_processor = SimpleNamespace(
            _maybe_update_reasoning_tokens=lambda req, token: None
        )
        self.disagg_decode_prealloc_queue = None
        self.disagg_decode_transfer_queue = DecodeTransferQueue(
            req_to_metadata_buffer_idx_allocator=mem.metadata_rows,
            metadata_buffers=mem.metadata,
            scheduler=self,
            tree_cache=mem.tree_cache,
        )
        self.disagg_decode_prealloc_queue = DecodePreallocQueue(
            req_to_token_pool=mem.req_to_token,
            token_to_kv_pool_allocator=mem.allocator,
            draft_token_to_kv_pool=None,
            req_to_metadata_buffer_idx_allocator=mem.metadata_rows,
            metadata_buffers=mem.metadata,
            scheduler=self,
            transfer_queue=self.disagg_decode_transfer_queue,
            tree_cache=mem.tree_cache,
            gpu_id=0,
            bootstrap_port=bootstrap_port,
            max_total_num_tokens=POOL_TOKENS,
            num_reserved_decode_tokens=MAX_NEW_TOKENS,
            transfer_backend=TransferBackend("pdlink"),
        )

    def abort_request_stand_in(self, rid: str) -> None:
        """Scheduler.abort_request's lines for the disaggregated decode queues."""
        for decode_req in self.disagg_decode_prealloc_queue.queue:
            if decode_req.req.rid == rid:
                decode_req.kv_receiver.abort()
        for decode_req in self.disagg_decode_transfer_queue.queue:
            if decode_req.req.rid == rid:
                decode_req.kv_receiver.abort()

    def tick(self) -> list:
        """One event_loop_normal_disagg_decode step's queue work: preallocate,
        hand the preallocated to the transfer queue, pop the transferred."""
        pre = self.disagg_decode_prealloc_queue
        allocated, _failed = pre.pop_preallocated()
        self.disagg_decode_transfer_queue.extend(allocated)
        return self.disagg_decode_transfer_queue.pop_transferred()


@dataclass
class Flow:
    """One request as both servers hold it."""

    room: int
    prompt_len: int
    prefill: Req
    decode: Req
    transferred: bool = False


@dataclass
class Cluster:
    pair: object
    prefill_mem: Memory
    decode_mem: Memory
    prefill: PrefillSchedulerStandIn
    decode: DecodeSchedulerStandIn
    bootstrap_port: int
    flows: dict = field(default_factory=dict)

    def new_flow(self, room: int, prompt_len: int) -> Flow:
        def make() -> Req:
            return Req(
                rid=f"req-{room}",
                origin_input_text="",
                origin_input_ids=array("q", range(prompt_len)),
                sampling_params=SamplingParams(max_new_tokens=MAX_NEW_TOKENS),
                bootstrap_host="127.0.0.1",
                bootstrap_port=self.bootstrap_port,
                bootstrap_room=room,
            )

        flow = Flow(room, prompt_len, make(), make())
        # Prefill's prefix-cache counts ride in another metadata buffer than
        # the first token: distinct per room, so decode's copies can be told.
        for k, name in enumerate(CACHED_TOKEN_FIELDS):
            setattr(flow.prefill, name, room % 13 + k)
        self.flows[room] = flow
        return flow

    def admit(self, flow: Flow) -> None:
        """The request reaches both servers: the prefill bootstrap queue and
        the decode prealloc queue take it."""
        self.prefill.disagg_prefill_bootstrap_queue.add(flow.prefill, num_kv_heads=HEAD_NUM)
        self.decode.disagg_decode_prealloc_queue.add(flow.decode)


@pytest.fixture(scope="module")
def attn_tp_group() -> Iterator[GroupCoordinator]:
    """SGLang's GroupCoordinator over a one-process gloo group on loopback:
    the CPU group the queues all-reduce their polls over (MIN, so Failed=0
    wins across ranks). Torn down with the module, so no other test file
    finds a default process group it did not make."""
    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    try:
        yield GroupCoordinator(
            group_ranks=[[0]],
            local_rank=0,
            torch_distributed_backend="gloo",
            use_pynccl=False,
            use_mscclpp=False,
            use_custom_allreduce=False,
            use_torch_symm_mem_all_reduce=False,
            use_hpu_communicator=False,
            use_xpu_communicator=False,
            group_name="attn_tp",
        )
    finally:
        dist.destroy_process_group()


@pytest.fixture
def cluster(pair, attn_tp_group, monkeypatch) -> Iterator[Cluster]:
    monkeypatch.setenv("SGLANG_HOST_IP", "127.0.0.1")
    monkeypatch.setenv("PDLINK_STAGING_SLOTS", str(STAGING_SLOTS))
    monkeypatch.setenv("PDLINK_DAEMON_LOST_TIMEOUT", "1")
    port = free_port()
    group = attn_tp_group
    with sglang_process(port, group) as server_args:
        bootstrap = kv_class(KVClassType.BOOTSTRAP_SERVER)("127.0.0.1", port)
        monkeypatch.setenv("PDLINK_PREFILLD_ADDR", pair.prefill.address)
        monkeypatch.setenv("PDLINK_PREFILL_BOOTSTRAP", pair.prefill.bootstrap)
        monkeypatch.setenv("PDLINK_REGION_DIR", str(pair.prefill.region_dir))
        pmem = Memory(ReqToTokenPool(REQ_SLOTS, MAX_CONTEXT, "cpu", False))
        prefill = PrefillSchedulerStandIn(server_args, group, pmem, port)
        monkeypatch.setenv("PDLINK_DECODED_ADDR", pair.decode.address)
        monkeypatch.setenv("PDLINK_REGION_DIR", str(pair.decode.region_dir))
        dmem = Memory(DecodeReqToTokenPool(REQ_SLOTS, MAX_CONTEXT, "cpu", False, REQ_SLOTS))
        decode = DecodeSchedulerStandIn(server_args, dmem, port)
        try:
            yield Cluster(pair, pmem, dmem, prefill, decode, port)
        finally:
            for mgr in (
                prefill.disagg_prefill_bootstrap_queue.kv_manager,
                decode.disagg_decode_prealloc_queue.kv_manager,
            ):
                mgr.close()
            bootstrap.close()


# --- the model side of prefill -------------------------------------------------


def forward_chunk(c: Cluster, req: Req, start: int, end: int) -> None:
    """The model forward stand-in for tokens [start, end): slots from the real
    allocator (as the extend batch's alloc does), then the layers' K and V
    written into the real pool at those slots."""
    mem = c.prefill_mem
    if start == 0:
        assert mem.req_to_token.alloc([req]) is not None, "prefill req_to_token full"
        last = torch.tensor([-1], dtype=torch.int64)
    else:
        last = mem.req_to_token.req_to_token[req.kv.req_pool_idx, start - 1 : start].to(torch.int64)
    locs = mem.allocator.alloc_extend(
        prefix_lens=torch.tensor([start], dtype=torch.int64),
        prefix_lens_cpu=torch.tensor([start], dtype=torch.int64),
        seq_lens=torch.tensor([end], dtype=torch.int64),
        seq_lens_cpu=torch.tensor([end], dtype=torch.int64),
        last_loc=last,
        extend_num_tokens=end - start,
    )
    assert locs is not None, "prefill KV pool full"
    mem.req_to_token.write((req.kv.req_pool_idx, slice(start, end)), locs.to(torch.int32))
    positions = torch.arange(start, end)
    for layer in range(LAYERS):
        mem.kv.k_buffer[layer][locs] = pattern(req.bootstrap_room, layer, 0, positions)
        mem.kv.v_buffer[layer][locs] = pattern(req.bootstrap_room, layer, 1, positions)
    req.kv.kv_allocated_len = end
    req.kv.kv_committed_len = end
    req.extend_end = end


def finish_last_chunk(c: Cluster, req: Req) -> None:
    """process_batch_result_disagg_prefill's lines for a request whose last
    chunk ran: the sampled first token, checkpoint, the inflight queue, and
    SGLang's last-chunk send (which writes the metadata row first)."""
    s = c.prefill
    req.output_ids.append(first_token(req.bootstrap_room))
    s.checkpoint_disagg_prefill(req)
    s.disagg_prefill_inflight_queue.append(req)
    if not req.pending_bootstrap:
        s.send_kv_chunk(req, last_chunk=True)


def prefill_step(c: Cluster, req: Req, chunk_tokens: int) -> bool:
    """One forward of a bootstrapped request's next chunk as the non-overlap
    loop runs it: a middle chunk is sent by process_prefill_chunk at the next
    step, the last goes through the batch result. True after the last."""
    s = c.prefill
    n = len(req.origin_input_ids)
    start = req.extend_end or 0
    end = min(start + chunk_tokens, n)
    forward_chunk(c, req, start, end)
    if end < n:
        s.chunked_req = req
        s.process_prefill_chunk(last_batch=None, running_batch=RunningBatchStandIn())
        return False
    s.chunked_req = None
    finish_last_chunk(c, req)
    return True


def prefill_request(c: Cluster, req: Req, chunk_tokens: int) -> None:
    while not prefill_step(c, req, chunk_tokens):
        pass


# --- checks ----------------------------------------------------------------------


def verify_decode_kv(c: Cluster, flow: Flow) -> None:
    """Every token's K and V of every layer at the slots decode's allocator
    gave the request, and what _commit_transfer_to_req took from the aux
    rows: the first token and the prefix-cache counts."""
    mem = c.decode_mem
    req = flow.decode
    locs = mem.req_to_token.req_to_token[req.kv.req_pool_idx, : flow.prompt_len].to(torch.int64)
    positions = torch.arange(flow.prompt_len)
    for layer in range(LAYERS):
        for which, buf in ((0, mem.kv.k_buffer), (1, mem.kv.v_buffer)):
            got = buf[layer][locs]
            want = pattern(flow.room, layer, which, positions)
            bad = (got != want).any(dim=-1).any(dim=-1).nonzero().flatten().tolist()
            assert not bad, (flow.room, layer, "KV"[which], "bad token positions", bad[:8])
    # _commit_transfer_to_req read it from the metadata row pdlink carried,
    # after its gate matched the row's bootstrap room to the request's.
    assert list(req.output_ids) == [first_token(flow.room)]
    for k, name in enumerate(CACHED_TOKEN_FIELDS):
        assert getattr(req, name) == flow.room % 13 + k, (flow.room, name)
    assert req.finished_reason is None


def release_decode(c: Cluster, req: Req) -> None:
    """What the running batch does at the end of the request: the KV row back."""
    release_kv_cache(req, c.decode_mem.tree_cache, checkpoint=False)


def abort_message(req: Req) -> str:
    assert isinstance(req.finished_reason, FINISH_ABORT), (req.rid, req.finished_reason)
    return req.finished_reason.message


def until(step, done, what: str) -> None:
    """Run step() (one scheduler iteration, 1 ms apart: the queues learn
    states only by polling) until done(), bounded."""

    def stepped() -> bool:
        if done():
            return True
        step()  # what it returns (a queue's popped requests) is not done()
        return False

    wait_for(stepped, WAIT, interval=0.001, what=what)


def run_until(c: Cluster, done, what: str, chunk_tokens: int = 8) -> None:
    """Scheduler steps on both servers until done() (bounded): prefill's
    bootstrap pop, chunked prefill of what it popped, its inflight poll; the
    decode tick."""
    s = c.prefill

    def step() -> None:
        for req in s.disagg_prefill_bootstrap_queue.pop_bootstrapped():
            prefill_request(c, req, chunk_tokens)
        s.process_disagg_prefill_inflight_queue()
        decode_tick(c)

    until(step, done, what)


def decode_tick(c: Cluster) -> None:
    for req in c.decode.tick():
        c.flows[req.bootstrap_room].transferred = True


def in_transfer_queue(c: Cluster, flow: Flow) -> bool:
    return any(d.req is flow.decode for d in c.decode.disagg_decode_transfer_queue.queue)


def assert_all_returned(c: Cluster) -> None:
    """Every page, row and staging slot SGLang and pdlink lent came back."""
    for mem in (c.prefill_mem, c.decode_mem):
        assert mem.metadata_rows.available_size() == METADATA_ROWS
        assert mem.allocator.available_size() == POOL_TOKENS
        assert mem.req_to_token.available_size() == mem.req_rows
    assert c.prefill.disagg_prefill_bootstrap_queue.kv_manager.slots.free == STAGING_SLOTS
    assert c.decode.disagg_decode_prealloc_queue.kv_manager.slots.free == STAGING_SLOTS


def admitted_with_metadata_sent(c: Cluster, room: int, prompt_len: int) -> Flow:
    """A request both servers took, decode's metadata sent (its transfer queue
    holds it), prefill's still in the bootstrap queue."""
    flow = c.new_flow(room, prompt_len)
    c.admit(flow)
    until(lambda: decode_tick(c), lambda: in_transfer_queue(c, flow), "decode metadata sent")
    return flow


def pop_bootstrapped(c: Cluster, count: int) -> list:
    popped: list = []
    until(
        lambda: popped.extend(c.prefill.disagg_prefill_bootstrap_queue.pop_bootstrapped()),
        lambda: len(popped) == count,
        "prefill bootstrapped",
    )
    return popped


def drain_bootstrap_queue(c: Cluster, what: str) -> None:
    queue = c.prefill.disagg_prefill_bootstrap_queue
    until(lambda: queue.pop_bootstrapped(), lambda: not queue.queue, what)


def drain_inflight_queue(c: Cluster, what: str) -> None:
    s = c.prefill
    until(
        lambda: s.process_disagg_prefill_inflight_queue(),
        lambda: not s.disagg_prefill_inflight_queue,
        what,
    )


def drain_transfer_queue(c: Cluster, what: str) -> None:
    until(lambda: decode_tick(c), lambda: not c.decode.disagg_decode_transfer_queue.queue, what)


def test_sglang_queues_move_many_chunked_requests_with_verified_kv_and_aux(cluster):
    c = cluster
    # Prompt lengths off the page size (a partial last page) and longer than
    # a chunk (several chunked sends each); more requests than req_to_token
    # rows or metadata rows, so SGLang's own admission holds some back. Six
    # metadata rows bound the rooms holding staging on each side: any six
    # consecutive requests here need at most 44 pages, under STAGING_SLOTS.
    flows = [c.new_flow(3000 + i, 9 + (i * 7) % 30) for i in range(16)]
    for f in flows:
        c.admit(f)
    finished: list[Flow] = []

    def all_done() -> bool:
        for f in flows:
            if f.transferred and f not in finished:
                verify_decode_kv(c, f)
                release_decode(c, f.decode)
                finished.append(f)
        # Prefill's inflight queue concludes on its own poll, maybe after decode.
        return len(finished) == len(flows) and not c.prefill.disagg_prefill_inflight_queue

    run_until(c, all_done, "16 requests through both schedulers' queues")
    s = c.prefill
    assert not s.disagg_prefill_inflight_queue
    assert not s.disagg_prefill_bootstrap_queue.queue
    # The prefill inflight queue streamed each request once, finished by
    # length (SGLang's FINISH_LENGTH(0) for a transferred prefill).
    assert sorted(r.rid for r in s.output_streamer.streamed) == sorted(f.prefill.rid for f in flows)
    assert all(not isinstance(r.finished_reason, FINISH_ABORT) for r in s.output_streamer.streamed)
    assert_all_returned(c)


def test_prefill_abort_in_the_bootstrap_queue_fails_both_queues_with_a_reason(cluster):
    c = cluster
    flow = admitted_with_metadata_sent(c, 4001, 13)
    c.prefill.abort_request_stand_in(flow.prefill.rid)
    s = c.prefill
    # SGLang's pop_bootstrapped sees Failed and runs handle_bootstrap_failure.
    drain_bootstrap_queue(c, "prefill bootstrap queue drops the aborted request")
    assert "Aborted by AbortReq" in abort_message(flow.prefill)
    assert s.output_streamer.streamed == [flow.prefill]
    # Decode's transfer queue sees the daemon's Failed, with prefill's reason.
    drain_transfer_queue(c, "decode transfer queue drops the aborted request")
    assert "aborted" in abort_message(flow.decode)
    assert c.decode.output_streamer.streamed == [flow.decode]
    assert not flow.transferred
    assert_all_returned(c)


def test_decode_abort_in_the_transfer_queue_fails_prefill_with_the_peers_reason(cluster):
    c = cluster
    flow = admitted_with_metadata_sent(c, 4002, 21)
    s = c.prefill
    assert pop_bootstrapped(c, 1) == [flow.prefill]
    assert not prefill_step(c, flow.prefill, 8)  # one middle chunk sent
    c.decode.abort_request_stand_in(flow.decode.rid)
    drain_transfer_queue(c, "decode transfer queue drops its aborted request")
    assert "Aborted by AbortReq" in abort_message(flow.decode)
    # Prefill finishes its forwards; its inflight queue then sees Failed and
    # SGLang's handle_inflight_transfer_failure carries decode's reason.
    prefill_request(c, flow.prefill, 8)
    drain_inflight_queue(c, "prefill inflight queue concludes the request")
    assert "aborted:remote" in abort_message(flow.prefill)
    assert s.output_streamer.streamed == [flow.prefill]
    assert_all_returned(c)


# prefilld's drain on SIGTERM at teardown would wait its default 30 s on
# the connection to the killed decoded; the test is about the queues.
@pytest.mark.parametrize("pair", [{"prefill": ["--drain-timeout=1s"]}], indirect=True)
def test_decoded_killed_mid_run_surfaces_as_failed_with_a_reason_in_both_queues(cluster):
    c = cluster
    flows = [c.new_flow(4100 + i, 17) for i in range(2)]
    for f in flows:
        c.admit(f)
    until(
        lambda: decode_tick(c),
        lambda: all(in_transfer_queue(c, f) for f in flows),
        "decode metadata sent",
    )
    s = c.prefill
    popped = pop_bootstrapped(c, len(flows))
    for req in popped:
        assert not prefill_step(c, req, 8)
    c.pair.decode.kill()
    drain_transfer_queue(c, "decode transfer queue fails its requests")
    for f in flows:
        assert "unreachable" in abort_message(f.decode)
    for req in popped:
        prefill_request(c, req, 8)
    drain_inflight_queue(c, "prefill inflight queue fails its requests")
    for f in flows:
        # Whichever of Send or the poll saw it first, the daemon's reason.
        assert re.search(rf"pdlink .*room {f.room}.* failed: \S+", abort_message(f.prefill))
        assert not f.transferred
    assert sorted(r.rid for r in s.output_streamer.streamed) == sorted(f.prefill.rid for f in flows)
    assert sorted(r.rid for r in c.decode.output_streamer.streamed) == sorted(
        f.decode.rid for f in flows
    )
    # A lost daemon leaks nothing on the engine side either.
    assert_all_returned(c)


def test_decode_abort_before_prefill_bootstraps_fails_the_bootstrap_queue_by_state(cluster):
    """The prefill room turns Failed in the daemon with no Send to fail
    first: only the state map tells SGLang's pop_bootstrapped (a state
    mapped by number would hand it pdlink's FAILED as an unknown KVPoll)."""
    c = cluster
    flow = admitted_with_metadata_sent(c, 4003, 10)
    c.decode.abort_request_stand_in(flow.decode.rid)
    drain_transfer_queue(c, "decode transfer queue drops its aborted request")
    s = c.prefill
    # The abort reaches prefilld on its own time: until it has, the room is
    # WaitingForInput and pop_bootstrapped would rightly pop the request.
    client = s.disagg_prefill_bootstrap_queue.kv_manager.client
    wait_for(
        lambda: getattr(client.status(flow.room), "state", None) == RoomState.FAILED,
        WAIT,
        what="prefill's daemon reports the room Failed",
    )
    assert s.disagg_prefill_bootstrap_queue.pop_bootstrapped() == []
    assert "aborted:remote" in abort_message(flow.prefill)
    assert s.output_streamer.streamed == [flow.prefill]
    assert_all_returned(c)


@dataclass
class PrefillTraffic:
    """What the prefill manager moved: bytes copied into staging (KV pages
    and aux rows) and the Sends its worker made."""

    staged_bytes: int = 0
    sends: list = field(default_factory=list)  # (start_position, pages, last)


def watch_prefill_traffic(c: Cluster, monkeypatch) -> PrefillTraffic:
    mgr = c.prefill.disagg_prefill_bootstrap_queue.kv_manager
    traffic = PrefillTraffic()
    copy, send = mgr.copy, mgr.client.send

    def counting_copy(dst: int, src: int, n: int) -> None:
        traffic.staged_bytes += n
        copy(dst, src, n)

    def recording_send(**kw):
        traffic.sends.append((kw["start_position"], len(kw["pages"]), kw["last"]))
        return send(**kw)

    monkeypatch.setattr(mgr, "copy", counting_copy)
    monkeypatch.setattr(mgr.client, "send", recording_send)
    return traffic


def decode_with_prefix(c: Cluster, flow: Flow, prefix_pages: int):
    """Decode's side of a request whose first prefix_pages pages its radix
    cache holds: pages for the whole prompt from decode's real allocator,
    decode's own bytes in the prefix pages, and the receiver's send_metadata
    with the pages after them and decode_prefix_len, as DecodePreallocQueue
    sends them on a radix hit (stood in: this test's decode radix cache is
    disabled, like the fixture's). Returns the receiver, the pages and the
    metadata row."""
    mgr = c.decode.disagg_decode_prealloc_queue.kv_manager
    mem = c.decode_mem
    tokens = mem.allocator.alloc(flow.prompt_len)
    pages = (tokens[::PAGE_SIZE] // PAGE_SIZE).tolist()
    own = torch.arange(prefix_pages * PAGE_SIZE)
    for layer in range(LAYERS):
        for which, buf in ((0, mem.kv.k_buffer), (1, mem.kv.v_buffer)):
            buf[layer][tokens[: len(own)]] = pattern(flow.room + 1, layer, which, own)
    row = mem.metadata_rows.alloc()
    receiver = kv_class(KVClassType.RECEIVER)(mgr, f"127.0.0.1:{c.bootstrap_port}", flow.room)
    assert mgr.try_ensure_parallel_info(f"127.0.0.1:{c.bootstrap_port}")
    receiver.init(0)
    wait_poll(receiver, {KVPoll.WaitingForInput}, "decode handshake")
    receiver.send_metadata(
        np.asarray(pages[prefix_pages:], dtype=np.int32),
        row,
        decode_prefix_len=prefix_pages * PAGE_SIZE,
    )
    return receiver, tokens, row


def run_with_decode_prefix(c: Cluster, room: int, npages: int, prefix: int) -> Req:
    """One request through SGLang's prefill queues, chunked, while decode
    holds its first prefix pages; checks decode's bytes and frees decode's
    side. Returns prefill's Req."""
    flow = c.new_flow(room, npages * PAGE_SIZE)
    c.prefill.disagg_prefill_bootstrap_queue.add(flow.prefill, num_kv_heads=HEAD_NUM)
    receiver, tokens, row = decode_with_prefix(c, flow, prefix)
    (req,) = pop_bootstrapped(c, 1)
    prefill_request(c, req, chunk_tokens=4 * PAGE_SIZE)
    drain_inflight_queue(c, "prefill inflight queue concludes the request")
    assert not isinstance(req.finished_reason, FINISH_ABORT), req.finished_reason
    wait_poll(receiver, {KVPoll.Success}, "decode Success")
    mem = c.decode_mem
    held = prefix * PAGE_SIZE
    positions = torch.arange(flow.prompt_len)
    for layer in range(LAYERS):
        for which, buf in ((0, mem.kv.k_buffer), (1, mem.kv.v_buffer)):
            own = pattern(room + 1, layer, which, positions[:held])
            sent = pattern(room, layer, which, positions[held:])
            assert torch.equal(buf[layer][tokens[:held]], own), (room, layer, which, "prefix")
            assert torch.equal(buf[layer][tokens[held:]], sent), (room, layer, which)
    assert int(mem.metadata.output_ids[row][0]) == first_token(room)
    receiver.clear()
    mem.allocator.free(tokens)
    mem.metadata_rows.free(row)
    return req


@pytest.mark.parametrize("prefix_known", [True, False], ids=["prefix_skipped", "prefix_ignored"])
def test_a_decode_prefix_is_neither_staged_nor_sent_by_sglangs_prefill(
    cluster, monkeypatch, prefix_known
):
    """SGLang's own prefill path (PrefillBootstrapQueue.finalize_bootstrap ->
    pop_decode_prefix_len -> init, the mixin's chunked send_kv_chunk) with a
    75% decode prefix: it stages and sends only the pages after it, and
    decode ends with its own prefix bytes and prefill's for the rest.

    prefix_ignored plays a prefill that never learns the prefix (the sender
    answers 0, as before prefilld reported it): every page is staged and
    sent, decoded skips the prefix's, and the bytes are as right. Each
    prints what prefill staged and sent per request."""
    c = cluster
    if not prefix_known:
        monkeypatch.setattr(kv_class(KVClassType.SENDER), "pop_decode_prefix_len", lambda self: 0)
    pmgr = c.prefill.disagg_prefill_bootstrap_queue.kv_manager
    npages, prefix = 16, 12
    staged_pages = npages - prefix if prefix_known else npages
    traffic = watch_prefill_traffic(c, monkeypatch)
    for room in range(4200, 4203):
        traffic.staged_bytes, traffic.sends = 0, []
        run_with_decode_prefix(c, room, npages, prefix)
        assert traffic.staged_bytes == staged_pages * sum(pmgr.item_lens) + sum(pmgr.aux_item_lens)
        assert traffic.sends[0][0] == (prefix if prefix_known else 0), traffic.sends
        assert sum(n for _, n, _ in traffic.sends) == staged_pages, traffic.sends
        assert [last for *_, last in traffic.sends] == [False] * (len(traffic.sends) - 1) + [True]
    print(
        f"\nprefix {prefix}/{npages} pages ({'skipped' if prefix_known else 'ignored'}): "
        f"staged {traffic.staged_bytes} bytes and {len(traffic.sends)} Sends a request"
    )
    assert_all_returned(c)
