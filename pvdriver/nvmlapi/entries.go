package nvmlapi

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
)

// entry is one NVML entry point's Go half.
type entry func(a *API, name string, r Request, out *Answer) Return

// entries is the one table of NVML entry points served, by NVIDIA's
// exported name (nvml.h; the versioned names are what nvml.h maps the
// plain ones to). What each puts in Answer is said beside it; the C half
// (pvdriver/libnvml/nvml.c) reads it by the same name. Every name not
// here answers NVML_ERROR_NOT_SUPPORTED.
var entries = map[string]entry{
	"nvmlInit":          initEntry, // Arg: flags (nvmlInitWithFlags)
	"nvmlInit_v2":       initEntry,
	"nvmlInitWithFlags": initEntry,
	"nvmlShutdown":      func(a *API, _ string, _ Request, _ *Answer) Return { return a.Shutdown() },

	"nvmlSystemGetDriverVersion":        systemText(abi.TextDriverVersion), // S
	"nvmlSystemGetNVMLVersion":          nvmlVersion,                       // S
	"nvmlSystemGetCudaDriverVersion":    cudaVersion,                       // V0
	"nvmlSystemGetCudaDriverVersion_v2": cudaVersion,
	"nvmlSystemGetProcessName":          processName, // Arg: pid; S

	"nvmlDeviceGetCount":               deviceCount, // V0
	"nvmlDeviceGetCount_v2":            deviceCount,
	"nvmlDeviceGetHandleByIndex":       onDevice(func(*API, Request, *Answer) Return { return Success }), // Dev: the index
	"nvmlDeviceGetHandleByIndex_v2":    onDevice(func(*API, Request, *Answer) Return { return Success }),
	"nvmlDeviceGetHandleByUUID":        handleBy(byUUID), // In; V0: the ordinal
	"nvmlDeviceGetHandleByPciBusId":    handleBy(byPCIBusID),
	"nvmlDeviceGetHandleByPciBusId_v2": handleBy(byPCIBusID),
	"nvmlDeviceGetHandleBySerial":      handleBy(bySerial),
	"nvmlDeviceGetIndex":               onDevice(func(_ *API, r Request, out *Answer) Return { out.V[0] = uint64(r.Dev); return Success }),

	"nvmlDeviceGetName": onDevice(func(a *API, _ Request, out *Answer) Return { out.S = a.description().Name; return Success }),
	"nvmlDeviceGetUUID": onDevice(func(a *API, _ Request, out *Answer) Return {
		out.S = abi.UUIDString(a.description().UUID)
		return Success
	}),
	"nvmlDeviceGetPciInfo_v3":            onDevice(pciInfo),           // V: domain, bus, device, pciDeviceId, pciSubSystemId; S: busId
	"nvmlDeviceGetCudaComputeCapability": onDevice(computeCapability), // V: major, minor
	"nvmlDeviceGetMemoryInfo":            onDevice(memoryInfo),        // V: total, free, used, reserved
	"nvmlDeviceGetMemoryInfo_v2":         onDevice(memoryInfo),
	"nvmlDeviceGetBAR1MemoryInfo":        onDevice(bar1Info),    // V: total, free, used
	"nvmlDeviceGetUtilizationRates":      onDevice(utilization), // V: gpu, memory

	"nvmlDeviceGetMinorNumber":                 field(abi.FieldMinorNumber), // V0, as every field below
	"nvmlDeviceGetBrand":                       field(abi.FieldBrand),
	"nvmlDeviceGetArchitecture":                field(abi.FieldArchitecture),
	"nvmlDeviceGetPowerUsage":                  field(abi.FieldPowerUsage),
	"nvmlDeviceGetEnforcedPowerLimit":          field(abi.FieldPowerLimit),
	"nvmlDeviceGetPowerManagementLimit":        field(abi.FieldPowerManagementLimit),
	"nvmlDeviceGetPowerManagementDefaultLimit": field(abi.FieldPowerDefaultLimit),
	"nvmlDeviceGetPerformanceState":            field(abi.FieldPState),
	"nvmlDeviceGetPowerState":                  field(abi.FieldPState),
	"nvmlDeviceGetComputeMode":                 field(abi.FieldComputeMode),
	"nvmlDeviceGetPersistenceMode":             field(abi.FieldPersistenceMode),
	"nvmlDeviceGetFanSpeed":                    field(abi.FieldFanSpeed),
	"nvmlDeviceGetCurrPcieLinkGeneration":      field(abi.FieldPCIeLinkGen),
	"nvmlDeviceGetCurrPcieLinkWidth":           field(abi.FieldPCIeLinkWidth),
	"nvmlDeviceGetMaxPcieLinkGeneration":       field(abi.FieldPCIeMaxLinkGen),
	"nvmlDeviceGetMaxPcieLinkWidth":            field(abi.FieldPCIeMaxLinkWidth),
	"nvmlDeviceGetEccMode":                     fields(abi.FieldECCCurrent, abi.FieldECCPending), // V: current, pending
	// Arg: nvmlTemperatureSensors_t, nvmlTemperatureThresholds_t,
	// nvmlClockType_t (nvmlDeviceGetClock: type | id<<32).
	"nvmlDeviceGetTemperature":  fieldOf(map[int64]abi.DeviceField{0: abi.FieldTemperature}, 1),
	"nvmlDeviceGetTemperatureV": fieldOf(map[int64]abi.DeviceField{0: abi.FieldTemperature}, 1),
	"nvmlDeviceGetTemperatureThreshold": fieldOf(map[int64]abi.DeviceField{0: abi.FieldTemperatureShutdown, 1: abi.FieldTemperatureSlowdown,
		2: abi.FieldTemperatureMemoryMax, 3: abi.FieldTemperatureGPUMax}, 8),
	"nvmlDeviceGetClockInfo":                       fieldOf(clockFields, abi.ClockTypes),
	"nvmlDeviceGetMaxClockInfo":                    fieldOf(maxClockFields, abi.ClockTypes),
	"nvmlDeviceGetApplicationsClock":               fieldOf(clockGroup(abi.FieldAppClock), abi.ClockTypes),
	"nvmlDeviceGetDefaultApplicationsClock":        fieldOf(clockGroup(abi.FieldDefaultAppClock), abi.ClockTypes),
	"nvmlDeviceGetMaxCustomerBoostClock":           fieldOf(clockGroup(abi.FieldBoostClock), abi.ClockTypes),
	"nvmlDeviceGetClock":                           onDevice(clock), // Arg: type | id<<32
	"nvmlDeviceGetPcieThroughput":                  fieldOf(map[int64]abi.DeviceField{0: abi.FieldPCIeTxThroughput, 1: abi.FieldPCIeRxThroughput}, 2),
	"nvmlDeviceGetPcieReplayCounter":               field(abi.FieldPCIeReplays),
	"nvmlDeviceGetPowerManagementLimitConstraints": fields(abi.FieldPowerMinLimit, abi.FieldPowerMaxLimit),   // V: min, max
	"nvmlDeviceGetEncoderUtilization":              fields(abi.FieldEncoderUtil, abi.FieldEncoderSamplingUS), // V: percent, period
	"nvmlDeviceGetDecoderUtilization":              fields(abi.FieldDecoderUtil, abi.FieldDecoderSamplingUS),
	// V0: nvmlClocksEventReasons bits (the throttle names are the older ones).
	"nvmlDeviceGetCurrentClocksEventReasons":      field(abi.FieldClocksEventReasons),
	"nvmlDeviceGetCurrentClocksThrottleReasons":   field(abi.FieldClocksEventReasons),
	"nvmlDeviceGetSupportedClocksEventReasons":    field(abi.FieldSupportedClocksEventReasons),
	"nvmlDeviceGetSupportedClocksThrottleReasons": field(abi.FieldSupportedClocksEventReasons),

	// Memory errors. Arg: errorType | counterType<<16 | location<<32
	// (nvmlMemoryErrorType_t, nvmlEccCounterType_t, nvmlMemoryLocation_t);
	// V0: the count. The node reports the DRAM's and the SRAM's counts;
	// other locations (the caches, register file of older GPUs) are not
	// supported.
	"nvmlDeviceGetTotalEccErrors":            onDevice(eccCount(func(int64) (abi.DeviceField, Return) { return abi.FieldECCTotal, Success })),
	"nvmlDeviceGetMemoryErrorCounter":        onDevice(eccCount(eccLocation)),
	"nvmlDeviceGetRetiredPages":              fieldOf(retiredFields, 2), // Arg: cause; V0: how many (the C half: no addresses)
	"nvmlDeviceGetRetiredPages_v2":           fieldOf(retiredFields, 2),
	"nvmlDeviceGetRetiredPagesPendingStatus": field(abi.FieldRetiredPending),
	"nvmlDeviceGetRemappedRows": fields(abi.FieldRemappedCorrectable, abi.FieldRemappedUncorrectable, abi.FieldRemapPending,
		abi.FieldRemapFailed), // V: correctable, uncorrectable, pending, failed

	// The inforom (S; Arg: nvmlInforomObject_t), as the node's card has it.
	"nvmlDeviceGetInforomVersion": textOf(map[int64]abi.DeviceText{0: abi.TextInforomOEM, 1: abi.TextInforomECC, 2: abi.TextInforomPower},
		4),
	"nvmlDeviceGetInforomImageVersion":          text(abi.TextInforomImage),
	"nvmlDeviceGetInforomConfigurationChecksum": field(abi.FieldInforomChecksum),

	// Virtualization, as the guest is: a whole GPU of its own to NVML
	// (one device, its full description, no vGPU type, license or
	// scheduler), on a machine that reaches it through a hypervisor: GPU
	// passthrough (V0: NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH), as
	// inside a VM given the card, never NVIDIA vGPU (whose nvmlVgpu* calls
	// the node does not serve). The guest is no vGPU host: its host vGPU
	// mode is not supported, as in a passthrough VM.
	"nvmlDeviceGetVirtualizationMode": onDevice(func(_ *API, _ Request, out *Answer) Return {
		out.V[0] = virtualizationPassthrough
		return Success
	}),
	"nvmlDeviceGetHostVgpuMode": onDevice(func(*API, Request, *Answer) Return { return ErrorNotSupported }),

	"nvmlDeviceGetSerial":          text(abi.TextSerial), // S, as every text below
	"nvmlDeviceGetBoardPartNumber": text(abi.TextBoardPart),
	"nvmlDeviceGetVbiosVersion":    text(abi.TextVBIOS),

	// V0: how many; V1, V2: the process's pid and the memory it holds.
	"nvmlDeviceGetComputeRunningProcesses":     onDevice(computeProcesses),
	"nvmlDeviceGetComputeRunningProcesses_v2":  onDevice(computeProcesses),
	"nvmlDeviceGetComputeRunningProcesses_v3":  onDevice(computeProcesses),
	"nvmlDeviceGetGraphicsRunningProcesses":    onDevice(none),
	"nvmlDeviceGetGraphicsRunningProcesses_v2": onDevice(none),
	"nvmlDeviceGetGraphicsRunningProcesses_v3": onDevice(none),

	// Events: nvidia-smi makes an event set as it starts and stops if it
	// cannot. The node forwards no event, so no event type is supported
	// (V0: 0), a set takes registrations and a wait times out (Arg: its
	// timeout in ms, waited, to at most maxEventWait).
	"nvmlEventSetCreate":               ready,
	"nvmlEventSetFree":                 ready,
	"nvmlDeviceRegisterEvents":         onDevice(none),
	"nvmlDeviceGetSupportedEventTypes": onDevice(none),
	"nvmlEventSetWait":                 eventWait,
	"nvmlEventSetWait_v2":              eventWait,

	// What the library does not serve, answered as what it is: no MIG
	// (V: current, pending NVML_DEVICE_MIG_DISABLE), no display, no NVLink,
	// no peer (V0: NVML_P2P_STATUS_NOT_SUPPORTED), no other GPU near.
	"nvmlDeviceGetMigMode":                onDevice(func(*API, Request, *Answer) Return { return Success }),
	"nvmlDeviceGetMaxMigDeviceCount":      onDevice(none), // V0: 0, MIG is disabled
	"nvmlDeviceIsMigDeviceHandle":         onDevice(none), // V0: 0, a handle names the whole GPU
	"nvmlDeviceGetDisplayMode":            onDevice(none), // V0: NVML_FEATURE_DISABLED
	"nvmlDeviceGetDisplayActive":          onDevice(none),
	"nvmlDeviceGetNvLinkState":            onDevice(func(*API, Request, *Answer) Return { return ErrorNotSupported }),
	"nvmlDeviceGetP2PStatus":              onDevices(func(_ *API, _ Request, out *Answer) Return { out.V[0] = p2pNotSupported; return Success }),
	"nvmlDeviceGetTopologyCommonAncestor": onDevices(commonAncestor), // V0: nvmlGpuTopologyLevel_t
	"nvmlDeviceGetTopologyNearestGpus":    onDevice(none),            // V0: how many
}

