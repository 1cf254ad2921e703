#!/usr/bin/env bash
# systemd-check.sh: boot the pdlink units under a real systemd and check them.
#
# A fresh Debian root (scripts/debian-root.sh, with systemd) is booted with
# systemd-nspawn -b --register=no --keep-unit (the registering form needs a
# host system bus). The daemons are built here with CGO_ENABLED=0 and copied
# in with deploy/systemd and docs/deployment.md. A oneshot unit inside the root runs
# this same script with --inside once the system is up: it installs decoded
# following the install comments of decoded.service and prefilld following
# docs/deployment.md (the README links it), then checks
#   - both units reach READY (Type=notify: active/running);
#   - `systemctl reload` without a token and with one keeps the same PID;
#   - kill -9 and a watchdog abort (kill -STOP) both restart the unit;
#   - `systemctl restart` brings it back;
#   - `systemctl stop` exits 0 well within the drain timeout;
#   - an engine's region file under /dev/shm/pdlink (owner engine, group
#     pdlink through the setgid directory) survives all of it, including the
#     last pdlink unit stopping, and the unit starts again afterwards.
# It writes its log and verdict to a directory bound from the host, then
# powers the container off. Every wait is bounded; the whole run takes about
# 45-75 s here (up to 20 s unpacking the cached root, 32 s waiting out the
# watchdog).
#
# Exits 0 on success, 1 on a failed check, and 0 with "SKIP: ..." only when
# systemd-nspawn cannot run here at all (not root, no systemd-nspawn or
# debootstrap, or nspawn fails to start a container); under CI=true only
# the last skips, the others fail (scripts/deps.sh should have installed the
# tools).
set -euo pipefail

checker_unit=pdlink-systemd-check.service

# ---------------------------------------------------------------- inside ---

t0=$(date +%s%N)
elapsed() { printf '%6.1fs' "$(( ($(date +%s%N) - t0) / 1000000 ))e-3"; }
step() { echo "[$(elapsed)] == $*"; }
note() { echo "[$(elapsed)]    $*"; }

# fail prints the state of both units and their journals, then stops.
fail() {
	echo "[$(elapsed)] FAIL: $*"
	for u in decoded prefilld; do
		echo "--- systemctl status $u"
		systemctl status --no-pager --lines=0 "$u" 2>&1 || true
		echo "--- journalctl -u $u (last 25 lines)"
		journalctl --no-pager -o short-monotonic -u "$u" -n 25 2>&1 || true
	done
	echo "--- ls -la /dev/shm /dev/shm/pdlink"
	ls -la /dev/shm /dev/shm/pdlink 2>&1 || true
	exit 1
}

# wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.1 s until it
# succeeds, failing the check with WHAT after SECONDS.
wait_for() {
	local limit=$1 what=$2
	shift 2
	local deadline=$(( $(date +%s%N) + limit * 1000000000 ))
	until "$@" >/dev/null 2>&1; do
		(( $(date +%s%N) < deadline )) || fail "$what (not within ${limit}s)"
		sleep 0.1
	done
}

prop() { systemctl show -p "$2" --value "$1"; }
pid_of() { prop "$1" MainPID; }

# running UNIT [PID]: active/running with a main PID (PID itself if given).
running() {
	[[ $(prop "$1" ActiveState) == active && $(prop "$1" SubState) == running ]] || return 1
	local pid
	pid=$(pid_of "$1")
	[[ $pid != 0 ]] && [[ -z ${2:-} || $pid == "$2" ]]
}

# restarted UNIT OLDPID: running again under another PID.
restarted() {
	local pid
	pid=$(pid_of "$1")
	[[ $pid != 0 && $pid != "$2" ]] && running "$1"
}

# http_get PORT PATH: a plain HTTP/1.0 GET on loopback (no curl in the root).
http_get() (
	exec 3<>"/dev/tcp/127.0.0.1/$1"
	printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
	timeout 5 cat <&3
)

# metric PORT NAME LABEL: the value of the first series of NAME with LABEL.
metric() {
	http_get "$1" /metrics | awk -v n="$2" -v l="$3" 'index($0, n "{") == 1 && index($0, l) { print $2; exit }'
}

journal_has() { journalctl --no-pager -u "$1" _PID="$2" | grep -qF -- "$3"; }

region=/dev/shm/pdlink/engine-kv-0
region_sum=

