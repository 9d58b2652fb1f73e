// Package x86store decodes an x86-64 instruction that stores to memory and
// says where the store lands and what it writes (Decode, Access.Target,
// Access.Emulate), given the thread's registers (Regs) and a way to read
// the guest's memory; a golden table (testdata/decode) and a fuzz target
// hold it to that.
//
// It is pure, portable Go: it decodes x86-64 bytes on any host, never
// touches a process, a register or a page itself, and never guesses: an
// instruction whose reach it cannot prove is ErrNotStore or not Bounded,
// and the tracer (package mmiotrace) steps it and compares instead.
package x86store
