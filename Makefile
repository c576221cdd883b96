SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

STATICCHECK   := honnef.co/go/tools/cmd/staticcheck@v0.8.2
WORKFLOWCHECK := go.temporal.io/sdk/contrib/tools/workflowcheck@v0.6.0
# Every package but e2e, which links the Temporal server and runs without -race.
UNIT_PKGS = $(shell go list ./... | grep -v /e2e$$)

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

.PHONY: services
services: ## Start (or install) what the tests need and print its environment
	@scripts/services.sh

.PHONY: test
test: ## Start what the tests need, then run every test
	@eval "$$(scripts/services.sh)"; \
	go test -count=1 -race $(UNIT_PKGS); \
	go test -count=1 ./e2e/

.PHONY: lint
lint: ## go vet, gofmt, staticcheck, workflowcheck and the docker-compose.yml check
	go vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@if go run $(STATICCHECK) -version >/dev/null 2>&1; then go run $(STATICCHECK) ./...; else echo "staticcheck unavailable; skipped"; fi
	@if go run $(WORKFLOWCHECK) -h >/dev/null 2>&1; then go run $(WORKFLOWCHECK) ./workflows/...; else echo "workflowcheck unavailable; skipped"; fi
	@scripts/check-compose.sh

.PHONY: build
build: ## Build bin/outbox
	CGO_ENABLED=0 go build -o bin/outbox ./cmd/outbox

.PHONY: bench
bench: ## Run the store benchmarks (see docs/benchmarks.md)
	@eval "$$(scripts/services.sh)"; \
	go test -run XXX -bench . -benchtime 3s -count 3 ./store

.PHONY: chaos
chaos: ## Run the fault-injection suite at full size (1,000 messages per fault)
	@eval "$$(scripts/services.sh)"; OUTBOX_CHAOS_MESSAGES=1000 go test -count=1 -timeout 60m -v -run . ./chaos/
