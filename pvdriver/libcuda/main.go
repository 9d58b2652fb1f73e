// Command libcuda is the guest's libcuda.so.1 (make libcuda builds it as
// bin/libcuda.so.1 with -buildmode=c-shared): NVIDIA's CUDA driver API,
// served through pvdriver, for programs that were written against CUDA and
// are not changed. exports.c is the exported surface — NVIDIA's versioned
// symbol names with their C types, one line per entry, the unsupported
// entries, and cuGetProcAddress's table; glue_cgo.go converts C arguments
// and calls pvdriver/cuapi, which holds the driver's logic.
//
// A program runs with LD_LIBRARY_PATH pointing at the library and
// VGPUHA_ENDPOINT (unix:///path or tcp://host:port) naming the primary;
// VGPUHA_FAILOVER lists the endpoints to resume the session on after a
// failover (comma-separated), VGPUHA_DEBUG=1 prints every refused call.
// vgpuha.h declares the library's one extension, apertures (device memory
// the program writes with plain stores; pvdriver/cuapi/aperture.go).
//
// Being Go, the library's runtime takes its signals on the calling
// thread's alternate signal stack, and aborts the program ("non-Go code
// disabled sigaltstack") when a signal finds it disabled while Go code
// runs. Programs may disable theirs (JAX's XLA did), so every call into
// Go passes through sigstack.c, which lends the thread a stack for the
// call when its own is disabled (testdata/sigstack.c).
//
// Why a Go runtime in every guest process (issue 42 asked whether it is
// the right design): the session's wire protocol, resume after a
// failover, exactly-once bookkeeping and the shared-memory transport are
// pvdriver's, one implementation that Go guests and this library share
// and that the failover tests exercise; a C copy of them would be a
// second implementation of the most delicate code. What a runtime costs a
// host program is known and contained here: its signal stack (above),
// threads it starts (a handful, idle between calls), and fork (PyTorch's
// forked DataLoader workers run; as with NVIDIA's driver, a forked child
// must not use the parent's CUDA state). The alternative, a C
// library forwarding each call to a helper process that holds the
// session, costs a hop per call; it becomes the better design if a host
// program is found that the runtime cannot live beside.
//
// Entering Go from C costs about a microsecond, so the queries frameworks
// ask before nearly every operation are answered in C from answers kept
// until the driver changes them (answers.c), and VGPUHA_STATS=1 counts
// every entry into Go with its time (tally.c).
//
// The runtime does not re-read the cgroup's CPU limit every second
// (updatemaxprocs=0): inside a guest program that polling was 7 % of the
// library's CPU samples (a ResNet's profile, VGPUHA_CPUPROFILE), and the
// program's own threads, not the runtime's, do the library's work.
//
//go:debug updatemaxprocs=0
package main

// #cgo LDFLAGS: -Wl,--wrap=crosscall2
import "C"

func main() {}