// nvml.h values the entries answer.
const (
	virtualizationPassthrough = 1  // NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
	errorTimeout              = 10 // NVML_ERROR_TIMEOUT
	p2pNotSupported           = 5  // NVML_P2P_STATUS_NOT_SUPPORTED
	topologyInternal          = 0  // NVML_TOPOLOGY_INTERNAL: the same board
)

var (
	clockFields    = map[int64]abi.DeviceField{0: abi.FieldClockGraphics, 1: abi.FieldClockSM, 2: abi.FieldClockMemory, 3: abi.FieldClockVideo}
	maxClockFields = map[int64]abi.DeviceField{0: abi.FieldMaxClockGraphics, 1: abi.FieldMaxClockSM, 2: abi.FieldMaxClockMemory, 3: abi.FieldMaxClockVideo}
	// clockIDs are nvmlDeviceGetClock's clock ids (nvmlClockId_t): the
	// current clocks, the applications clocks, their defaults, the boost
	// maxima.
	clockIDs = [...]map[int64]abi.DeviceField{clockFields, clockGroup(abi.FieldAppClock), clockGroup(abi.FieldDefaultAppClock),
		clockGroup(abi.FieldBoostClock)}
	// retiredFields are the retired page counts by cause
	// (nvmlPageRetirementCause_t).
	retiredFields = map[int64]abi.DeviceField{0: abi.FieldRetiredSingleBit, 1: abi.FieldRetiredDoubleBit}
)

