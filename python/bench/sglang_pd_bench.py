"""SGLang: prefill + decode servers beside pdlink's daemons against one colocated server.

    .venv/bin/python python/bench/sglang_pd_bench.py [--per-length 4] [--ref HEAD]

A measurement, not a test (issue 25). In one run, on loopback, with the
suites' tiny Llama (python/tests/engines/tiny_llama.py, its fixed seed and
shapes) and SGLang 0.5.23's CPU engine as python/tests/engines/sglang runs
it (its harness's server functions: float32, pages of 16 tokens,
torch_native attention; decode with --disaggregation-decode-retraction-backup
cpu_tensor as the suite's decode; no --chunked-prefill-size, so prefill and
the colocated server chunk alike), the same distinct prompts go to:

  colocated  one SGLang server;
  pd         a prefill and a decode server (--disaggregation-transfer-backend
             pdlink) beside prefilld/decoded (bin/, `make build`).

All three servers run at once; requests go one at a time, alternating which
setup goes first, so both share the machine's load evenly.

Measured:
  TTFT     client -> first streamed chunk of /generate carrying an output
           token. PD: the prefill and the decode request are sent at once
           (as SGLang's router does), TTFT is the decode stream's first
           token (prefill's forward, the KV transfer and decode's first
           step included). p99 is nearest-rank (with 16 samples: the max).
  tokens   output ids against the colocated server's.
  staging  the backend's copies between SGLang's KV pool and the
           registered region, per request: pdlink.sglang.staging.copy_pages
           timed inside the real servers (a sitecustomize the bench puts on
           the servers' PYTHONPATH wraps it, nothing else changes; aux rows
           not included), prefill's copy into the region (each chunk's
           send) and decode's copy out of it (after Success), beside one
           contiguous memmove of the same bytes in this process (the
           machine's copy ceiling, the reference).
  KV       decoded's pdlink_transfer_duration_seconds (first byte to last)
           and pdlink_room_duration_seconds{outcome="success"}, means.

--ref HEAD measures the committed pdlink package (the servers' PYTHONPATH and
this process), so uncommitted work in the tree does not leak into the
numbers; the test helpers (python/tests) are the working tree's.

Prints a JSON summary and a markdown table; servers' logs stay in the
printed directory.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parent
TESTS = PYTHON_DIR / "tests"


def _pdlink_source() -> tuple[Path, str]:
    """--ref REF: the pdlink package of that commit (git archive into a temp dir), for the
    servers and this process, whatever the working tree holds; else the working tree's."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--ref", default="")
    ref = pre.parse_known_args()[0].ref
    if not ref:
        return PYTHON_DIR, "working tree"
    repo = str(PYTHON_DIR.parent)
    out = Path(tempfile.mkdtemp(prefix="sglang-pd-bench-pdlink-"))
    tar = subprocess.run(
        ["git", "-C", repo, "archive", ref, "python/pdlink"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    commit = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--short", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    return out / "python", f"{ref} ({commit})"


PDLINK_DIR, PDLINK_SOURCE = _pdlink_source()
for p in (TESTS / "engines" / "sglang", TESTS / "engines", TESTS, PYTHON_DIR, PDLINK_DIR):
    sys.path.insert(0, str(p))

import harness  # noqa: E402
import tiny_llama  # noqa: E402
from benchlib import pct, uptime  # noqa: E402
from daemons import Pair  # noqa: E402
from harness import PAGE, colocated, decode_server, generate, new_room, prefill_server  # noqa: E402
from servers import Server  # noqa: E402

SETUPS = ("colocated", "pd")
DECODE_EXTRA = ("--disaggregation-decode-retraction-backup", "cpu_tensor")
PAGE_BYTES_PER_BUFFER = PAGE * tiny_llama.KV_HEADS * tiny_llama.HEAD_DIM * 4
BUFFERS = tiny_llama.LAYERS * 2  # SGLang's MHA pool: a K and a V buffer per layer

# Loaded by every server process (PYTHONPATH); wraps copy_pages when the
# backend imports pdlink.sglang.staging, and appends one line per call:
# role, pages, seconds, bytes.
SITECUSTOMIZE = """
import importlib.abc
import importlib.machinery
import os
import sys
import time

_LOG = os.environ.get("PDLINK_BENCH_COPY_LOG")


class _TimeCopies(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "pdlink.sglang.staging":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            real = module.copy_pages
            role = "prefill" if os.environ.get("PDLINK_PREFILLD_ADDR") else "decode"

            def copy_pages(copy, src_bases, dst_bases, item_lens, src_pages, dst_pages):
                t0 = time.perf_counter()
                real(copy, src_bases, dst_bases, item_lens, src_pages, dst_pages)
                dt = time.perf_counter() - t0
                n = len(src_pages)
                with open(_LOG, "a") as f:
                    f.write(f"{role} {n} {dt:.9f} {n * sum(int(x) for x in item_lens)}\\n")

            module.copy_pages = copy_pages

        spec.loader.exec_module = exec_module
        return spec


if _LOG:
    sys.meta_path.insert(0, _TimeCopies())
"""


def stream(srv: Server, ids: list[int], max_new: int, t0: float, **fields) -> dict:
    """/generate streamed: seconds from t0 to the first chunk with an output id, final ids."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    try:
        conn.request(
            "POST",
            "/generate",
            body=json.dumps(
                {
                    "input_ids": ids,
                    "sampling_params": harness.sampling(max_new),
                    "stream": True,
                    **fields,
                }
            ),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        out: dict = {"ttft": None, "error": None, "ids": []}
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return out
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            got = ev.get("output_ids") or []
            if got and out["ttft"] is None:
                out["ttft"] = time.perf_counter() - t0
            # Cumulative (SGLang's default, not --incremental-streaming-output).
            if got:
                out["ids"] = list(got)
            fin = (ev.get("meta_info") or {}).get("finish_reason") or {}
            if isinstance(fin, dict) and fin.get("type") == "abort":
                out["error"] = f"aborted: {fin}"
        out["total"] = time.perf_counter() - t0
        return out
    finally:
        conn.close()


def pd_stream(prefill: Server, decode: Server, ids: list[int], max_new: int) -> dict:
    fields = {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": new_room(),
    }
    pre: dict = {}

    def send_prefill() -> None:
        try:
            pre["answer"] = generate(prefill, ids, max_new, **fields)
        except Exception as err:  # reported below
            pre["error"] = err

    t0 = time.perf_counter()
    t = threading.Thread(target=send_prefill, name="pd-prefill")
    t.start()
    out = stream(decode, ids, max_new, t0, **fields)
    t.join(180)
    if "error" in pre:
        out["error"] = out["error"] or f"prefill: {pre['error']}"
    return out


def metric_values(http_addr: str, prefix: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out


def msum(values: dict[str, float], name: str, label: str = "") -> float:
    return sum(
        v
        for k, v in values.items()
        if k.split("{")[0] == name and (not label or label in k.partition("{")[2])
    )


def copies_since(log: Path, offset: int) -> tuple[list[tuple[str, int, float, int]], int]:
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        return [], offset
    rows = []
    for line in data[offset:].decode().splitlines():
        role, pages, secs, nbytes = line.split()
        rows.append((role, int(pages), float(secs), int(nbytes)))
    return rows, len(data)


def in_process(pages: list[int], region_dir: Path, repeat: int = 20) -> dict[int, dict]:
    """copy_pages in this process, without servers: SGLang-shaped host pool buffers (a K and a
    V buffer per layer, one page = PAGE tokens of every KV head) and a real registered-region
    file, both touched first; the request's pool pages one contiguous run at a random offset
    (a fresh pool's allocation), into and out of staging slots 0..n-1."""
    import random

    import numpy as np

    from pdlink import Region, RegionLayout
    from pdlink.sglang.staging import copier, copy_pages

    pool_pages = harness.MAX_TOTAL_TOKENS // PAGE + 1
    slots = max(pages)
    pool = [np.ones((pool_pages, PAGE_BYTES_PER_BUFFER), np.uint8) for _ in range(BUFFERS)]
    region = Region.create(
        str(region_dir), RegionLayout.uniform(BUFFERS, slots, PAGE_BYTES_PER_BUFFER)
    )
    try:
        for i in range(BUFFERS):
            region.pages(i)[:] = 1
        pool_bases = [int(a.ctypes.data) for a in pool]
        reg_bases = [int(region.pages(i).ctypes.data) for i in range(BUFFERS)]
        items = [PAGE_BYTES_PER_BUFFER] * BUFFERS
        copy = copier(False)
        rng = random.Random(7)
        out: dict[int, dict] = {}
        for n in pages:
            into, outof = [], []
            for _ in range(repeat):
                first = rng.randrange(1, pool_pages - n)
                src = list(range(first, first + n))
                dst = list(range(n))
                t0 = time.perf_counter()
                copy_pages(copy, pool_bases, reg_bases, items, src, dst)
                into.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                copy_pages(copy, reg_bases, pool_bases, items, dst, src)
                outof.append(time.perf_counter() - t0)
            out[n] = {
                "into_region_p50_ms": round(statistics.median(into) * 1e3, 3),
                "out_of_region_p50_ms": round(statistics.median(outof) * 1e3, 3),
            }
        return out
    finally:
        region.close()
        region.unlink()


def memmove_ref(nbytes: int, repeat: int = 20) -> float:
    src = ctypes.create_string_buffer(nbytes)
    dst = ctypes.create_string_buffer(nbytes)
    ctypes.memmove(dst, src, nbytes)  # fault both in
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ctypes.memmove(dst, src, nbytes)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="16,100,400,1000", help="prompt lengths in tokens")
    ap.add_argument("--per-length", type=int, default=4, help="distinct prompts per length")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument(
        "--ref",
        default="",
        help="measure this commit's python/pdlink (e.g. HEAD) instead of the working tree's",
    )
    ap.add_argument("--dir", default="", help="work and log directory (default: a new temp dir)")
    ap.add_argument("--json", default="", help="also write the JSON summary here")
    args = ap.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="sglang-pd-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    hook = work / "copy-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    copy_log = work / "copies.log"
    os.environ["PDLINK_BENCH_COPY_LOG"] = str(copy_log)
    # The harness's servers, with the copy hook first on their PYTHONPATH.
    real_env = harness.server_env

    def server_env(extra=None):
        env = real_env(extra)
        env["PYTHONPATH"] = f"{hook}:{PDLINK_DIR}:{env['PYTHONPATH']}"
        return env

    harness.server_env = server_env

    summary: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "uptime_start": uptime(),
        "args": vars(args),
        "work_dir": str(work),
        "pdlink": PDLINK_SOURCE,
    }
    print(f"work dir {work}; {summary['uptime_start']}", flush=True)
    model = tiny_llama.write(work / "tiny-llama")
    lengths = [int(x) for x in args.lengths.split(",")]
    p = tiny_llama.prompt_ids
    warm = [p(100, 900 + i) for i in range(2)]
    measured = [(n, p(n, 1000 * n + i)) for i in range(args.per_length) for n in lengths]

    (work / "daemons").mkdir(exist_ok=True)
    pair = Pair(work / "daemons")
    servers: dict[str, Server] = {}
    try:
        servers["colocated"] = colocated("colocated", model, logs)
        servers["prefill"] = prefill_server("pd-prefill", model, logs, pair.prefill)
        servers["decode"] = decode_server("pd-decode", model, logs, pair.decode, extra=DECODE_EXTRA)
        t0 = time.monotonic()
        for s in servers.values():
            s.wait_ready()
        summary["servers_ready_seconds"] = round(time.monotonic() - t0, 1)
        print(f"servers ready in {summary['servers_ready_seconds']} s", flush=True)
        colo, pre, dec = servers["colocated"], servers["prefill"], servers["decode"]

        def one(setup: str, ids: list[int]) -> dict:
            if setup == "colocated":
                return stream(colo, ids, args.max_new, time.perf_counter())
            return pd_stream(pre, dec, ids, args.max_new)

        for w in warm:
            for s in SETUPS:
                r = one(s, w)
                if r["error"] or r["ttft"] is None:
                    raise SystemExit(f"warm-up request on {s} failed: {r}")

        before = metric_values(pair.decode.http, "pdlink_")
        offset = copy_log.stat().st_size if copy_log.exists() else 0
        runs: dict[str, list[dict]] = {s: [] for s in SETUPS}
        for i, (n, ids) in enumerate(measured):
            order = SETUPS if i % 2 == 0 else SETUPS[::-1]
            for s in order:
                r = one(s, ids)
                r["length"], r["prompt"] = n, i
                if s == "pd":
                    rows, offset = copies_since(copy_log, offset)
                    r["copies"] = rows
                runs[s].append(r)
        after = metric_values(pair.decode.http, "pdlink_")
        summary["uptime_end"] = uptime()
    finally:
        for s in servers.values():
            if s.alive():
                s.stop()
        pair.kill()

    ref = {r["prompt"]: r["ids"] for r in runs["colocated"]}
    results: dict = {}
    for s in SETUPS:
        ok = [r for r in runs[s] if r["ttft"] is not None and not r["error"]]
        ttft = [r["ttft"] for r in ok]
        match = [r["ids"] == ref[r["prompt"]] for r in runs[s]]
        tokens = sum(
            sum(a == b for a, b in zip(r["ids"], ref[r["prompt"]], strict=False)) for r in runs[s]
        )
        results[s] = {
            "requests": len(runs[s]),
            "errors": [r["error"] for r in runs[s] if r["error"]],
            "ttft_p50_ms": round(statistics.median(ttft) * 1e3, 1),
            "ttft_p99_ms": round(pct(ttft, 0.99) * 1e3, 1),
            "e2e_p50_ms": round(statistics.median(r["total"] for r in ok) * 1e3, 1),
            "ttft_p50_ms_by_length": {
                n: round(statistics.median(r["ttft"] for r in ok if r["length"] == n) * 1e3, 1)
                for n in lengths
            },
            "requests_matching": sum(match),
            "tokens_matched": f"{tokens}/{sum(len(ref[r['prompt']]) for r in runs[s])}",
        }
    # Staging copies per request, by prompt length and role.
    staging: dict = {}
    for n in lengths:
        rs = [r for r in runs["pd"] if r["length"] == n]
        row: dict = {"pages": -(-n // PAGE)}
        for role in ("prefill", "decode"):
            per_req = [sum(c[2] for c in r["copies"] if c[0] == role) for r in rs]
            calls = [sum(1 for c in r["copies"] if c[0] == role) for r in rs]
            nbytes = [sum(c[3] for c in r["copies"] if c[0] == role) for r in rs]
            row[role] = {
                "p50_ms": round(statistics.median(per_req) * 1e3, 3),
                "max_ms": round(max(per_req) * 1e3, 3),
                "calls_per_request": statistics.median(calls),
                "bytes_per_request": statistics.median(nbytes),
            }
        nb = row["pages"] * BUFFERS * PAGE_BYTES_PER_BUFFER
        row["bytes"] = nb
        row["memmove_ms"] = round(memmove_ref(nb) * 1e3, 3)
        staging[n] = row
    pages = [-(-n // PAGE) for n in lengths]
    ref_copies = in_process(pages, work / "in-process-region")
    for n in lengths:
        staging[n]["in_process"] = ref_copies[-(-n // PAGE)]
    results["pd"]["staging"] = staging
    for s in SETUPS:
        results[s]["rows"] = [
            {
                "prompt": r["prompt"],
                "length": r["length"],
                "ttft_ms": round(r["ttft"] * 1e3, 1) if r["ttft"] is not None else None,
                "total_ms": round(r.get("total", 0) * 1e3, 1),
            }
            for r in runs[s]
        ]
    cnt = msum(after, "pdlink_transfer_duration_seconds_count") - msum(
        before, "pdlink_transfer_duration_seconds_count"
    )
    rcnt = msum(after, "pdlink_room_duration_seconds_count", 'outcome="success"') - msum(
        before, "pdlink_room_duration_seconds_count", 'outcome="success"'
    )
    results["pd"]["kv"] = {
        "rooms": cnt,
        "transfer_mean_ms": round(
            (
                msum(after, "pdlink_transfer_duration_seconds_sum")
                - msum(before, "pdlink_transfer_duration_seconds_sum")
            )
            / cnt
            * 1e3,
            2,
        )
        if cnt
        else None,
        "room_mean_ms": round(
            (
                msum(after, "pdlink_room_duration_seconds_sum", 'outcome="success"')
                - msum(before, "pdlink_room_duration_seconds_sum", 'outcome="success"')
            )
            / rcnt
            * 1e3,
            2,
        )
        if rcnt
        else None,
    }
    summary["results"] = results
    print(json.dumps(summary, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print()
    print(table(results, lengths))


def table(results: dict, lengths: list[int]) -> str:
    lines = [
        "| setup | TTFT p50 / p99 (ms) | TTFT p50 by prompt length (ms) | all 16 tokens p50 (ms) "
        "| tokens vs colocated |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in SETUPS:
        r = results[s]
        by_len = ", ".join(f"{n}: {v}" for n, v in r["ttft_p50_ms_by_length"].items())
        lines.append(
            f"| {s} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {by_len} | {r['e2e_p50_ms']} | "
            f"{r['requests_matching']}/{r['requests']} requests, {r['tokens_matched']} tokens |"
        )
    kv = results["pd"]["kv"]
    lines += [
        "",
        f"KV per PD request (decoded): {kv['transfer_mean_ms']} ms first byte to last, "
        f"{kv['room_mean_ms']} ms decode room open to Success (means of {kv['rooms']:g}).",
        "",
        "| prompt tokens | pages | bytes | in the servers: prefill copy into the region p50 / max "
        "(ms) | in the servers: decode copy out p50 / max (ms) | in this process, no servers: "
        "into / out of (ms) | memmove of the same bytes, cache-hot (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in lengths:
        st = results["pd"]["staging"][n]
        pr, de = st["prefill"], st["decode"]
        lines.append(
            f"| {n} | {st['pages']} | {st['bytes'] / 1024:.0f} KiB | {pr['p50_ms']} / "
            f"{pr['max_ms']} ({pr['calls_per_request']:g} calls) | {de['p50_ms']} / "
            f"{de['max_ms']} | {st['in_process']['into_region_p50_ms']} / "
            f"{st['in_process']['out_of_region_p50_ms']} | {st['memmove_ms']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
