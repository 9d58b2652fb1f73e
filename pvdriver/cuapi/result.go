package cuapi

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Result is a CUresult, numbered as cuda.h numbers them (CUDA Driver API
// reference, "Data types used by CUDA driver": enum cudaError_enum).
type Result int32

// The CUresult values this driver returns, and their names.
const (
	Success               Result = 0
	ErrorInvalidValue     Result = 1
	ErrorUnsupportedLimit Result = 215
	ErrorOutOfMemory      Result = 2
	ErrorNotInitialized   Result = 3
	ErrorDeinitialized    Result = 4
	ErrorNoDevice         Result = 100
	ErrorInvalidDevice    Result = 101
	ErrorInvalidImage     Result = 200
	ErrorInvalidContext   Result = 201
	ErrorNoBinaryForGPU   Result = 209
	ErrorInvalidPTX       Result = 218
	ErrorFileNotFound     Result = 301
	ErrorInvalidHandle    Result = 400
	ErrorIllegalState     Result = 401
	ErrorNotFound         Result = 500
	ErrorNotReady         Result = 600
	ErrorIllegalAddress   Result = 700
	ErrorLaunchResources  Result = 701
	ErrorContextDestroyed Result = 709
	ErrorLaunchFailed     Result = 719
	ErrorCooperativeLarge Result = 720
	ErrorNotPermitted     Result = 800
	ErrorNotSupported     Result = 801
	ErrorUnknown          Result = 999
)

var resultText = map[Result][2]string{
	Success:                 {"CUDA_SUCCESS", "no error"},
	ErrorInvalidValue:       {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	ErrorOutOfMemory:        {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	ErrorNotInitialized:     {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	ErrorDeinitialized:      {"CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	ErrorNoDevice:           {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	ErrorInvalidDevice:      {"CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	ErrorInvalidImage:       {"CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	ErrorInvalidContext:     {"CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	ErrorUnsupportedLimit:   {"CUDA_ERROR_UNSUPPORTED_LIMIT", "limit is not supported on this architecture"},
	ErrorNoBinaryForGPU:     {"CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
	ErrorInvalidPTX:         {"CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
	ErrorFileNotFound:       {"CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
	ErrorInvalidHandle:      {"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	ErrorIllegalState:       {"CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in the current state"},
	ErrorCaptureUnsupported: {"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
	ErrorCaptureInvalidated: {"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
	ErrorCaptureUnmatched:   {"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream"},
	ErrorCaptureWrongThread: {"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
	ErrorNotFound:           {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	ErrorNotReady:           {"CUDA_ERROR_NOT_READY", "device not ready"},
	ErrorIllegalAddress:     {"CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	ErrorLaunchResources:    {"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
	ErrorContextDestroyed:   {"CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
	ErrorLaunchFailed:       {"CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	ErrorCooperativeLarge:   {"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
	ErrorNotPermitted:       {"CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	ErrorNotSupported:       {"CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	ErrorUnknown:            {"CUDA_ERROR_UNKNOWN", "unknown error"},
}

// Name is the result's cuda.h name (cuGetErrorName); ok is false for a
// value this driver does not know.
func (r Result) Name() (name string, ok bool) { t, ok := resultText[r]; return t[0], ok }

// Description is the result's message (cuGetErrorString).
func (r Result) Description() (text string, ok bool) { t, ok := resultText[r]; return t[1], ok }

// Results lists every result Name knows.
func Results() []Result {
	rs := make([]Result, 0, len(resultText))
	for r := range resultText {
		rs = append(rs, r)
	}
	return rs
}

// resultOf maps a pvdriver error to the CUresult CUDA gives for the same
// failure. A failed request's message goes to stderr when VGPUHA_DEBUG is
// set, or always when loud is (module loads: the program cannot otherwise
// learn why its kernel was refused). A refusal its user can fix on the
// node (a quota, a session limit, a feature the node was not started
// with: out of memory or not supported, the node's message naming the
// setting) is said once per call, even without VGPUHA_DEBUG.
func resultOf(call string, err error, loud bool) Result {
	if err == nil {
		return Success
	}
	if loud || os.Getenv("VGPUHA_DEBUG") != "" || fixable(err) && firstTime(call) {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: %s: %v\n", call, err)
	}
	var st abi.Status
	if errors.Is(err, abi.StatusCooperativeTooLarge) {
		return ErrorCooperativeLarge
	}
	switch {
	case errors.Is(err, pvdriver.ErrClosed), errors.Is(err, pvdriver.ErrRolledBack):
		return ErrorUnknown
	case errors.As(err, &st):
	default:
		return ErrorUnknown
	}
	switch st.Base() {
	case abi.StatusInvalidValue, abi.StatusOutOfRange:
		return ErrorInvalidValue
	case abi.StatusInvalidHandle:
		return ErrorInvalidHandle
	case abi.StatusOutOfMemory:
		return ErrorOutOfMemory
	case abi.StatusNotSupported:
		return ErrorNotSupported
	case abi.StatusNoBinaryForGPU:
		return ErrorNoBinaryForGPU
	case abi.StatusInvalidImage:
		return ErrorInvalidImage
	case abi.StatusNotFound:
		return ErrorNotFound
	case abi.StatusLaunchFailed:
		return ErrorLaunchFailed
	}
	return ErrorUnknown
}

// fixable reports whether err is a refusal an operator's setting decides.
func fixable(err error) bool {
	return errors.Is(err, abi.StatusOutOfMemory) || errors.Is(err, abi.StatusNotSupported)
}

var said sync.Map // call name -> true: its fixable refusal was said

func firstTime(call string) bool {
	_, done := said.LoadOrStore(call, true)
	return !done
}
