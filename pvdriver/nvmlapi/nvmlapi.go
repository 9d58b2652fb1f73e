// Package nvmlapi is NVIDIA's management library (NVML) over the
// process's vgpuha session: the Go half of the guest's libnvidia-ml.so.1
// (pvdriver/libnvml is its C half, which exports NVIDIA's names and puts
// answers into NVML's structs). It owns the table of NVML entry points
// served and what each answers; the session and the view of the devices
// are the process's CUDA driver's (cuapi.Driver.Session), so a program's
// CUDA and NVML count, order and name the same devices.
//
// What it answers comes from the node, never from here: the device's
// description taken once with the session (name, UUID, memory, PCI
// location, compute capability), and the device's live state
// (abi.DeviceStatusReply: temperature, power, clocks, utilization, the
// memory the guest holds) read when asked. The card's identity (serial,
// board part number, PCI ids, minor number, brand, architecture) is kept
// from the first node that answered, so after a failover the device is the
// same device; its live values are the new node's GPU's. A value the node
// does not have is NVML_ERROR_NOT_SUPPORTED. It must never report a value
// it made up, and never hold a session of its own.
package nvmlapi

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
)

// Return is nvmlReturn_t (nvml.h).
type Return int32

// The nvmlReturn_t values this package answers.
const (
	Success               Return = 0
	ErrorUninitialized    Return = 1
	ErrorInvalidArgument  Return = 2
	ErrorNotSupported     Return = 3
	ErrorNotFound         Return = 6
	ErrorInsufficientSize Return = 7
	ErrorDriverNotLoaded  Return = 9
	ErrorGPUIsLost        Return = 15
)

// Request is one call's arguments: the device (an ordinal among the
// visible devices; the C half turns handles into ordinals), a second
// device for the calls that take two, a numeric argument (a sensor, a
// clock type, flags) and a text argument (a UUID, PCI bus id or serial).
type Request struct {
	Dev, Dev2 int
	Arg       int64
	In        string
}

// Answer is what a call returns besides its status: numbers and a text,
// each entry's own (said at the entry), which the C half puts into NVML's
// structs.
type Answer struct {
	V [8]uint64
	S string
}

// Session is where the process's session, status connection and view of
// the devices come from: the process's CUDA driver (cuapi.Driver).
type Session interface {
	// Session is the process's session, opened if it is not.
	Session(caller string) (*pvdriver.Client, abi.DeviceInfoReply, []int, cuapi.Result)
	// OpenSession is the process's session if one is open now, else nil.
	OpenSession() *pvdriver.Client
	// Watch opens a status connection to the process's node.
	Watch(caller string) (*pvdriver.StatusClient, abi.DeviceInfoReply, []int, error)
}

// API is a process's NVML.
type API struct {
	src   Session
	debug io.Writer // VGPUHA_DEBUG: where unserved entries name themselves; nil for silence

	mu    sync.Mutex
	inits int // nvmlInit calls not yet shut down
	// opened: the device's description and the visible devices are taken
	// (from the process's session, or from status, the status connection
	// while the process has no session).
	opened  bool
	status  *pvdriver.StatusClient
	dev     abi.DeviceInfoReply
	visible []int
	// identity is the card's identity from the first status read (kept
	// for the process's life, see the package doc).
	identity *abi.DeviceStatusReply
	said     map[string]bool // unserved entries already named
}

// New returns a process's NVML over src, naming unserved entries on debug
// (nil: silent).
func New(src Session, debug io.Writer) *API {
	return &API{src: src, debug: debug, said: map[string]bool{}}
}

// Call runs NVML entry point name: its row of the table, or
// NVML_ERROR_NOT_SUPPORTED (named once on the debug writer) for an entry
// not served.
func (a *API) Call(name string, r Request, out *Answer) Return {
	e, ok := entries[name]
	if !ok {
		a.unserved(name)
		return ErrorNotSupported
	}
	return e(a, name, r, out)
}

// Served reports whether entry point name has a row.
func Served(name string) bool { _, ok := entries[name]; return ok }

