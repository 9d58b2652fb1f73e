# phase-rate.awk: the summed steps/s of many programs between two steps.
# Input: lines "EPOCH step N loss X" (scripts/gpu-many-guests.sh's .ts
# files, one program after another: a step numbered lower than the one
# before starts the next program). Variables: from, to (steps). Each
# program counts (to - from) steps over the time between its lines for
# steps from and to; one that printed either not at all counts nothing.
function flush() {
	if (t0 != "" && t1 != "" && t1 > t0) sum += (to - from) / (t1 - t0)
	t0 = t1 = ""
}
$2 == "step" {
	n = $3 + 0
	if (n < last) flush()
	last = n
	if (n == from) t0 = $1
	if (n == to) t1 = $1
}
END {
	flush()
	printf "%.1f", sum
}
