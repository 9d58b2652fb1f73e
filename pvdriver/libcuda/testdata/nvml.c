/* The guest's NVML (libnvidia-ml.so.1) beside its libcuda.so.1: every
 * entry it serves, called once, each printed as "ENTRY RESULT [VALUES]"
 * for the test to check against the node's device (TestNVML). Modes:
 *   full      every entry, with CUDA memory held by this process
 *   visible   the device count and identity NVML and CUDA each report
 *   failover  the identity and memory, then "checkpoint" (the test fails
 *             the primary over), then the same again
 *   watch     what nvidia-smi -q reads, NVML only (no CUDA in the process:
 *             its NVML takes no session) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudaapi.h"
#include "nvmlapi.h"

#define SAY(name, r, ...) do { printf("%s %d", name, (int)(r)); printf(" " __VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

static void cuda_uuid(char *out, size_t n) {
	CUuuid u;
	CUresult r = cuDeviceGetUuid(&u, 0);
	const unsigned char *b = (const unsigned char *)u.bytes;
	if (r != 0) { snprintf(out, n, "error-%d", r); return; }
	snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
		b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void identity(nvmlDevice_t h) {
	char s[96];
	nvmlMemory_t m;
	nvmlReturn_t r = nvmlDeviceGetUUID(h, s, sizeof s);
	SAY("nvmlDeviceGetUUID", r, "%s", r ? "" : s);
	r = nvmlDeviceGetName(h, s, sizeof s);
	SAY("nvmlDeviceGetName", r, "%s", r ? "" : s);
	r = nvmlDeviceGetMemoryInfo(h, &m);
	SAY("nvmlDeviceGetMemoryInfo", r, "%llu %llu %llu", m.total, m.free, m.used);
}

static int visible(void) {
	unsigned int n = 0;
	int cn = -1;
	char s[96];
	SAY("nvmlInit_v2", nvmlInit_v2(), "");
	nvmlReturn_t r = nvmlDeviceGetCount_v2(&n);
	SAY("nvmlDeviceGetCount_v2", r, "%u", n);
	SAY("cuInit", cuInit(0), "");
	CUresult cr = cuDeviceGetCount(&cn);
	SAY("cuDeviceGetCount", cr, "%d", cn);
	if (n > 0) {
		nvmlDevice_t h;
		SAY("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex_v2(0, &h), "");
		r = nvmlDeviceGetUUID(h, s, sizeof s);
		SAY("nvmlDeviceGetUUID", r, "%s", s);
		cuda_uuid(s, sizeof s);
		SAY("cuDeviceGetUuid", 0, "%s", s);
	}
	SAY("nvmlShutdown", nvmlShutdown(), "");
	return 0;
}

static int failover(void) {
	nvmlDevice_t h;
	char line[16];
	SAY("nvmlInit_v2", nvmlInit_v2(), "");
	SAY("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex_v2(0, &h), "");
	identity(h);
	printf("checkpoint\n");
	fflush(stdout);
	if (fgets(line, sizeof line, stdin) == NULL) return 1;
	identity(h);
	unsigned int t;
	SAY("nvmlDeviceGetTemperature", nvmlDeviceGetTemperature(h, 0, &t), "");
	SAY("nvmlShutdown", nvmlShutdown(), "");
	return 0;
}

/* processes calls one of the process-list entries: how many first, then
 * the list. */
#define PROCESSES(fn, type) do { \
	type p[4]; \
	unsigned int n = 0; \
	nvmlReturn_t r0 = fn(h, &n, NULL); \
	unsigned int need = n; \
	n = 4; \
	nvmlReturn_t r = fn(h, &n, p); \
	SAY(#fn, r, "%d %u %u %u %llu", r0, need, n, n ? p[0].pid : 0, n ? p[0].usedGpuMemory : 0ULL); \
} while (0)