// Names lists the entry points served, sorted.
func Names() []string {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (a *API) unserved(name string) {
	if a.debug == nil {
		return
	}
	a.mu.Lock()
	first := !a.said[name]
	a.said[name] = true
	a.mu.Unlock()
	if first {
		fmt.Fprintf(a.debug, "vgpuha libnvidia-ml: %s is not supported (NVML_ERROR_NOT_SUPPORTED)\n", name)
	}
}

// initFlagNoGPUs is NVML_INIT_FLAG_NO_GPUS: initialise even where there is
// no device.
const initFlagNoGPUs = 1

// Init is nvmlInit_v2 and nvmlInitWithFlags: it shares the process's
// session where its CUDA has one open, or else opens a status connection
// (package doc), counted: every Init needs a Shutdown. Without a node it
// fails with NVML_ERROR_DRIVER_NOT_LOADED, as NVML does without a driver,
// unless flags say NO_GPUS.
func (a *API) Init(caller string, flags uint64) Return {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.opened && !a.openLocked(caller) && flags&initFlagNoGPUs == 0 {
		return ErrorDriverNotLoaded
	}
	a.inits++
	return Success
}

// openLocked takes the device's description and the visible devices:
// from the process's session if it has one open, else from a status
// connection, else (a node that knows no status connection) from a
// session opened for it.
// Precondition: a.mu must be locked.
func (a *API) openLocked(caller string) bool {
	if a.src.OpenSession() == nil {
		st, dev, vis, err := a.src.Watch(caller)
		if err == nil {
			a.status, a.dev, a.visible, a.opened = st, dev, vis, true
			return true
		}
		if !errors.Is(err, abi.StatusBadFrame) {
			if !errors.Is(err, cuapi.ErrNoEndpoint) {
				fmt.Fprintf(os.Stderr, "vgpuha libnvidia-ml: %s: %v\n", caller, err)
			}
			return false
		}
	}
	_, dev, vis, r := a.src.Session(caller)
	if r != cuapi.Success {
		return false
	}
	a.dev, a.visible, a.opened = dev, vis, true
	return true
}

// Shutdown is nvmlShutdown: one Init fewer. The last one closes the
// status connection; a session stays the process's (its CUDA driver ends
// it at exit).
func (a *API) Shutdown() Return {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inits == 0 {
		return ErrorUninitialized
	}
	a.inits--
	if a.inits == 0 && a.status != nil {
		a.status.Close()
		a.status, a.opened = nil, false
	}
	return Success
}

// ready checks Init and returns the visible devices.
func (a *API) ready() ([]int, Return) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inits == 0 {
		return nil, ErrorUninitialized
	}
	return a.visible, Success
}

// device checks Init and that ordinal dev is a visible device.
func (a *API) device(dev int) Return {
	vis, r := a.ready()
	if r != Success {
		return r
	}
	if dev < 0 || dev >= len(vis) {
		return ErrorInvalidArgument
	}
	return Success
}

// identityFields and identityTexts are the card's identity: kept from the
// first node's answer for the process's life.
var (
	identityFields = []abi.DeviceField{abi.FieldPCIDeviceID, abi.FieldPCISubsystemID, abi.FieldMinorNumber,
		abi.FieldBrand, abi.FieldArchitecture}
	identityTexts = []abi.DeviceText{abi.TextSerial, abi.TextBoardPart}
)

// liveStatus is the device's live state, read from the node now (one
// round trip: a value is never older than the call that asks for it),
// with the card's identity kept from the first read.
func (a *API) liveStatus() (abi.DeviceStatusReply, Return) {
	st, err, asked := a.ask()
	if !asked {
		return abi.DeviceStatusReply{}, ErrorNotSupported // initialised with NO_GPUS and no node
	}
	if err != nil {
		if a.debug != nil {
			fmt.Fprintf(a.debug, "vgpuha libnvidia-ml: reading the device's state: %v\n", err)
		}
		var refused *pvdriver.Error
		if errors.As(err, &refused) { // a node that answers no device_status (an older one)
			return abi.DeviceStatusReply{}, ErrorNotSupported
		}
		return abi.DeviceStatusReply{}, ErrorGPUIsLost // no node holds the session any more
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.identity == nil {
		id := st
		a.identity = &id
	}
	for _, f := range identityFields {
		v, ok := a.identity.Get(f)
		st.Clear(f)
		if ok {
			st.Set(f, v)
		}
	}
	for _, t := range identityTexts {
		s, _ := a.identity.Text(t)
		st.ClearText(t)
		st.SetText(t, s)
	}
	return st, Success
}

// ask reads the device's status over the process's session if it has
// one open now (the session's own memory included), else over the
// status connection; asked is false with neither.
func (a *API) ask() (st abi.DeviceStatusReply, err error, asked bool) {
	if c := a.src.OpenSession(); c != nil {
		st, err = c.DeviceStatus()
		return st, err, true
	}
	a.mu.Lock()
	status := a.status
	a.mu.Unlock()
	if status == nil {
		return st, nil, false
	}
	st, err = status.DeviceStatus()
	return st, err, true
}

// description is the device's description taken at Init.
func (a *API) description() abi.DeviceInfoReply {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dev
}