# make_region writes a region file as an engine would: its own user, the
# pdlink group (setgid directory), UMask=0007.
make_region() {
	useradd --system --no-create-home --shell /usr/sbin/nologin engine
	usermod -aG pdlink engine
	runuser -u engine -- sh -c "umask 0007 && head -c 1048576 /dev/urandom > $region"
	region_sum=$(sha256sum <"$region")
	note "region $(stat -c '%n %U:%G %a %s bytes' "$region")"
}

# check_region: the directory and the region file are there, unchanged.
check_region() {
	local when=$1
	[[ -d /dev/shm/pdlink ]] || fail "$when: /dev/shm/pdlink is gone"
	[[ $(stat -c '%a %U:%G' /dev/shm/pdlink) == "2770 root:pdlink" ]] ||
		fail "$when: /dev/shm/pdlink is $(stat -c '%a %U:%G' /dev/shm/pdlink), want 2770 root:pdlink"
	[[ -f $region ]] || fail "$when: the engine's region file $region is gone"
	[[ $(stat -c '%U:%G' "$region") == engine:pdlink ]] || fail "$when: $region is $(stat -c '%U:%G' "$region")"
	[[ $(sha256sum <"$region") == "$region_sum" ]] || fail "$when: $region changed"
	note "region file intact ($when)"
}

