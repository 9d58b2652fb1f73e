package standby_test

import (
	"os"
	"testing"

	"github.com/vgpuha/vgpuha/internal/node"
)

// TestMain lets this test binary run as a GPU worker for the nodes of
// the tests that run their sessions in workers.
func TestMain(m *testing.M) {
	node.RunWorkerIfAsked()
	os.Exit(m.Run())
}
