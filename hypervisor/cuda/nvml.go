package cuda

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/ebitengine/purego"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The GPU's live state, read from the host's NVIDIA management library
// (libnvidia-ml.so.1, loaded at run time with purego like libcuda) for
// the GPU this backend serves, found by its UUID: what a guest's NVML
// reports (gpu.DeviceStatusReporter). A value NVML does not answer is
// left out, and a host without NVML answers none. Signatures and enums
// follow nvml.h (NVML API reference, "Device Queries").

// nvmlPciInfo is nvmlPciInfo_t (nvml.h): 68 bytes.
type nvmlPciInfo struct {
	busIDLegacy    [16]byte
	domain         uint32
	bus            uint32
	device         uint32
	pciDeviceID    uint32
	pciSubSystemID uint32
	busID          [32]byte
}

// nvmlLib is the host NVML's entry points this backend calls.
type nvmlLib struct {
	init          func() int32
	handleByUUID  func(uuid *byte, dev *uintptr) int32
	u32           map[string]func(dev uintptr, v *uint32) int32
	u32Arg        map[string]func(dev uintptr, arg uint32, v *uint32) int32
	text          map[string]func(dev uintptr, s *byte, n uint32) int32
	driverVersion func(s *byte, n uint32) int32
	utilization   func(dev uintptr, u *[2]uint32) int32
	pci           func(dev uintptr, p *nvmlPciInfo) int32
	bar1          func(dev uintptr, m *[3]uint64) int32
	pairs         map[string]func(dev uintptr, a, b *uint32) int32
	u64           map[string]func(dev uintptr, v *uint64) int32
	textArg       map[string]func(dev uintptr, arg uint32, s *byte, n uint32) int32
	eccTotal      func(dev uintptr, errorType, counterType uint32, v *uint64) int32
	eccCounter    func(dev uintptr, errorType, counterType, location uint32, v *uint64) int32
	retired       func(dev uintptr, cause uint32, count *uint32, addresses *uint64) int32
	remapped      func(dev uintptr, corr, unc, pending, failed *uint32) int32
}

