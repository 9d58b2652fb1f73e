# vgpuha — `make help` lists the targets.
GO       ?= go
FUZZTIME ?= 30s
RACE     ?= -race

.PHONY: help build libcuda demo setup test test-short fuzz bench vet gpu-test kmod-module kmod-test

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/vgpuha
	$(GO) build -o bin/vgpuha ./cmd/vgpuha

libcuda: ## build bin/libcuda.so.1, the guest's CUDA driver library (needs gcc)
	$(GO) build -buildmode=c-shared -ldflags=-extldflags=-Wl,-soname,libcuda.so.1 -o bin/libcuda.so.1 ./pvdriver/libcuda
	rm -f bin/libcuda.so.h

demo: build ## run the demo on the software GPU, all agents on loopback
	./bin/vgpuha demo

setup: ## install test dependencies (qemu, busybox, a Debian kernel in .vm/)
	./scripts/setup-test-deps.sh

test: setup vet ## set up, then run every test with the race detector (VM tests included)
	$(GO) test $(RACE) -count=1 -timeout 30m ./...
	$(GO) test -count=1 -run 'TestAnnouncedFramesBoundMemory' ./hypervisor/ # memory bounds: measured without the race detector

test-short: ## unit tests only, no setup
	$(GO) test -short ./...

kmod-module: ## build kmod/module/vgpuha_mmio.ko for the VM's kernel (headers from make setup)
	@if [ -f .vm/headers/build/Makefile ]; then $(MAKE) -C .vm/headers/build M=$(CURDIR)/kmod/module modules; \
	else echo "kmod-module: skipped: no kernel headers in .vm/headers (run make setup)"; fi

kmod-test: setup ## boot a VM with the kernel module: its tests, the kmod modes' MMIO tests, bench mmio (all modes side by side)
	VGPUHA_KMOD_BENCH=1 $(GO) test -count=1 -timeout 60m -v -run '^TestModuleInVM$$' ./kmod/

vet: ## go vet
	$(GO) vet ./...

fuzz: ## run every fuzz target for FUZZTIME and keep the corpus in testdata/
	./scripts/fuzz.sh $(FUZZTIME)

bench: build ## run the benchmarks and print their reports
	./bin/vgpuha bench pv
	$(GO) test -run '^$$' -bench . -benchtime 1x ./internal/lab/bench/

gpu-test: libcuda ## on a machine with an NVIDIA GPU: CUDA backend tests, two-process replication on the GPU, GPU benchmarks, C programs through bin/libcuda.so.1
	CGO_ENABLED=0 $(GO) build -o bin/vgpuha ./cmd/vgpuha
	CGO_ENABLED=0 $(GO) test -c -o bin/cuda.test ./hypervisor/cuda
	./scripts/gpu-test.sh bin
