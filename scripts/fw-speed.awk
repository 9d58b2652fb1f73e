# Reads "program mode steps/s" lines (gpu-runtime.sh's STATS) and prints, per
# program, the median steps/s of each mode's runs, its ratio to native's
# median, and how many runs the median is of.
{ if ($3 != "") { v[$1 SUBSEP $2] = v[$1 SUBSEP $2] " " $3; progs[$1]; modes[$2] } }
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
END {
	if (length(progs) == 0) exit
	order = "native library replicated failover"
	nm = split(order, m, " ")
	printf "| program (median steps/s, runs) |"
	for (i = 1; i <= nm; i++) if (m[i] in modes) printf " %s |", m[i]
	printf "\n|---|"
	for (i = 1; i <= nm; i++) if (m[i] in modes) printf "---|"
	printf "\n"
	for (p in progs) {
		base = (p SUBSEP "native") in v ? median(v[p SUBSEP "native"]) : 0
		printf "| %s |", p
		for (i = 1; i <= nm; i++) {
			if (!(m[i] in modes)) continue
			k = p SUBSEP m[i]
			if (!(k in v)) { printf " — |"; continue }
			med = median(v[k]); runs = split(v[k], tmp, " ")
			if (m[i] != "native" && base > 0) printf " %.1f (%.2f×, %d) |", med, med / base, runs
			else printf " %.1f (%d) |", med, runs
		}
		printf "\n"
	}
}
