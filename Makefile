SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

STATICCHECK   := honnef.co/go/tools/cmd/staticcheck@v0.8.2
WORKFLOWCHECK := go.temporal.io/sdk/contrib/tools/workflowcheck@v0.6.0
# The modules of go.work: the library at the root, the command (whose module also holds
# the built-in Temporal server that outbox dev and outbox bench build and run in a child
# process when no Temporal CLI is installed), the end-to-end tests, the enqueue
# benchmark against River (a module of its own so River stays out of the library's graph;
# its one test checks the benchmark's variants, its benchmark runs with make bench-enqueue),
# the test of the Kubernetes manifests in deploy/kubernetes (a module of its own so the
# Kubernetes API types stay out of the library's graph), the MySQL store (a module of its
# own so a team on PostgreSQL never downloads the MySQL driver), and what both stores
# share, the store driver, the URL redactor and the trace helpers (modules of their own
# so a team on MySQL never downloads the PostgreSQL driver).
# deploy/monitoring (the test of the Grafana dashboard and the Prometheus alert rules) is a
# module outside go.work, tested and vetted with GOWORK=off: Prometheus's server module
# would otherwise raise the workspace's shared dependencies under the Temporal server.
MODULES = ./... ./cmd/outbox/... ./e2e/... ./benchmarks/enqueue/... ./deploy/kubernetes/... ./store/mysqlstore/... ./store/storedriver/... ./internal/redact/... ./internal/tracing/...
# Every package with tests but e2e, which links the Temporal server and runs without -race.
# (Packages without tests are left out: go test would still build them with -race, and
# cmd/outbox/internal/temporalserver links the whole server; lint's go vet checks them.)
UNIT_PKGS = $(shell go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' $(MODULES) | grep -v /e2e$$)

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

.PHONY: services
services: ## Start (or install) what the tests need and print its environment
	@scripts/services.sh

.PHONY: test
test: ## Start what the tests need, then run every test (the quick-start and docs checks verbosely)
	@eval "$$(scripts/services.sh)"; \
	for p in $$(go list ./examples/...); do go build -o /dev/null "$$p"; done; \
	go test -count=1 -race $(UNIT_PKGS); \
	(cd deploy/monitoring && GOWORK=off go test -count=1 ./...); \
	go test -c -o bin/e2e.test ./e2e/; \
	cd e2e; \
	../bin/e2e.test -test.count=1 -test.timeout=30m -test.skip='^(TestQuickStart|TestDocsCommands)$$'; \
	echo "quick start and the docs' commands: go run ./cmd/outbox dev from a fresh checkout, as in the README, and every shell command of the docs that a test can run, as written"; \
	../bin/e2e.test -test.count=1 -test.timeout=30m -test.v -test.run='^(TestQuickStart|TestDocsCommands)$$'

.PHONY: lint
lint: ## go vet, gofmt, no tracked file over 1 MiB, staticcheck, workflowcheck and the docker-compose.yml check
	go vet $(MODULES)
	go vet -tags nodev ./cmd/outbox/
	cd deploy/monitoring && GOWORK=off go vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@out=$$(git ls-files -z | xargs -0 stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 { print $$2 }'); if [ -n "$$out" ]; then echo "files over 1 MiB are tracked (a build output? they would go into every module download):"; echo "$$out"; exit 1; fi
	@if go run $(STATICCHECK) -version >/dev/null 2>&1; then go run $(STATICCHECK) $(MODULES); else echo "staticcheck unavailable; skipped"; fi
	@if go run $(WORKFLOWCHECK) -h >/dev/null 2>&1; then go run $(WORKFLOWCHECK) ./workflows/...; else echo "workflowcheck unavailable; skipped"; fi
	@scripts/check-compose.sh

.PHONY: build
build: ## Build bin/outbox (with outbox dev and outbox bench)
	CGO_ENABLED=0 go build -o bin/outbox ./cmd/outbox

.PHONY: build-prod
build-prod: ## Build bin/outbox-prod as the image does: no outbox dev, no Temporal server inside
	cd cmd/outbox && GOWORK=off CGO_ENABLED=0 go build -tags nodev -trimpath -ldflags="-s -w" -o ../../bin/outbox-prod .

.PHONY: tidy
tidy: ## go mod tidy in each module
	GOWORK=off go mod tidy
	cd cmd/outbox && GOWORK=off go mod tidy
	cd e2e && GOWORK=off go mod tidy
	cd benchmarks/enqueue && GOWORK=off go mod tidy
	cd deploy/kubernetes && GOWORK=off go mod tidy
	cd store/mysqlstore && GOWORK=off go mod tidy
	cd store/storedriver && GOWORK=off go mod tidy
	cd internal/redact && GOWORK=off go mod tidy
	cd internal/tracing && GOWORK=off go mod tidy
	cd deploy/monitoring && GOWORK=off go mod tidy

.PHONY: bench
bench: ## Run the store benchmarks (see docs/benchmarks.md)
	@eval "$$(scripts/services.sh)"; \
	go test -run XXX -bench . -benchtime 3s -count 3 ./store

.PHONY: bench-enqueue
bench-enqueue: ## Run the enqueue benchmark against a same-data row and River (see docs/benchmarks.md)
	@eval "$$(scripts/services.sh)"; \
	cd benchmarks/enqueue; \
	go test -run XXX -bench . -count 1 .

.PHONY: bench-e2e
bench-e2e: ## Run the end-to-end benchmark against the naive shape (see docs/benchmarks.md)
	@eval "$$(scripts/services.sh)"; \
	go run ./cmd/outbox bench --runs 3

.PHONY: chaos
chaos: ## Run the fault-injection suite at full size (1,000 messages per fault)
	@eval "$$(scripts/services.sh)"; OUTBOX_CHAOS_MESSAGES=1000 go test -count=1 -timeout 60m -v -run . ./chaos/
