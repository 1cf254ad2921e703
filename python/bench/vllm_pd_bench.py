"""vLLM disaggregated serving: PdlinkConnector beside NixlConnector and one colocated server.

    .venv-vllm/bin/python python/bench/vllm_pd_bench.py [--per-length 4]

A measurement, not a test (issues 25 and 30). In one run, on loopback, with
the suites' tiny Llama (python/tests/engines/tiny_llama.py, its fixed seed,
its shapes unchanged) and vLLM's CPU backend as the suite runs it (float32,
block size 32, --enforce-eager), the same prompts go to:

  colocated  one vLLM server (the reference, and the tokens' oracle);
  pdlink     PdlinkConnector prefill (kv_producer) + decode (kv_consumer)
             beside prefilld/decoded (bin/, `make build`), prefilld's
             --bootstrap-timeout 10 s (--bootstrap-timeout);
  nixl       vLLM's NixlConnector prefill + decode (kv_both, kv_buffer_device
             cpu, UCX, a side-channel port each), kv_lease_duration 30 s
             (vLLM's default; --nixl-lease).

Two phases, because an idle NixlConnector server keeps most of a core busy
here (its worker's main thread; measured and printed as "idle CPU"), which
would slow whatever else runs: phase 1 runs colocated + pdlink, phase 2
colocated + nixl (the same colocated server; pdlink's servers stopped
first). Inside a phase requests go one at a time, the two setups
alternating which goes first, so each PD setup is compared with the
colocated server measured beside it, under the same load. Each request
waits first until every server of the phase is back to its idle CPU (vLLM's
CPU engine keeps a core busy for about a second after each request, which
made a colocated request right after a PD one 40x slower; see settle()).

Both PD setups are driven through pdlink.vllm.proxy (`python -m`): prefill
with max_tokens 1 and do_remote_decode, then decode with the
kv_transfer_params prefill returned, streamed. Both prefill servers get a
KV pool of --prefill-blocks blocks (vLLM's --num-gpu-blocks-override), small
enough that a few filler requests reuse every block (the late decode
below); colocated and decode servers keep vLLM's default pool.

CPU binding (--bind): vLLM's CPU worker binds its OpenMP thread itself; its
default on this 2-core box ("auto", what the suite runs) puts every
server's worker on core 0. There NixlConnector's decode took 35-45 s per
request (a lease expired before decode read its blocks), so by default
(--bind split) prefill and colocated workers are bound to core 0 and decode
workers to core 1 (VLLM_CPU_OMP_THREADS_BIND); --bind suite keeps vLLM's.

Measured:
  TTFT     client -> first streamed chunk carrying a token. Colocated:
           straight to the server. PD: through the proxy, so prefill's whole
           answer (max_tokens 1) + the decode request's first token (its KV
           load included) + the proxy's hops; the prefill part is the
           proxy's X-Pdlink-Prefill-Seconds header. The same for both
           connectors. p99 is nearest-rank (with 16 samples: the max).
  KV       per request, as each connector exposes it: pdlink, decoded's
           pdlink_transfer_duration_seconds (first byte to last) and
           pdlink_room_duration_seconds{outcome="success"} (decode's room
           open to Success); NixlConnector, the decode server's
           vllm:nixl_xfer_time_seconds. Means over the measured requests.
  tokens   each request's token ids (return_token_ids) against the
           colocated server's.
  held     two prefill requests whose decode never comes: time from the last
           prefill answer until the prefill server's own
           vllm:kv_cache_usage_perc is back to 0 (polled every 0.25 s).
  late     then each one's decode, sent with its stale params: the first
           right away (its blocks freed, not yet reused), the second after
           filler requests on the prefill server allocated more blocks than
           its pool holds (its blocks reused): HTTP status, answer time,
           tokens matched.
  idle CPU each server's process tree over 10 s with no request (/proc).

Prints a JSON summary and a markdown table; servers' logs stay in the
printed directory.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parent
TESTS = PYTHON_DIR / "tests"
# This tree's pdlink and the suites' helpers (as the vLLM harness sets them up).
for p in (TESTS / "engines" / "vllm", TESTS / "engines", TESTS, PYTHON_DIR):
    sys.path.insert(0, str(p))

import tiny_llama  # noqa: E402
from benchlib import pct, uptime  # noqa: E402
from daemons import Pair  # noqa: E402
from harness import (  # noqa: E402
    BASE_ENV,
    BLOCK_SIZE,
    completion_body,
    kv_usage,
    metric_sum,
    metrics,
    pdlink_config,
    prefill_only,
    vllm_server,
)
from servers import HTTPStatusError, Server, free_port  # noqa: E402

from pdlink.client import wait_for  # noqa: E402


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def matched(got: list[int] | None, want: list[int]) -> int:
    """Leading token ids equal to the colocated server's."""
    n = 0
    for a, b in zip(got or [], want, strict=False):
        if a != b:
            break
        n += 1
    return n


