# gpushare: every target prints what it does; `make` alone lists them.
GO         ?= go
FUZZTIME   ?= 3s
E2E_TIMEOUT ?= 30m
# End-to-end tests marked t.Parallel (each starts its own cluster) run this many at a time; 1 runs
# them one by one.
E2E_PARALLEL ?= 2
# make bench: BENCH_COUNT runs of each in-process benchmark, each of -benchtime BENCHTIME; BENCH_E2E_COUNT runs of
# the test-bed scheduling throughput, each one round alone and one with the extender (-benchtime=1x); raw output in BENCH_RAW.
BENCH_COUNT     ?= 5
BENCH_E2E_COUNT ?= 3
BENCHTIME       ?= 1s
BENCH_TIMEOUT   ?= 60m
BENCH_RAW       ?= docs/benchmarks/raw
BENCHREPORT      = $(GO) run ./test/benchreport/cmd/benchreport
export GOTOOLCHAIN := local
# go-nvml's header marks the NVML calls deprecated in CUDA 13 that its bindings still wrap; every cgo
# build of the device plugin would print hundreds of lines of -Wdeprecated-declarations about them.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# make check builds the test bed in the background beside the unit tests; its output goes here and
# is printed when the build fails.
BED_LOG ?= bin/bed-build.log
# make check fuzzes beside the end-to-end tests (their clusters leave most of the CPU idle); the
# fuzzing's output goes here, printed when it fails.
FUZZ_LOG ?= bin/fuzz.log
# make check also vets and tests the side modules beside the end-to-end tests (log in SIDE_LOG); CI's
# make verify skips their vet with VERIFY_SIDE=0, so a cold machine compiles their dependencies there
# and not before the end-to-end tests start. Both background jobs run at nice 19: the clusters' own
# processes keep the CPU they ask for.
SIDE_LOG ?= bin/side.log
VERIFY_SIDE ?= 1
# make demo runs the built program itself, not `go run`: go run dies on SIGTERM and would leave the
# demo running without a parent, and make then forwards SIGTERM straight to the demo.
DEMO_BIN ?= bin/localcluster

.DEFAULT_GOAL := help
.PHONY: help build test unit unit-main unit-side side fuzz e2e check demo bench lint lint-main lint-side fmt verify clean

help: ## List the targets (default)
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Compile every package and the programs into bin/
	$(GO) build ./...
	@if [ -n "$$(ls cmd 2>/dev/null)" ]; then mkdir -p bin && $(GO) build -o bin/ ./cmd/...; fi

test: unit fuzz ## Unit and component tests with the race detector, then every fuzz target briefly

unit: unit-main unit-side ## Unit and component tests with the race detector, every module

unit-main:
	$(GO) test -race -count=1 ./...

# The side modules (own go.mod each): the scheduler-plugin build, the dashboard, packing and Helm checks.
unit-side:
	cd cmd/gpushare-scheduler && GOWORK=off $(GO) test -race -count=1 ./gpushareplugin/
	cd test/dashboard && GOWORK=off $(GO) test -race -count=1 ./...
	cd test/packing/cmd/packbench && GOWORK=off $(GO) test -race -count=1 ./...
	cd test/helm && GOWORK=off $(GO) test -race -count=1 ./...

side: lint-side unit-side ## go vet and the unit tests of the side modules (make check runs them beside the end-to-end tests)

fuzz: ## Every fuzz target for FUZZTIME each (default 3s; e.g. make fuzz FUZZTIME=1m)
	FUZZTIME=$(FUZZTIME) bash test/fuzz.sh

e2e: ## End-to-end tests on a real local cluster (builds the test bed first, cached)
	bash test/bed/build.sh
	$(GO) test -race -count=1 -tags e2e -timeout $(E2E_TIMEOUT) -parallel $(E2E_PARALLEL) ./test/...
	cd test/browser && GOWORK=off $(GO) test -race -count=1 -tags e2e -timeout 10m ./...

check: ## All tests: what CI runs (the test bed builds in the background beside the unit tests, log in BED_LOG; the side modules' vet and tests, log in SIDE_LOG, and fuzzing, log in FUZZ_LOG, run beside the end-to-end tests)
	@mkdir -p $(dir $(BED_LOG))
	@echo "building the test bed in the background (log: $(BED_LOG)) while the unit tests run"
	@setsid bash test/bed/build.sh >$(BED_LOG) 2>&1 & bed=$$!; \
	trap 'kill -- -$$bed 2>/dev/null || kill $$bed 2>/dev/null' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	start=$$(date +%s); \
	if ! $(MAKE) --no-print-directory unit-main; then \
		echo "check: the unit tests failed after $$(( $$(date +%s) - start ))s; the test bed build is stopped"; exit 1; \
	fi; \
	echo "check: unit tests passed in $$(( $$(date +%s) - start ))s; waiting for the test bed build"; \
	if ! wait $$bed; then echo "check: the test bed build failed; its log ($(BED_LOG)):"; cat $(BED_LOG); exit 1; fi; \
	echo "check: test bed ready after $$(( $$(date +%s) - start ))s:"; grep -v 'still building' $(BED_LOG) | sed 's/^/  /'; \
	echo "check: the side modules (log: $(SIDE_LOG)) and fuzzing (log: $(FUZZ_LOG)) in the background, at nice 19, beside the end-to-end tests, which mostly wait"; \
	nice -n 19 $(MAKE) --no-print-directory side >$(SIDE_LOG) 2>&1 & side=$$!; \
	FUZZTIME=$(FUZZTIME) FUZZ_WORKERS=1 nice -n 19 bash test/fuzz.sh >$(FUZZ_LOG) 2>&1 & fuzz=$$!; \
	trap 'kill $$side $$fuzz 2>/dev/null' EXIT; \
	$(MAKE) --no-print-directory e2e || exit 1; \
	echo "check: end-to-end tests passed after $$(( $$(date +%s) - start ))s"; \
	if ! wait $$side; then echo "check: the side modules failed; their log ($(SIDE_LOG)):"; cat $(SIDE_LOG); exit 1; fi; \
	if ! wait $$fuzz; then echo "check: fuzzing failed; its log ($(FUZZ_LOG)):"; cat $(FUZZ_LOG); exit 1; fi; \
	tail -n 1 $(FUZZ_LOG); echo "check: all passed after $$(( $$(date +%s) - start ))s"

