# Sourced by the GPU scripts that run one replicated pair (gpu-nvml.sh,
# gpu-many-guests.sh): start_pair DIR FLAGS... starts a standby on GPU 1
# (GPU 0 on a one-GPU host) and a primary on GPU 0 in PAIR_MODE (commit), both
# with FLAGS (the primary also with PRIMARY_FLAGS), their sockets, key,
# state and logs in DIR, and waits until
# the primary is protected (30 s at most). It needs B (the binaries'
# directory) and appends both nodes to pids; primary is the primary's pid.
# Guests reach the primary at unix://DIR/p.sock, the standby once promoted
# at unix://DIR/s.sock.
start_pair() {
	local dir=$1 standby_gpu=0 port=$((7400 + RANDOM % 500)) _
	shift
	[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && standby_gpu=1
	mkdir -p "$dir/state"
	(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key") # the nodes refuse a key others can read
	CUDA_VISIBLE_DEVICES=$standby_gpu "$B/vgpuha" standby "$@" --listen "tcp://127.0.0.1:$port" --replicate.key-file "$dir/key" \
		--guest-listen "unix://$dir/s.sock" --admin-listen "unix://$dir/sa.sock" 2>"$dir/standby.log" &
	pids+=($!)
	CUDA_VISIBLE_DEVICES=0 "$B/vgpuha" primary "$@" --guest-listen "unix://$dir/p.sock" --mode "${PAIR_MODE:-commit}" \
		--replicate-to "tcp://127.0.0.1:$port" --replicate.key-file "$dir/key" --admin-listen "unix://$dir/pa.sock" \
		--state-dir "$dir/state" ${PRIMARY_FLAGS:-} 2>"$dir/primary.log" &
	primary=$!
	pids+=($primary)
	for _ in $(seq 300); do
		"$B/vgpuha" status --admin "unix://$dir/pa.sock" --json 2>/dev/null | grep -Eq '"protected": *true' && return 0
		sleep 0.1
	done
	echo "the pair in $dir never became protected" >&2
	return 1
}