def body(prompt: str, max_tokens: int) -> dict:
    return completion_body(prompt, max_tokens, return_token_ids=True)


def stream(url: str, req: dict, timeout: float = 300) -> dict:
    """One streamed completion: ttft, total seconds, token ids, the prefill header, or the error."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    t0 = time.perf_counter()
    out: dict = {"status": None, "ttft": None, "error": None, "ids": []}
    try:
        conn.request(
            "POST",
            "/v1/completions",
            body=json.dumps({**req, "stream": True}),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        out["status"] = resp.status
        if resp.status != 200:
            out["error"] = resp.read().decode(errors="replace")[:300]
            return out
        pre = resp.getheader("X-Pdlink-Prefill-Seconds")
        out["prefill"] = float(pre) if pre else None
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            choices = json.loads(data).get("choices") or []
            if not choices:
                continue
            ids = choices[0].get("token_ids") or []
            if ids and out["ttft"] is None:
                out["ttft"] = time.perf_counter() - t0
            out["ids"] += ids
            if choices[0].get("finish_reason") == "error":
                out["error"] = "finish_reason error"
        return out
    except OSError as err:
        out["error"] = f"{type(err).__name__}: {err}"
        return out
    finally:
        out["total"] = time.perf_counter() - t0
        conn.close()


def complete_ids(server: Server, prompt: str, max_tokens: int, **more) -> list[int]:
    ans = server.post("/v1/completions", {**body(prompt, max_tokens), **more}, 300)
    return list(ans["choices"][0]["token_ids"])


def delta(after: dict[str, float], before: dict[str, float], name: str, **labels: str) -> float:
    return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)


def mean_ms(after: dict[str, float], before: dict[str, float], hist: str, **labels: str):
    """A histogram's mean between two scrapes in ms (its _sum over its _count), or None."""
    n = delta(after, before, hist + "_count", **labels)
    return round(delta(after, before, hist + "_sum", **labels) / n * 1e3, 2) if n else None


def _tree(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        x = todo.pop()
        out.append(x)
        todo += kids.get(x, [])
    return out


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def idle_cpu(servers: dict[str, Server], seconds: float = 10.0) -> dict[str, float]:
    """Cores each server's process tree used over seconds with no request."""
    trees = {k: _tree(s.proc.pid) for k, s in servers.items()}
    before = {k: _cpu_seconds(v) for k, v in trees.items()}
    time.sleep(seconds)
    return {k: round((_cpu_seconds(v) - before[k]) / seconds, 2) for k, v in trees.items()}


def settle(servers: dict[str, Server], idle: dict[str, float], bound: float = 5.0) -> float:
    """Wait until every server's process tree is back to its idle CPU; the seconds waited.

    vLLM's CPU engine keeps a core busy for about a second after a request
    (measured: ~1 core for 0.8-1.0 s on prefill and decode alike), which slowed
    whichever request came next on that core by as much: a colocated request
    right after a PD one took 850 ms instead of 20 ms. So each request starts
    with every server within 0.2 core of its idle figure over 100 ms, or after
    bound seconds.
    """
    trees = {k: _tree(s.proc.pid) for k, s in servers.items()}
    t0 = time.monotonic()
    prev, at = {k: _cpu_seconds(v) for k, v in trees.items()}, t0
    while time.monotonic() - t0 < bound:
        time.sleep(0.1)
        cur, now = {k: _cpu_seconds(v) for k, v in trees.items()}, time.monotonic()
        busy = any((cur[k] - prev[k]) / (now - at) > idle[k] + 0.2 for k in trees)
        prev, at = cur, now
        if not busy:
            break
    return time.monotonic() - t0


def nixl_config(lease: float) -> dict:
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"kv_lease_duration": lease},
    }


