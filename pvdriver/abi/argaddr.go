package abi

import "encoding/binary"

// MapAddresses is args with every value of them that may hold an address
// replaced by f of it: a pointer or 64-bit argument, and each
// 8-byte-aligned word of a structure passed by value (ArgBytes; a
// library's kernels take addresses in structures too). It returns args
// itself when f changes nothing, else a copy: the caller's arguments stay
// as they were. A guest library maps host addresses to their mirrors with
// it, a node the primary's module variables to its own.
func MapAddresses(args []Arg, f func(uint64) uint64) []Arg {
	out := args
	set := func(i int, a Arg) {
		if &out[0] == &args[0] {
			out = append([]Arg(nil), args...)
		}
		out[i] = a
	}
	for i, a := range args {
		switch a.Kind {
		case ArgPtr, ArgU64:
			if v := f(a.Bits); v != a.Bits {
				a.Bits = v
				set(i, a)
			}
		case ArgBytes:
			if raw := mapWords(a.Raw, f); len(raw) > 0 && &raw[0] != &a.Raw[0] {
				a.Raw = raw
				set(i, a)
			}
		}
	}
	return out
}

// mapWords is raw with each 8-byte-aligned word v replaced by f(v); raw
// itself if no word changes, else a copy.
func mapWords(raw []byte, f func(uint64) uint64) []byte {
	out := raw
	for off := 0; off+8 <= len(raw); off += 8 {
		v := binary.LittleEndian.Uint64(raw[off:])
		w := f(v)
		if w == v {
			continue
		}
		if &out[0] == &raw[0] {
			out = append([]byte(nil), raw...)
		}
		binary.LittleEndian.PutUint64(out[off:], w)
	}
	return out
}
