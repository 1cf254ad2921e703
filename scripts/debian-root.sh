#!/usr/bin/env bash
# debian-root.sh DIR [PACKAGE...]
#
# Makes DIR a minimal Debian root of this machine's release holding only what
# every machine here starts with: git, make, gcc (with libc6-dev, so cgo and
# the race detector link), and this machine's apt sources, pip configuration,
# resolver and CA bundle, through which the registries are reached. The Go toolchain is not
# copied: scripts/in-root.sh binds the host's in. PACKAGEs are added to the
# debootstrap set (systemd for a root that boots, say).
#
# debootstrap takes about 30 s here, so the result is cached as a tarball
# under PDLINK_ROOT_CACHE (default /var/cache/pdlink), one per release and
# package set; later calls only unpack it. The cache lives on the machine,
# never in the repository. PDLINK_ROOT_FRESH=1 rebuilds it.
set -euo pipefail

dir=${1:?usage: debian-root.sh DIR [PACKAGE...]}
shift
extra=("$@")

if [[ $(id -u) -ne 0 ]]; then
	echo "debian-root: needs root (debootstrap, chroot)" >&2
	exit 1
fi
command -v debootstrap >/dev/null || {
	echo "debian-root: debootstrap missing: apt-get install debootstrap" >&2
	exit 1
}

. /etc/os-release
release=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
base=(git make gcc libc6-dev)
include=$(printf '%s\n' "${base[@]}" "${extra[@]}" | sort -u | paste -sd, -)
key=$(printf '%s %s' "$release" "$include" | sha256sum | cut -c1-16)
cache=${PDLINK_ROOT_CACHE:-/var/cache/pdlink}
tarball="$cache/debian-$release-$key.tar"

# The first URIs line of the machine's own sources is the mirror debootstrap
# fetches from, so the root reaches exactly what the machine reaches.
mirror=$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' \
	/etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

if [[ ! -f $tarball || ${PDLINK_ROOT_FRESH:-0} == 1 ]]; then
	mkdir -p "$cache"
	build=$(mktemp -d "$cache/build.XXXXXX")
	trap 'rm -rf "$build"' EXIT
	echo "debian-root: debootstrap $release ($include) from $mirror"
	debootstrap --variant=minbase --include="$include" "$release" "$build" "$mirror" \
		>"$build.log" 2>&1 || {
		tail -20 "$build.log" >&2
		echo "debian-root: debootstrap failed (log $build.log)" >&2
		exit 1
	}
	rm -f "$build.log"
	rm -f "$build"/var/cache/apt/archives/*.deb
	find "$build"/var/lib/apt/lists -maxdepth 1 -type f -delete
	chmod 0755 "$build"
	tar -C "$build" -cf "$tarball.tmp" .
	mv "$tarball.tmp" "$tarball"
	rm -rf "$build"
	trap - EXIT
fi

rm -rf "$dir"
mkdir -p "$dir"
tar -C "$dir" -xf "$tarball"
chmod 0755 "$dir"

# The machine's own apt sources, keyrings, resolver and CA bundle.
rm -f "$dir"/etc/apt/sources.list
cp -a /etc/apt/sources.list.d/. "$dir"/etc/apt/sources.list.d/
[[ -f /etc/apt/sources.list ]] && cp /etc/apt/sources.list "$dir"/etc/apt/
cp -a /usr/share/keyrings/. "$dir"/usr/share/keyrings/
cp -L /etc/resolv.conf "$dir"/etc/resolv.conf
mkdir -p "$dir"/etc/ssl/certs
cp -L /etc/ssl/certs/ca-certificates.crt "$dir"/etc/ssl/certs/ca-certificates.crt
# The machine's local CAs too: a package that brings ca-certificates (python3
# does) rebuilds the bundle above from these and Debian's, and would drop them.
if [[ -d /usr/local/share/ca-certificates ]]; then
	mkdir -p "$dir"/usr/local/share/ca-certificates
	cp -a /usr/local/share/ca-certificates/. "$dir"/usr/local/share/ca-certificates/
fi
# The machine's pip configuration, as its apt sources: here it points pip at
# the CA bundle above (a venv's pip trusts only its own bundle otherwise, and
# PyPI is reached through a proxy that bundle does not know).
[[ -f /etc/pip.conf ]] && cp -L /etc/pip.conf "$dir"/etc/pip.conf
# debootstrap writes no /etc/hosts, which every installed machine has (the
# installer writes it): without it "localhost" does not resolve, and tests and
# tools that listen on or dial localhost fail only in the root.
if [[ ! -f $dir/etc/hosts ]]; then
	cat >"$dir"/etc/hosts <<-EOF
		127.0.0.1	localhost
		127.0.1.1	$(cat "$dir"/etc/hostname 2>/dev/null || echo debian)
		::1		localhost ip6-localhost ip6-loopback
		ff02::1		ip6-allnodes
		ff02::2		ip6-allrouters
	EOF
fi
echo "debian-root: $dir ready ($release: $include)"
