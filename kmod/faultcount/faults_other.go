//go:build !amd64

package faultcount

import (
	"fmt"
	"runtime"
)

// NewFaultCounter would count the faults of process tgid in [lo, hi), but
// the exceptions:page_fault_user tracepoint it attaches to, and the error
// code it reads, exist only on x86.
func NewFaultCounter(tgid int, lo, hi uint64) (*FaultCounter, error) {
	return nil, fmt.Errorf("%w (%s): the fault counter reads x86's exceptions:page_fault_user tracepoint", ErrUnsupportedArch, runtime.GOARCH)
}
