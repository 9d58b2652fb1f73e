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
package main

// #cgo LDFLAGS: -Wl,--wrap=crosscall2
import "C"

func main() {}
