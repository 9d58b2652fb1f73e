// Package gpu defines Backend, the seam between the hypervisor (and the
// standby, which replays onto the same interface) and a real or simulated
// GPU. It owns no state of its own.
//
// A Backend hands out Contexts, one per guest session: a context owns its
// device allocations, modules and streams, and one context can never reach
// another's memory. Callers validate guest input before calling; a backend
// still refuses anything outside its context (defence in depth) and never
// panics on bad arguments.
//
// Addresses are chosen by the caller, not the backend: the hypervisor's
// allocator decides where each allocation lives inside the context's window
// so that a standby can reproduce the same device addresses (DESIGN.md
// decision 1). A backend that cannot place the window where asked reports the
// base it got, and the caller falls back to address translation.
package gpu

import (
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Backend is a local GPU.
type Backend interface {
	// Name is the backend's kind, e.g. "sim" or "cuda".
	Name() string
	// NewContext creates an isolated context whose allocations live in a
	// device virtual-address window of size bytes, asked for at base. The
	// context's Window reports where it really lies.
	NewContext(base, size uint64) (Context, error)
	// Close releases the device.
	Close() error
}

// Handles a backend hands out. They mean nothing outside their context and
// are never shown to a guest (guests see handlemap's virtual handles).
type (
	Module   uint64
	Function uint64
	Stream   uint64 // zero is the context's null stream
)

// LaunchConfig is a kernel launch's shape.
type LaunchConfig struct {
	Grid, Block abi.Dim3
	SharedBytes uint32
}

// Context is one guest's slice of the GPU. Methods are called from one
// goroutine at a time.
type Context interface {
	// Window is the base the context's address window really got.
	Window() (base, size uint64)
	// Alloc backs [addr, addr+size) inside the window with device memory.
	Alloc(addr, size uint64) error
	// Free releases the allocation that starts at addr.
	Free(addr uint64) error
	CopyHtoD(dst uint64, src []byte, s Stream) error
	CopyDtoH(dst []byte, src uint64, s Stream) error
	CopyDtoD(dst, src, size uint64, s Stream) error
	// Memset stores count elements of width bytes (1 or 4).
	Memset(dst uint64, width int, value uint32, count uint64, s Stream) error
	LoadModule(img *abi.ModuleImage) (Module, error)
	UnloadModule(m Module) error
	Function(m Module, name string) (Function, error)
	// Launch runs f; args have been checked against the kernel's signature.
	Launch(f Function, cfg LaunchConfig, args []abi.Arg, s Stream) error
	CreateStream() (Stream, error)
	DestroyStream(s Stream) error
	SyncStream(s Stream) error
	Sync() error
	// Close frees everything the context holds.
	Close() error
}

// Limits every backend enforces on launches, matching CUDA's for compute
// capability 7.0 and later (CUDA Programming Guide, "Compute Capabilities").
const (
	MaxThreadsPerBlock = 1024
	MaxSharedBytes     = 48 << 10
	MaxGridX           = 1<<31 - 1
	MaxGridYZ          = 65535
	MaxBlockZ          = 64
)

// HostAllocator is implemented by backends that copy faster from host
// memory they allocate themselves (page-locked memory on CUDA). The standby
// receives replicated data straight into such buffers. Buffers live as long
// as the backend.
type HostAllocator interface {
	AllocHost(n int) ([]byte, error)
}
