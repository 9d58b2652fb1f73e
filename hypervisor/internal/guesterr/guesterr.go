// Package guesterr is how a guest's request fails inside the hypervisor:
// an error that carries the status the guest sees (Fail), and a refusal
// whose reason operators count (Refuse, vgpuha_guest_refusals_total).
//
// It owns the error types and the list of refusal reasons. It must never
// decide anything: a package that refuses a request picks the status and
// the reason; this one only carries them to the connection, which replies
// and counts.
package guesterr

import (
	"errors"
	"fmt"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Error is a request failure with the status the guest sees. It matches
// its status with errors.Is and errors.As, and keeps the chain of the error
// that caused it (formatted with %w). It is the hypervisor refusing a
// request before the backend ran it (IsRefusal).
type Error struct {
	status abi.Status
	err    error
}

func (e *Error) Error() string   { return e.err.Error() }
func (e *Error) Unwrap() []error { return []error{e.status, e.err} }

// Fail refuses a request with status st; format and args are as for
// fmt.Errorf, so a cause given with %w stays in the chain.
func Fail(st abi.Status, format string, args ...any) error {
	return &Error{status: st, err: fmt.Errorf(format, args...)}
}

// StatusOf maps an error to the status reported to the guest. Backend
// errors wrap a Status; anything else is internal.
func StatusOf(err error) abi.Status {
	if err == nil {
		return abi.StatusOK
	}
	var st abi.Status
	if errors.As(err, &st) {
		return st
	}
	return abi.StatusInternal
}

// IsRefusal reports whether err is the hypervisor refusing a request
// before the backend ran it (nothing changed), as opposed to a backend error.
func IsRefusal(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// Refusal classes counted in vgpuha_guest_refusals_total{reason}.
const (
	SessionFailed   = "session_failed"   // a request after its session failed
	ReplayMismatch  = "replay_mismatch"  // an applied id resent with other content
	RequestID       = "request_id"       // an id too far past the last applied one
	UnknownRequest  = "unknown_request"  // an id at or below the last applied one, never applied
	ResumeToken     = "resume_token"     // resume with a missing or wrong token
	ResumeAttached  = "resume_attached"  // resume of a session served elsewhere
	BufferBudget    = "buffer_budget"    // request bytes over the node's budget
	TenantMemory    = "tenant_memory"    // allocation over the tenant's quota
	TenantSessions  = "tenant_sessions"  // session over the tenant's limit
	TenantDetached  = "tenant_detached"  // detached session over the tenant's limit: freed
	GraceCapped     = "grace_capped"     // grace asked above the cap (granted the cap)
	TenantAdmission = "tenant_admission" // a new tenant while its tenants hold the whole device
	DeviceFull      = "device_full"      // an allocation that does not fit beside what the tenants hold
	StatusConns     = "status_conns"     // a status connection past the node's limit
)

// Reasons lists every refusal class (each series exists from the start).
var Reasons = []string{SessionFailed, ReplayMismatch, RequestID, UnknownRequest, ResumeToken,
	ResumeAttached, BufferBudget, TenantMemory, TenantSessions, TenantDetached,
	GraceCapped, TenantAdmission, DeviceFull, StatusConns}

// refused is a request refused for a reason operators count and see in
// the log (a guest probing the node leaves a trace).
type refused struct {
	err    *Error
	reason string
}

func (e *refused) Error() string { return e.err.Error() }
func (e *refused) Unwrap() error { return e.err }

// Refuse is Fail with a counted reason.
func Refuse(reason string, st abi.Status, format string, args ...any) error {
	return &refused{err: &Error{status: st, err: fmt.Errorf(format, args...)}, reason: reason}
}

// Reason is the counted reason err was refused for, or "".
func Reason(err error) string {
	var r *refused
	if errors.As(err, &r) {
		return r.reason
	}
	return ""
}

// Deferred is an asynchronous request's failure, kept for the next
// synchronization: the connection counts it under the request's op and
// status but sends no reply.
type Deferred struct{ Err error }

func (e Deferred) Error() string { return e.Err.Error() }
func (e Deferred) Unwrap() error { return e.Err }
