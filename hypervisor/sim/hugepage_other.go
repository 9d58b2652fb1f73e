//go:build !linux

package sim

// deviceMemory returns n zeroed bytes of device memory.
func deviceMemory(n uint64) []byte { return make([]byte, n) }

// populate does nothing: pages are mapped on first write.
func populate([]byte) {}
