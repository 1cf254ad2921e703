#!/usr/bin/env bash
# Data-plane benchmarks for pkg/transfer, reported as ratios to the references measured in
# the same run: iperf3 single stream over loopback and a single-thread memory copy.
# Usage: pkg/transfer/bench.sh            (BENCHTIME=2s COUNT=3 by default)
# Each benchmark prints GB/s (1e9 bytes/s) and, for the transfer and iperf3 runs, CPU seconds
# spent per GB by the sending and receiving processes.
set -euo pipefail

cd "$(dirname "$0")"
benchtime="${BENCHTIME:-2s}"
count="${COUNT:-3}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

if ! command -v iperf3 >/dev/null 2>&1; then
	echo "bench.sh: iperf3 not on PATH; the iperf3 reference is skipped (apt-get install iperf3)" >&2
fi

# Each round runs the references and the transfers back to back (go test -count would
# repeat one benchmark before the next), so load from other work on the machine hits both
# alike.
go test -c -o "$out.test" .
trap 'rm -f "$out" "$out.test"' EXIT
for ((round = 1; round <= count; round++)); do
	"$out.test" -test.run '^$' -test.bench 'Iperf3Reference|MemcpyReference|TCP_|Shm_' \
		-test.benchtime="$benchtime" | tee -a "$out"
done

awk '
function metric(name, unit,   i) {
	for (i = 3; i < NF; i++) if ($(i+1) == unit) return $i
	return ""
}
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	if ((v = metric(name, "GB/s")) != "") { n[name]++; gb[name, n[name]] = v }
	if ((v = metric(name, "snd-cpu-s/GB")) != "") { sc[name, n[name]] = v }
	if ((v = metric(name, "rcv-cpu-s/GB")) != "") { rc[name, n[name]] = v }
	if (!(name in seen)) { seen[name] = 1; order[++k] = name }
}
function sortv(a, m,   i, j, t) {
	for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
}
function median(arr, name,   m, i, v) {
	m = n[name]; if (m == 0) return ""
	for (i = 1; i <= m; i++) v[i] = arr[name, i]
	sortv(v, m)
	lo[name] = v[1]; hi[name] = v[m]
	return (m % 2) ? v[(m+1)/2] : (v[m/2] + v[m/2+1]) / 2
}
END {
	ip = median(gb, "Iperf3Reference"); mc = median(gb, "MemcpyReference")
	printf "\n%-30s %-22s %9s %9s %14s %14s\n", "benchmark", "GB/s median [min-max]", "x iperf3", "x memcpy", "snd cpu-s/GB", "rcv cpu-s/GB"
	for (i = 1; i <= k; i++) {
		name = order[i]; med = median(gb, name); l = lo[name]; h = hi[name]
		r1 = (ip != "" && ip > 0) ? sprintf("%.2f", med / ip) : "-"
		r2 = (mc != "" && mc > 0) ? sprintf("%.2f", med / mc) : "-"
		s = median(sc, name); r = median(rc, name)
		printf "%-30s %6.2f [%.2f-%.2f] %9s %9s %14s %14s\n", name, med, l, h, r1, r2, (s == "" ? "-" : sprintf("%.3f", s)), (r == "" ? "-" : sprintf("%.3f", r))
	}
	printf "\nratios are of medians over %d runs; iperf3: single stream, loopback, 3 s; memcpy: one thread, 64 MiB between pre-faulted shared mappings (its CPU in the snd column)\n", n["MemcpyReference"]
}' "$out"
