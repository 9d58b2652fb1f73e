package mmiotrace

// The x86-64 half of the ptrace modes is package ptrace's (its register
// layout, system-call injection and the XSAVE area); what the tracer
// itself needs to know of the architecture is here.

// ptraceArchErr reports whether the ptrace modes work on this
// architecture: they do on x86-64.
func ptraceArchErr(Mode) error { return nil }
