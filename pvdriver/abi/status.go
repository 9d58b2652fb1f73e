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
	StatusUnavailable           // the node does not serve guests (standby, suspended, being promoted)
	StatusUnknownImage          // the node holds no image with that hash for this guest: send its bytes
	StatusNoBinaryForGPU        // a module image holds no code this GPU runs (CUDA's NO_BINARY_FOR_GPU)
	StatusInvalidImage          // a module image (cubin, fatbin, PTX) the GPU's loader rejects
	StatusNotFound              // a named symbol (kernel, variable) the module does not have
	// StatusDeposed refines StatusUnavailable: the node was fenced, a node
	// under a newer term took over (the message names the terms).
	StatusDeposed
	// StatusNoSession refines StatusInvalidValue: the node holds no session
	// with the id a hello asked to resume. Its reply carries a HelloReply
	// naming only the term the node serves under (CarriesBody).
	StatusNoSession
	// StatusCooperativeTooLarge refines StatusInvalidValue: a cooperative
	// launch asked for more blocks than the GPU holds at once (CUDA's
	// COOPERATIVE_LAUNCH_TOO_LARGE).
	StatusCooperativeTooLarge
	statusLimit
)

// refines maps each refining status to the one it refines: errors.Is
// matches both, and a peer of the previous ABI version, which knows only
// the refined one, is sent that.
var refines = map[Status]Status{StatusDeposed: StatusUnavailable, StatusNoSession: StatusInvalidValue,
	StatusCooperativeTooLarge: StatusInvalidValue}

// Base is the status s refines, or s.
func (s Status) Base() Status {
	if b, ok := refines[s]; ok {
		return b
	}
	return s
}

// Is reports whether s refines target (errors.Is).
func (s Status) Is(target error) bool {
	t, ok := target.(Status)
	return ok && t != s && s.Base() == t
}

// CarriesBody reports whether a reply of status s carries its op's reply
// body: a success, and StatusNoSession (the node's term).
func (s Status) CarriesBody() bool { return s == StatusOK || s == StatusNoSession }

// For is s as a peer speaking ABI version v knows it.
func (s Status) For(v uint16) Status {
	if v < Version {
		return s.Base()
	}
	return s
}

var statusNames = [...]string{
	StatusOK: "ok", StatusInvalidValue: "invalid value", StatusInvalidHandle: "invalid handle",
	StatusOutOfRange: "address out of range", StatusOutOfMemory: "out of memory",
	StatusNotSupported: "not supported", StatusLaunchFailed: "launch failed",
	StatusBadFrame: "bad frame", StatusInternal: "internal error", StatusUnavailable: "unavailable",
	StatusUnknownImage: "unknown image", StatusNoBinaryForGPU: "no binary for this GPU",
	StatusInvalidImage: "invalid image", StatusNotFound: "not found",
	StatusDeposed: "deposed", StatusNoSession: "no such session",
	StatusCooperativeTooLarge: "cooperative launch too large",
}

func (s Status) Error() string {
	if s < statusLimit {
		return statusNames[s]
	}
	return fmt.Sprintf("status %d", uint32(s))
}

// String is the status's name.
func (s Status) String() string { return s.Error() }
