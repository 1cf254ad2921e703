#!/usr/bin/env bash
# in-root.sh DIR COMMAND [ARG...]
#
# Runs COMMAND as root inside the Debian root DIR (scripts/debian-root.sh)
# with a clean environment, in private mount and PID namespaces: /proc, /sys,
# /dev, /dev/pts, a fresh /dev/shm and the host's Go toolchain (read-only)
# are mounted for the command only and vanish with it, as do its processes.
# The network is the machine's (registries, loopback).
#
# PDLINK_GO_DOWNLOADS=DIR (a module cache's cache/download, the host's say) is
# bound in read-only as the first GOPROXY, a file:// one, before the usual
# proxy: the command's go still downloads, extracts and checks every module
# against go.sum into its own empty module cache, but takes the bytes from DIR
# when DIR has them and from the network only when it does not.
set -euo pipefail

dir=${1:?usage: in-root.sh DIR COMMAND [ARG...]}
shift
(($#)) || { echo "usage: in-root.sh DIR COMMAND [ARG...]" >&2; exit 2; }
dir=$(cd "$dir" && pwd)

if [[ -z ${PDLINK_IN_ROOT_NS:-} ]]; then
	goroot=$(go env GOROOT 2>/dev/null || true)
	[[ -n $goroot && -x $goroot/bin/go ]] || { echo "in-root: no Go toolchain on this machine" >&2; exit 1; }
	if [[ -n ${PDLINK_GO_DOWNLOADS:-} && ! -d $PDLINK_GO_DOWNLOADS ]]; then
		echo "in-root: PDLINK_GO_DOWNLOADS=$PDLINK_GO_DOWNLOADS is not a directory" >&2
		exit 1
	fi
	[[ -z ${PDLINK_GO_DOWNLOADS:-} ]] || PDLINK_GO_DOWNLOADS=$(cd "$PDLINK_GO_DOWNLOADS" && pwd)
	PDLINK_IN_ROOT_NS=1 PDLINK_GOROOT=$goroot exec unshare --mount --pid --fork \
		--propagation private "$0" "$dir" "$@"
fi

# The root itself becomes a mount point, as / is on a machine: tools that
# change the propagation of / (ip netns exec: mount --make-rslave /) fail
# with EINVAL on a plain directory.
mount --bind "$dir" "$dir"
mount -t proc proc "$dir/proc"
mount -t sysfs sysfs "$dir/sys"
mount --rbind /dev "$dir/dev"
mkdir -p "$dir/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$dir/dev/shm"
mkdir -p "$dir/run" "$dir/tmp" "$dir/usr/local/go"
mount -t tmpfs -o mode=0755 run "$dir/run"
mount --bind "$PDLINK_GOROOT" "$dir/usr/local/go"
mount -o remount,bind,ro "$dir/usr/local/go"
goproxy=${GOPROXY:-https://proxy.golang.org,direct}
if [[ -n ${PDLINK_GO_DOWNLOADS:-} ]]; then
	# Under the fresh /run, so nothing of it is left in the root afterwards.
	mkdir -p "$dir/run/pdlink-go-downloads"
	mount --bind "$PDLINK_GO_DOWNLOADS" "$dir/run/pdlink-go-downloads"
	mount -o remount,bind,ro "$dir/run/pdlink-go-downloads"
	goproxy=file:///run/pdlink-go-downloads,$goproxy
fi

exec chroot "$dir" /usr/bin/env -i \
	HOME=/root USER=root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
	PATH=/usr/local/go/bin:/root/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	GOTOOLCHAIN=local GOPROXY="$goproxy" \
	"$@"
