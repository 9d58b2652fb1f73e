package nodeproc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"time"
)

// Node is one node: a `vgpuha primary` or `vgpuha standby` process and
// its admin endpoint (a unix socket, reachable from any namespace).
type Node struct {
	Cmd   *exec.Cmd
	Admin string // unix:///path
	HTTP  *http.Client
}

func New(adminSock string) *Node {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", adminSock)
	}}
	return &Node{Admin: "unix://" + adminSock, HTTP: &http.Client{Transport: tr}}
}

// Do sends one admin request and returns the body of a 200 reply.
func (a *Node) Do(method, path string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://admin"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, body)
	}
	return body, nil
}

// Status decodes the node's /status into v.
func (a *Node) Status(v any) error {
	body, err := a.Do(http.MethodGet, "/status", 2*time.Second)
	if err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}

// Post POSTs to an admin path (/switchover, /epoch) and returns the reply.
func (a *Node) Post(path string, timeout time.Duration) ([]byte, error) {
	return a.Do(http.MethodPost, path, timeout)
}

// Healthy reports whether the node's admin endpoint answers /healthz.
func (a *Node) Healthy() bool {
	_, err := a.Do(http.MethodGet, "/healthz", time.Second)
	return err == nil
}

// Promotion returns the standby's takeover record, nil before one.
func (a *Node) Promotion() *Promotion {
	var st struct{ Promotion *Promotion }
	if a.Status(&st) != nil {
		return nil
	}
	return st.Promotion
}

// Promotion is the part of a standby's /status that records its takeover.
type Promotion struct {
	Term             uint64
	DetectionSeconds float64 `json:"detection_seconds"`
	PromotionSeconds float64 `json:"promotion_seconds"`
	Serving          time.Time
	// DiscardedEpochRecords (epoch mode): records of the uncommitted
	// epoch the standby dropped when it took over.
	DiscardedEpochRecords int `json:"discarded_epoch_records"`
}

// Fenced waits up to d (0: asks once) for the node to answer that it no
// longer serves as the primary.
func (a *Node) Fenced(d time.Duration) bool {
	return WaitFor(d, func() bool {
		var st struct{ Serving bool }
		return a.Status(&st) == nil && !st.Serving
	}) == nil
}

// Signal sends sig to the node's process.
func (a *Node) Signal(sig os.Signal) { a.Cmd.Process.Signal(sig) }

// FreeAddr returns a loopback HOST:PORT nobody listens on now.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// WaitFor polls ok every 20 ms until it holds or d has passed.
func WaitFor(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
