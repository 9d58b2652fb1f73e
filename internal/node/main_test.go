package node_test

import (
	"os"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
)

// TestMain lets this test binary run as an etcd member for
// etcdtest.StartProcesses (the stall tests freeze members with SIGSTOP).
func TestMain(m *testing.M) {
	etcdtest.RunMemberIfAsked()
	os.Exit(m.Run())
}