// clockGroup is a group of clock fields (abi.ClockField) by clock type.
func clockGroup(group abi.DeviceField) map[int64]abi.DeviceField {
	m := map[int64]abi.DeviceField{}
	for typ := range uint64(abi.ClockTypes) {
		m[int64(typ)], _ = abi.ClockField(group, typ)
	}
	return m
}

// Memory locations (nvmlMemoryLocation_t) whose error counts the node
// reports, and how many there are.
const (
	locationDRAM   = 2
	locationSRAM   = 7
	locationsCount = 8
)

// eccLocation is the error count group of the location in Arg.
func eccLocation(location int64) (abi.DeviceField, Return) {
	switch {
	case location == locationDRAM:
		return abi.FieldECCDRAM, Success
	case location == locationSRAM:
		return abi.FieldECCSRAM, Success
	case location >= 0 && location < locationsCount:
		return abi.FieldInvalid, ErrorNotSupported
	}
	return abi.FieldInvalid, ErrorInvalidArgument
}

// eccCount answers the memory error count Arg names (errorType |
// counterType<<16 | location<<32) from the group group picks by location.
func eccCount(group func(location int64) (abi.DeviceField, Return)) func(*API, Request, *Answer) Return {
	return func(a *API, r Request, out *Answer) Return {
		g, res := group(r.Arg >> 32)
		if res != Success {
			return res
		}
		f, ok := abi.ECCField(g, uint64(r.Arg&0xffff), uint64(r.Arg>>16&0xffff))
		if !ok {
			return ErrorInvalidArgument
		}
		return field(f)(a, "", r, out)
	}
}

