package drill

import (
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// The drill's workload: launches of the histogram kernel over elements
// values, each adding elements into nbins counters, so the counters' sum
// counts launches exactly: a lost launch or one applied twice shows.
const (
	elements, nbins = 1024, 16
	launches        = 400
	syncEvery       = 20 // the guest synchronizes every so many launches
	// epochEvery: in epoch mode the guest synchronizes this often, and the
	// checkpointer cuts an epoch after each synchronization.
	epochEvery = 40
)

// counters is the workload's state on the guest's GPU.
type counters struct {
	g          *pvdriver.Client
	f          pvdriver.Function
	data, bins pvdriver.DevicePtr
	cfg        pvdriver.LaunchConfig
}

// newCounters loads the kernel, uploads the values and zeroes the counters.
func newCounters(g *pvdriver.Client) (*counters, error) {
	img, _ := kernels.Image("histogram")
	m, err := g.LoadModule(img)
	if err != nil {
		return nil, err
	}
	c := &counters{g: g, cfg: pvdriver.LaunchConfig{Grid: pvdriver.Dim(elements / 256), Block: pvdriver.Dim(256)}}
	if c.f, err = g.GetFunction(m, "histogram"); err != nil {
		return nil, err
	}
	if c.data, err = g.Alloc(4 * elements); err != nil {
		return nil, err
	}
	if c.bins, err = g.Alloc(4 * nbins); err != nil {
		return nil, err
	}
	values := make([]byte, 4*elements)
	for i := 0; i < elements; i++ {
		binary.LittleEndian.PutUint32(values[4*i:], uint32(i))
	}
	if err := g.CopyHtoD(c.data, values); err != nil {
		return nil, err
	}
	return c, g.Memset8(c.bins, 0, 4*nbins)
}

func (c *counters) launch() error {
	return c.g.Launch(c.f, c.cfg, pvdriver.Ptr(c.data), pvdriver.U32(elements), pvdriver.Ptr(c.bins), pvdriver.U32(nbins))
}

// count reads the counters and returns how many launches they add up to.
func (c *counters) count() (int64, error) {
	out := make([]byte, 4*nbins)
	if err := c.g.CopyDtoH(out, c.bins); err != nil {
		return 0, err
	}
	var total int64
	for b := 0; b < nbins; b++ {
		total += int64(binary.LittleEndian.Uint32(out[4*b:]))
	}
	return total / elements, nil
}

// checkpointer is epoch mode's simulated VM checkpointer: after the guest
// synchronized it cuts an epoch on the primary, and journals the guest's
// progress only once the cut is committed on the standby. The journal is
// the VM checkpoint a takeover restores the guest to.
type checkpointer struct {
	primary *nodeproc.Node
	journal int // launches the last committed checkpoint holds
}

// cut cuts an epoch after launched launches.
func (c *checkpointer) cut(launched int) {
	if _, committed, err := cutEpoch(c.primary); err == nil && committed {
		c.journal = launched
	}
}

// cutEpoch cuts an epoch on an epoch-mode primary (POST /epoch): it
// returns the epoch cut and whether everything before it is committed on
// the standby.
func cutEpoch(primary *nodeproc.Node) (epoch uint64, committed bool, err error) {
	var cut struct {
		Epoch     uint64 `json:"epoch"`
		Committed bool   `json:"committed_on_standby"`
	}
	body, err := primary.Post("/epoch", 5*time.Second)
	if err == nil {
		err = json.Unmarshal(body, &cut)
	}
	return cut.Epoch, cut.Committed, err
}

// noteFailovers records how many failovers the guest went through and,
// for the first, its guest pause, when that began after the fault struck
// (zero: before it struck, nothing is measured from it), and how the
// guest found the new node.
func (rec *Record) noteFailovers(fo []pvdriver.Failover, struck time.Time) {
	rec.Failovers = len(fo)
	if len(fo) == 0 {
		return
	}
	s := MeasureSpans(struck, nil, &fo[0])
	rec.PauseMS = MS(s.GuestPause)
	if !struck.IsZero() {
		rec.PauseFromMS = MS(s.GuestLost)
	}
	rec.GuestLooks, rec.GuestStalled = fo[0].Looks, fo[0].Stalled
}

// noteTakeover records the spans of p's takeover after the fault struck.
func (rec *Record) noteTakeover(p *nodeproc.Promotion, struck time.Time) {
	s := MeasureSpans(struck, p, nil)
	rec.SilenceMS, rec.DetectionMS, rec.PromotionMS, rec.TakeoverMS = MS(s.Silence), MS(s.Detection), MS(s.Promotion), MS(s.Takeover)
}
