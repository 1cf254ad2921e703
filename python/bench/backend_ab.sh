#!/usr/bin/env bash
# The SGLang backend's bench (the bench-marked test in
# python/tests/sglang/test_sglang_transfer.py) run against a base ref's
# pdlink package and this tree's, alternating, so both sides are measured
# under the same load on this shared machine. The daemons (bin/) and the
# bench test are this tree's on both sides: what differs is the Python.
#
#   python/bench/backend_ab.sh [base-ref]     (default main; BENCH_ROUNDS=2)
#
# Then the Go side's own costs in the same run: the daemon's fixed cost of
# a Send (BenchmarkPrefillSendRetry) and of polling rooms (-cpu 1).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
base=${1:-main}
rounds=${BENCH_ROUNDS:-2}
python=${PYTHON:-$repo/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$repo" archive "$base" python/pdlink | tar -x -C "$tmp"

run() { # $1: the directory whose pdlink the bench imports (python -m puts it first)
	if ! (cd "$1" && PDLINK_BIN_DIR="$repo/bin" "$python" -m pytest -q -s -p no:warnings \
		-p no:cacheprovider -m bench -c "$repo/python/pyproject.toml" --rootdir "$repo/python" \
		"$repo/python/tests/sglang/test_sglang_transfer.py") >"$tmp/out" 2>&1; then
		cat "$tmp/out"
		return 1
	fi
	sed -n '/^sglang backend/,/rooms\/s/p; /^sglang prefix/,/end of prefix/p' "$tmp/out"
}

for round in $(seq "$rounds"); do
	echo "-- before: $base ($(git -C "$repo" rev-parse --short "$base")), round $round; load$(uptime | sed 's/.*load//')"
	run "$tmp/python"
	echo "-- after: this tree ($(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- python/pdlink || echo '+changes')), round $round; load$(uptime | sed 's/.*load//')"
	run "$repo/python"
done

echo "-- Go, same run (-cpu 1): a Send's fixed cost in prefilld, Poll of 1000 rooms; load$(uptime | sed 's/.*load//')"
(cd "$repo" && go test -run '^$' -bench 'PrefillSendRetry|OwnerPoll1000' -benchtime 1s -cpu 1 ./pkg/room/ &&
	go test -run '^$' -bench 'Poll1000' -benchtime 1s -cpu 1 ./pkg/poll/) | grep '^Benchmark'