// maxEventWait bounds one event wait, so a caller's long timeout does
// not hold a thread in the library past what it can tell apart from none.
const maxEventWait = time.Minute

// ready checks Init.
func ready(a *API, _ string, _ Request, _ *Answer) Return {
	_, res := a.ready()
	return res
}

// eventWait is nvmlEventSetWait: no event ever comes, so it waits out the
// timeout.
func eventWait(a *API, _ string, r Request, _ *Answer) Return {
	if _, res := a.ready(); res != Success {
		return res
	}
	time.Sleep(min(time.Duration(max(r.Arg, 0))*time.Millisecond, maxEventWait))
	return errorTimeout
}

func initEntry(a *API, name string, r Request, _ *Answer) Return {
	return a.Init(name, uint64(r.Arg))
}

// none answers zero: nothing of the kind asked.
func none(*API, Request, *Answer) Return { return Success }

// onDevice checks Init and the device before fn.
func onDevice(fn func(*API, Request, *Answer) Return) entry {
	return func(a *API, _ string, r Request, out *Answer) Return {
		if res := a.device(r.Dev); res != Success {
			return res
		}
		return fn(a, r, out)
	}
}

// onDevices checks Init and both devices before fn.
func onDevices(fn func(*API, Request, *Answer) Return) entry {
	return func(a *API, _ string, r Request, out *Answer) Return {
		if res := a.device(r.Dev); res != Success {
			return res
		}
		if res := a.device(r.Dev2); res != Success {
			return res
		}
		return fn(a, r, out)
	}
}

