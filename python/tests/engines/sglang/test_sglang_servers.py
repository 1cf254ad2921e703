"""Real SGLang servers, prefill and decode in separate processes beside their daemons,
compute the same greedy tokens as one colocated server.

What is real: SGLang 0.5.23's launch_server (HTTP server, tokenizer manager,
scheduler, its PD queues, radix cache, model runner and torch_native
attention over its KV pool on CPU), pdlink's backend loaded through SGLang's
plugin entry point, prefilld and decoded as built, bytes over loopback TCP.
Stood in: SGLang's CPU kernels (sgl_kernel, import stand-ins that raise if
called; nothing on this path calls them, checked below). The tiny Llama's
weights are random (fixed seed): tokens are meaningless and deterministic,
and each depends on attention over the whole context.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import tiny_llama
from conftest import MAX_NEW, PROMPTS
from daemons import Daemon
from harness import (
    PAGE,
    loads,
    metric,
    pd_generate,
    prefill_server,
    standin_calls,
)

from pdlink.client import wait_for

# Without a radix cache SGLang 0.5.23's decode keeps retraction backups in a
# pinned host pool (cudaHostRegister, which fails without a GPU); its own
# setting for a plain host copy is cpu_tensor.
DECODE_EXTRA = ("--disaggregation-decode-retraction-backup", "cpu_tensor")

PAGE_BYTES = tiny_llama.LAYERS * 2 * PAGE * tiny_llama.KV_HEADS * tiny_llama.HEAD_DIM * 4
ORDERED = ["len5", "len16_one_page", "len17", "len40", "len100", "len300_chunked", "len1000"]


def pages(n_tokens: int) -> int:
    return -(-n_tokens // PAGE)


def test_every_prompt_matches_the_colocated_server(stack, oracle):
    for name in ORDERED:
        pre, dec = pd_generate(stack.prefill, stack.decode, PROMPTS[name], MAX_NEW)
        assert not isinstance(pre, Exception), f"{name}: prefill failed: {pre}"
        assert dec["output_ids"] == oracle[name], name


def test_decoded_verified_every_page_of_a_request(stack, oracle):
    ids = PROMPTS["fresh0"]
    before = metric(stack.pair.decode.http, "pdlink_transfer_bytes_total")
    _, dec = pd_generate(stack.prefill, stack.decode, ids, MAX_NEW)
    assert dec["output_ids"] == oracle["fresh0"]
    moved = metric(stack.pair.decode.http, "pdlink_transfer_bytes_total") - before
    assert moved == pages(len(ids)) * PAGE_BYTES


def test_requests_in_flight_together_each_match(stack, oracle):
    names = [f"fresh{i}" for i in range(1, 6)]
    with ThreadPoolExecutor(len(names)) as pool:
        got = list(
            pool.map(lambda n: pd_generate(stack.prefill, stack.decode, PROMPTS[n], MAX_NEW), names)
        )
    for name, (pre, dec) in zip(names, got, strict=True):
        assert not isinstance(pre, Exception), f"{name}: prefill failed: {pre}"
        assert dec["output_ids"] == oracle[name], name


def test_both_kv_pools_are_empty_after_the_requests(stack):
    # SGLang's own accounting (/v1/loads), not pdlink's: every page a request
    # held on either server came back, and no request waits in a PD queue.
    for srv in (stack.prefill, stack.decode):
        wait_for(lambda s=srv: loads(s)["num_used_tokens"] == 0, 30, what=f"{srv.name} pool empty")
        queues = loads(srv)["disaggregation"]
        assert all(v == 0 for k, v in queues.items() if k.endswith("_reqs")), queues


def test_no_kernel_standin_was_called(stack):
    for srv in (stack.prefill, stack.decode):
        assert standin_calls(srv) == [], srv.name


def test_a_prefill_with_other_weights_changes_the_tokens(stack, oracle, tmp_path, log_dir):
    """The token check can fail: the same shapes, other weights on prefill, so the KV
    (and the first token) decode receives is well formed and wrong."""
    wrong = tiny_llama.write(tmp_path / "other-weights", seed=tiny_llama.SEED + 1)
    daemon = Daemon("prefilld", tmp_path, ["--bootstrap-listen=tcp://127.0.0.1:0"])
    srv = prefill_server("wrong-prefill", wrong, log_dir, daemon)
    try:
        srv.wait_ready()
        _, dec = pd_generate(srv, stack.decode, PROMPTS["len100"], MAX_NEW)
    finally:
        srv.stop()
        daemon.kill()
    same = sum(a == b for a, b in zip(dec["output_ids"], oracle["len100"], strict=True))
    assert same < MAX_NEW // 2, (dec["output_ids"], oracle["len100"])
