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
// Being Go, the library inherits one rule of the Go runtime for threads
// that call into it: such a thread may replace its signal stack
// (sigaltstack) but must never disable it, or the next signal the
// runtime gets on it aborts the program ("non-Go code disabled
// sigaltstack"). Programs that switch stacks and put the old one back
// are fine; the torture guest does exactly that.
package main

func main() {}
