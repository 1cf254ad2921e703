#!/usr/bin/env bash
# make bench: every benchmark, each beside a reference measured in the same
# run (iperf3 over loopback for TCP, a plain memory copy for memory), so the
# numbers are read as ratios on this noisy 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."

benchtime=${BENCHTIME:-1s}
echo "== room state machine and inflight queue (one core)"
go test -run '^$' -bench . -benchmem -benchtime "$benchtime" -cpu 1 ./pkg/poll/... ./pkg/inflight/...
echo "== control plane: ZeroMQ transport frame rate"
go test -run '^$' -bench . -benchtime "$benchtime" ./pkg/conn/zmtp/
if [[ -x pkg/transfer/bench.sh ]]; then
	echo "== data plane (ratios to iperf3 and memcpy measured in this run)"
	pkg/transfer/bench.sh
fi
echo "== end to end: both daemons, simulated schedulers (ratios to iperf3 and memcpy, same run)"
bin/pdctl bench --requests "${BENCH_REQUESTS:-100}"
echo "== Python client: cache poll, Send, rooms/s, beside the Go Poll benchmarks (same run)"
scripts/pyenv.sh test
.venv/bin/python python/bench/client_bench.py
echo "== SGLang backend: poll of 256 senders, Send with its staging copy, rooms/s (through SGLang's classes),"
echo "   main's pdlink (before) and this tree's (after) alternating in this run, beside a Poll RPC and a sleep's wake-up"
scripts/pyenv.sh test sglang
python/bench/backend_ab.sh "${BENCH_BASE:-main}"
