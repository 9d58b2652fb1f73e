package link

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"net"
	"sync"
	"time"
)

// Heartbeats also travel on a second path, UDP datagrams to the standby's
// replication address, so that losing the TCP link alone (a stuck socket, a
// half-open connection) does not make the standby take over from a live
// primary. A datagram is magic, boot id, the primary's id, counter, term and
// an HMAC-SHA256 tag (truncated to 16 bytes) under the replication key:
// without the key nobody can keep a dead primary looking alive, old
// datagrams replayed are ignored (the counter must grow within one boot of
// the primary), and a standby hears only the primary it follows (another
// primary holding the key, a stray, must not keep it from taking over).
// Protocol 5 added the primary's id (a datagram of the old size is bad).

const udpMagic = "VGHB"
const udpSize = 4 + 8 + 8 + 8 + 8 + MacSize

func heartbeatTag(key []byte, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("vgpuha udp heartbeat"))
	m.Write(body)
	return m.Sum(nil)[:MacSize]
}

// SendUDPHeartbeats sends primary's heartbeat datagram to addr every
// interval until ctx ends; failed sends are counted through failed (may
// be nil).
func SendUDPHeartbeats(ctx context.Context, addr string, key []byte, primary uint64, term func() uint64, interval time.Duration, failed func()) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	var boot [8]byte
	rand.Read(boot[:])
	t := time.NewTicker(interval)
	defer t.Stop()
	for n := uint64(1); ; n++ {
		b := append([]byte(udpMagic), boot[:]...)
		b = binary.LittleEndian.AppendUint64(b, primary)
		b = binary.LittleEndian.AppendUint64(b, n)
		b = binary.LittleEndian.AppendUint64(b, term())
		b = append(b, heartbeatTag(key, b)...)
		if _, err := c.Write(b); err != nil && failed != nil {
			failed() // e.g. ICMP unreachable reported on the next write
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ListenUDPHeartbeats calls heard with the sender's primary id and term
// for every authentic, fresh heartbeat datagram arriving on addr, and bad
// (may be nil) for every other datagram, until ctx ends.
func ListenUDPHeartbeats(ctx context.Context, addr string, key []byte, heard func(primary, term uint64), bad func()) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); pc.Close() }()
	var mu sync.Mutex
	var lastBoot [8]byte
	var lastN uint64
	buf := make([]byte, 512)
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			continue
		}
		b := buf[:n]
		if n != udpSize || string(b[:4]) != udpMagic || !hmac.Equal(b[n-MacSize:], heartbeatTag(key, b[:n-MacSize])) {
			if bad != nil {
				bad()
			}
			continue
		}
		var boot [8]byte
		copy(boot[:], b[4:12])
		primary, count := binary.LittleEndian.Uint64(b[12:]), binary.LittleEndian.Uint64(b[20:])
		mu.Lock()
		fresh := boot != lastBoot || count > lastN
		if fresh {
			lastBoot, lastN = boot, count
		}
		mu.Unlock()
		if fresh {
			heard(primary, binary.LittleEndian.Uint64(b[28:]))
		} else if bad != nil {
			bad() // a replay
		}
	}
}
