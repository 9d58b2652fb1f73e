//go:build !linux

package shm

import (
	"context"
	"errors"
	"net"
	"time"
)

// ErrUnsupported is returned by Dial and NewListener where there is no
// shared-memory transport.
var ErrUnsupported = errors.New("shm: the shared-memory transport needs Linux (memfd, SCM_RIGHTS); use unix:// or tcp://")

// Options are a guest's ring sizes (zero: DefaultRing), its spin limit
// and its host-memory region.
type Options struct {
	RequestRing, ReplyRing uint32
	MaxSpin                time.Duration
	HostMemory             *HostMemory
}

// NewHostMemory fails: shared memory needs Linux.
func NewHostMemory(uint64) (*HostMemory, error) { return nil, ErrUnsupported }

// Close does nothing: no region is ever made here.
func (h *HostMemory) Close() error { return nil }

// SetHostMemoryBudget does nothing: shared memory needs Linux.
func (l *Listener) SetHostMemoryBudget(int64) {}

// Dial fails: shared memory needs Linux.
func Dial(context.Context, string, Options) (*Conn, error) { return nil, ErrUnsupported }

// Listener is never made outside Linux.
type Listener struct{ net.Listener }

// NewListener fails: shared memory needs Linux.
func NewListener(*net.UnixListener, int) (*Listener, error) { return nil, ErrUnsupported }

func writeByte(uintptr, byte) {}

// SetMaxSpin does nothing: shared memory needs Linux.
func (l *Listener) SetMaxSpin(time.Duration) {}
