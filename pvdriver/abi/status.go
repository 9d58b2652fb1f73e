package abi

import "fmt"

// Status is the outcome of a request as the hypervisor reports it. Non-zero
// statuses are errors; they compare with errors.Is against the Status
// constants below.
type Status uint32

// Statuses. Values are part of the wire format.
const (
	StatusOK             Status = iota
	StatusInvalidValue          // a malformed or out-of-range argument
	StatusInvalidHandle         // an unknown module, function or stream handle
	StatusOutOfRange            // a device address outside the session's allocations
	StatusOutOfMemory           // quota or window exhausted
	StatusNotSupported          // e.g. a kernel the backend cannot run
	StatusLaunchFailed          // a kernel faulted while running
	StatusBadFrame              // the frame itself could not be parsed
	StatusInternal              // a hypervisor-side failure; nothing was changed
	StatusUnavailable           // the node does not serve guests (standby, fenced)
	StatusUnknownImage          // the node holds no image with that hash for this guest: send its bytes
	StatusNoBinaryForGPU        // a module image holds no code this GPU runs (CUDA's NO_BINARY_FOR_GPU)
	StatusInvalidImage          // a module image (cubin, fatbin, PTX) the GPU's loader rejects
	StatusNotFound              // a named symbol (kernel, variable) the module does not have
	statusLimit
)

var statusNames = [...]string{
	StatusOK: "ok", StatusInvalidValue: "invalid value", StatusInvalidHandle: "invalid handle",
	StatusOutOfRange: "address out of range", StatusOutOfMemory: "out of memory",
	StatusNotSupported: "not supported", StatusLaunchFailed: "launch failed",
	StatusBadFrame: "bad frame", StatusInternal: "internal error", StatusUnavailable: "unavailable",
	StatusUnknownImage: "unknown image", StatusNoBinaryForGPU: "no binary for this GPU",
	StatusInvalidImage: "invalid image", StatusNotFound: "not found",
}

func (s Status) Error() string {
	if s < statusLimit {
		return statusNames[s]
	}
	return fmt.Sprintf("status %d", uint32(s))
}

// String is the status's name.
func (s Status) String() string { return s.Error() }
