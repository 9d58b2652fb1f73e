package cuda

import (
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// statusFresh is how long one reading of the GPU's live state answers
// every guest that asks: `nvidia-smi -q` asks once for each entry it
// prints, and each reading is some 80 calls into the host's NVML.
// Counters and clocks a quarter of a second old are what nvidia-smi's own
// sampling shows.
const statusFresh = 250 * time.Millisecond

// statusCache keeps the last reading of a device's live state for
// statusFresh. read fills a reply and says whether it could read at all;
// a failed reading is not kept.
type statusCache struct {
	mu    sync.Mutex
	at    time.Time
	reply abi.DeviceStatusReply
	now   func() time.Time // time.Now; tests set it
}

// get fills r (empty) with a reading at most statusFresh old, taking a new
// one with read when the kept one is older.
func (c *statusCache) get(r *abi.DeviceStatusReply, read func(*abi.DeviceStatusReply) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	if t := now(); c.at.IsZero() || t.Sub(c.at) >= statusFresh || t.Before(c.at) {
		var fresh abi.DeviceStatusReply
		if !read(&fresh) {
			return
		}
		c.reply, c.at = fresh, t
	}
	*r = c.reply
}
