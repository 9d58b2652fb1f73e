package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/nvmlapi"
	"github.com/vgpuha/vgpuha/replicate"
)

// buildNVML compiles libcuda.so.1, the guest's libnvidia-ml.so.1 beside it
// (as make libcuda does) and testdata/nvml.c into a temporary directory.
func buildNVML(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is missing (apt-get install gcc): the NVML library and its test program cannot be built")
	}
	dir := t.TempDir()
	steps := [][]string{
		{"go", "build", "-buildmode=c-shared", "-ldflags=-extldflags=-Wl,-soname,libcuda.so.1", "-o", filepath.Join(dir, "libcuda.so.1"), "."},
		{"gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", filepath.Join(dir, "libnvidia-ml.so.1"),
			filepath.Join("..", "libnvml", "nvml.c"), "-ldl", "-lpthread"},
		{"ln", "-s", "libcuda.so.1", filepath.Join(dir, "libcuda.so")},
		{"ln", "-s", "libnvidia-ml.so.1", filepath.Join(dir, "libnvidia-ml.so")},
		{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "nvml"), filepath.Join("testdata", "nvml.c"),
			"-L" + dir, "-lnvidia-ml", "-lcuda"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	return dir
}

// nvmlLine is one entry's line of the program's output: its result and
// what it printed.
type nvmlLine struct {
	ret  int
	rest string
}

// nvmlOutput is the program's lines by entry, in order.
type nvmlOutput map[string][]nvmlLine

func (o nvmlOutput) first(t *testing.T, name string) nvmlLine {
	t.Helper()
	if len(o[name]) == 0 {
		t.Fatalf("the program printed no %s line", name)
	}
	return o[name][0]
}

// nums is the line's printed numbers.
func (l nvmlLine) nums(t *testing.T) []uint64 {
	t.Helper()
	var v []uint64
	for _, f := range strings.Fields(l.rest) {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			t.Fatalf("%q: not numbers", l.rest)
		}
		v = append(v, n)
	}
	return v
}

// runNVML runs the NVML program in mode against endpoint (with env added)
// and returns its lines and stderr. At a "checkpoint" line it calls
// atCheckpoint, then lets the program go on.
func runNVML(t *testing.T, dir, mode string, env []string, atCheckpoint func()) (nvmlOutput, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, "nvml"), mode)
	cmd.Env = append(append(os.Environ(), "LD_LIBRARY_PATH="+dir, "VGPUHA_DEBUG=1"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := nvmlOutput{}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if line == "checkpoint" {
			atCheckpoint()
			stdin.Write([]byte("\n"))
			continue
		}
		f := strings.SplitN(line, " ", 3)
		ret, err := strconv.Atoi(f[min(1, len(f)-1)])
		if len(f) < 3 || err != nil {
			t.Fatalf("unexpected line %q", line)
		}
		out[f[0]] = append(out[f[0]], nvmlLine{ret: ret, rest: strings.TrimSpace(f[2])})
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("nvml %s: %v\nstderr:\n%s", mode, err, stderr.String())
	}
	return out, stderr.String()
}

// nodeView is what the node says of its device, through a session of the
// test's own.
func nodeView(t *testing.T, endpoint string) (abi.DeviceInfoReply, abi.DeviceStatusReply) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pvdriver.Open(ctx, endpoint, pvdriver.Options{GuestName: "nvml-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.DeviceInfo()
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.DeviceStatus()
	if err != nil {
		t.Fatal(err)
	}
	return info, st
}

// TestNVML runs the guest's NVML against a node on the software GPU:
// every entry it serves once, with values checked against the node's; the
// device NVML and CUDA each count and name under CUDA_VISIBLE_DEVICES;
// and the same device after the primary fails over.
func TestNVML(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds libcuda.so.1 and libnvidia-ml.so.1")
	}
	dir := buildNVML(t)
	t.Run("entries", func(t *testing.T) { testNVMLEntries(t, dir) })
	t.Run("visible", func(t *testing.T) { testNVMLVisible(t, dir) })
	t.Run("failover", func(t *testing.T) { testNVMLFailover(t, dir) })
	t.Run("one-session", func(t *testing.T) { testNVMLOneSession(t, dir) })
}

