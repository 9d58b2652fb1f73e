#!/usr/bin/env bash
# gen.sh DRIVER OUT.c: trampolines for every cu* symbol of DRIVER but the
# three exporttrace.c defines itself.
set -euo pipefail
names=$(nm -D --defined-only "$1" | awk '$3 ~ /^cu/ {print $3}' | grep -vx -e cuGetExportTable -e cuGetProcAddress -e cuGetProcAddress_v2 | sort -u)
{
	echo '#include <dlfcn.h>'
	echo 'extern void *exporttrace_real;'
	for n in $names; do echo "__attribute__((visibility(\"hidden\"))) void *p_$n; __attribute__((naked)) void $n(void) { __asm__(\"jmp *p_$n(%rip)\"); }"; done
	echo 'void exporttrace_bind(void) {'
	for n in $names; do echo "	p_$n = dlsym(exporttrace_real, \"$n\");"; done
	echo '}'
} >"$2"
# wrappers.h: a wrapper per (table, slot) that logs through exporttrace_traced.
{
	echo 'uintptr_t exporttrace_traced(int, int, void *, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);'
	for t in $(seq 0 7); do for s in $(seq 0 127); do
		echo "static uintptr_t w_${t}_$s(uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t e, uintptr_t f, uintptr_t g, uintptr_t h) { return exporttrace_traced($t, $s, __builtin_return_address(0), a, b, c, d, e, f, g, h); }"
	done; done
	echo 'static void *const wrappers[MAXT][MAXS] = {'
	for t in $(seq 0 7); do printf '{'; for s in $(seq 0 127); do printf '(void *)w_%s_%s, ' $t $s; done; echo '},'; done
	echo '};'
} >"$(dirname "$2")/wrappers.h"