// fields answers the live values fs in V, or NOT_SUPPORTED unless the
// node has them all.
func fields(fs ...abi.DeviceField) entry {
	return onDevice(func(a *API, _ Request, out *Answer) Return {
		st, res := a.liveStatus()
		if res != Success {
			return res
		}
		for i, f := range fs {
			v, ok := st.Get(f)
			if !ok {
				return ErrorNotSupported
			}
			out.V[i] = v
		}
		return Success
	})
}

func field(f abi.DeviceField) entry { return fields(f) }

// fieldOf answers the live value Arg selects; an Arg at or past limit is
// an invalid argument, one below it that the node does not have is not
// supported.
func fieldOf(byArg map[int64]abi.DeviceField, limit int64) entry {
	return func(a *API, name string, r Request, out *Answer) Return {
		if r.Arg < 0 || r.Arg >= limit {
			if res := a.device(r.Dev); res != Success {
				return res
			}
			return ErrorInvalidArgument
		}
		f, ok := byArg[r.Arg]
		if !ok {
			if res := a.device(r.Dev); res != Success {
				return res
			}
			return ErrorNotSupported
		}
		return field(f)(a, name, r, out)
	}
}

// clock is nvmlDeviceGetClock: a clock of a type (nvmlClockType_t) by
// its id (nvmlClockId_t: current, applications, default applications,
// boost maximum).
func clock(a *API, r Request, out *Answer) Return {
	typ, id := r.Arg&0xffffffff, r.Arg>>32
	if id < 0 || id >= int64(len(clockIDs)) {
		return ErrorInvalidArgument
	}
	return fieldOf(clockIDs[id], abi.ClockTypes)(a, "", Request{Dev: r.Dev, Arg: typ}, out)
}

// text answers the live text t in S.
func text(t abi.DeviceText) entry {
	return onDevice(func(a *API, _ Request, out *Answer) Return {
		st, res := a.liveStatus()
		if res != Success {
			return res
		}
		s, ok := st.Text(t)
		if !ok {
			return ErrorNotSupported
		}
		out.S = s
		return Success
	})
}

