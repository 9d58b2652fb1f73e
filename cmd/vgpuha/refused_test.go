package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestRefusedAsyncCallSurvivesFailover is issue 47's sixth finding: one
// refused asynchronous memset (out of its allocation), a read, then
// SIGKILL of the primary. The guest used to find the session "rolled
// back" on the promoted standby (the refused request counted as done,
// while the standby, which never heard of it, was one request behind), and
// every later call failed. Now the failure is answered on both nodes: the
// session resumes, the memset's failure is reported exactly once (at the
// first synchronization, on whichever node it comes), it never becomes
// applied, and the next calls work.
func TestRefusedAsyncCallSurvivesFailover(t *testing.T) {
	skipShort(t)
	for _, when := range []string{"reported-after-failover", "reported-before-failover"} {
		t.Run(when, func(t *testing.T) {
			g, p, kill := refusedAsyncBeforeKill(t)
			if when == "reported-before-failover" {
				if err := g.Synchronize(); !errors.Is(err, abi.StatusOutOfRange) {
					t.Fatalf("the synchronization after the refused memset: %v, want its failure (%s)", err, abi.StatusOutOfRange)
				}
			}
			kill()
			err := g.Synchronize()
			switch {
			case when == "reported-after-failover" && !errors.Is(err, abi.StatusOutOfRange):
				t.Fatalf("the first synchronization on the new primary: %v, want the refused memset's failure", err)
			case when == "reported-before-failover" && err != nil:
				t.Fatalf("the first synchronization on the new primary: %v, want none (the failure was reported before)", err)
			}
			if err := g.Synchronize(); err != nil {
				t.Fatalf("a second synchronization: %v (a failure is reported once)", err)
			}
			out := make([]byte, 8192)
			if err := g.CopyDtoH(out, p); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, bytes.Repeat([]byte{7}, 8192)) {
				t.Fatalf("after the failover the memory reads %v...: the refused memset was applied", out[4090:4100])
			}
			if err := g.Memset8(p, 9, 8192); err != nil {
				t.Fatalf("a call after the failover: %v", err)
			}
			if err := g.CopyDtoH(out, p); err != nil || !bytes.Equal(out, bytes.Repeat([]byte{9}, 8192)) {
				t.Fatalf("reading after the failover: %v, %v...", err, out[:4])
			}
			if fo := g.Failovers(); len(fo) != 1 || fo[0].Term != 2 {
				t.Fatalf("failovers %+v: want one, to the promoted standby", fo)
			}
		})
	}
}

// refusedAsyncBeforeKill starts a protected pair of node processes, opens a
// guest that fails over, allocates 8 KiB, fills it with 7s, then sends an
// asynchronous memset that the node refuses (it runs past the
// allocation) and reads the allocation back (a commit point after the
// refused request). kill SIGKILLs the primary and waits until the
// standby serves.
func refusedAsyncBeforeKill(t *testing.T) (g *pvdriver.Client, p pvdriver.DevicePtr, kill func()) {
	t.Helper()
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	repl, adminA, adminB := freePort(t), freePort(t), freePort(t)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	startNode(t, "standby", "--listen", "tcp://"+repl, "--replicate.key-file", keyFile, "--guest-listen", "unix://"+sockB, "--admin-listen", adminB)
	a := startPrimary(t, "--guest-listen", "unix://"+sockA, "--replicate-to", "tcp://"+repl, "--replicate.key-file", keyFile,
		"--admin-listen", adminA)
	waitStatus(t, adminA, "protected", nodeStatus.protected)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, "unix://"+sockA, pvdriver.Options{GuestName: "g", Failover: []string{"unix://" + sockB}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if p, err = g.Alloc(8192); err != nil {
		t.Fatal(err)
	}
	if err := g.Memset8(p, 7, 8192); err != nil {
		t.Fatal(err)
	}
	if err := g.Memset32Async(p+4096, 1, 4096, 0); err != nil { // 16 KiB from the middle of 8: refused
		t.Fatal(err)
	}
	out := make([]byte, 8192)
	if err := g.CopyDtoH(out, p); err != nil {
		t.Fatalf("the read after the refused memset: %v", err)
	}
	return g, p, func() {
		a.cmd.Process.Kill()
		a.cmd.Wait()
		waitStatus(t, adminB, "promoted", nodeStatus.promoted)
	}
}
