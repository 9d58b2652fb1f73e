# vgpuha — `make help` lists the targets.
GO       ?= go
FUZZTIME ?= 30s
RACE     ?= -race
# make install: DESTDIR is a root to install under (packaging, tests);
# PREFIX and SYSCONFDIR are what the units in contrib/systemd name.
DESTDIR    ?=
PREFIX     ?= /usr/local
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system

.PHONY: help build lab libcuda demo setup test test-short fuzz bench vet gpu-test install install-check kmod-module kmod-test

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/vgpuha, the agent (primary, standby, status, verify, switchover, run)
	$(GO) build -o bin/vgpuha ./cmd/vgpuha

lab: ## build bin/vgpuha-lab, the lab tool: the agent's commands plus guests, demo, drills, benchmarks
	$(GO) build -o bin/vgpuha-lab ./cmd/vgpuha-lab

install: build ## install the agent, systemd units, /etc/vgpuha (example configs, kept if present), completion, docs under DESTDIR
	install -D -m 0755 bin/vgpuha $(DESTDIR)$(PREFIX)/bin/vgpuha
	install -D -m 0644 -t $(DESTDIR)$(UNITDIR) contrib/systemd/vgpuha-primary.service contrib/systemd/vgpuha-standby.service
	install -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/vgpuha
	for f in primary standby; do [ -e $(DESTDIR)$(SYSCONFDIR)/vgpuha/$$f.toml ] || install -m 0644 contrib/config/$$f.toml $(DESTDIR)$(SYSCONFDIR)/vgpuha/; done
	install -d $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	bin/vgpuha completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/vgpuha
	bin/vgpuha completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_vgpuha
	bin/vgpuha completion fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/vgpuha.fish
	install -D -m 0644 -t $(DESTDIR)$(PREFIX)/share/doc/vgpuha README.md ARCHITECTURE.md docs/*.md

install-check: ## install into a temporary root and check that everything the units name is there
	$(GO) test -count=1 -run 'TestMakeInstall' ./cmd/vgpuha/

libcuda: ## build bin/libcuda.so.1 and bin/libnvidia-ml.so.1, the guest's CUDA driver and NVML (needs gcc)
	$(GO) build -buildmode=c-shared -ldflags=-extldflags=-Wl,-soname,libcuda.so.1 -o bin/libcuda.so.1 ./pvdriver/libcuda
	rm -f bin/libcuda.so.h
	$(CC) -O2 -Wall -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o bin/libnvidia-ml.so.1 pvdriver/libnvml/nvml.c -ldl -lpthread

demo: lab ## run the demo on the software GPU, all agents on loopback
	./bin/vgpuha-lab demo

setup: ## install test dependencies (qemu, busybox, a Debian kernel in .vm/)
	./scripts/setup-test-deps.sh

test: setup vet ## set up, then run every test with the race detector (VM tests included)
	$(GO) test $(RACE) -count=1 -timeout 30m ./...
	$(GO) test -count=1 -run 'TestAnnouncedFramesBoundMemory|TestUnreadRepliesBoundMemory|TestReadsReuseTheirBuffer' ./hypervisor/ # memory bounds: measured without the race detector

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

bench: lab ## run the benchmarks and print their reports
	./bin/vgpuha-lab bench pv
	$(GO) test -run '^$$' -bench . -benchtime 1x ./bench/
	$(GO) test -run '^$$' -bench Entries -benchtime 1x ./pvdriver/libcuda/ # needs gcc
	$(GO) test -run '^$$' -bench LaunchKernel -benchtime 20000x ./pvdriver/cuapi/

gpu-test: libcuda ## on a machine with an NVIDIA GPU: CUDA backend tests, two-process replication on the GPU, GPU benchmarks, C programs through bin/libcuda.so.1
	CGO_ENABLED=0 $(GO) build -o bin/vgpuha ./cmd/vgpuha
	CGO_ENABLED=0 $(GO) build -o bin/vgpuha-lab ./cmd/vgpuha-lab
	CGO_ENABLED=0 $(GO) test -c -o bin/cuda.test ./hypervisor/cuda
	./scripts/gpu-test.sh bin