// nvmlU32Fields are the fields NVML answers as one unsigned int: the
// entry point, and its argument (a sensor, threshold or clock type) or -1.
var nvmlU32Fields = []struct {
	field abi.DeviceField
	sym   string
	arg   int32
}{
	{abi.FieldTemperature, "nvmlDeviceGetTemperature", 0},                  // NVML_TEMPERATURE_GPU
	{abi.FieldTemperatureShutdown, "nvmlDeviceGetTemperatureThreshold", 0}, // NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
	{abi.FieldTemperatureSlowdown, "nvmlDeviceGetTemperatureThreshold", 1},
	{abi.FieldTemperatureGPUMax, "nvmlDeviceGetTemperatureThreshold", 3},
	{abi.FieldPowerUsage, "nvmlDeviceGetPowerUsage", -1},
	{abi.FieldPowerLimit, "nvmlDeviceGetEnforcedPowerLimit", -1},
	{abi.FieldPowerDefaultLimit, "nvmlDeviceGetPowerManagementDefaultLimit", -1},
	{abi.FieldPowerManagementLimit, "nvmlDeviceGetPowerManagementLimit", -1},
	{abi.FieldClockGraphics, "nvmlDeviceGetClockInfo", 0}, // NVML_CLOCK_GRAPHICS, SM, MEM, VIDEO
	{abi.FieldClockSM, "nvmlDeviceGetClockInfo", 1},
	{abi.FieldClockMemory, "nvmlDeviceGetClockInfo", 2},
	{abi.FieldClockVideo, "nvmlDeviceGetClockInfo", 3},
	{abi.FieldMaxClockGraphics, "nvmlDeviceGetMaxClockInfo", 0},
	{abi.FieldMaxClockSM, "nvmlDeviceGetMaxClockInfo", 1},
	{abi.FieldMaxClockMemory, "nvmlDeviceGetMaxClockInfo", 2},
	{abi.FieldMaxClockVideo, "nvmlDeviceGetMaxClockInfo", 3},
	{abi.FieldPState, "nvmlDeviceGetPerformanceState", -1},
	{abi.FieldComputeMode, "nvmlDeviceGetComputeMode", -1},
	{abi.FieldPersistenceMode, "nvmlDeviceGetPersistenceMode", -1},
	{abi.FieldMinorNumber, "nvmlDeviceGetMinorNumber", -1},
	{abi.FieldBrand, "nvmlDeviceGetBrand", -1},
	{abi.FieldArchitecture, "nvmlDeviceGetArchitecture", -1},
	{abi.FieldFanSpeed, "nvmlDeviceGetFanSpeed", -1},
	{abi.FieldPCIeLinkGen, "nvmlDeviceGetCurrPcieLinkGeneration", -1},
	{abi.FieldPCIeLinkWidth, "nvmlDeviceGetCurrPcieLinkWidth", -1},
	{abi.FieldPCIeMaxLinkGen, "nvmlDeviceGetMaxPcieLinkGeneration", -1},
	{abi.FieldPCIeMaxLinkWidth, "nvmlDeviceGetMaxPcieLinkWidth", -1},
	{abi.FieldTemperatureMemoryMax, "nvmlDeviceGetTemperatureThreshold", 2}, // NVML_TEMPERATURE_THRESHOLD_MEM_MAX
	{abi.FieldAppClock, "nvmlDeviceGetApplicationsClock", 0},                // NVML_CLOCK_GRAPHICS, SM, MEM, VIDEO
	{abi.FieldAppClock + 1, "nvmlDeviceGetApplicationsClock", 1},
	{abi.FieldAppClock + 2, "nvmlDeviceGetApplicationsClock", 2},
	{abi.FieldAppClock + 3, "nvmlDeviceGetApplicationsClock", 3},
	{abi.FieldDefaultAppClock, "nvmlDeviceGetDefaultApplicationsClock", 0},
	{abi.FieldDefaultAppClock + 1, "nvmlDeviceGetDefaultApplicationsClock", 1},
	{abi.FieldDefaultAppClock + 2, "nvmlDeviceGetDefaultApplicationsClock", 2},
	{abi.FieldDefaultAppClock + 3, "nvmlDeviceGetDefaultApplicationsClock", 3},
	{abi.FieldBoostClock, "nvmlDeviceGetMaxCustomerBoostClock", 0},
	{abi.FieldBoostClock + 1, "nvmlDeviceGetMaxCustomerBoostClock", 1},
	{abi.FieldBoostClock + 2, "nvmlDeviceGetMaxCustomerBoostClock", 2},
	{abi.FieldBoostClock + 3, "nvmlDeviceGetMaxCustomerBoostClock", 3},
	{abi.FieldPCIeTxThroughput, "nvmlDeviceGetPcieThroughput", 0}, // NVML_PCIE_UTIL_TX_BYTES, RX
	{abi.FieldPCIeRxThroughput, "nvmlDeviceGetPcieThroughput", 1},
	{abi.FieldPCIeReplays, "nvmlDeviceGetPcieReplayCounter", -1},
	{abi.FieldRetiredPending, "nvmlDeviceGetRetiredPagesPendingStatus", -1},
	{abi.FieldInforomChecksum, "nvmlDeviceGetInforomConfigurationChecksum", -1},
}

// nvmlPairs are the fields NVML answers two at a time (two unsigned ints).
var nvmlPairs = []struct {
	a, b abi.DeviceField
	sym  string
}{
	{abi.FieldECCCurrent, abi.FieldECCPending, "nvmlDeviceGetEccMode"},
	{abi.FieldEncoderUtil, abi.FieldEncoderSamplingUS, "nvmlDeviceGetEncoderUtilization"},
	{abi.FieldDecoderUtil, abi.FieldDecoderSamplingUS, "nvmlDeviceGetDecoderUtilization"},
	{abi.FieldPowerMinLimit, abi.FieldPowerMaxLimit, "nvmlDeviceGetPowerManagementLimitConstraints"},
}

