#!/usr/bin/env bash
# fresh-check.sh: the README's two commands on a fresh Debian machine.
#
# Builds a minimal Debian root of this machine's release (scripts/debian-root.sh:
# git, make, gcc, the machine's apt sources, resolver and CA bundle; the host's
# Go bound in read-only by scripts/in-root.sh), clones the committed HEAD of
# this checkout into it, and runs `make demo` and then `make test` there with
# an empty module cache and build cache and CI=true (so a test whose tool is
# missing fails instead of skipping). Whatever those targets need beyond that
# they must install themselves, as on a new machine.
#
# Downloads are shared, installs are not: the root's go fetches every module
# itself, into its own empty module cache and checked against go.sum, but
# through a file:// GOPROXY on this machine's module download cache first
# (scripts/in-root.sh, PDLINK_GO_DOWNLOADS), so what this machine's go already
# fetched (CI's lint step fetches every module the tests build) is not fetched
# over the network a second time.
#
# Prints the time of each step and exits non-zero on the first failure. The
# root is deleted at the end; FRESH_KEEP=1 keeps it for debugging (then
# `scripts/in-root.sh DIR bash` enters it). FRESH_TMP (default /var/tmp) is
# where the root goes: it holds about 9 GB during the run (the Python venv with SGLang and torch is 6 GB).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
	echo "fresh-check: needs root (debootstrap, chroot, namespaces)" >&2
	exit 1
fi

head=$(git rev-parse HEAD)
if [[ -n $(git status --porcelain) ]]; then
	echo "fresh-check: the worktree has uncommitted or untracked changes; they are NOT checked (only HEAD ${head:0:12} is)"
fi

root=$(mktemp -d "${FRESH_TMP:-/var/tmp}/pdlink-fresh.XXXXXX")
cleanup() {
	rc=$?
	if [[ ${FRESH_KEEP:-0} == 1 ]]; then
		echo "fresh-check: root kept at $root (scripts/in-root.sh $root bash)"
	elif grep -q " $root/" /proc/self/mounts; then
		# in-root.sh mounts in a private namespace, so nothing should be
		# left; never rm -rf through a mount of /dev or the Go toolchain.
		echo "fresh-check: mounts left under $root, not removing it" >&2
		rc=1
	else
		rm -rf "$root"
	fi
	exit "$rc"
}
trap cleanup EXIT

start=$SECONDS
summary=()
step() {
	local name=$1
	shift
	local t0=$SECONDS
	echo "==> fresh-check: $name"
	if "$@"; then
		summary+=("$(printf '%-14s %4ds ok' "$name" $((SECONDS - t0)))")
	else
		summary+=("$(printf '%-14s %4ds FAILED' "$name" $((SECONDS - t0)))")
		printf 'fresh-check: %s\n' "${summary[@]}" >&2
		echo "fresh-check: FAILED at $name after $((SECONDS - start))s" >&2
		exit 1
	fi
}

src=/root/pdlink
clone() {
	git clone -q --no-checkout "$PWD" "$root$src"
	git -C "$root$src" checkout -q --detach "$head"
	# A chroot starts no services: packages installed in it (prometheus)
	# must not start daemons on the machine's network.
	printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
	chmod 0755 "$root/usr/sbin/policy-rc.d"
}
# inside runs a make target in the clone as CI runs it (CI=true), the Go
# caches at their defaults under /root.
downloads=$(go env GOMODCACHE)/cache/download
[[ -d $downloads ]] || downloads=
inside() {
	PDLINK_GO_DOWNLOADS=$downloads scripts/in-root.sh "$root" /bin/sh -c 'cd "$0" && exec env CI=true "$@"' "$src" "$@"
}
packages() { chroot "$root" dpkg-query -W -f='${Package} ${Version}\n' | sort; }
# demo runs make demo from empty Go module and build caches, as on a new
# machine (make test then shares them, as for someone following the README),
# and fails if it installed any Debian package: the demo needs only Go.
demo() {
	local d before after
	for d in root/go root/.cache; do
		[[ ! -e $root/$d ]] || { echo "fresh-check: /$d exists in the new root" >&2; return 1; }
	done
	before=$(packages)
	inside make demo || return 1
	after=$(packages)
	if [[ $before != "$after" ]]; then
		echo "fresh-check: make demo installed Debian packages:" >&2
		diff <(echo "$before") <(echo "$after") | grep '^>' >&2
		return 1
	fi
}

step root scripts/debian-root.sh "$root"
step clone clone
step "make demo" demo
step "make test" inside make test
printf 'fresh-check: %s\n' "${summary[@]}"
echo "fresh-check: ok, HEAD ${head:0:12} in a fresh $(. /etc/os-release && echo "$VERSION_CODENAME") root, $((SECONDS - start))s"
