package pvdriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// StatusClient is a status connection (abi.OpStatusHello): a process that
// only watches the node's device (a guest's NVML with no CUDA session in
// its process: nvidia-smi) asks about it without opening a session, so it
// takes none of the node's session slots. It asks one question at a
// time. A connection lost, or a node that no longer serves (deposed,
// its lease run out), is left for the first endpoint that opens a new
// status connection, in the order given, searched as a session's resume
// is (a round every probeEvery, for up to Options.ResumeTimeout, when
// there are failover endpoints): there is no session to resume, only a
// device to ask about, and after a failover that is the new primary's.
type StatusClient struct {
	endpoints []string
	name      string
	gpu       string        // the GPU it asks about, as Options.GPU pins a session's (empty: the node's first)
	search    time.Duration // how long to look for a node that answers (0: one round)

	mu   sync.Mutex
	conn net.Conn
	fr   *abi.FrameReader
	next uint64 // last request id
	term uint64 // the term of the node that answers
}

// statusWait bounds one status question, dialing included.
const statusWait = 5 * time.Second

// OpenStatus opens a status connection to endpoint, or, failing that, to
// the first of opts.Failover that opens one (opts.GuestName names it in
// the node's log). A node that answered and refused is reported as its
// *Error (an older node that knows no status connection among them).
func OpenStatus(ctx context.Context, endpoint string, opts Options) (*StatusClient, error) {
	c := &StatusClient{endpoints: append([]string{endpoint}, opts.Failover...), name: opts.GuestName, gpu: opts.GPU}
	if len(opts.Failover) > 0 {
		c.search = resumeTimeout(opts)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.connectLocked(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// connectLocked opens a status connection on the first endpoint that
// opens one. Precondition: c.mu must be locked.
func (c *StatusClient) connectLocked(ctx context.Context) error {
	var errs []error
	for _, ep := range c.endpoints {
		err := c.dialLocked(ctx, ep)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	return fmt.Errorf("pvdriver: no endpoint opens a status connection: %w", errors.Join(errs...))
}

func (c *StatusClient) dialLocked(ctx context.Context, ep string) error {
	conn, err := transport.DialWith(ctx, ep, nil)
	if err != nil {
		return err
	}
	c.conn, c.fr, c.next = conn, abi.NewFrameReader(conn, 1<<20), 0
	var hr abi.StatusHelloReply
	if err := c.askLocked(abi.OpStatusHello, &abi.StatusHello{GuestName: c.name, GPU: c.gpu}, &hr); err != nil {
		c.dropLocked()
		return err
	}
	c.term = hr.Term
	return nil
}

// askLocked sends one request on the connection and reads its reply.
// Precondition: c.mu must be locked and c.conn open.
func (c *StatusClient) askLocked(op abi.Opcode, req, reply abi.Body) error {
	c.next++
	c.conn.SetDeadline(time.Now().Add(statusWait))
	defer c.conn.SetDeadline(time.Time{})
	if _, err := c.conn.Write(abi.AppendBodyFrame(nil, op, 0, c.next, req)); err != nil {
		return err
	}
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	// A node that knows no such op answers as a reject (an older one).
	if (f.Op != op && f.Op != abi.OpReject) || f.RequestID != c.next || f.Flags&abi.FlagReply == 0 {
		return fmt.Errorf("pvdriver: %s answered by %s %d (%#x)", op, f.Op, f.RequestID, f.Flags)
	}
	st, msg, err := abi.DecodeReply(f.Payload, reply)
	if err == nil && st != abi.StatusOK {
		err = &Error{Op: op, Status: st, Message: msg}
	}
	return err
}

func (c *StatusClient) dropLocked() {
	if c.conn != nil {
		c.conn.Close()
		c.conn, c.fr = nil, nil
	}
}

// call asks one question; a connection lost, or a node that says it no
// longer serves, is left for a new status connection (connectLocked) and
// the question asked there once.
func (c *StatusClient) call(op abi.Opcode, req, reply abi.Body) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	for try := 0; try < 2; try++ {
		if c.conn == nil {
			if err = c.reconnectLocked(); err != nil { // no node answers: as a session with none left
				return fmt.Errorf("%w: %s", ErrClosed, err.Error())
			}
		}
		if err = c.askLocked(op, req, reply); err == nil || !elsewhere(err) {
			return err
		}
		c.dropLocked()
	}
	return err
}

// reconnectLocked looks for a node that opens a status connection: a
// round over the endpoints every probeEvery, until one does or c.search
// has passed. Precondition: c.mu must be locked.
func (c *StatusClient) reconnectLocked() error {
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), statusWait)
		err := c.connectLocked(ctx)
		cancel()
		looking := time.Since(start)
		if err == nil || looking >= c.search {
			return err
		}
		time.Sleep(probeEvery(looking))
	}
}

// elsewhere reports whether err means another node (or a new connection)
// may answer: the connection broke, or the node no longer serves.
func elsewhere(err error) bool {
	var refused *Error
	if !errors.As(err, &refused) {
		return true // the connection, not the node, failed
	}
	return refused.Status == abi.StatusDeposed || refused.Status == abi.StatusUnavailable
}

// DeviceInfo describes the node's device.
func (c *StatusClient) DeviceInfo() (abi.DeviceInfoReply, error) {
	var r abi.DeviceInfoReply
	err := c.call(abi.OpDeviceInfo, &abi.DeviceInfo{}, &r)
	return r, err
}

// DeviceStatus reads the live state of the node's device and the memory
// this guest (its tenant) holds there; no session's own share.
func (c *StatusClient) DeviceStatus() (abi.DeviceStatusReply, error) {
	var r abi.DeviceStatusReply
	err := c.call(abi.OpDeviceStatus, &abi.DeviceStatus{}, &r)
	return r, err
}

// Term is the term of the node that answered last.
func (c *StatusClient) Term() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term
}

// Close ends the status connection.
func (c *StatusClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked()
	return nil
}