// nvmlU64Fields are the fields NVML answers as one unsigned long long:
// the entry point, or the older name of the same (NVML renamed the
// throttle reasons clocks event reasons).
var nvmlU64Fields = []struct {
	field    abi.DeviceField
	sym, old string
}{
	{abi.FieldClocksEventReasons, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
	{abi.FieldSupportedClocksEventReasons, "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons"},
}

// nvmlInforomObjects are the inforom objects whose versions NVML answers
// (nvmlDeviceGetInforomVersion's nvmlInforomObject_t).
var nvmlInforomObjects = []struct {
	text abi.DeviceText
	obj  uint32
}{
	{abi.TextInforomOEM, 0}, {abi.TextInforomECC, 1}, {abi.TextInforomPower, 2},
}

// nvmlECCGroups are the memory error count groups (abi.ECCField) and the
// memory location each counts (nvmlMemoryLocation_t; -1: the totals).
var nvmlECCGroups = []struct {
	group    abi.DeviceField
	location int32
}{
	{abi.FieldECCTotal, -1}, {abi.FieldECCDRAM, 2}, {abi.FieldECCSRAM, 7},
}

// nvmlTexts are the texts NVML answers per device.
var nvmlTexts = []struct {
	text abi.DeviceText
	sym  string
}{
	{abi.TextSerial, "nvmlDeviceGetSerial"},
	{abi.TextBoardPart, "nvmlDeviceGetBoardPartNumber"},
	{abi.TextVBIOS, "nvmlDeviceGetVbiosVersion"},
	{abi.TextInforomImage, "nvmlDeviceGetInforomImageVersion"},
}

// loadNVML opens the host's NVML and registers every entry point it has
// of those above (an older NVML lacks some: their fields stay out).
func loadNVML() (*nvmlLib, error) {
	var lib uintptr
	var err error
	for _, name := range []string{"libnvidia-ml.so.1", "libnvidia-ml.so"} {
		if lib, err = purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("loading the host's NVML (libnvidia-ml.so.1): %w", err)
	}
	has := func(sym string) bool { _, err := purego.Dlsym(lib, sym); return err == nil }
	if !has("nvmlInit_v2") || !has("nvmlDeviceGetHandleByUUID") {
		return nil, fmt.Errorf("the host's NVML has no nvmlInit_v2 or nvmlDeviceGetHandleByUUID")
	}
	n := &nvmlLib{u32: map[string]func(uintptr, *uint32) int32{}, u32Arg: map[string]func(uintptr, uint32, *uint32) int32{},
		text: map[string]func(uintptr, *byte, uint32) int32{}}
	purego.RegisterLibFunc(&n.init, lib, "nvmlInit_v2")
	purego.RegisterLibFunc(&n.handleByUUID, lib, "nvmlDeviceGetHandleByUUID")
	n.registerTables(lib, has)
	for _, e := range []struct {
		fn  any
		sym string
	}{
		{&n.driverVersion, "nvmlSystemGetDriverVersion"}, {&n.utilization, "nvmlDeviceGetUtilizationRates"},
		{&n.pci, "nvmlDeviceGetPciInfo_v3"}, {&n.bar1, "nvmlDeviceGetBAR1MemoryInfo"},
		{&n.eccTotal, "nvmlDeviceGetTotalEccErrors"}, {&n.eccCounter, "nvmlDeviceGetMemoryErrorCounter"},
		{&n.retired, "nvmlDeviceGetRetiredPages"}, {&n.remapped, "nvmlDeviceGetRemappedRows"},
	} {
		if has(e.sym) {
			purego.RegisterLibFunc(e.fn, lib, e.sym)
		}
	}
	if r := n.init(); r != 0 {
		return nil, fmt.Errorf("the host's nvmlInit_v2: error %d", r)
	}
	return n, nil
}

// registerTables registers the entry points of the tables above that the
// host's NVML has.
func (n *nvmlLib) registerTables(lib uintptr, has func(string) bool) {
	for _, f := range nvmlU32Fields {
		switch {
		case !has(f.sym):
		case f.arg < 0:
			var fn func(uintptr, *uint32) int32
			purego.RegisterLibFunc(&fn, lib, f.sym)
			n.u32[f.sym] = fn
		case n.u32Arg[f.sym] == nil:
			var fn func(uintptr, uint32, *uint32) int32
			purego.RegisterLibFunc(&fn, lib, f.sym)
			n.u32Arg[f.sym] = fn
		}
	}
	for _, t := range nvmlTexts {
		if has(t.sym) {
			var fn func(uintptr, *byte, uint32) int32
			purego.RegisterLibFunc(&fn, lib, t.sym)
			n.text[t.sym] = fn
		}
	}
	n.pairs = map[string]func(uintptr, *uint32, *uint32) int32{}
	for _, p := range nvmlPairs {
		if has(p.sym) {
			var fn func(uintptr, *uint32, *uint32) int32
			purego.RegisterLibFunc(&fn, lib, p.sym)
			n.pairs[p.sym] = fn
		}
	}
	n.u64 = map[string]func(uintptr, *uint64) int32{}
	for _, f := range nvmlU64Fields {
		for _, sym := range []string{f.sym, f.old} {
			if has(sym) && n.u64[f.sym] == nil {
				var fn func(uintptr, *uint64) int32
				purego.RegisterLibFunc(&fn, lib, sym)
				n.u64[f.sym] = fn
			}
		}
	}
	n.textArg = map[string]func(uintptr, uint32, *byte, uint32) int32{}
	if has("nvmlDeviceGetInforomVersion") {
		var fn func(uintptr, uint32, *byte, uint32) int32
		purego.RegisterLibFunc(&fn, lib, "nvmlDeviceGetInforomVersion")
		n.textArg["nvmlDeviceGetInforomVersion"] = fn
	}
}

// nvmlDevice is the host NVML and its handle of this backend's GPU.
type nvmlDevice struct {
	once sync.Once
	lib  *nvmlLib
	dev  uintptr
}

// open finds the GPU by UUID in the host's NVML once; on failure it says
// why once and every status is left without the GPU's values.
func (n *nvmlDevice) open(uuid [16]byte) *nvmlLib {
	n.once.Do(func() {
		lib, err := loadNVML()
		if err == nil {
			name := append([]byte(abi.UUIDString(uuid)), 0)
			if r := lib.handleByUUID(&name[0], &n.dev); r != 0 {
				err = fmt.Errorf("the host's NVML does not know GPU %s: error %d", abi.UUIDString(uuid), r)
			}
		}
		if err != nil {
			slog.Warn("the guests' NVML will show no live GPU values (temperature, power, clocks, utilization)", "err", err)
			return
		}
		n.lib = lib
	})
	return n.lib
}

// read fills r with every value the host's NVML answers for the GPU.
func (n *nvmlDevice) read(lib *nvmlLib, r *abi.DeviceStatusReply) {
	for _, f := range nvmlU32Fields {
		var v uint32
		res := int32(-1)
		if fn := lib.u32[f.sym]; fn != nil && f.arg < 0 {
			res = fn(n.dev, &v)
		} else if fn := lib.u32Arg[f.sym]; fn != nil && f.arg >= 0 {
			res = fn(n.dev, uint32(f.arg), &v)
		}
		if res == 0 {
			r.Set(f.field, uint64(v))
		}
	}
	buf := make([]byte, abi.MaxDeviceText)
	for _, t := range nvmlTexts {
		if fn := lib.text[t.sym]; fn != nil && fn(n.dev, &buf[0], uint32(len(buf))) == 0 {
			r.SetText(t.text, cstring(&buf[0]))
		}
	}
	if lib.driverVersion != nil && lib.driverVersion(&buf[0], uint32(len(buf))) == 0 {
		r.SetText(abi.TextDriverVersion, cstring(&buf[0]))
	}
	var util [2]uint32
	if lib.utilization != nil && lib.utilization(n.dev, &util) == 0 {
		r.Set(abi.FieldUtilGPU, uint64(util[0]))
		r.Set(abi.FieldUtilMemory, uint64(util[1]))
	}
	for _, p := range nvmlPairs {
		var a, b uint32
		if fn := lib.pairs[p.sym]; fn != nil && fn(n.dev, &a, &b) == 0 {
			r.Set(p.a, uint64(a))
			r.Set(p.b, uint64(b))
		}
	}
	for _, f := range nvmlU64Fields {
		var v uint64
		if fn := lib.u64[f.sym]; fn != nil && fn(n.dev, &v) == 0 {
			r.Set(f.field, v)
		}
	}
	if fn := lib.textArg["nvmlDeviceGetInforomVersion"]; fn != nil {
		for _, o := range nvmlInforomObjects {
			if fn(n.dev, o.obj, &buf[0], uint32(len(buf))) == 0 {
				r.SetText(o.text, cstring(&buf[0]))
			}
		}
	}
	n.readErrors(lib, r)
	var pci nvmlPciInfo
	if lib.pci != nil && lib.pci(n.dev, &pci) == 0 {
		r.Set(abi.FieldPCIDeviceID, uint64(pci.pciDeviceID))
		r.Set(abi.FieldPCISubsystemID, uint64(pci.pciSubSystemID))
	}
	var bar1 [3]uint64 // total, free, used
	if lib.bar1 != nil && lib.bar1(n.dev, &bar1) == 0 {
		r.Set(abi.FieldBAR1Total, bar1[0])
		r.Set(abi.FieldBAR1Used, bar1[2])
	}
}

// readErrors fills r with the GPU's memory error counts, retired pages
// and remapped rows, as far as the host's NVML answers them.
func (n *nvmlDevice) readErrors(lib *nvmlLib, r *abi.DeviceStatusReply) {
	for _, g := range nvmlECCGroups {
		for errorType := range uint64(2) { // NVML_MEMORY_ERROR_TYPE_CORRECTED, UNCORRECTED
			for counterType := range uint64(2) { // NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
				f, _ := abi.ECCField(g.group, errorType, counterType)
				var v uint64
				res := int32(-1)
				if g.location < 0 && lib.eccTotal != nil {
					res = lib.eccTotal(n.dev, uint32(errorType), uint32(counterType), &v)
				} else if g.location >= 0 && lib.eccCounter != nil {
					res = lib.eccCounter(n.dev, uint32(errorType), uint32(counterType), uint32(g.location), &v)
				}
				if res == 0 {
					r.Set(f, v)
				}
			}
		}
	}
	if lib.retired != nil {
		for cause, f := range []abi.DeviceField{abi.FieldRetiredSingleBit, abi.FieldRetiredDoubleBit} {
			var count uint32 // 0 and no buffer: how many (NVML_ERROR_INSUFFICIENT_SIZE when there are some)
			if res := lib.retired(n.dev, uint32(cause), &count, nil); res == 0 || res == nvmlErrorInsufficientSize {
				r.Set(f, uint64(count))
			}
		}
	}
	var corr, unc, pending, failed uint32
	if lib.remapped != nil && lib.remapped(n.dev, &corr, &unc, &pending, &failed) == 0 {
		r.Set(abi.FieldRemappedCorrectable, uint64(corr))
		r.Set(abi.FieldRemappedUncorrectable, uint64(unc))
		r.Set(abi.FieldRemapPending, uint64(pending))
		r.Set(abi.FieldRemapFailed, uint64(failed))
	}
}

// nvmlErrorInsufficientSize is NVML_ERROR_INSUFFICIENT_SIZE.
const nvmlErrorInsufficientSize = 7

// Backend reads its GPU's live state from the host's NVML.
var _ gpu.DeviceStatusReporter = (*Backend)(nil)

// DeviceStatus implements gpu.DeviceStatusReporter: r is empty, and gets
// a reading at most statusFresh old (statuscache.go).
func (b *Backend) DeviceStatus(r *abi.DeviceStatusReply) {
	if b.uuid == ([16]byte{}) {
		return
	}
	b.status.get(r, func(fresh *abi.DeviceStatusReply) bool {
		lib := b.nvml.open(b.uuid)
		if lib != nil {
			b.nvml.read(lib, fresh)
		}
		return lib != nil
	})
}
