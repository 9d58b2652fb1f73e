#!/usr/bin/env bash
# Runs every fuzz target in the module for $1 (default 30s) each, then copies
# the inputs the fuzzer found interesting from the Go cache into the
# package's testdata/fuzz, so they run as seeds in every `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-30s}
cache=$(go env GOCACHE)/fuzz
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | awk '{print $2}'); do
		echo "fuzz: $pkg $target for $time"
		go test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$time"
		if [ -d "$cache/$pkg/$target" ]; then
			mkdir -p "$dir/testdata/fuzz/$target"
			# Keep a bounded corpus: the newest 200 inputs.
			ls -t "$cache/$pkg/$target" | head -200 | while read -r f; do
				cp -n "$cache/$pkg/$target/$f" "$dir/testdata/fuzz/$target/" 2>/dev/null || true
			done
		fi
	done
done
