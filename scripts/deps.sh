#!/usr/bin/env bash
# Installs what building, testing and the demo need on a fresh Debian
# machine. Idempotent: packages already present are not touched, and apt is
# only consulted when something is missing.
set -euo pipefail

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v curl >/dev/null || need+=(curl)

if ((${#need[@]})); then
	sudo=""
	if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
	echo "deps: installing ${need[*]}"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# /usr/include/google/protobuf holds the well-known types protoc needs.
test -f /usr/include/google/protobuf/timestamp.proto || {
	echo "deps: protobuf well-known types missing (/usr/include/google/protobuf)" >&2
	exit 1
}
