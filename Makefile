# pdlink: `make demo` and `make test` work on a fresh Debian machine. The demo
# needs nothing but Go (the generated code is committed); test, proto, bench,
# systemd-check and fresh-check install their Debian packages first
# (scripts/deps.sh GROUP).

GO          ?= go
BIN         := bin
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X main.version=$(VERSION)
# Pinned tools. protoc-gen-go and protoc-gen-go-grpc are pinned by the
# `tool` directives in go.mod; protoc comes from Debian's protobuf-compiler.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BUF         := github.com/bufbuild/buf/cmd/buf@v1.75.0
GOTEST_FLAGS ?= -race -count=1 -timeout 10m

export GOFLAGS ?= -mod=readonly

.PHONY: python-test python-lint engine-check
.PHONY: all deps build test demo bench lint style vet staticcheck buf-lint proto proto-check tidy-check ci clean deploy-check deploy-update chaos twohost fresh-check

all: build

## deps: every Debian package any target here uses (what CI installs).
deps:
	@scripts/deps.sh all

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# Suites that run real daemons, Prometheus and proxies: one package at a time,
# so their timing bounds are not judged on a machine loaded by each other.
SYSTEM_PKGS := ./test/... ./deploy/...

## test: every package under the race detector, the Python suites, the
## real-engine suites (make engine-check), then the real-process suites (e2e,
## chaos short version, deploy checks) one package at a time.
test:
	@scripts/deps.sh test
	$(GO) test $(GOTEST_FLAGS) $$($(GO) list ./... | grep -v -e /test/ -e /deploy)
	$(MAKE) python-test
	$(MAKE) engine-check
	$(GO) test $(GOTEST_FLAGS) -p 1 $(SYSTEM_PKGS)
	PDLINK_CHAOS_TRANSPORT=tcp $(GO) test $(GOTEST_FLAGS) ./test/chaos/

## python-test: the Python package's tests (python/tests) in the project's
## venv (scripts/pyenv.sh), on real daemons built into bin/; the sglang group
## brings SGLang for the backend's tests (python/tests/sglang).
python-test: build
	scripts/pyenv.sh test sglang
	cd python && PDLINK_BIN_DIR=$(abspath $(BIN)) ../.venv/bin/python -m pytest -q tests --ignore=tests/engines

## engine-check: the real-engine suites: real SGLang and vLLM servers on CPU
## (a tiny Llama written from a fixed seed) computing attention over KV that
## pdlink moved, token for token against one colocated server. SGLang's in
## .venv (the sglang group), vLLM's in .venv-vllm (scripts/pyenv.sh vllm).
engine-check: build
	@scripts/deps.sh engines
	scripts/pyenv.sh test sglang vllm
	cd python && PDLINK_BIN_DIR=$(abspath $(BIN)) ../.venv/bin/python -m pytest -q tests/engines/sglang
	cd python && PDLINK_BIN_DIR=$(abspath $(BIN)) ../.venv-vllm/bin/python -m pytest -q tests/engines/vllm

## demo: Go only, no Debian package.
demo: build
	$(BIN)/pdctl demo

bench: build
	@scripts/deps.sh bench
	scripts/bench.sh

## lint: formatting, vet, staticcheck (pinned), buf lint (pinned), ruff (pinned).
lint: style vet staticcheck buf-lint python-lint

python-lint:
	scripts/pyenv.sh test
	.venv/bin/ruff format --check python
	.venv/bin/ruff check python

style:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) run $(STATICCHECK) ./...

buf-lint:
	cd api && $(GO) run $(BUF) lint

## proto: regenerate api/pdlink/v1 with Debian's protoc and the pinned plugins,
## and the Python stubs (python/pdlink/v1) with the pinned grpcio-tools.
proto:
	@scripts/deps.sh proto
	$(GO) build -o $(BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc
	cd api && protoc -I . -I /usr/include \
		--plugin=protoc-gen-go=../$(BIN)/protoc-gen-go \
		--plugin=protoc-gen-go-grpc=../$(BIN)/protoc-gen-go-grpc \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		pdlink/v1/*.proto
	scripts/pyenv.sh proto
	.venv/bin/python -m grpc_tools.protoc -I api \
		--python_out=python --pyi_out=python --grpc_python_out=python \
		api/pdlink/v1/*.proto

## proto-check: regeneration must not change the committed code.
proto-check: proto
	git diff --exit-code -- api/ python/pdlink/v1/
	@test -z "$$(git status --porcelain -- api/ python/pdlink/v1/)" || { git status --porcelain -- api/ python/pdlink/v1/; echo "untracked generated files"; exit 1; }

## tidy-check: go mod tidy must not change go.mod or go.sum.
tidy-check:
	GOFLAGS=-mod=mod $(GO) mod tidy
	git diff --exit-code -- go.mod go.sum

## chaos: the fault-injection suite, long version (make test runs the short one).
chaos:
	@scripts/deps.sh test
	PDLINK_CHAOS_LONG=1 $(GO) test -count=1 -v -timeout 60m ./test/chaos/
	PDLINK_CHAOS_LONG=1 PDLINK_CHAOS_TRANSPORT=tcp $(GO) test -count=1 -v -timeout 60m ./test/chaos/

## twohost: prefilld and decoded on two network namespaces over a veth
## (needs root; make test runs it too, and it skips without root).
twohost:
	@scripts/deps.sh test
	$(GO) test $(GOTEST_FLAGS) -v ./test/twohost/

## deploy-check: systemd-analyze, kustomize + strict API decoding, promtool,
## and a real Prometheus firing and resolving the pin alert.
deploy-check:
	@scripts/deps.sh test
	$(GO) test $(GOTEST_FLAGS) ./deploy/...

## systemd-check: boot the units under a real systemd (systemd-nspawn, a fresh
## Debian root; needs root) and check READY, reload, restarts, watchdog, stop,
## and that the engine's KV regions survive (scripts/systemd-check.sh).
.PHONY: systemd-check
systemd-check:
	@scripts/deps.sh systemd-check
	scripts/systemd-check.sh

## deploy-update: regenerate deploy/systemd/*.env (from the flags) and
## deploy/k8s/base/prometheusrule.yaml (from the rule file).
deploy-update:
	$(GO) test -count=1 ./deploy -update

## fresh-check: make demo and make test in a minimal Debian root of this
## machine's release, from the committed HEAD, with empty Go caches
## (FRESH_KEEP=1 keeps the root for debugging).
fresh-check:
	@scripts/deps.sh fresh-check
	scripts/fresh-check.sh

## ci: what .ci/run does; make test runs once, inside fresh-check's root.
ci: lint proto-check tidy-check systemd-check fresh-check

clean:
	rm -rf $(BIN)