def proxy_server(name: str, prefill: Server, decode: Server, log_dir: Path) -> Server:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "pdlink.vllm.proxy",
        "--prefill",
        prefill.url,
        "--decode",
        decode.url,
        "--port",
        str(port),
    ]
    return Server(
        name, argv, port=port, log_dir=log_dir, env={"PYTHONPATH": BASE_ENV["PYTHONPATH"]}
    )


def late_decode(decode: Server, prompt: str, max_tokens: int, params: dict, want: list[int]):
    t0 = time.monotonic()
    out: dict = {}
    ids = None
    try:
        ids = complete_ids(decode, prompt, max_tokens, kv_transfer_params=params)
        out["status"] = 200
    except HTTPStatusError as err:
        out["status"] = err.status
        out["body"] = err.body[:200]
    except OSError as err:
        out["status"] = None
        out["body"] = f"{type(err).__name__}: {err}"
    out["seconds"] = round(time.monotonic() - t0, 2)
    out["tokens_matched"] = f"{matched(ids, want)}/{len(want)}" if ids is not None else "-"
    return out


def held_then_late(prefill, decode, prompts, want, fillers, max_tokens, bound, counters) -> dict:
    """Prefill each prompt (decode never asked), time until the pool is empty, then late decodes."""
    res: dict = {}
    idle = lambda: kv_usage(prefill) == 0  # noqa: E731
    # Every 0.25 s: the held time's resolution, and a light load on the server.
    wait_for(idle, 60, 0.25, "prefill's KV pool idle before the held-blocks run")
    before = counters()
    params = [prefill_only(prefill, p) for p in prompts]
    t_ans = time.monotonic()
    res["usage_while_held"] = round(kv_usage(prefill), 4)
    try:
        wait_for(idle, bound, 0.25, "prefill's blocks freed")
        res["held_seconds"] = round(time.monotonic() - t_ans, 2)
    except TimeoutError:
        res["held_seconds"] = f"> {bound:g} (still held)"
    res["late_blocks_free"] = late_decode(decode, prompts[0], max_tokens, params[0], want[0])
    for f in fillers:
        complete_ids(prefill, f, 1)
    res["late_blocks_reused"] = late_decode(decode, prompts[1], max_tokens, params[1], want[1])
    after = counters()
    res["counters"] = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k)}
    return res


def measure(
    urls: dict[str, str],
    prompts: list[tuple[int, str]],
    max_tokens: int,
    log,
    quiet=lambda: 0.0,
) -> dict[str, list]:
    runs: dict[str, list[dict]] = {s: [] for s in urls}
    names = list(urls)
    for i, (n, prompt) in enumerate(prompts):
        for s in names if i % 2 == 0 else names[::-1]:
            waited = quiet()
            r = stream(urls[s], body(prompt, max_tokens))
            r["length"], r["prompt"], r["settle"] = n, i, waited
            runs[s].append(r)
            ttft = f"{r['ttft'] * 1e3:.0f} ms" if r["ttft"] is not None else "-"
            log(f"  {i} len {n} {s}: ttft {ttft}, total {r['total']:.2f} s {r['error'] or ''}")
    return runs