# install_from_unit_comments runs the "Install" comment block of a unit, from
# the directory holding the unit files and the binary, as an operator would.
install_from_unit_comments() {
	local role=$1 dir=/opt/pdlink/unit-install
	mkdir -p "$dir"
	cp /opt/pdlink/deploy/systemd/* "$dir"/
	cp "/opt/pdlink/bin/$role" "$dir"/
	sed -n '/^# Install/,/^#$/{ s/^#   //p }' "$dir/$role.service" >"$dir/install-$role.sh"
	[[ -s $dir/install-$role.sh ]] || fail "$role.service has no install comments"
	note "install steps of $role.service:"
	sed 's/^/        /' "$dir/install-$role.sh"
	(cd "$dir" && bash -euo pipefail "install-$role.sh") || fail "the install comments of $role.service do not install it"
}

# install_from_readme runs the systemd block of the deployment page
# (docs/deployment.md, which the README links) from the checkout.
install_from_readme() {
	local role=$1 readme=/opt/pdlink/docs/deployment.md
	sed -n '/^## systemd/,/^```$/p' "$readme" | sed '1,/^```sh$/d; /^```$/d' |
		sed "s/prefilld/$role/g" >/opt/pdlink/install-readme.sh
	[[ -s /opt/pdlink/install-readme.sh ]] || fail "no systemd install block in docs/deployment.md"
	note "docs/deployment.md install steps for $role:"
	sed 's/^/        /' /opt/pdlink/install-readme.sh
	(cd /opt/pdlink && bash -euo pipefail install-readme.sh) || fail "the install steps of docs/deployment.md do not install $role"
}

inside() {
	step "boot: $(systemctl is-system-running 2>&1 || true), systemd $(systemctl --version | awk 'NR==1 {print $2}')"

	step "install decoded from the install comments of decoded.service"
	install_from_unit_comments decoded
	step "install prefilld from docs/deployment.md"
	install_from_readme prefilld

	step "READY: both units active/running (Type=notify)"
	for u in decoded prefilld; do
		wait_for 30 "$u did not reach READY" running "$u"
		note "$u pid $(pid_of "$u") $(prop "$u" ActiveState)/$(prop "$u" SubState)"
	done

	step "an engine creates its KV region under /dev/shm/pdlink"
	make_region
	check_region "after install"

	step "reload without --auth-token-file keeps the same PID"
	for u in decoded prefilld; do
		pid=$(pid_of "$u")
		systemctl reload "$u" || fail "systemctl reload $u"
		wait_for 10 "$u did not log 'reload: nothing to reload'" journal_has "$u" "$pid" "reload: nothing to reload"
		running "$u" "$pid" || fail "$u after reload: pid $(pid_of "$u") $(prop "$u" ActiveState)/$(prop "$u" SubState), was pid $pid"
		note "$u pid $pid still running"
	done

	step "stop prefilld: decoded is now the only pdlink unit on the host"
	begin=$(date +%s%N)
	systemctl stop prefilld
	took=$(( ($(date +%s%N) - begin) / 1000000 ))
	[[ $(prop prefilld ActiveState) == inactive && $(prop prefilld Result) == success ]] ||
		fail "prefilld stop: $(prop prefilld ActiveState) result $(prop prefilld Result)"
	[[ $(prop prefilld ExecMainStatus) == 0 ]] || fail "prefilld exited with $(prop prefilld ExecMainStatus)"
	note "prefilld stopped in ${took}ms, exit status 0"
	check_region "after prefilld stopped"

	step "kill -9 decoded restarts it"
	pid=$(pid_of decoded)
	kill -9 "$pid"
	wait_for 20 "decoded not restarted after kill -9 (NRestarts=$(prop decoded NRestarts))" restarted decoded "$pid"
	note "decoded pid $pid -> $(pid_of decoded), NRestarts=$(prop decoded NRestarts)"
	check_region "after kill -9"

	step "a wedged decoded (kill -STOP) is aborted by the watchdog and restarted"
	wd=$(sed -n 's/^WatchdogSec=\([0-9]*\)s$/\1/p' /etc/systemd/system/decoded.service)
	[[ -n $wd ]] || fail "no WatchdogSec in seconds in decoded.service"
	pid=$(pid_of decoded)
	kill -STOP "$pid"
	wait_for $((wd + 15)) "decoded not restarted after its watchdog (NRestarts=$(prop decoded NRestarts))" restarted decoded "$pid"
	note "decoded pid $pid -> $(pid_of decoded), NRestarts=$(prop decoded NRestarts)"
	journalctl --no-pager -u decoded | grep -qi "watchdog timeout" || fail "the journal does not show the watchdog timeout"
	note "journal: $(journalctl --no-pager -u decoded | grep -i 'watchdog timeout' | tail -1 | cut -c1-120)"
	check_region "after the watchdog restart"

	step "systemctl restart decoded"
	pid=$(pid_of decoded)
	systemctl restart decoded || fail "systemctl restart decoded"
	wait_for 20 "decoded not running after restart" restarted decoded "$pid"
	note "decoded pid $pid -> $(pid_of decoded)"
	check_region "after systemctl restart"

	step "reload with --auth-token-file keeps the same PID and reloads the token"
	head -c 32 /dev/urandom | sha256sum | cut -c1-48 >/etc/pdlink/token
	chgrp pdlink /etc/pdlink/token
	chmod 0640 /etc/pdlink/token
	sed -i 's|^#PDLINK_AUTH_TOKEN_FILE=$|PDLINK_AUTH_TOKEN_FILE=/etc/pdlink/token|' /etc/pdlink/decoded.env
	grep -q '^PDLINK_AUTH_TOKEN_FILE=/etc/pdlink/token$' /etc/pdlink/decoded.env || fail "could not set the token in decoded.env"
	systemctl restart decoded || fail "systemctl restart decoded with a token"
	wait_for 20 "decoded not running with a token" running decoded
	pid=$(pid_of decoded)
	port=$(sed -n 's/^#\{0,1\}PDLINK_HTTP_LISTEN=127.0.0.1:\([0-9]*\)$/\1/p' /etc/pdlink/decoded.env)
	wait_for 10 "decoded /metrics on port $port" metric "$port" pdlink_auth_token_reloads_total 'result="ok"'
	[[ $(metric "$port" pdlink_auth_token_reloads_total 'result="ok"') == 0 ]] || fail "token reloads before any SIGHUP"
	head -c 32 /dev/urandom | sha256sum | cut -c1-48 >/etc/pdlink/token
	systemctl reload decoded || fail "systemctl reload decoded with a token"
	reloaded() { [[ $(metric "$port" pdlink_auth_token_reloads_total 'result="ok"') == 1 ]]; }
	wait_for 10 "decoded did not count the token reload" reloaded
	running decoded "$pid" || fail "decoded after a token reload: pid $(pid_of decoded), was $pid"
	note "decoded pid $pid still running, pdlink_auth_token_reloads_total{result=\"ok\"} = 1"

	step "stop decoded, the last pdlink unit: exit 0 within the drain"
	drain=$(sed -n 's/^#\{0,1\}PDLINK_DRAIN_TIMEOUT=\([0-9]*\)s$/\1/p' /etc/pdlink/decoded.env)
	[[ -n $drain ]] || fail "no PDLINK_DRAIN_TIMEOUT in seconds in decoded.env"
	begin=$(date +%s%N)
	systemctl stop decoded
	took=$(( ($(date +%s%N) - begin) / 1000000 ))
	[[ $(prop decoded ActiveState) == inactive && $(prop decoded Result) == success ]] ||
		fail "decoded stop: $(prop decoded ActiveState) result $(prop decoded Result)"
	[[ $(prop decoded ExecMainCode) == 1 && $(prop decoded ExecMainStatus) == 0 ]] ||
		fail "decoded did not exit 0: code $(prop decoded ExecMainCode) status $(prop decoded ExecMainStatus)"
	(( took < drain * 1000 )) || fail "decoded took ${took}ms to stop, drain timeout ${drain}s"
	note "decoded stopped in ${took}ms (drain timeout ${drain}s), exit status 0"
	check_region "after the last pdlink unit stopped"

	step "start both again"
	# decoded has started six times within StartLimitIntervalSec=60s, one
	# more than StartLimitBurst=5 allows (as meant: a crash loop ends); the
	# check's own pace is not a crash loop.
	systemctl reset-failed decoded
	for u in decoded prefilld; do
		systemctl start "$u" || fail "systemctl start $u after every pdlink unit stopped"
		wait_for 20 "$u not running after a start" running "$u"
		note "$u pid $(pid_of "$u")"
	done
	check_region "at the end"
	step "PASS"
}

if [[ ${1:-} == --inside ]]; then
	set -o errtrace
	trap 'echo "[$(elapsed)] FAIL: command failed at line $LINENO: $BASH_COMMAND"' ERR
	inside
	echo PASS >/out/result
	exit 0
fi

# ------------------------------------------------------------------ host ---

cd "$(dirname "$0")/.."
repo=$(pwd)
budget=${PDLINK_SYSTEMD_CHECK_TIMEOUT:-240}

# Missing tools skip a local run but fail CI, where scripts/deps.sh must
# have installed them.
skip() {
	if [[ ${CI:-} == true ]]; then
		echo "FAIL: systemd-check: $* (CI=true)"
		exit 1
	fi
	echo "SKIP: systemd-check: $*"
	exit 0
}
[[ $(id -u) -eq 0 ]] || skip "needs root (debootstrap, systemd-nspawn)"
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn missing (apt-get install systemd-container)"
command -v debootstrap >/dev/null || skip "debootstrap missing (apt-get install debootstrap)"

work=$(mktemp -d /var/tmp/pdlink-systemd-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root out=$work/out
mkdir -p "$out"

step "build prefilld and decoded (CGO_ENABLED=0)"
CGO_ENABLED=0 go build -ldflags "-X main.version=$(git describe --always --dirty 2>/dev/null || echo dev)" \
	-o "$work/bin/" ./cmd/prefilld ./cmd/decoded

step "Debian root with systemd"
scripts/debian-root.sh "$root" systemd systemd-sysv dbus >"$work/root.log" 2>&1 || {
	cat "$work/root.log" >&2
	exit 1
}

# Can nspawn run a container here at all? Anything after this is a failure.
if ! probe=$(timeout 60 systemd-nspawn -q -D "$root" --register=no --keep-unit /bin/true 2>&1); then
	echo "SKIP: systemd-check: systemd-nspawn cannot run a container here: $probe"
	exit 0
fi

# The checkout as an operator has it: binaries in bin/, the unit files, the docs.
mkdir -p "$root/opt/pdlink/scripts" "$root/opt/pdlink/deploy" "$root/opt/pdlink/docs"
cp -a "$work/bin" "$root/opt/pdlink/bin"
cp -a deploy/systemd "$root/opt/pdlink/deploy/systemd"
cp docs/deployment.md "$root/opt/pdlink/docs/"
cp scripts/systemd-check.sh "$root/opt/pdlink/scripts/"

# The checker: after boot, run the inside half, then power off either way.
cat >"$root/etc/systemd/system/$checker_unit" <<EOF
[Unit]
Description=pdlink systemd-check (the harness, not part of an install)
After=multi-user.target
SuccessAction=poweroff
FailureAction=poweroff

[Service]
Type=oneshot
ExecStart=/opt/pdlink/scripts/systemd-check.sh --inside
StandardOutput=file:/out/check.log
StandardError=inherit
TimeoutStartSec=$((budget - 30))s

[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -s "/etc/systemd/system/$checker_unit" "$root/etc/systemd/system/multi-user.target.wants/$checker_unit"

step "boot the root (systemd-nspawn -b), run the checks inside (at most ${budget}s)"
set +e
timeout -k 10 "$budget" systemd-nspawn -q -D "$root" -b --register=no --keep-unit \
	--bind="$out:/out" >"$work/console.log" 2>&1
rc=$?
set -e
sed 's/^/    /' "$out/check.log" 2>/dev/null || echo "    (no check log)"
if [[ $(cat "$out/result" 2>/dev/null) != PASS ]]; then
	((rc == 124)) && echo "systemd-check: the container did not power off within ${budget}s"
	echo "--- container console (last 40 lines)"
	tail -40 "$work/console.log" | sed 's/\x1b\[[0-9;]*m//g'
	step "FAIL"
	exit 1
fi
step "PASS (nspawn exit $rc)"