static void device_values(nvmlDevice_t h) {
	unsigned int v, w;
	int a, b;
	nvmlReturn_t r;
	char s[96];
#define SAY_UINT(name) r = name(h, &v); SAY(#name, r, "%u", r ? 0 : v);
	NVML_UINT_ENTRIES(SAY_UINT)
#define SAY_UINT_ARG(name) r = name(h, 0, &v); SAY(#name, r, "%u", r ? 0 : v);
	NVML_UINT_ARG_ENTRIES(SAY_UINT_ARG)
	SAY("temperature-sensor-1", nvmlDeviceGetTemperature(h, 1, &v), "");
	nvmlTemperature_t temp = {.version = (unsigned int)sizeof temp | 1u << 24, .sensorType = 0};
	r = nvmlDeviceGetTemperatureV(h, &temp);
	SAY("nvmlDeviceGetTemperatureV", r, "%d", r ? 0 : temp.temperature);
	temp.version = 0;
	SAY("temperature-v-bad-version", nvmlDeviceGetTemperatureV(h, &temp), "");
	r = nvmlDeviceGetClock(h, 0, 0, &v);
	SAY("nvmlDeviceGetClock", r, "%u", r ? 0 : v);
	SAY("application-clock", nvmlDeviceGetClock(h, 0, 1, &v), "");
	r = nvmlDeviceGetEccMode(h, &v, &w);
	SAY("nvmlDeviceGetEccMode", r, "%u %u", r ? 0 : v, r ? 0 : w);
	v = w = 7;
	r = nvmlDeviceGetMigMode(h, &v, &w);
	SAY("nvmlDeviceGetMigMode", r, "%u %u", v, w);
	r = nvmlDeviceGetCudaComputeCapability(h, &a, &b);
	SAY("nvmlDeviceGetCudaComputeCapability", r, "%d %d", a, b);
	nvmlUtilization_t u;
	r = nvmlDeviceGetUtilizationRates(h, &u);
	SAY("nvmlDeviceGetUtilizationRates", r, "%u %u", r ? 0 : u.gpu, r ? 0 : u.memory);
	nvmlBAR1Memory_t bar;
	r = nvmlDeviceGetBAR1MemoryInfo(h, &bar);
	SAY("nvmlDeviceGetBAR1MemoryInfo", r, "%llu", r ? 0 : bar.bar1Total);
	r = nvmlDeviceGetSerial(h, s, sizeof s);
	SAY("nvmlDeviceGetSerial", r, "%s", r ? "" : s);
	r = nvmlDeviceGetBoardPartNumber(h, s, sizeof s);
	SAY("nvmlDeviceGetBoardPartNumber", r, "%s", r ? "" : s);
	r = nvmlDeviceGetVbiosVersion(h, s, sizeof s);
	SAY("nvmlDeviceGetVbiosVersion", r, "%s", r ? "" : s);
	a = -1;
	r = nvmlDeviceGetP2PStatus(h, h, 0, &a);
	SAY("nvmlDeviceGetP2PStatus", r, "%d", a);
	a = -1;
	r = nvmlDeviceGetTopologyCommonAncestor(h, h, &a);
	SAY("nvmlDeviceGetTopologyCommonAncestor", r, "%d", a);
	v = 9;
	r = nvmlDeviceGetTopologyNearestGpus(h, 50, &v, NULL);
	SAY("nvmlDeviceGetTopologyNearestGpus", r, "%u", v);
	unsigned long long mj;
	SAY("nvmlDeviceGetTotalEnergyConsumption", nvmlDeviceGetTotalEnergyConsumption(h, &mj), "");
}

/* health_values calls the entries of the device's errors, inforom,
 * clocks and link (what nvidia-smi -q reads beside the basics), each with
 * a valid argument and then, where it takes one, an argument past NVML's
 * (named "...-bad"). */