def summarize(runs: list[dict], oracle: dict[int, list[int]], lengths: list[int]) -> dict:
    ok = [r for r in runs if r["ttft"] is not None and not r["error"]]
    ttft = [r["ttft"] for r in ok]
    res: dict = {
        "requests": len(runs),
        "errors": [r["error"] for r in runs if r["error"]],
        "ttft_p50_ms": round(statistics.median(ttft) * 1e3, 1) if ttft else None,
        "ttft_p99_ms": round(pct(ttft, 0.99) * 1e3, 1) if ttft else None,
        "e2e_p50_ms": round(statistics.median(r["total"] for r in ok) * 1e3, 1) if ok else None,
        "settle_mean_s": round(statistics.mean(r["settle"] for r in runs), 2) if runs else None,
        "ttft_p50_ms_by_length": {
            n: round(statistics.median(r["ttft"] for r in ok if r["length"] == n) * 1e3, 1)
            for n in lengths
            if any(r["length"] == n for r in ok)
        },
        "requests_matching": sum(r["ids"] == oracle[r["prompt"]] for r in runs),
        "tokens_matched": f"{sum(matched(r['ids'], oracle[r['prompt']]) for r in runs)}/"
        f"{sum(len(oracle[r['prompt']]) for r in runs)}",
    }
    res["rows"] = [
        {
            "prompt": r["prompt"],
            "length": r["length"],
            "ttft_ms": round(r["ttft"] * 1e3, 1) if r["ttft"] is not None else None,
            "prefill_ms": round(r["prefill"] * 1e3, 1) if r.get("prefill") else None,
            "total_ms": round(r["total"] * 1e3, 1),
        }
        for r in runs
    ]
    pre = [r for r in ok if r.get("prefill") is not None]
    if pre:
        res["prefill_answer_p50_ms"] = round(statistics.median(r["prefill"] for r in pre) * 1e3, 1)
        res["decode_first_token_p50_ms"] = round(
            statistics.median(r["ttft"] - r["prefill"] for r in pre) * 1e3, 1
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="16,100,400,1000", help="prompt lengths in tokens")
    ap.add_argument("--per-length", type=int, default=4, help="distinct prompts per length")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--bootstrap-timeout", type=float, default=10.0, help="prefilld's, seconds")
    ap.add_argument("--nixl-lease", type=float, default=30.0, help="kv_lease_duration, seconds")
    ap.add_argument("--prefill-blocks", type=int, default=160, help="both prefill servers' pool")
    ap.add_argument(
        "--bind",
        choices=("split", "suite"),
        default="split",
        help="split: prefill and colocated workers on core 0, decode workers on core 1; "
        "suite: vLLM's default binding for all",
    )
    ap.add_argument("--dir", default="", help="work and log directory (default: a new temp dir)")
    ap.add_argument("--json", default="", help="also write the JSON summary here")
    args = ap.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="vllm-pd-bench-"))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    summary: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "uptime_start": uptime(),
        "args": vars(args),
        "work_dir": str(work),
    }

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(f"work dir {work}; {summary['uptime_start']}")
    model = tiny_llama.write(work / "tiny-llama")
    lengths = [int(x) for x in args.lengths.split(",")]
    mt = args.max_tokens

    # The prompts: distinct (no prefix cache hit anywhere), the same for every setup.
    p = tiny_llama.prompt_ids
    text = tiny_llama.prompt_text
    warm = [text(p(100, 900 + i)) for i in range(2)]
    prompts = [(n, text(p(n, 1000 * n + i))) for i in range(args.per_length) for n in lengths]
    late = {"pdlink": [text(p(200, 500 + i)) for i in (0, 1)]}
    late["nixl"] = [text(p(200, 500 + i)) for i in (2, 3)]
    # Fillers: more blocks than the prefill pool holds, 1000 tokens each.
    n_fill = math.ceil(args.prefill_blocks * 1.2 * BLOCK_SIZE / 1000)
    fillers = {
        s: [text(p(1000, 700 + 10 * k + i)) for i in range(n_fill)]
        for k, s in enumerate(("pdlink", "nixl"))
    }
    pool = ("--num-gpu-blocks-override", str(args.prefill_blocks))

    def core(n: int) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": str(n)} if args.bind == "split" else {}

    results: dict = {}
    servers: dict[str, Server] = {}
    (work / "daemons").mkdir(exist_ok=True)
    pair = Pair(work / "daemons", (f"--bootstrap-timeout={args.bootstrap_timeout:g}s",), ())

    def stop(*names: str) -> None:
        for name in names:
            s = servers.get(name)
            if s is not None and s.alive():
                s.stop()

    def ready(*names: str) -> float:
        t0 = time.monotonic()
        for name in names:
            servers[name].wait_ready()
        return round(time.monotonic() - t0, 1)

    try:
        # ---- phase 1: colocated + pdlink -------------------------------------
        servers["colocated"] = vllm_server("colocated", model, logs, env=core(0))
        servers["pdlink-prefill"] = vllm_server(
            "pdlink-prefill",
            model,
            logs,
            extra_args=pool,
            env=core(0),
            kv_config=pdlink_config(
                "kv_producer",
                prefilld_addr=pair.prefill.address,
                prefill_bootstrap=pair.prefill.bootstrap,
                region_dir=str(pair.prefill.region_dir),
            ),
        )
        servers["pdlink-decode"] = vllm_server(
            "pdlink-decode",
            model,
            logs,
            env=core(1),
            kv_config=pdlink_config(
                "kv_consumer",
                decoded_addr=pair.decode.address,
                region_dir=str(pair.decode.region_dir),
            ),
        )
        summary["phase1_ready_seconds"] = ready("colocated", "pdlink-prefill", "pdlink-decode")
        servers["pdlink-proxy"] = proxy_server(
            "pdlink-proxy", servers["pdlink-prefill"], servers["pdlink-decode"], logs
        )
        servers["pdlink-proxy"].wait_ready(120)
        log(f"phase 1 servers ready in {summary['phase1_ready_seconds']} s")
        colo = servers["colocated"]
        oracle_late = {s: [complete_ids(colo, t, mt) for t in ts] for s, ts in late.items()}
        urls = {"colocated": colo.url, "pdlink": servers["pdlink-proxy"].url}
        measure(urls, [(100, w) for w in warm], mt, lambda _: None)
        phase1 = {k: servers[k] for k in ("colocated", "pdlink-prefill", "pdlink-decode")}
        idle1 = summary["idle_cpu_cores_phase1"] = idle_cpu(phase1)
        decoded = f"http://{pair.decode.http}/metrics"
        before = metrics(lambda: _get(decoded), "pdlink_")
        runs1 = measure(urls, prompts, mt, log, lambda: settle(phase1, idle1))
        after = metrics(lambda: _get(decoded), "pdlink_")
        summary["uptime_phase1"] = uptime()
        oracle = {r["prompt"]: r["ids"] for r in runs1["colocated"]}
        results["colocated (phase 1)"] = summarize(runs1["colocated"], oracle, lengths)
        res = results["pdlink"] = summarize(runs1["pdlink"], oracle, lengths)
        cnt = delta(after, before, "pdlink_transfer_duration_seconds_count")
        res["kv"] = {
            "rooms": cnt,
            "transfer_mean_ms": mean_ms(after, before, "pdlink_transfer_duration_seconds"),
            "room_open_to_success_mean_ms": mean_ms(
                after, before, "pdlink_room_duration_seconds", outcome="success"
            ),
            "bytes_mean": round(delta(after, before, "pdlink_transfer_bytes_total") / cnt)
            if cnt
            else None,
        }
        prefilld = f"http://{pair.prefill.http}/metrics"
        res["no_decode"] = held_then_late(
            servers["pdlink-prefill"],
            servers["pdlink-decode"],
            late["pdlink"],
            oracle_late["pdlink"],
            fillers["pdlink"],
            mt,
            args.bootstrap_timeout + 60,
            lambda: metrics(lambda: _get(prefilld), "pdlink_room_failures_total"),
        )
        log(f"pdlink, no decode: {res['no_decode']}")
        stop("pdlink-proxy", "pdlink-prefill", "pdlink-decode")
        pair.kill()

        # ---- phase 2: colocated + nixl ---------------------------------------
        for role in ("prefill", "decode"):
            servers[f"nixl-{role}"] = vllm_server(
                f"nixl-{role}",
                model,
                logs,
                extra_args=pool if role == "prefill" else (),
                kv_config=nixl_config(args.nixl_lease),
                env={
                    **core(0 if role == "prefill" else 1),
                    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                    "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
                },
            )
        summary["phase2_ready_seconds"] = ready("nixl-prefill", "nixl-decode")
        servers["nixl-proxy"] = proxy_server(
            "nixl-proxy", servers["nixl-prefill"], servers["nixl-decode"], logs
        )
        servers["nixl-proxy"].wait_ready(120)
        log(f"phase 2 servers ready in {summary['phase2_ready_seconds']} s")
        urls = {"colocated": colo.url, "nixl": servers["nixl-proxy"].url}
        measure(urls, [(100, w) for w in warm], mt, lambda _: None)
        phase2 = {k: servers[k] for k in ("colocated", "nixl-prefill", "nixl-decode")}
        idle2 = summary["idle_cpu_cores_phase2"] = idle_cpu(phase2)
        nixl_dec = servers["nixl-decode"]
        before = metrics(lambda: nixl_dec.get("/metrics"), "vllm:nixl")
        runs2 = measure(urls, prompts, mt, log, lambda: settle(phase2, idle2))
        after = metrics(lambda: nixl_dec.get("/metrics"), "vllm:nixl")
        summary["uptime_phase2"] = uptime()
        results["colocated (phase 2)"] = summarize(runs2["colocated"], oracle, lengths)
        res = results["nixl"] = summarize(runs2["nixl"], oracle, lengths)
        xcnt = delta(after, before, "vllm:nixl_xfer_time_seconds_count")
        res["kv"] = {
            "transfers": xcnt,
            "xfer_mean_ms": mean_ms(after, before, "vllm:nixl_xfer_time_seconds"),
            "bytes_mean": round(delta(after, before, "vllm:nixl_bytes_transferred_sum") / xcnt)
            if xcnt
            else None,
        }
        nixl_pre = servers["nixl-prefill"]
        res["no_decode"] = held_then_late(
            nixl_pre,
            nixl_dec,
            late["nixl"],
            oracle_late["nixl"],
            fillers["nixl"],
            mt,
            args.nixl_lease + 60,
            lambda: {
                k.split("{")[0]: v
                for k, v in metrics(lambda: nixl_pre.get("/metrics"), "vllm:nixl_num").items()
                if k.split("{")[0].endswith("_total")
            },
        )
        log(f"nixl, no decode: {res['no_decode']}")
        summary["uptime_end"] = uptime()
    finally:
        for s in servers.values():
            if s.alive():
                s.stop()
        pair.kill()

    summary["results"] = results
    out = json.dumps(summary, indent=1, default=str)
    print(out)
    if args.json:
        Path(args.json).write_text(out + "\n")
    print()
    print(table(summary, args))


