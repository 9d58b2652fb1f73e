package cuda

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestLauncherOrderDrainFailure drives the launcher's queue without a GPU
// (submit records what the driver would get): launches reach submit in
// the order they were queued, on one thread, never while a drain has
// returned and the caller works; a refused launch is reported once, by
// the next takeFailure, and the launches after it still go; close submits
// what is queued and ends the thread.
func TestLauncherOrderDrainFailure(t *testing.T) {
	var (
		mu        sync.Mutex
		got       []uintptr
		inCall    bool // the "context lock" holder is working between drain and its next add
		overlaps  int
		begun     int
		refuseAt  = uintptr(700)
		refusal   = errors.New("launch out of resources")
		slowEvery = uintptr(50) // the launch before each drain takes a while: the drain finds it in flight
	)
	l := startLauncher(func() error { begun++; return nil }, func(q *queuedLaunch) error {
		if q.fn%slowEvery == 0 {
			time.Sleep(200 * time.Microsecond)
		}
		mu.Lock()
		defer mu.Unlock()
		if inCall {
			overlaps++
		}
		got = append(got, q.fn)
		if q.fn == refuseAt {
			return fmt.Errorf("launch %d: %w", q.fn, refusal)
		}
		return nil
	})
	const n = 2000
	failures := 0
	for i := uintptr(1); i <= n; i++ {
		l.add(queuedLaunch{fn: i})
		if i%50 == 0 { // another call on the context: it drains first
			for l.queued.Load() != 0 { // let the launcher take the batch: the drain finds it in flight
			}
			l.drain()
			mu.Lock()
			inCall = true
			if len(got) != int(i) {
				t.Fatalf("after a drain at launch %d, %d were submitted", i, len(got))
			}
			mu.Unlock()
			if err := l.takeFailure(); err != nil {
				if !errors.Is(err, refusal) || i < refuseAt {
					t.Fatalf("at launch %d: failure %v", i, err)
				}
				failures++
			}
			mu.Lock()
			inCall = false
			mu.Unlock()
		}
	}
	l.add(queuedLaunch{fn: n + 1})
	l.close()
	select {
	case <-l.done:
	default:
		t.Fatal("close returned with the launcher still running")
	}
	if failures != 1 {
		t.Fatalf("the refused launch was reported %d times, want once", failures)
	}
	if begun != 1 || overlaps != 0 {
		t.Fatalf("begin ran %d times (want 1); %d submissions overlapped a caller's work", begun, overlaps)
	}
	if len(got) != n+1 {
		t.Fatalf("%d launches submitted, want %d", len(got), n+1)
	}
	for i, fn := range got {
		if fn != uintptr(i+1) {
			t.Fatalf("submission %d was launch %d: out of order", i, fn)
		}
	}
}

// TestLauncherSleepsAndWakes: an idle launcher sleeps past its spin and
// wakes for the next launch; one whose begin failed refuses every launch.
func TestLauncherSleepsAndWakes(t *testing.T) {
	var mu sync.Mutex
	n := 0
	l := startLauncher(func() error { return nil }, func(*queuedLaunch) error { mu.Lock(); n++; mu.Unlock(); return nil })
	for range 3 {
		time.Sleep(3 * launchSpin) // asleep on wake by now
		l.add(queuedLaunch{fn: 1})
		l.drain()
	}
	l.close()
	if n != 3 {
		t.Fatalf("%d launches submitted after sleeps, want 3", n)
	}

	broken := errors.New("no context")
	l = startLauncher(func() error { return broken }, func(*queuedLaunch) error { t.Error("submitted without a context"); return nil })
	l.add(queuedLaunch{fn: 1})
	l.drain()
	if err := l.takeFailure(); !errors.Is(err, broken) {
		t.Fatalf("failure %v, want the begin error", err)
	}
	l.close()
}