// simNotSupported are the entries whose values the software GPU does not
// have: each must answer NVML_ERROR_NOT_SUPPORTED (3), never a number.
var simNotSupported = []string{
	"nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetBrand",
	"nvmlDeviceGetArchitecture", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
	"nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetPerformanceState",
	"nvmlDeviceGetPowerState", "nvmlDeviceGetComputeMode", "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetFanSpeed",
	"nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration",
	"nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureThreshold",
	"nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetClock", "application-clock",
	"nvmlDeviceGetEccMode", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetBAR1MemoryInfo", "nvmlDeviceGetSerial",
	"nvmlDeviceGetBoardPartNumber", "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetNvLinkState",
	"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperatureV",
	"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
	"nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons",
	"nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
	"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetMemoryErrorCounter", "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPages_v2",
	"nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetInforomImageVersion",
	"nvmlDeviceGetInforomVersion", "nvmlDeviceGetInforomConfigurationChecksum", "nvmlDeviceGetPcieReplayCounter",
	"nvmlDeviceGetApplicationsClock", "nvmlDeviceGetDefaultApplicationsClock", "nvmlDeviceGetMaxCustomerBoostClock",
	"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetHostVgpuMode",
}

// healthLines are the prefixes of the health_values lines that ask the
// node's device (one line per argument; "-bad" lines are wantReturns').
var healthLines = []string{"ecc-", "retired-", "inforom-", "clock-", "app-clock-", "default-app-clock-", "boost-clock-", "threshold-", "pcie-rx"}

// wantReturns are the other entries' results (nvmlReturn_t).
var wantReturns = map[string]int{
	"uninitialized": 1, "nvmlInit": 0, "nvmlInit_v2": 0, "nvmlInitWithFlags": 0, "index-past-count": 2,
	"name-short-buffer": 7, "memory-v2-bad-version": 25, "temperature-sensor-1": 2, "temperature-v-bad-version": 25, "nvmlDeviceGetHandleBySerial": 6,
	"unknown-export-table": 3, "nvmlEventSetCreate": 0, "nvmlDeviceRegisterEvents": 0, "nvmlEventSetWait_v2": 10,
	"nvmlEventSetWait": 10, "nvmlEventSetFree": 0,
	"nvmlShutdown": 0, "shutdown-2": 0, "shutdown-3": 0, "shutdown-4": 1, "after-shutdown": 1,
	"ecc-total-bad": 2, "ecc-location-bad": 2, "retired-bad": 2, "inforom-bad": 2, "clock-bad-id": 2, "clock-bad-type": 2, "pcie-bad": 2,
}

