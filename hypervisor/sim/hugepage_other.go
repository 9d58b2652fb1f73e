//go:build !linux

package sim

// deviceMemory returns n zeroed bytes of device memory.
func deviceMemory(n uint64) []byte { return make([]byte, n) }