// textOf answers the live text Arg selects, as fieldOf does a field.
func textOf(byArg map[int64]abi.DeviceText, limit int64) entry {
	return func(a *API, name string, r Request, out *Answer) Return {
		if res := a.device(r.Dev); res != Success {
			return res
		}
		t, ok := byArg[r.Arg]
		switch {
		case r.Arg < 0 || r.Arg >= limit:
			return ErrorInvalidArgument
		case !ok:
			return ErrorNotSupported
		}
		return text(t)(a, name, r, out)
	}
}

// systemText answers the node's text t in S.
func systemText(t abi.DeviceText) entry {
	return func(a *API, _ string, _ Request, out *Answer) Return {
		if _, res := a.ready(); res != Success {
			return res
		}
		st, res := a.liveStatus()
		if res != Success {
			return res
		}
		s, ok := st.Text(t)
		if !ok {
			return ErrorNotSupported
		}
		out.S = s
		return Success
	}
}

// nvmlVersion is NVML's version as NVIDIA writes it: the CUDA major
// version this library serves, then the node's driver version.
func nvmlVersion(a *API, name string, r Request, out *Answer) Return {
	if res := systemText(abi.TextDriverVersion)(a, name, r, out); res != Success {
		return res
	}
	out.S = fmt.Sprintf("%d.%s", cuapi.Version/1000, out.S)
	return Success
}

// cudaVersion is the CUDA version the library serves (cuDriverGetVersion's).
func cudaVersion(a *API, _ string, _ Request, out *Answer) Return {
	if _, res := a.ready(); res != Success {
		return res
	}
	out.V[0] = uint64(cuapi.Version)
	return Success
}

// processName is the guest process's name as its own system has it: its
// command's first word (or its comm).
func processName(a *API, _ string, r Request, out *Answer) Return {
	if _, res := a.ready(); res != Success {
		return res
	}
	if r.Arg <= 0 {
		return ErrorNotFound
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.Arg))
	if err == nil {
		cmd, _, _ = bytes.Cut(cmd, []byte{0})
	}
	if len(cmd) == 0 {
		if cmd, err = os.ReadFile(fmt.Sprintf("/proc/%d/comm", r.Arg)); err != nil {
			return ErrorNotFound
		}
		cmd = bytes.TrimSpace(cmd)
	}
	out.S = string(cmd)
	return Success
}

func deviceCount(a *API, _ string, _ Request, out *Answer) Return {
	vis, res := a.ready()
	if res != Success {
		return res
	}
	out.V[0] = uint64(len(vis))
	return Success
}

// handleBy answers the ordinal of the visible device that match says
// In names, or NOT_FOUND.
func handleBy(match func(a *API, in string) (bool, Return)) entry {
	return func(a *API, _ string, r Request, out *Answer) Return {
		vis, res := a.ready()
		if res != Success {
			return res
		}
		if r.In == "" {
			return ErrorInvalidArgument
		}
		for ord := range vis { // the node serves one device: every visible ordinal is it
			ok, res := match(a, r.In)
			if res != Success {
				return res
			}
			if ok {
				out.V[0] = uint64(ord)
				return Success
			}
		}
		return ErrorNotFound
	}
}

func byUUID(a *API, in string) (bool, Return) {
	return strings.EqualFold(strings.TrimSpace(in), abi.UUIDString(a.description().UUID)), Success
}

func bySerial(a *API, in string) (bool, Return) {
	st, res := a.liveStatus()
	if res != Success {
		return false, res
	}
	s, ok := st.Text(abi.TextSerial)
	return ok && s == strings.TrimSpace(in), Success
}

func byPCIBusID(a *API, in string) (bool, Return) {
	dom, bus, dev, ok := ParseBusID(in)
	if !ok {
		return false, ErrorInvalidArgument
	}
	d := a.description()
	return dom == attr(d, attrPCIDomain) && bus == attr(d, attrPCIBus) && dev == attr(d, attrPCIDevice), Success
}