demo: ## Build the programs, start a local cluster with hollow GPU nodes, our extender and plugins, run the samples, print kubectl inspect gpushare (Ctrl-C stops)
	@mkdir -p $(dir $(DEMO_BIN))
	$(GO) build -o $(DEMO_BIN) ./test/localcluster
	$(DEMO_BIN)

bench: ## Benchmarks into BENCH_RAW (benchstat-compatible): every package BENCH_COUNT times (5), the test-bed scheduling throughput and saturating burst BENCH_E2E_COUNT times (3), the extender's RSS at 5,000 nodes and 50,000 pods once, the live map's render in headless Chromium BENCH_E2E_COUNT times; their medians into docs/benchmarks/results.json and docs/benchmarks.md; then the packing results and plots
	$(BENCHREPORT) run -o $(BENCH_RAW)/go.txt -- \
		$(GO) test -p=1 -run='^$$' -bench=. -benchmem -count=$(BENCH_COUNT) -benchtime=$(BENCHTIME) -timeout=$(BENCH_TIMEOUT) ./...
	bash test/bed/build.sh
	$(BENCHREPORT) run -o $(BENCH_RAW)/e2e.txt -- \
		$(GO) test -tags=e2e -run='^$$' -bench='SchedulingThroughput|SaturatingBurst' -benchmem -benchtime=1x -count=$(BENCH_E2E_COUNT) -timeout=$(BENCH_TIMEOUT) ./test/e2e
	$(BENCHREPORT) run -o $(BENCH_RAW)/memory.txt -- \
		$(GO) test -tags=e2e -run='^$$' -bench=ExtenderMemory -benchtime=1x -count=1 -timeout=$(BENCH_TIMEOUT) ./test/e2e
	$(BENCHREPORT) run -o $(BENCH_RAW)/browser.txt -- \
		env GOWORK=off $(GO) -C test/browser test -run='^$$' -bench=PageRender -benchtime=5x -count=$(BENCH_E2E_COUNT) ./...
	$(BENCHREPORT) report -json docs/benchmarks/results.json -md docs/benchmarks.md $(BENCH_RAW)/go.txt $(BENCH_RAW)/e2e.txt $(BENCH_RAW)/memory.txt $(BENCH_RAW)/browser.txt
	GOWORK=off $(GO) -C test/packing/cmd/packbench run . -out docs/benchmarks/packing.json -plots docs/img -md docs/benchmarks.md

lint: lint-main lint-side ## go vet on the modules' own code (built as -race, so make test reuses its compiles of every dependency)

lint-main:
	$(GO) vet -race ./...
	$(GO) vet -race -tags e2e ./test/...
	cd test/browser && GOWORK=off $(GO) vet -race -tags e2e ./...

lint-side:
	cd cmd/gpushare-scheduler && GOWORK=off $(GO) vet -race ./...
	cd test/dashboard && GOWORK=off $(GO) vet -race ./...
	cd test/packing/cmd/packbench && GOWORK=off $(GO) vet -race ./...
	cd test/helm && GOWORK=off $(GO) vet -race ./...

fmt: ## gofmt every Go file
	gofmt -w $$(git ls-files '*.go')

verify: ## Fail on gofmt drift, go vet findings, go mod tidy drift or a tracked file over 1 MiB (test/large-files.txt)
	@bash test/large-files.sh
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt drift:"; echo "$$out"; exit 1; fi
	$(MAKE) --no-print-directory $(if $(filter 0,$(VERIFY_SIDE)),lint-main,lint)
	$(GO) mod tidy -diff
	cd test/bed && GOWORK=off $(GO) mod tidy -diff
	cd cmd/gpushare-scheduler && GOWORK=off $(GO) mod tidy -diff
	cd test/dashboard && GOWORK=off $(GO) mod tidy -diff
	cd test/packing/cmd/packbench && GOWORK=off $(GO) mod tidy -diff
	cd test/helm && GOWORK=off $(GO) mod tidy -diff
	cd test/browser && GOWORK=off $(GO) mod tidy -diff

clean: ## Remove bin/ and the test cache (the test bed's binary cache stays: see test/bed/build.sh)
	rm -rf bin
	$(GO) clean -testcache
