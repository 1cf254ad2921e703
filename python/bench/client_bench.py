"""What the Python client adds to one scheduler step, on real daemons (not a test).

    .venv/bin/python python/bench/client_bench.py [--rooms 256] [--lifecycles 2000]

Measures, on a prefilld and decoded it starts on loopback (bin/ built by
make build):
  - a poll of N rooms from the Watch-fed cache (statuses(ids)): goal <= 50 us;
  - the same N rooms as one batched Poll RPC, for comparison;
  - Send latency, p50 and p99 (goal p99 <= 1 ms): a chunk, and the last
    chunk (which returns once decode admitted its pages);
  - room lifecycles per second driven from one Python thread (open both
    sides, metadata, send, wait for Success in the cache, clear);
and prints the Go Poll benchmarks (pkg/poll, pkg/room) run in the same run,
so the numbers are read side by side on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# This tree's pdlink, not whichever one the venv has installed (an editable
# install may point at another checkout): the bench measures its own code.
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from daemons import REPO, Pair  # noqa: E402

import pdlink  # noqa: E402
from pdlink import DecodeClient, PrefillClient, Region, RegionLayout, RoomState  # noqa: E402
from pdlink.client import wait_for  # noqa: E402


def _us(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50_us": round(statistics.median(s) * 1e6, 2),
        "p99_us": round(s[int(len(s) * 0.99) - 1] * 1e6, 2),
        "max_us": round(s[-1] * 1e6, 2),
        "n": len(s),
    }


def bench(rooms: int, lifecycles: int, in_flight: int) -> dict[str, object]:
    layout = RegionLayout.uniform(
        buffers=2, pages=4096, item_len=256, aux_rows=1024, aux_row_len=32
    )
    out: dict[str, object] = {"rooms": rooms}
    with tempfile.TemporaryDirectory() as tmp:
        pair = Pair(Path(tmp))
        try:
            pre = PrefillClient(pair.prefill.address)
            dec = DecodeClient(pair.decode.address)
            src = Region.create(str(pair.prefill.region_dir), layout)
            dst = Region.create(str(pair.decode.region_dir), layout)
            pre.register_region(src)
            dec.register_region(dst)
            assert pre.wait_connected(10) and dec.wait_connected(10)
            ids = list(range(1, rooms + 1))
            for r in ids:
                dec.open(r, pair.prefill.bootstrap)
                pre.open(r)
                dec.send_metadata(r, [2 * r - 2, 2 * r - 1], aux_index=(r - 1) % 1024)
            wait_for(
                lambda: all(
                    (s := pre.status(r)) and s.state == RoomState.WAITING_FOR_INPUT for r in ids
                ),
                30,
                what="rooms bound",
            )

            samples = []
            for _ in range(2000):
                t0 = time.perf_counter()
                pre.statuses(ids)
                samples.append(time.perf_counter() - t0)
            out["cache_poll"] = _us(samples)

            samples = []
            for _ in range(300):
                t0 = time.perf_counter()
                pre.poll(ids)
                samples.append(time.perf_counter() - t0)
            out["rpc_poll"] = _us(samples)

            samples = []
            for r in ids:
                t0 = time.perf_counter()
                pre.send(r, [2 * r - 2], start_position=0)
                samples.append(time.perf_counter() - t0)
            out["send_chunk"] = _us(samples)
            samples = []
            for r in ids:
                t0 = time.perf_counter()
                pre.send(r, [2 * r - 1], start_position=1, last=True, aux_index=(r - 1) % 1024)
                samples.append(time.perf_counter() - t0)
            out["send_last"] = _us(samples)
            wait_for(
                lambda: all((s := dec.status(r)) and s.state == RoomState.SUCCESS for r in ids),
                30,
                what="rooms Success",
            )
            pre.clear(ids)
            dec.clear(ids)

            # Lifecycles: in_flight rooms at a time, each on its own pages.
            t0 = time.perf_counter()
            base = 10**6
            done = 0
            while done < lifecycles:
                wave = list(range(base + done, base + min(done + in_flight, lifecycles)))
                for i, r in enumerate(wave):
                    dec.open(r, pair.prefill.bootstrap)
                    pre.open(r)
                    dec.send_metadata(r, [i], aux_index=i)
                for i, r in enumerate(wave):
                    wait_for(
                        lambda r=r: (s := pre.status(r)) and s.state == RoomState.WAITING_FOR_INPUT,
                        30,
                        interval=0.0002,
                    )
                    pre.send(r, [i], last=True, aux_index=i)
                wait_for(
                    lambda w=wave: all(
                        (s := dec.status(r)) and s.state == RoomState.SUCCESS for r in w
                    ),
                    30,
                    interval=0.0002,
                )
                wait_for(
                    lambda w=wave: all(
                        (s := pre.status(r)) and s.state == RoomState.SUCCESS for r in w
                    ),
                    30,
                    interval=0.0002,
                )
                dec.clear(wave)
                pre.clear(wave)
                done += len(wave)
            out["lifecycles_per_s"] = round(lifecycles / (time.perf_counter() - t0), 1)
            out["in_flight"] = in_flight
            for c in (pre, dec):
                c.close()
            src.close()
            dst.close()
        finally:
            pair.kill()
    return out


def go_poll_benchmarks() -> str:
    cmd = ["go", "test", "-run", "^$", "-bench", "Poll", "-benchtime", "1s", "-cpu", "1"]
    res = subprocess.run(
        [*cmd, "./pkg/poll/", "./pkg/room/"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return "\n".join(ln for ln in res.stdout.splitlines() if ln.startswith("Benchmark"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rooms", type=int, default=256)
    ap.add_argument("--lifecycles", type=int, default=2000)
    ap.add_argument("--in-flight", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = bench(args.rooms, args.lifecycles, args.in_flight)
    res["go"] = go_poll_benchmarks()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    n = args.rooms
    print(f"pdlink under test: {pdlink.__file__}")
    print(f"poll of {n} rooms from the cache: {res['cache_poll']}  (goal p50 <= 50 us)")
    print(f"poll of {n} rooms, one Poll RPC:   {res['rpc_poll']}")
    print(f"Send (a chunk, not last):         {res['send_chunk']}  (goal p99 <= 1000 us)")
    print(f"Send (last chunk, waits for admission): {res['send_last']}")
    print(
        f"room lifecycles/s from Python:    {res['lifecycles_per_s']} ({args.in_flight} in flight)"
    )
    print("Go Poll benchmarks, same run (-cpu 1):")
    print(res["go"])


if __name__ == "__main__":
    main()
