package cuapi

import (
	"fmt"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestResultOfStatus: each node status reaches the program as the CUDA
// error NVIDIA's driver returns for it; callers branch on some of them
// (a runtime tries its next image on NO_BINARY_FOR_GPU).
func TestResultOfStatus(t *testing.T) {
	want := map[abi.Status]Result{
		abi.StatusInvalidValue: ErrorInvalidValue, abi.StatusOutOfRange: ErrorInvalidValue,
		abi.StatusInvalidHandle: ErrorInvalidHandle, abi.StatusOutOfMemory: ErrorOutOfMemory,
		abi.StatusNotSupported: ErrorNotSupported, abi.StatusLaunchFailed: ErrorLaunchFailed,
		abi.StatusNoBinaryForGPU: ErrorNoBinaryForGPU, abi.StatusInvalidImage: ErrorInvalidImage,
		abi.StatusNotFound: ErrorNotFound, abi.StatusInternal: ErrorUnknown,
	}
	for st, r := range want {
		if got := resultOf("test", fmt.Errorf("node: %w", st), false); got != r {
			t.Errorf("%v: got %d, want %d", st, got, r)
		}
	}
}