// ParseBusID reads a PCI bus id as NVML and CUDA write it:
// [domain:]bus:device.function, in hex (the function is ignored: a GPU is
// function 0).
func ParseBusID(s string) (domain, bus, device uint64, ok bool) {
	s = strings.TrimSpace(s)
	loc, _, hasFn := strings.Cut(s, ".")
	parts := strings.Split(loc, ":")
	if !hasFn || len(parts) < 2 || len(parts) > 3 {
		return 0, 0, 0, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 32)
		if err != nil || p == "" {
			return 0, 0, 0, false
		}
		nums[i] = v
	}
	if len(nums) == 2 {
		nums = append([]uint64{0}, nums...)
	}
	return nums[0], nums[1], nums[2], true
}

// CUdevice_attribute numbers (cuda.h) of the device's PCI location and
// compute capability, read from the description the session took.
const (
	attrPCIBus    = 33
	attrPCIDevice = 34
	attrPCIDomain = 50
	attrMajor     = 75
	attrMinor     = 76
)

func attr(d abi.DeviceInfoReply, a int) uint64 {
	if a < len(d.Attrs) && d.Attrs[a] >= 0 {
		return uint64(d.Attrs[a])
	}
	return 0
}

// pciInfo is the device's PCI location from the description (as CUDA
// reports it, so CUDA's and NVML's bus ids agree) and its PCI ids from the
// node (zero where the node does not say).
func pciInfo(a *API, _ Request, out *Answer) Return {
	d := a.description()
	out.V[0], out.V[1], out.V[2] = attr(d, attrPCIDomain), attr(d, attrPCIBus), attr(d, attrPCIDevice)
	if st, res := a.liveStatus(); res == Success {
		out.V[3], _ = st.Get(abi.FieldPCIDeviceID)
		out.V[4], _ = st.Get(abi.FieldPCISubsystemID)
	}
	return Success
}

func computeCapability(a *API, _ Request, out *Answer) Return {
	d := a.description()
	out.V[0], out.V[1] = attr(d, attrMajor), attr(d, attrMinor)
	return Success
}

// memoryInfo is the guest's view of the device's memory: total is the
// device's, or the guest's quota where the node sets a lower one; used is
// what the guest holds on the node (every session of it); nothing is
// reserved.
func memoryInfo(a *API, _ Request, out *Answer) Return {
	st, res := a.liveStatus()
	if res != Success {
		return res
	}
	used, ok := st.Get(abi.FieldGuestMemoryUsed)
	if !ok {
		return ErrorNotSupported
	}
	total := a.description().TotalMem
	if q, ok := st.Get(abi.FieldGuestMemoryQuota); ok && q < total {
		total = q
	}
	out.V[0], out.V[1], out.V[2] = total, total-min(used, total), used
	return Success
}

func bar1Info(a *API, _ Request, out *Answer) Return {
	st, res := a.liveStatus()
	if res != Success {
		return res
	}
	total, ok1 := st.Get(abi.FieldBAR1Total)
	used, ok2 := st.Get(abi.FieldBAR1Used)
	if !ok1 || !ok2 {
		return ErrorNotSupported
	}
	out.V[0], out.V[1], out.V[2] = total, total-min(used, total), used
	return Success
}

func utilization(a *API, r Request, out *Answer) Return {
	return fields(abi.FieldUtilGPU, abi.FieldUtilMemory)(a, "", r, out)
}

// computeProcesses lists the guest's compute processes this process knows
// of: itself, while its session holds device memory (other processes of
// the guest are counted in the memory used, not listed).
func computeProcesses(a *API, _ Request, out *Answer) Return {
	st, res := a.liveStatus()
	if res != Success {
		return res
	}
	if held, ok := st.Get(abi.FieldSessionMemory); ok && held > 0 {
		out.V[0], out.V[1], out.V[2] = 1, uint64(os.Getpid()), held
	}
	return Success
}

// commonAncestor: a device and itself share their board.
func commonAncestor(_ *API, r Request, out *Answer) Return {
	if r.Dev != r.Dev2 {
		return ErrorNotSupported // one device is served: never reached
	}
	out.V[0] = topologyInternal
	return Success
}
