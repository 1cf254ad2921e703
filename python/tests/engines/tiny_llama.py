"""A tiny Llama written once per test session, the same bytes for every engine process.

Both real-engine suites (SGLang's and vLLM's) load this model: no download,
random weights from a fixed seed, saved as safetensors with a word-level
tokenizer, so every server of a run (the colocated oracle, the prefill and
the decode server) reads identical weights from one directory.

Why these numbers:
- GQA (4 query heads, 2 KV heads) so a KV page holds fewer heads than the
  attention uses, as in production Llamas.
- head_dim 64: a size every CPU attention kernel of both engines takes.
- float32 and weights scaled by 1/sqrt(fan_in) (lm_head sharper): logits
  spread by O(1), so greedy ties that a different batch shape could flip
  are rare, while every token still depends on attention over the whole
  context (a wrong KV page changes the tokens; the suites check that).
- numpy's PCG64 from a fixed seed, not torch's RNG: the two suites run
  different torch builds, and the file is what must be identical anyway.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SEED = 20261206
VOCAB = 512
HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 512
MAX_POSITIONS = 2048
# Ids 0-2 are the special tokens; a prompt is words w3..w511.
UNK, BOS, EOS = 0, 1, 2
FIRST_WORD = 3

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "attention_bias": False,
    "mlp_bias": False,
}


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def linear(out_dim: int, in_dim: int, gain: float = 1.0) -> np.ndarray:
        w = rng.standard_normal((out_dim, in_dim), dtype=np.float32)
        return w * np.float32(gain / np.sqrt(in_dim))

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32),
        "model.norm.weight": np.ones(HIDDEN, dtype=np.float32),
        "lm_head.weight": linear(VOCAB, HIDDEN, gain=4.0),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        w[p + "self_attn.q_proj.weight"] = linear(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = linear(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = linear(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = linear(HIDDEN, HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = linear(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = linear(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = linear(HIDDEN, INTERMEDIATE)
    return w


def _tokenizer() -> dict:
    vocab = {"<unk>": UNK, "<s>": BOS, "</s>": EOS}
    vocab.update({f"w{i}": i for i in range(FIRST_WORD, VOCAB)})
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t, i in (("<unk>", UNK), ("<s>", BOS), ("</s>", EOS))
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def write(directory: str | Path, seed: int = SEED) -> Path:
    """Writes the model into directory (created) and returns it; same bytes every call.

    Another seed gives a model of the same shapes with other weights: a server
    running it computes KV that is the right size and wrong (the suites use it
    to show their token checks can fail)."""
    from safetensors.numpy import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    save_file(_weights(np.random.Generator(np.random.PCG64(seed))), str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(CONFIG, indent=1))
    (d / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False})
    )
    (d / "tokenizer.json").write_text(json.dumps(_tokenizer()))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": MAX_POSITIONS,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    return d


def prompt_ids(length: int, seed: int) -> list[int]:
    """A prompt of length word ids, the same for the same (length, seed)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    return [int(x) for x in rng.integers(FIRST_WORD, VOCAB, size=length)]


def prompt_text(ids: list[int]) -> str:
    """The text the tokenizer turns back into exactly ids."""
    return " ".join(f"w{i}" for i in ids)
