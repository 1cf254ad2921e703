"""What PdlinkConnector's staging copy costs per request, beside a plain memcpy.

The connector copies a request's blocks from vLLM's KV tensors into the
registered region before Send (prefill, stage_out) and out of it into the
request's blocks after Success (decode, stage_in). This measures both on
vLLM's CPU KV layout ([blocks, kv_heads, block_size, 2 * head_size] per
layer), with the blocks scattered over the pool as vLLM allocates them,
and the same bytes moved by one contiguous torch copy_ in the same run (the
machine's copy ceiling, the reference).

  .venv-vllm/bin/python python/bench/vllm_connector_staging.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdlink.vllm.staging import Staging, page_buffers

# (name, layers, kv_heads, block_size, head_size, dtype, prompt tokens)
SHAPES = [
    ("tiny test Llama, 1000 tokens", 4, 2, 32, 64, torch.float32, 1000),
    ("Llama-3-8B shape, 1024 tokens", 32, 8, 16, 128, torch.bfloat16, 1024),
    ("Llama-3-8B shape, 4096 tokens", 32, 8, 16, 128, torch.bfloat16, 4096),
]


def _ms(samples: list[float]) -> str:
    s = sorted(samples)
    return f"p50 {statistics.median(s) * 1e3:7.2f} ms  p90 {s[int(len(s) * 0.9)] * 1e3:7.2f} ms"


def bench(name, layers, heads, bs, hd, dtype, tokens, repeat, region_dir) -> None:
    blocks = -(-tokens // bs)
    pool = blocks * 3  # the request's blocks scattered over a pool thrice its size
    kv = {f"l{i}": torch.randn(pool, heads, bs, 2 * hd).to(dtype) for i in range(layers)}
    bufs = page_buffers(kv, pool)
    staging = Staging.create(region_dir, bufs, blocks)
    nbytes = blocks * sum(b.item_len for b in bufs)
    slots = list(range(blocks))
    rng = random.Random(7)
    out_t, in_t, ref_t = [], [], []
    flat_src = torch.empty(nbytes, dtype=torch.uint8)
    flat_dst = torch.empty(nbytes, dtype=torch.uint8)
    flat_dst.copy_(flat_src)  # fault both in
    for _ in range(repeat):
        ids = rng.sample(range(pool), blocks)
        t0 = time.perf_counter()
        staging.stage_out(ids, slots)
        out_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        staging.stage_in(slots, ids)
        in_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        flat_dst.copy_(flat_src)
        ref_t.append(time.perf_counter() - t0)
    staging.close()
    gbs = nbytes / statistics.median(out_t) / 1e9
    ref = nbytes / statistics.median(ref_t) / 1e9
    print(f"{name}: {blocks} blocks, {nbytes / 2**20:.1f} MiB per request")
    print(f"  stage_out (prefill) {_ms(out_t)}  {gbs:5.1f} GB/s")
    print(f"  stage_in  (decode)  {_ms(in_t)}  {nbytes / statistics.median(in_t) / 1e9:5.1f} GB/s")
    print(f"  memcpy reference    {_ms(ref_t)}  {ref:5.1f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--region-dir", default="/dev/shm")
    args = ap.parse_args()
    torch.set_num_threads(1)  # vLLM's worker copies on its own thread
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {time.ctime()}")
    with tempfile.TemporaryDirectory(dir=args.region_dir) as d:
        for shape in SHAPES:
            bench(*shape, args.repeat, d)


if __name__ == "__main__":
    main()
