# outbox-cdc. `make test` provisions what it needs (Kafka jars from Maven
# Central into .cache/) and runs everything against real servers.
SHELL := /bin/bash
GO ?= go
BIN := bin/outbox-cdc
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/outbox-cdc/outbox-cdc/internal/cli.Version=$(VERSION)
CONFIG ?= outbox-cdc.yaml

.PHONY: all build test unit integration chaos vet lint bench demo run kafka-jars clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/outbox-cdc

kafka-jars:
	./scripts/fetch-kafka.sh

vet:
	$(GO) vet ./...

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

unit: kafka-jars build
	OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v /test/integration)

# The integration suite starts a private PostgreSQL and a real Apache Kafka
# broker itself (internal/testenv); it never skips.
integration: kafka-jars build
	@mkdir -p .cache
	set -o pipefail; OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 30m -v ./test/integration/ 2>&1 \
	  | tee .cache/integration.log \
	  | grep --line-buffered -E '^(=== RUN|--- |    --- |PASS|FAIL|ok|integration:|panic)|_test.go:[0-9]+: [^t]'; \
	  status=$${PIPESTATUS[0]}; [ $$status -eq 0 ] || tail -100 .cache/integration.log; exit $$status

# make test runs the short chaos suite (test/chaos) with the unit packages;
# make chaos is the long soak (about 10 minutes, >= 20 connector kills).
test: lint unit integration

chaos: kafka-jars build
	OUTBOX_CDC_CHAOS=long OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 30m -v -run TestChaos ./test/chaos/

bench:
	@mkdir -p bench/results
	set -o pipefail; $(GO) test -run '^$$' -bench . -benchmem ./decode/ ./offsets/ ./router/ | tee bench/results/microbench.txt
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/outbox-cdc
	$(GO) run ./bench/cmd/outbox-bench -connector $(BIN) -micro bench/results/microbench.txt -out bench/results $(BENCH_FLAGS)

demo: kafka-jars
	$(GO) run ./internal/demo

run: build
	$(BIN) run --config $(CONFIG)

clean:
	rm -rf bin
