"""PdlinkConnector on real vLLM engines: disaggregated tokens equal colocated ones."""

from __future__ import annotations

from conftest import MAX_TOKENS, PROMPTS
from harness import disagg


def test_every_prompt_matches_the_colocated_oracle(stack, oracle):
    for pr in PROMPTS:
        r = disagg(stack.prefill, stack.decode, pr.text, MAX_TOKENS)
        assert r.error is None, f"{pr.name}: {r.error}"
        assert r.text == oracle[pr.name], f"{pr.name}: disaggregated tokens differ"