static void health_values(nvmlDevice_t h) {
	unsigned int v, w, x, y;
	unsigned long long u;
	nvmlReturn_t r;
	char s[96];
#define SAY_ULL(name) r = name(h, &u); SAY(#name, r, "%llu", r ? 0 : u);
	NVML_ULL_ENTRIES(SAY_ULL)
#define SAY_PAIR(name) r = name(h, &v, &w); SAY(#name, r, "%u %u", r ? 0 : v, r ? 0 : w);
	NVML_PAIR_ENTRIES(SAY_PAIR)
	for (int e = 0; e < 2; e++)
		for (int c = 0; c < 2; c++) {
			char name[64];
			r = nvmlDeviceGetTotalEccErrors(h, e, c, &u);
			snprintf(name, sizeof name, "ecc-total-%d-%d", e, c);
			SAY(name, r, "%llu", r ? 0 : u);
			for (int loc = 0; loc < 8; loc++) {
				r = nvmlDeviceGetMemoryErrorCounter(h, e, c, loc, &u);
				snprintf(name, sizeof name, "ecc-location-%d-%d-%d", e, c, loc);
				SAY(name, r, "%llu", r ? 0 : u);
			}
		}
	SAY("nvmlDeviceGetTotalEccErrors", nvmlDeviceGetTotalEccErrors(h, 0, 0, &u), "");
	SAY("nvmlDeviceGetMemoryErrorCounter", nvmlDeviceGetMemoryErrorCounter(h, 0, 0, 2, &u), "");
	SAY("ecc-total-bad", nvmlDeviceGetTotalEccErrors(h, 2, 0, &u), "");
	SAY("ecc-location-bad", nvmlDeviceGetMemoryErrorCounter(h, 0, 0, 8, &u), "");
	for (int cause = 0; cause < 2; cause++) {
		unsigned long long pages[4];
		char name[64];
		v = 0;
		r = nvmlDeviceGetRetiredPages(h, cause, &v, NULL);
		snprintf(name, sizeof name, "retired-%d", cause);
		SAY(name, r, "%u", v);
		w = 4;
		snprintf(name, sizeof name, "retired-addresses-%d", cause);
		SAY(name, nvmlDeviceGetRetiredPages(h, cause, &w, pages), "%u", w);
	}
	v = 0;
	SAY("nvmlDeviceGetRetiredPages", nvmlDeviceGetRetiredPages(h, 0, &v, NULL), "%u", v);
	v = 0;
	SAY("nvmlDeviceGetRetiredPages_v2", nvmlDeviceGetRetiredPages_v2(h, 1, &v, NULL, NULL), "%u", v);
	SAY("retired-bad", nvmlDeviceGetRetiredPages(h, 2, &v, NULL), "");
	r = nvmlDeviceGetRemappedRows(h, &v, &w, &x, &y);
	SAY("nvmlDeviceGetRemappedRows", r, "%u %u %u %u", r ? 0 : v, r ? 0 : w, r ? 0 : x, r ? 0 : y);
	r = nvmlDeviceGetInforomImageVersion(h, s, sizeof s);
	SAY("nvmlDeviceGetInforomImageVersion", r, "%s", r ? "" : s);
	for (int o = 0; o < 4; o++) {
		char name[64];
		r = nvmlDeviceGetInforomVersion(h, o, s, sizeof s);
		snprintf(name, sizeof name, "inforom-%d", o);
		SAY(name, r, "%s", r ? "" : s);
	}
	SAY("nvmlDeviceGetInforomVersion", nvmlDeviceGetInforomVersion(h, 0, s, sizeof s), "");
	SAY("inforom-bad", nvmlDeviceGetInforomVersion(h, 4, s, sizeof s), "");
	for (unsigned int id = 0; id < 4; id++)
		for (unsigned int t = 0; t < 4; t++) {
			char name[64];
			r = nvmlDeviceGetClock(h, t, id, &v);
			snprintf(name, sizeof name, "clock-%u-%u", t, id);
			SAY(name, r, "%u", r ? 0 : v);
		}
	SAY("clock-bad-id", nvmlDeviceGetClock(h, 0, 4, &v), "");
	SAY("clock-bad-type", nvmlDeviceGetClock(h, 4, 0, &v), "");
	for (unsigned int t = 0; t < 4; t++) {
		char name[64];
		r = nvmlDeviceGetApplicationsClock(h, t, &v);
		snprintf(name, sizeof name, "app-clock-%u", t);
		SAY(name, r, "%u", r ? 0 : v);
		r = nvmlDeviceGetDefaultApplicationsClock(h, t, &v);
		snprintf(name, sizeof name, "default-app-clock-%u", t);
		SAY(name, r, "%u", r ? 0 : v);
		r = nvmlDeviceGetMaxCustomerBoostClock(h, t, &v);
		snprintf(name, sizeof name, "boost-clock-%u", t);
		SAY(name, r, "%u", r ? 0 : v);
	}
	r = nvmlDeviceGetPcieThroughput(h, 1, &v);
	SAY("pcie-rx", r, "%u", r ? 0 : v);
	SAY("pcie-bad", nvmlDeviceGetPcieThroughput(h, 2, &v), "");
	for (unsigned int t = 0; t < 4; t++) {
		char name[64];
		r = nvmlDeviceGetTemperatureThreshold(h, t, &v);
		snprintf(name, sizeof name, "threshold-%u", t);
		SAY(name, r, "%u", r ? 0 : v);
	}
}