def _late(r: dict | None) -> str:
    if not r:
        return "-"
    return f"HTTP {r['status']} in {r['seconds']} s, tokens {r['tokens_matched']}"


def table(summary: dict, args) -> str:
    res = summary["results"]
    idle = {**summary.get("idle_cpu_cores_phase1", {}), **summary.get("idle_cpu_cores_phase2", {})}
    lines = [
        "| setup | TTFT p50 / p99 (ms) | x colocated beside it (p50) | prefill answer / decode "
        "first token p50 (ms) | TTFT p50 by prompt length 16/100/400/1000 (ms) | 16 tokens p50 "
        "(ms) | KV transfer per request | tokens vs colocated | idle CPU (cores) "
        "| blocks held, no decode | late decode: blocks freed; blocks reused |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ref = {"pdlink": "colocated (phase 1)", "nixl": "colocated (phase 2)"}
    for s, r in res.items():
        by_len = " / ".join(str(v) for v in r["ttft_p50_ms_by_length"].values())
        kv, ratio, split, cpu, held, late = "-", "-", "-", "-", "-", "-"
        if s in ref and r["ttft_p50_ms"] and res[ref[s]]["ttft_p50_ms"]:
            ratio = f"{r['ttft_p50_ms'] / res[ref[s]]['ttft_p50_ms']:.1f}x"
        if "prefill_answer_p50_ms" in r:
            split = f"{r['prefill_answer_p50_ms']} / {r['decode_first_token_p50_ms']}"
        if s == "pdlink":
            k = r["kv"]
            kv = (
                f"{k['transfer_mean_ms']} ms first byte to last, "
                f"{k['room_open_to_success_mean_ms']} ms decode's room open to Success (decoded)"
            )
            cpu = f"{idle.get('pdlink-prefill')} + {idle.get('pdlink-decode')}"
            bound = f"--bootstrap-timeout {args.bootstrap_timeout:g} s"
        elif s == "nixl":
            kv = f"{r['kv']['xfer_mean_ms']} ms (vllm:nixl_xfer_time_seconds)"
            cpu = f"{idle.get('nixl-prefill')} + {idle.get('nixl-decode')}"
            bound = f"kv_lease_duration {args.nixl_lease:g} s"
        else:
            cpu = str(idle.get("colocated", "-"))
        nd = r.get("no_decode")
        if nd:
            held = f"{nd['held_seconds']} s ({bound})"
            late = f"{_late(nd['late_blocks_free'])}; {_late(nd['late_blocks_reused'])}"
        lines.append(
            f"| {s} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {ratio} | {split} | {by_len} | "
            f"{r['e2e_p50_ms']} | {kv} | {r['requests_matching']}/{r['requests']} requests, "
            f"{r['tokens_matched']} tokens | {cpu} | {held} | {late} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
