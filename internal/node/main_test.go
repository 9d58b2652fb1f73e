package node_test

import (
	"os"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
	"github.com/vgpuha/vgpuha/internal/node"
)

// TestMain lets this test binary run as an etcd member for
// etcdtest.StartProcesses (the stall tests freeze members with SIGSTOP),
// and as a GPU worker (gpus_test.go).
func TestMain(m *testing.M) {
	etcdtest.RunMemberIfAsked()
	node.RunWorkerIfAsked()
	os.Exit(m.Run())
}
