#!/usr/bin/env bash
# deps.sh [GROUP...]
#
# Installs the Debian packages a make target needs, deciding by package
# (dpkg-query), never by the presence of a command or a file: a command can be
# on PATH from elsewhere while the package that brings what it needs beside it
# (protoc's well-known types in libprotobuf-dev, say) is missing. Idempotent:
# apt is only consulted when a package is missing; sudo when not root.
#
# make demo and make build need none of these: the generated code is
# committed, so Go alone builds and runs the demo.
#
# GROUPs (default: all, what CI installs):
#   proto        make proto, make proto-check
#   test         make test, make deploy-check, make chaos
#   bench        make bench (its iperf3 reference)
#   systemd-check  make systemd-check (systemd-nspawn, a minimal Debian root)
#   fresh-check  make fresh-check (the minimal Debian root)
#   python       scripts/pyenv.sh: the Python venv of make test, make lint,
#                make proto (Debian's python3 and its venv module)
#   engines      make engine-check (what the engines' wheels link and PyPI
#                does not ship)
#   all          every group
set -euo pipefail

# One list per group, by Debian package name.
proto=(protobuf-compiler libprotobuf-dev)
# prometheus: promtool and the real Prometheus of the alert tests; systemd:
# systemd-analyze verify/security of deploy/systemd; procps: /bin/kill, which
# the units' ExecReload names and systemd-analyze verify requires to exist
# (not in a minimal root); iproute2: ip netns for the two-host suite under
# test/. A suite that needs another tool adds its package to the group of the
# make target that runs it.
test=(prometheus systemd procps iproute2)
bench=(iperf3)
systemd_check=(systemd-container debootstrap)
fresh_check=(debootstrap)
python=(python3 python3-venv)
# libnuma1: vLLM's CPU kernels (vllm._C) link libnuma.so.1; without it every
# vLLM worker dies at start ("'_C' object has no attribute
# 'init_cpu_memory_env'", after a warning that the import failed).
engines=(libnuma1)

groups=("$@")
((${#groups[@]})) || groups=(all)
want=()
for g in "${groups[@]}"; do
	case $g in
	proto) want+=("${proto[@]}") ;;
	test) want+=("${test[@]}") ;;
	bench) want+=("${bench[@]}") ;;
	systemd-check) want+=("${systemd_check[@]}") ;;
	fresh-check) want+=("${fresh_check[@]}") ;;
	python) want+=("${python[@]}") ;;
	engines) want+=("${engines[@]}") ;;
	all) want+=("${proto[@]}" "${test[@]}" "${bench[@]}" "${systemd_check[@]}" "${fresh_check[@]}" "${python[@]}" "${engines[@]}") ;;
	*)
		echo "deps: unknown group $g (proto, test, bench, systemd-check, fresh-check, python, engines, all)" >&2
		exit 2
		;;
	esac
done

installed() {
	[[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

need=()
for p in $(printf '%s\n' "${want[@]}" | sort -u); do
	installed "$p" || need+=("$p")
done
((${#need[@]})) || exit 0

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
echo "deps: installing ${need[*]}"
# Another apt may hold the lock for a while on a shared machine: wait for it.
apt=(apt-get -qq -o DPkg::Lock::Timeout=300)
"${sudo[@]}" "${apt[@]}" update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
	"${apt[@]}" install -y --no-install-recommends "${need[@]}" >/dev/null
for p in "${need[@]}"; do
	installed "$p" || { echo "deps: $p still not installed after apt-get install" >&2; exit 1; }
done