func testNVMLEntries(t *testing.T, dir string) {
	c, err := cluster.Start(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, st := nodeView(t, c.Endpoint)
	out, stderr := runNVML(t, dir, "full", []string{"VGPUHA_ENDPOINT=" + c.Endpoint}, nil)
	for _, name := range nvmlapi.Names() {
		if len(out[name]) == 0 {
			t.Errorf("%s is served but the program never called it: add it to testdata/nvml.c", name)
		}
	}
	for _, name := range simNotSupported {
		if l := out.first(t, name); l.ret != 3 {
			t.Errorf("%s on the software GPU: %d %q, want NVML_ERROR_NOT_SUPPORTED", name, l.ret, l.rest)
		}
	}
	for name, want := range wantReturns {
		if l := out.first(t, name); l.ret != want {
			t.Errorf("%s: %d, want %d", name, l.ret, want)
		}
	}
	for name, lines := range out {
		if asksHealth(name) && lines[0].ret != 3 {
			t.Errorf("%s on the software GPU: %d %q, want NVML_ERROR_NOT_SUPPORTED", name, lines[0].ret, lines[0].rest)
		}
	}
	if !strings.Contains(stderr, "nvmlDeviceGetTotalEnergyConsumption is not supported") {
		t.Errorf("an unserved entry did not name itself with VGPUHA_DEBUG=1; stderr:\n%s", stderr)
	}
	checkNVMLIdentity(t, out, info)
	checkNVMLMemory(t, out, info, st)
	checkNVMLRest(t, out, info, dir)
}

// expect fails t unless entry's first line is a success that printed want.
func expect(t *testing.T, out nvmlOutput, entry, want string) {
	t.Helper()
	if l := out.first(t, entry); l.ret != 0 || l.rest != want {
		t.Errorf("%s: %d %q, want success %q", entry, l.ret, l.rest, want)
	}
}

// checkNVMLIdentity: NVML's device is CUDA's and the node's, found by
// index, UUID and PCI bus id alike.
func checkNVMLIdentity(t *testing.T, out nvmlOutput, info abi.DeviceInfoReply) {
	uuid := abi.UUIDString(info.UUID)
	for _, e := range []string{"nvmlDeviceGetUUID", "cuDeviceGetUuid"} {
		expect(t, out, e, uuid)
	}
	expect(t, out, "nvmlDeviceGetName", info.Name)
	expect(t, out, "cuDeviceGetName", info.Name)
	expect(t, out, "nvmlDeviceGetCount", "1")
	expect(t, out, "nvmlDeviceGetCount_v2", "1")
	expect(t, out, "nvmlDeviceGetIndex", "0")
	for _, e := range []string{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId"} {
		expect(t, out, e, "1") // the same handle as by index
	}
	dom, bus, dev := info.Attrs[50], info.Attrs[33], info.Attrs[34]
	expect(t, out, "nvmlDeviceGetPciInfo_v3", fmt.Sprintf("%d %d %d %08X:%02X:%02X.0 %04X:%02X:%02X.0", dom, bus, dev, dom, bus, dev, dom, bus, dev))
	expect(t, out, "nvmlDeviceGetCudaComputeCapability", fmt.Sprintf("%d %d", info.Attrs[75], info.Attrs[76]))
}

// checkNVMLMemory: total is the device's (or the guest's quota), used is
// what the guest holds: the 64 MiB this process allocated through CUDA,
// which its process list shows too.
func checkNVMLMemory(t *testing.T, out nvmlOutput, info abi.DeviceInfoReply, st abi.DeviceStatusReply) {
	total := info.TotalMem
	if q, ok := st.Get(abi.FieldGuestMemoryQuota); ok {
		total = q
	}
	const held = 64 << 20
	lines := out["nvmlDeviceGetMemoryInfo"]
	if len(lines) != 2 || lines[0].ret != 0 || lines[1].ret != 0 {
		t.Fatalf("nvmlDeviceGetMemoryInfo: %+v", lines)
	}
	before, after := lines[0].nums(t), lines[1].nums(t)
	if before[0] != total || before[1]+before[2] != total || after[0] != total || after[1]+after[2] != total {
		t.Errorf("memory before %v and after %v: want a total of %d, free + used = total", before, after, total)
	}
	if after[2] < before[2]+held {
		t.Errorf("used %d after this process allocated %d bytes, %d before", after[2], held, before[2])
	}
	v2 := out.first(t, "nvmlDeviceGetMemoryInfo_v2").nums(t)
	if v2[0] != total || v2[2] != after[2] || v2[1] != after[1] || v2[3] != 0 {
		t.Errorf("memory v2 %v, v1 %v", v2, after)
	}
	pid := out.first(t, "getpid").nums(t)[0]
	for _, e := range []string{"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses"} {
		l := out.first(t, e)
		v := l.nums(t) // result of the count query, count needed, count, pid, memory
		if l.ret != 0 || v[0] != 7 || v[1] != 1 || v[2] != 1 || v[3] != pid || v[4] < held {
			t.Errorf("%s: %d %v, want the process itself holding at least %d bytes", e, l.ret, v, held)
		}
	}
	expect(t, out, "smi-slot-213", fmt.Sprintf("1 %d %d %s", pid, out.first(t, "nvmlDeviceGetComputeRunningProcesses_v3").nums(t)[4],
		out.first(t, "nvmlSystemGetProcessName").rest))
	for _, e := range []string{"nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses"} {
		expect(t, out, e, "0 0 0 0 0")
	}
}

// checkNVMLRest: versions, names and what the library answers as absent.
func checkNVMLRest(t *testing.T, out nvmlOutput, info abi.DeviceInfoReply, dir string) {
	expect(t, out, "nvmlErrorString", "Not Supported")
	expect(t, out, "nvmlSystemGetCudaDriverVersion", "13000")
	expect(t, out, "nvmlSystemGetCudaDriverVersion_v2", "13000")
	expect(t, out, "nvmlSystemGetProcessName", filepath.Join(dir, "nvml"))
	expect(t, out, "nvmlDeviceGetMigMode", "0 0")
	expect(t, out, "nvmlDeviceGetVirtualizationMode", "1") // NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
	expect(t, out, "nvmlDeviceGetMaxMigDeviceCount", "0")
	expect(t, out, "nvmlDeviceIsMigDeviceHandle", "0")
	expect(t, out, "nvmlDeviceGetDisplayMode", "0")
	expect(t, out, "nvmlDeviceGetDisplayActive", "0")
	expect(t, out, "nvmlDeviceGetP2PStatus", "5")
	expect(t, out, "nvmlDeviceGetTopologyCommonAncestor", "0")
	expect(t, out, "nvmlDeviceGetTopologyNearestGpus", "0")
	expect(t, out, "nvmlDeviceGetSupportedEventTypes", "0")
	expect(t, out, "nvmlInternalGetExportTable", "1")
	expect(t, out, "smi-slot-81", "1")
	expect(t, out, "smi-slot-100", "0")
}

// testNVMLVisible: NVML and CUDA count the same devices under every
// CUDA_VISIBLE_DEVICES, and name the same one.
func testNVMLVisible(t *testing.T, dir string) {
	c, err := cluster.Start(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, _ := nodeView(t, c.Endpoint)
	uuid := abi.UUIDString(info.UUID)
	for _, tc := range []struct {
		env     []string
		visible bool
	}{
		{nil, true},
		{[]string{"CUDA_VISIBLE_DEVICES=0"}, true},
		{[]string{"CUDA_VISIBLE_DEVICES=" + uuid}, true},
		{[]string{"CUDA_VISIBLE_DEVICES=" + uuid[:12]}, true},
		{[]string{"CUDA_VISIBLE_DEVICES=1"}, false},
		{[]string{"CUDA_VISIBLE_DEVICES=1,0"}, false},
		{[]string{"CUDA_VISIBLE_DEVICES="}, false},
		{[]string{"CUDA_VISIBLE_DEVICES=GPU-ffffffff"}, false},
	} {
		out, _ := runNVML(t, dir, "visible", append(tc.env, "VGPUHA_ENDPOINT="+c.Endpoint), nil)
		if tc.visible {
			expect(t, out, "nvmlDeviceGetCount_v2", "1")
			expect(t, out, "cuInit", "")
			expect(t, out, "cuDeviceGetCount", "1")
			expect(t, out, "nvmlDeviceGetUUID", uuid)
			expect(t, out, "cuDeviceGetUuid", uuid)
			continue
		}
		expect(t, out, "nvmlDeviceGetCount_v2", "0")
		if l := out.first(t, "cuInit"); l.ret != 100 { // CUDA_ERROR_NO_DEVICE
			t.Errorf("%v: cuInit %d, want CUDA_ERROR_NO_DEVICE", tc.env, l.ret)
		}
		if l := out.first(t, "cuDeviceGetCount"); l.ret == 0 && l.rest != "0" {
			t.Errorf("%v: CUDA counts %s devices, NVML none", tc.env, l.rest)
		}
	}
}

// testNVMLFailover: after the primary is killed the NVML still answers,
// for the same device: the same UUID, though the standby's card has its
// own (the pair shows guests UUIDs of its own: hypervisor's identity.go).
func testNVMLFailover(t *testing.T, dir string) {
	var cards atomic.Int32 // each node's software GPU describes itself by its own UUID
	newCard := func() (gpu.Backend, error) {
		b := sim.New(1 << 30)
		b.Number = uint8(cards.Add(1))
		return b, nil
	}
	c := protectedPair(t, cluster.Options{Replicate: true, StartStandby: true, Failover: true, Mode: replicate.ModeCommit, NewBackend: newCard})
	if cards.Load() != 2 {
		t.Fatalf("%d software GPUs made for the pair, want 2", cards.Load())
	}
	info, _ := nodeView(t, c.Endpoint)
	out, _ := runNVML(t, dir, "failover", []string{"VGPUHA_ENDPOINT=" + c.Endpoint, "VGPUHA_FAILOVER=" + c.StandbyEndpoint}, c.KillPrimary)
	if c.Standby.Promoted() == nil {
		t.Fatal("the standby was never promoted")
	}
	for _, e := range []string{"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo"} {
		lines := out[e]
		if len(lines) != 2 || lines[0].ret != 0 || lines[1] != lines[0] {
			t.Errorf("%s before and after the failover: %+v", e, lines)
		}
	}
	expect(t, out, "nvmlDeviceGetUUID", abi.UUIDString(info.UUID))
	if l := out.first(t, "nvmlDeviceGetTemperature"); l.ret != 3 {
		t.Errorf("temperature after the failover: %d, want the standby's software GPU's NVML_ERROR_NOT_SUPPORTED", l.ret)
	}
	// A process started after the failover (nvidia-smi) sees the device
	// under the same UUID, from the new primary.
	after, _ := runNVML(t, dir, "watch", []string{"VGPUHA_ENDPOINT=" + c.StandbyEndpoint}, nil)
	expect(t, after, "nvmlDeviceGetUUID", abi.UUIDString(info.UUID))
}

// asksHealth reports whether a line of health_values asks the device
// with a valid argument.
func asksHealth(name string) bool {
	for _, p := range healthLines {
		if strings.HasPrefix(name, p) && !strings.HasSuffix(name, "-bad") && !strings.Contains(name, "-bad-") {
			return true
		}
	}
	return false
}

// reportingGPU is a software GPU that reports a live state, as the CUDA
// backend reads one from the host's NVML: every device field set to
// reportedValue(field), every text to reportedText(text). It lets the
// test follow each value from the node's backend to the guest's NVML
// entry (the software GPU itself has none to report).
type reportingGPU struct{ *sim.Backend }

// reportedValue is field f's value: 1000 and its number, but for two
// retired pages (fewer than the test program has room for).
func reportedValue(f abi.DeviceField) uint64 {
	if f == abi.FieldRetiredSingleBit {
		return 2
	}
	return 1000 + uint64(f)
}
func reportedText(t abi.DeviceText) string { return fmt.Sprintf("text-%d", t) }

func (reportingGPU) DeviceStatus(r *abi.DeviceStatusReply) {
	for f := abi.FieldGuestMemoryQuota + 1; f <= abi.FieldTemperatureMemoryMax; f++ {
		r.Set(f, reportedValue(f))
	}
	for t := abi.TextSerial; t <= abi.TextInforomPower; t++ {
		r.SetText(t, reportedText(t))
	}
}

// testNVMLOneSession: on a node limited to one session
// (--guest.max-sessions 1) that a running guest holds, the NVML of a
// process without CUDA (as nvidia-smi) still answers everything from the
// node, over a status connection that takes no slot: the device, the
// memory the guest holds, and each value of what nvidia-smi -q reads,
// exactly as the node's GPU reports it.
func testNVMLOneSession(t *testing.T, dir string) {
	c, err := cluster.Start(cluster.Options{
		NewBackend: func() (gpu.Backend, error) { return reportingGPU{sim.New(1 << 30)}, nil },
		Hypervisor: func(cfg *hypervisor.Config) { cfg.MaxSessions = 1 },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	running, err := pvdriver.Open(ctx, c.Endpoint, pvdriver.Options{GuestName: "running"})
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	if _, err := running.Alloc(64 << 20); err != nil {
		t.Fatal(err)
	}
	info, err := running.DeviceInfo()
	if err != nil {
		t.Fatal(err)
	}
	out, stderr := runNVML(t, dir, "watch", []string{"VGPUHA_ENDPOINT=" + c.Endpoint}, nil)
	if l := out.first(t, "nvmlInit_v2"); l.ret != 0 {
		t.Fatalf("nvmlInit_v2 beside a guest holding the only session: %d\n%s", l.ret, stderr)
	}
	expect(t, out, "nvmlDeviceGetCount_v2", "1")
	expect(t, out, "nvmlDeviceGetUUID", abi.UUIDString(info.UUID))
	mem := out.first(t, "nvmlDeviceGetMemoryInfo").nums(t)
	if mem[0] != info.TotalMem || mem[2] < 64<<20 {
		t.Errorf("memory %v: want a total of %d and at least the running guest's 64 MiB used", mem, info.TotalMem)
	}
	expect(t, out, "nvmlDeviceGetComputeRunningProcesses_v3", "0") // it holds nothing itself
	expect(t, out, "nvmlSystemGetDriverVersion", reportedText(abi.TextDriverVersion))
	expect(t, out, "nvmlDeviceGetTemperature", fmt.Sprint(reportedValue(abi.FieldTemperature)))
	checkReported(t, out)
	// The node sees the NVML process's connection end a moment after the
	// process does.
	st := c.Primary.Status()
	for deadline := time.Now().Add(5 * time.Second); st.StatusConnections != 0 && time.Now().Before(deadline); st = c.Primary.Status() {
		time.Sleep(5 * time.Millisecond)
	}
	if len(st.Sessions) != 1 || st.StatusConnections != 0 {
		t.Errorf("after the NVML process: %d sessions (the running guest's), %d status connections (want none)", len(st.Sessions), st.StatusConnections)
	}
}

// checkReported: each entry answers the value reportingGPU gave its field.
func checkReported(t *testing.T, out nvmlOutput) {
	v := func(f abi.DeviceField) string { return fmt.Sprint(reportedValue(f)) }
	pair := func(a, b abi.DeviceField) string { return v(a) + " " + v(b) }
	want := map[string]string{
		"nvmlDeviceGetCurrentClocksEventReasons":       v(abi.FieldClocksEventReasons),
		"nvmlDeviceGetCurrentClocksThrottleReasons":    v(abi.FieldClocksEventReasons),
		"nvmlDeviceGetSupportedClocksEventReasons":     v(abi.FieldSupportedClocksEventReasons),
		"nvmlDeviceGetSupportedClocksThrottleReasons":  v(abi.FieldSupportedClocksEventReasons),
		"nvmlDeviceGetPowerManagementLimitConstraints": pair(abi.FieldPowerMinLimit, abi.FieldPowerMaxLimit),
		"nvmlDeviceGetEncoderUtilization":              pair(abi.FieldEncoderUtil, abi.FieldEncoderSamplingUS),
		"nvmlDeviceGetDecoderUtilization":              pair(abi.FieldDecoderUtil, abi.FieldDecoderSamplingUS),
		"nvmlDeviceGetRemappedRows": pair(abi.FieldRemappedCorrectable, abi.FieldRemappedUncorrectable) + " " +
			pair(abi.FieldRemapPending, abi.FieldRemapFailed),
		"nvmlDeviceGetRetiredPagesPendingStatus":    v(abi.FieldRetiredPending),
		"nvmlDeviceGetInforomConfigurationChecksum": v(abi.FieldInforomChecksum),
		"nvmlDeviceGetPcieReplayCounter":            v(abi.FieldPCIeReplays),
		"nvmlDeviceGetVirtualizationMode":           "1",
		"pcie-rx":                                   v(abi.FieldPCIeRxThroughput),
		"threshold-2":                               v(abi.FieldTemperatureMemoryMax),
		"nvmlDeviceGetInforomImageVersion":          reportedText(abi.TextInforomImage),
		"inforom-0":                                 reportedText(abi.TextInforomOEM),
		"inforom-1":                                 reportedText(abi.TextInforomECC),
		"inforom-2":                                 reportedText(abi.TextInforomPower),
	}
	for e := range uint64(2) {
		for c := range uint64(2) {
			total, _ := abi.ECCField(abi.FieldECCTotal, e, c)
			dram, _ := abi.ECCField(abi.FieldECCDRAM, e, c)
			sram, _ := abi.ECCField(abi.FieldECCSRAM, e, c)
			want[fmt.Sprintf("ecc-total-%d-%d", e, c)] = v(total)
			want[fmt.Sprintf("ecc-location-%d-%d-2", e, c)] = v(dram)
			want[fmt.Sprintf("ecc-location-%d-%d-7", e, c)] = v(sram)
		}
	}
	for typ := range uint64(abi.ClockTypes) {
		for id, group := range []abi.DeviceField{abi.FieldClockGraphics, abi.FieldAppClock, abi.FieldDefaultAppClock, abi.FieldBoostClock} {
			f := group + abi.DeviceField(typ)
			want[fmt.Sprintf("clock-%d-%d", typ, id)] = v(f)
		}
		for name, group := range map[string]abi.DeviceField{"app-clock": abi.FieldAppClock, "default-app-clock": abi.FieldDefaultAppClock,
			"boost-clock": abi.FieldBoostClock} {
			want[fmt.Sprintf("%s-%d", name, typ)] = v(group + abi.DeviceField(typ))
		}
	}
	for entry, w := range want {
		expect(t, out, entry, w)
	}
	for _, e := range []string{"retired-addresses-0", "ecc-location-0-0-0", "inforom-3", "nvmlDeviceGetHostVgpuMode"} {
		if l := out.first(t, e); l.ret != 3 {
			t.Errorf("%s: %d, want NVML_ERROR_NOT_SUPPORTED (the guest is not given it)", e, l.ret)
		}
	}
	// Asked how many (no room), or with less room than pages: the count,
	// and NVML_ERROR_INSUFFICIENT_SIZE, as NVML answers.
	for e, f := range map[string]abi.DeviceField{"retired-0": abi.FieldRetiredSingleBit, "retired-1": abi.FieldRetiredDoubleBit,
		"retired-addresses-1": abi.FieldRetiredDoubleBit} {
		if l := out.first(t, e); l.ret != 7 || l.rest != v(f) {
			t.Errorf("%s: %d %q, want NVML_ERROR_INSUFFICIENT_SIZE and %s pages", e, l.ret, l.rest, v(f))
		}
	}
	for _, name := range []string{"ecc-total-bad", "ecc-location-bad", "retired-bad", "inforom-bad", "clock-bad-id", "clock-bad-type", "pcie-bad"} {
		if l := out.first(t, name); l.ret != wantReturns[name] {
			t.Errorf("%s: %d, want %d", name, l.ret, wantReturns[name])
		}
	}
}