/* watch is what nvidia-smi does: NVML alone, no CUDA in the process. */
static int watch(void) {
	nvmlDevice_t h;
	unsigned int n = 0;
	char s[96];
	SAY("nvmlInit_v2", nvmlInit_v2(), "");
	nvmlReturn_t r = nvmlDeviceGetCount_v2(&n);
	SAY("nvmlDeviceGetCount_v2", r, "%u", n);
	SAY("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex_v2(0, &h), "");
	identity(h);
	unsigned int count = 4;
	nvmlProcessInfo_t p[4];
	r = nvmlDeviceGetComputeRunningProcesses_v3(h, &count, p);
	SAY("nvmlDeviceGetComputeRunningProcesses_v3", r, "%u", count);
	r = nvmlSystemGetDriverVersion(s, sizeof s);
	SAY("nvmlSystemGetDriverVersion", r, "%s", r ? "" : s);
	unsigned int v;
	r = nvmlDeviceGetTemperature(h, 0, &v);
	SAY("nvmlDeviceGetTemperature", r, "%u", r ? 0 : v);
#define SAY_UINT_W(name) r = name(h, &v); SAY(#name, r, "%u", r ? 0 : v);
	NVML_UINT_ENTRIES(SAY_UINT_W)
	health_values(h);
	SAY("nvmlShutdown", nvmlShutdown(), "");
	return 0;
}

/* events: a set takes a registration and no event comes. */
static void events(nvmlDevice_t h) {
	nvmlEventSet_t set = NULL;
	nvmlEventData_t ev;
	unsigned long long types = 7;
	SAY("nvmlEventSetCreate", nvmlEventSetCreate(&set), "");
	nvmlReturn_t r = nvmlDeviceGetSupportedEventTypes(h, &types);
	SAY("nvmlDeviceGetSupportedEventTypes", r, "%llu", types);
	SAY("nvmlDeviceRegisterEvents", nvmlDeviceRegisterEvents(h, 0, set), "");
	SAY("nvmlEventSetWait_v2", nvmlEventSetWait_v2(set, &ev, 20), "");
	SAY("nvmlEventSetWait", nvmlEventSetWait(set, &ev, 0), "");
	SAY("nvmlEventSetFree", nvmlEventSetFree(set), "");
}

/* smi_table calls nvidia-smi's private table as nvidia-smi does: a handle
 * by index (slot 81) and a process list (slot 213, entries of 4128 bytes:
 * pid, memory, instance ids, protected memory, name). */
static void smi_table(nvmlDevice_t h) {
	static const unsigned char id[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
	static const unsigned char other[16] = {1};
	const void *t = NULL;
	SAY("unknown-export-table", nvmlInternalGetExportTable(&t, other), "");
	nvmlReturn_t r = nvmlInternalGetExportTable(&t, id);
	const uintptr_t *table = t;
	SAY("nvmlInternalGetExportTable", r, "%d", r == 0 && table[0] > 648);
	if (r != 0) return;
	typedef nvmlReturn_t (*slot_fn)(void *, void *, void *);
	nvmlDevice_t h2 = NULL;
	r = ((slot_fn)table[81])((void *)0, &h2, (void *)0x22);
	SAY("smi-slot-81", r, "%d", h2 == h);
	static struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; unsigned long long cc; char name[4096]; } procs[4];
	unsigned int n = 4;
	r = ((slot_fn)table[213])(h, &n, procs);
	SAY("smi-slot-213", r, "%u %u %llu %s", n, n ? procs[0].pid : 0, n ? procs[0].used : 0ULL, n ? procs[0].name : "-");
	n = 9;
	r = ((slot_fn)table[100])(h, &n, NULL);
	SAY("smi-slot-100", r, "%u", n);
}

static int full(void) {
	unsigned int n = 0, i;
	int v;
	char s[96], bus[32];
	nvmlDevice_t h, h2;
	nvmlReturn_t r;
	SAY("getpid", 0, "%d", (int)getpid());
	SAY("nvmlErrorString", 0, "%s", nvmlErrorString(3));
	SAY("uninitialized", nvmlDeviceGetCount_v2(&n), "");
	SAY("nvmlInit", nvmlInit(), "");
	SAY("nvmlInit_v2", nvmlInit_v2(), "");
	SAY("nvmlInitWithFlags", nvmlInitWithFlags(0), "");
	r = nvmlSystemGetDriverVersion(s, sizeof s);
	SAY("nvmlSystemGetDriverVersion", r, "%s", r ? "" : s);
	r = nvmlSystemGetNVMLVersion(s, sizeof s);
	SAY("nvmlSystemGetNVMLVersion", r, "%s", r ? "" : s);
	r = nvmlSystemGetCudaDriverVersion(&v);
	SAY("nvmlSystemGetCudaDriverVersion", r, "%d", v);
	r = nvmlSystemGetCudaDriverVersion_v2(&v);
	SAY("nvmlSystemGetCudaDriverVersion_v2", r, "%d", v);
	r = nvmlSystemGetProcessName((unsigned int)getpid(), s, sizeof s);
	SAY("nvmlSystemGetProcessName", r, "%s", r ? "" : s);
	r = nvmlDeviceGetCount(&n);
	SAY("nvmlDeviceGetCount", r, "%u", n);
	r = nvmlDeviceGetCount_v2(&n);
	SAY("nvmlDeviceGetCount_v2", r, "%u", n);
	SAY("nvmlDeviceGetHandleByIndex", nvmlDeviceGetHandleByIndex(0, &h2), "");
	SAY("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex_v2(0, &h), "%d", h == h2);
	SAY("index-past-count", nvmlDeviceGetHandleByIndex_v2(n, &h2), "");
	r = nvmlDeviceGetIndex(h, &i);
	SAY("nvmlDeviceGetIndex", r, "%u", i);
	SAY("name-short-buffer", nvmlDeviceGetName(h, s, 2), "");
	nvmlPciInfo_t pci;
	r = nvmlDeviceGetPciInfo_v3(h, &pci);
	SAY("nvmlDeviceGetPciInfo_v3", r, "%u %u %u %s %s", pci.domain, pci.bus, pci.device, pci.busId, pci.busIdLegacy);
	snprintf(bus, sizeof bus, "%s", pci.busId);
	SAY("nvmlDeviceGetHandleByPciBusId_v2", nvmlDeviceGetHandleByPciBusId_v2(bus, &h2), "%d", h == h2);
	SAY("nvmlDeviceGetHandleByPciBusId", nvmlDeviceGetHandleByPciBusId(pci.busIdLegacy, &h2), "%d", h == h2);
	SAY("nvmlDeviceGetHandleBySerial", nvmlDeviceGetHandleBySerial("0000000000000", &h2), "");
	r = nvmlDeviceGetUUID(h, s, sizeof s);
	SAY("nvmlDeviceGetHandleByUUID", nvmlDeviceGetHandleByUUID(s, &h2), "%d", h == h2);
	identity(h);

	/* CUDA in the same process: the same device, and the memory it holds. */
	CUcontext ctx;
	CUdeviceptr p;
	SAY("cuInit", cuInit(0), "");
	r = cuDeviceGetName(s, sizeof s, 0);
	SAY("cuDeviceGetName", r, "%s", s);
	cuda_uuid(s, sizeof s);
	SAY("cuDeviceGetUuid", 0, "%s", s);
	SAY("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, 0), "");
	SAY("cuCtxSetCurrent", cuCtxSetCurrent(ctx), "");
	SAY("cuMemAlloc", cuMemAlloc(&p, 64 << 20), "%d", 64 << 20);
	nvmlMemory_t m;
	r = nvmlDeviceGetMemoryInfo(h, &m);
	SAY("nvmlDeviceGetMemoryInfo", r, "%llu %llu %llu", m.total, m.free, m.used);
	nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
	r = nvmlDeviceGetMemoryInfo_v2(h, &m2);
	SAY("nvmlDeviceGetMemoryInfo_v2", r, "%llu %llu %llu %llu", m2.total, m2.free, m2.used, m2.reserved);
	m2.version = 1;
	SAY("memory-v2-bad-version", nvmlDeviceGetMemoryInfo_v2(h, &m2), "");
	PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t);
	PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t);
	PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t);
	PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t);
	PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t);
	PROCESSES(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t);
	device_values(h);
	health_values(h);
	events(h);
	smi_table(h);
	SAY("nvmlShutdown", nvmlShutdown(), "");
	SAY("shutdown-2", nvmlShutdown(), "");
	SAY("shutdown-3", nvmlShutdown(), "");
	SAY("shutdown-4", nvmlShutdown(), "");
	SAY("after-shutdown", nvmlDeviceGetCount_v2(&n), "");
	return 0;
}

int main(int argc, char **argv) {
	const char *mode = argc > 1 ? argv[1] : "full";
	if (strcmp(mode, "visible") == 0) return visible();
	if (strcmp(mode, "failover") == 0) return failover();
	if (strcmp(mode, "watch") == 0) return watch();
	return full();
}
