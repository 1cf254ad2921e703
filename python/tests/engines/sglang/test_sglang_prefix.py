"""Decode prefix reuse on real SGLang servers: the pages decode's radix cache
already holds move no byte, and the tokens stay the colocated server's.

What is real: SGLang 0.5.23's launch_server as prefill and decode beside
prefilld and decoded (the suite's conftest), decode with its own
`--disaggregation-decode-enable-radix-cache`: SGLang's DecodePreallocQueue
matches the request against decode's radix tree, allocates pages only after
the match and hands the matched length to the backend's send_metadata as
`decode_prefix_len`; pdlink sends it to decoded as the room's prefix_len (in
pages), prefilld reports it to the prefill scheduler, whose
finalize_bootstrap (pop_decode_prefix_len) starts SGLang's prefill sending
at it. The byte counts are the daemons' own (`pdlink_transfer_bytes_total`:
sent on prefilld, written and verified on decoded).

Decode's flags: with its radix cache on, SGLang itself resolves the
retraction backup to `cpu_tensor` (kv_cache_builder picks the pinned
`host_pool` only without it), so the main module's
`--disaggregation-decode-retraction-backup cpu_tensor` is not needed here
(it is allowed, and changes nothing).
"""

from __future__ import annotations

import tiny_llama
from conftest import MAX_NEW, PROMPTS
from harness import PAGE, metric, pd_generate, standin_calls, wait_pools_empty

DECODE_EXTRA = ("--disaggregation-decode-enable-radix-cache",)

PAGE_BYTES = tiny_llama.LAYERS * 2 * PAGE * tiny_llama.KV_HEADS * tiny_llama.HEAD_DIM * 4
BYTES = "pdlink_transfer_bytes_total"
# prefix_child's first 64 tokens are prefix_base's (conftest).
SHARED_PAGES = 64 // PAGE


def pages(n_tokens: int) -> int:
    return -(-n_tokens // PAGE)


def moved(stack, name: str) -> tuple[list[int], int, int]:
    """One PD request of PROMPTS[name]: decode's tokens and the pages each daemon
    counted for it (prefilld sent, decoded wrote and verified)."""
    dec_http, pre_http = stack.pair.decode.http, stack.pair.prefill.http
    dec0, pre0 = metric(dec_http, BYTES), metric(pre_http, BYTES)
    pre, dec = pd_generate(stack.prefill, stack.decode, PROMPTS[name], MAX_NEW)
    assert not isinstance(pre, Exception), f"{name}: prefill failed: {pre}"
    written = metric(dec_http, BYTES) - dec0
    sent = metric(pre_http, BYTES) - pre0
    assert written % PAGE_BYTES == 0 and sent % PAGE_BYTES == 0, (written, sent)
    return dec["output_ids"], int(sent // PAGE_BYTES), int(written // PAGE_BYTES)


def test_a_child_moves_only_the_pages_after_the_prefix_decode_already_holds(stack, oracle):
    base, child = PROMPTS["prefix_base"], PROMPTS["prefix_child"]
    tokens, sent, written = moved(stack, "prefix_base")
    assert tokens == oracle["prefix_base"]
    # Nothing cached yet on this decode: every page of the prompt.
    assert (sent, written) == (pages(len(base)), pages(len(base)))

    tokens, sent, written = moved(stack, "prefix_child")
    assert tokens == oracle["prefix_child"]
    # Decode's radix cache holds base's pages; the child shares 4 of them.
    # Prefill sent none of those, and decoded wrote none.
    assert pages(len(child)) - SHARED_PAGES == 3
    assert (sent, written) == (3, 3)


def test_the_same_prompt_again_moves_no_page_and_keeps_its_tokens(stack, oracle):
    """prefix_base is 6 whole pages, all in decode's cache after the test above:
    SGLang's match takes the whole prompt, the room carries only the aux row
    (the first token prefill computed), and decode computes on its own pages."""
    assert len(PROMPTS["prefix_base"]) % PAGE == 0
    tokens, sent, written = moved(stack, "prefix_base")
    assert tokens == oracle["prefix_base"]
    assert (sent, written) == (0, 0)


def test_both_kv_pools_are_empty_after_the_requests(stack):
    # Decode's radix cache keeps the prefixes as evictable pages, which
    # /v1/loads does not count as used.
    for srv in (stack.prefill, stack.decode):
        wait_pools_empty(srv)


def test_no_kernel_standin_was_called(stack):
    for srv in (stack.prefill, stack.decode):
        assert standin_calls(srv) == [], srv.name
