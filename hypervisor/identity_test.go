package hypervisor

import (
	"bytes"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestReplicaShowsThePrimarysDevice: a replica shows its guest the device
// its session-open record names (the GPU it was placed on at the primary),
// not the one this node placed it on; a record that names none (GPU 0, or
// an older primary's) shows GPU 0.
func TestReplicaShowsThePrimarysDevice(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DeviceIdentity = []byte("pair-secret-0123456789abcdef")
	srv, err := NewServer(sim.New(1<<30), cfg, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tok := bytes.Repeat([]byte{1}, abi.ResumeTokenSize)
	for id, device := range map[uint64]int{1: 3, 2: 0} {
		open := sessionOpen{Guest: "g", Token: tok, GraceKnown: true, Grace: 60e9, Device: device}
		if err := srv.OpenReplica(id, cfg.WindowBase+(id-1)*cfg.WindowSize, open.Append(nil)); err != nil {
			t.Fatal(err)
		}
		srv.mu.Lock()
		sess := srv.sessions[id]
		srv.mu.Unlock()
		body, err := sess.deviceInfo(&abi.DeviceInfo{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := body.(*abi.DeviceInfoReply).UUID, deviceUUID(cfg.DeviceIdentity, device); got != want {
			t.Errorf("a replica of a session placed on the primary's GPU %d, here on GPU %d, shows %s, want %s",
				device, sess.dev.index, abi.UUIDString(got), abi.UUIDString(want))
		}
	}
	bare := sessionOpen{Guest: "old", Token: tok, GraceKnown: true, Grace: 60e9}.Append(nil) // an older primary's record
	if err := srv.OpenReplica(3, cfg.WindowBase+2*cfg.WindowSize, bare); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	shown := srv.sessions[3].shown
	srv.mu.Unlock()
	if shown != 0 {
		t.Errorf("a record that names no device shows GPU %d, want 0", shown)
	}
}
