/* libnvidia-ml.so.1 for guests: NVIDIA's management library (NVML) as
 * nvidia-smi, pynvml, PyTorch and vLLM call it, served by the
 * libcuda.so.1 that sits beside this file (pvdriver/libcuda). A process
 * must hold one Go runtime, so this library is C only: it loads that
 * libcuda.so.1 (or, failing that, the one the loader finds by its soname)
 * and calls vgpuhaNvml (vgnvml.h) for every entry, whose Go half
 * (pvdriver/nvmlapi) holds the logic and shares the process's session.
 * This file only marshals NVML's types: handles, strings, structs.
 *
 * Names, types and constants are nvml.h's (NVML API version 12). An entry
 * not served answers NVML_ERROR_NOT_SUPPORTED and names itself on stderr
 * with VGPUHA_DEBUG=1 (unserved.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgnvml.h"

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_LIBRARY_NOT_FOUND = 12,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

/* A device handle points into vg_devs; its ordinal is its index there. */
#define VG_MAX_DEVICES 64
typedef struct nvmlDevice_st { char unused; } *nvmlDevice_t;
static struct nvmlDevice_st vg_devs[VG_MAX_DEVICES];

typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_v1_t;
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
#define NVML_STRUCT_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((ver) << 24U)))

/* ---- Loading the libcuda.so.1 beside this library. ---- */
static vgpuha_nvml_fn vg_fn;
static pthread_once_t vg_once = PTHREAD_ONCE_INIT;

static void vg_load(void) {
	Dl_info self;
	void *lib = NULL;
	if (dladdr((void *)vg_load, &self) && self.dli_fname != NULL) {
		char path[PATH_MAX];
		const char *slash = strrchr(self.dli_fname, '/');
		int dir = slash ? (int)(slash - self.dli_fname) : 0;
		if (slash && snprintf(path, sizeof path, "%.*s/libcuda.so.1", dir, self.dli_fname) < (int)sizeof path)
			lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	}
	if (lib == NULL) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (lib != NULL) vg_fn = (vgpuha_nvml_fn)dlsym(lib, "vgpuhaNvml");
	if (vg_fn == NULL)
		fprintf(stderr, "vgpuha libnvidia-ml: no vgpuha libcuda.so.1 beside %s or on the library path: %s\n",
			self.dli_fname ? self.dli_fname : "this library", lib ? "it lacks vgpuhaNvml (NVIDIA's own?)" : dlerror());
}

/* vg_call runs entry name in Go; NVML_ERROR_LIBRARY_NOT_FOUND without it. */
static nvmlReturn_t vg_call(const char *name, int dev, int dev2, long long arg, const char *in, struct vgpuha_nvml_answer *a) {
	pthread_once(&vg_once, vg_load);
	if (vg_fn == NULL) return NVML_ERROR_LIBRARY_NOT_FOUND;
	memset(a, 0, sizeof *a);
	return vg_fn(name, dev, dev2, arg, in, a);
}

static int vg_ordinal(nvmlDevice_t d) {
	if (d < vg_devs || d >= vg_devs + VG_MAX_DEVICES) return -1;
	return (int)(d - vg_devs);
}

static nvmlDevice_t vg_handle(unsigned long long ordinal) { return &vg_devs[ordinal]; }

/* vg_text copies the answer's text into a caller's buffer of length n. */
static nvmlReturn_t vg_text(nvmlReturn_t r, const struct vgpuha_nvml_answer *a, char *buf, unsigned int n) {
	if (r != NVML_SUCCESS) return r;
	size_t len = strlen(a->s);
	if (buf == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (len + 1 > n) return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(buf, a->s, len + 1);
	return NVML_SUCCESS;
}

#define ANSWER struct vgpuha_nvml_answer a
#define CALL(dev, arg) vg_call(__func__, vg_ordinal(dev), -1, arg, NULL, &a)

/* ---- Initialisation and errors. ---- */
nvmlReturn_t nvmlInit(void) { ANSWER; return vg_call(__func__, -1, -1, 0, NULL, &a); }
nvmlReturn_t nvmlInit_v2(void) { ANSWER; return vg_call(__func__, -1, -1, 0, NULL, &a); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { ANSWER; return vg_call(__func__, -1, -1, flags, NULL, &a); }
nvmlReturn_t nvmlShutdown(void) { ANSWER; return vg_call(__func__, -1, -1, 0, NULL, &a); }

/* nvmlErrorString's texts, as NVML's own (nvml.h's comments). */
static const struct { nvmlReturn_t r; const char *text; } vg_errors[] = {
	{0, "Success"}, {1, "Uninitialized"}, {2, "Invalid Argument"}, {3, "Not Supported"},
	{4, "Insufficient Permissions"}, {5, "Already Initialized"}, {6, "Not Found"}, {7, "Insufficient Size"},
	{8, "Insufficient External Power"}, {9, "Driver Not Loaded"}, {10, "Timeout"}, {11, "Interrupt Request Issue"},
	{12, "NVML Shared Library Not Found"}, {13, "Function Not Found"}, {14, "Corrupted infoROM"},
	{15, "GPU is lost"}, {16, "GPU requires restart"}, {17, "The operating system has blocked the request."},
	{18, "RM has detected an NVML/RM version mismatch."}, {19, "In use by another client"},
	{20, "Insufficient Memory"}, {21, "No data"}, {22, "The requested vgpu operation is not available on target device, because ECC is enabled"},
	{23, "Ran out of critical resources, other than memory"}, {24, "The requested frequency is not supported"},
	{25, "The provided version is invalid/unsupported"}, {26, "The requested functionality has been deprecated"},
	{27, "The system is not ready for the request"}, {28, "The GPU was not found"}, {29, "The resource is in an invalid state"},
	{999, "Unknown Error"},
};

const char *nvmlErrorString(nvmlReturn_t r) {
	for (size_t i = 0; i < sizeof vg_errors / sizeof vg_errors[0]; i++)
		if (vg_errors[i].r == r) return vg_errors[i].text;
	return "Unknown Error";
}

/* ---- System queries. ---- */
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { ANSWER; return vg_text(CALL(NULL, 0), &a, v, n); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int n) { ANSWER; return vg_text(CALL(NULL, 0), &a, v, n); }
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int n) { ANSWER; return vg_text(CALL(NULL, pid), &a, name, n); }

static nvmlReturn_t vg_int(nvmlReturn_t r, const struct vgpuha_nvml_answer *a, int *v) {
	if (r == NVML_SUCCESS && v == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) *v = (int)a->v[0];
	return r;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { ANSWER; return vg_int(CALL(NULL, 0), &a, v); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { ANSWER; return vg_int(CALL(NULL, 0), &a, v); }

/* ---- Devices and handles. ---- */
static nvmlReturn_t vg_uint(nvmlReturn_t r, const struct vgpuha_nvml_answer *a, unsigned int *v) {
	if (r == NVML_SUCCESS && v == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) *v = (unsigned int)a->v[0];
	return r;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { ANSWER; return vg_uint(CALL(NULL, 0), &a, n); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { ANSWER; return vg_uint(CALL(NULL, 0), &a, n); }

static nvmlReturn_t vg_found(nvmlReturn_t r, const struct vgpuha_nvml_answer *a, nvmlDevice_t *d) {
	if (r == NVML_SUCCESS && (d == NULL || a->v[0] >= VG_MAX_DEVICES)) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) *d = vg_handle(a->v[0]);
	return r;
}
static nvmlReturn_t vg_by_index(const char *fn, unsigned int i, nvmlDevice_t *d) {
	ANSWER;
	nvmlReturn_t r = vg_call(fn, i < VG_MAX_DEVICES ? (int)i : -1, -1, 0, NULL, &a);
	a.v[0] = i;
	return vg_found(r, &a, d);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return vg_by_index(__func__, i, d); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return vg_by_index(__func__, i, d); }
static nvmlReturn_t vg_by_text(const char *fn, const char *in, nvmlDevice_t *d) {
	ANSWER;
	if (in == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	return vg_found(vg_call(fn, -1, -1, 0, in, &a), &a, d);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) { return vg_by_text(__func__, uuid, d); }
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *d) { return vg_by_text(__func__, id, d); }
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *d) { return vg_by_text(__func__, id, d); }
nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *d) { return vg_by_text(__func__, serial, d); }
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { ANSWER; return vg_uint(CALL(d, 0), &a, i); }

/* ---- Texts. ---- */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int n) { ANSWER; return vg_text(CALL(d, 0), &a, s, n); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int n) { ANSWER; return vg_text(CALL(d, 0), &a, s, n); }
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *s, unsigned int n) { ANSWER; return vg_text(CALL(d, 0), &a, s, n); }
nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t d, char *s, unsigned int n) { ANSWER; return vg_text(CALL(d, 0), &a, s, n); }
nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t d, char *s, unsigned int n) { ANSWER; return vg_text(CALL(d, 0), &a, s, n); }
nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t d, char *s, unsigned int n) { ANSWER; return vg_text(CALL(d, 0), &a, s, n); }
nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t d, int object, char *s, unsigned int n) {
	ANSWER;
	return vg_text(CALL(d, (unsigned int)object), &a, s, n);
}

/* ---- One unsigned value (an enum, a count, milliwatts, MHz, °C). ---- */
#define UINT_ENTRY(name) nvmlReturn_t name(nvmlDevice_t d, unsigned int *v) { ANSWER; return vg_uint(CALL(d, 0), &a, v); }
#define UINT_ARG_ENTRY(name) nvmlReturn_t name(nvmlDevice_t d, unsigned int arg, unsigned int *v) { ANSWER; return vg_uint(CALL(d, arg), &a, v); }
UINT_ENTRY(nvmlDeviceGetMinorNumber)
UINT_ENTRY(nvmlDeviceGetBrand)
UINT_ENTRY(nvmlDeviceGetArchitecture)
UINT_ENTRY(nvmlDeviceGetPowerUsage)
UINT_ENTRY(nvmlDeviceGetEnforcedPowerLimit)
UINT_ENTRY(nvmlDeviceGetPowerManagementLimit)
UINT_ENTRY(nvmlDeviceGetPowerManagementDefaultLimit)
UINT_ENTRY(nvmlDeviceGetPerformanceState)
UINT_ENTRY(nvmlDeviceGetPowerState)
UINT_ENTRY(nvmlDeviceGetComputeMode)
UINT_ENTRY(nvmlDeviceGetPersistenceMode)
UINT_ENTRY(nvmlDeviceGetFanSpeed)
UINT_ENTRY(nvmlDeviceGetCurrPcieLinkGeneration)
UINT_ENTRY(nvmlDeviceGetCurrPcieLinkWidth)
UINT_ENTRY(nvmlDeviceGetMaxPcieLinkGeneration)
UINT_ENTRY(nvmlDeviceGetMaxPcieLinkWidth)
UINT_ENTRY(nvmlDeviceGetDisplayMode)
UINT_ENTRY(nvmlDeviceGetDisplayActive)
UINT_ENTRY(nvmlDeviceGetMaxMigDeviceCount)
UINT_ENTRY(nvmlDeviceIsMigDeviceHandle)
UINT_ENTRY(nvmlDeviceGetRetiredPagesPendingStatus)
UINT_ENTRY(nvmlDeviceGetInforomConfigurationChecksum)
UINT_ENTRY(nvmlDeviceGetPcieReplayCounter)
UINT_ENTRY(nvmlDeviceGetVirtualizationMode)
UINT_ENTRY(nvmlDeviceGetHostVgpuMode)
UINT_ARG_ENTRY(nvmlDeviceGetTemperature)
UINT_ARG_ENTRY(nvmlDeviceGetTemperatureThreshold)
UINT_ARG_ENTRY(nvmlDeviceGetClockInfo)
UINT_ARG_ENTRY(nvmlDeviceGetMaxClockInfo)
UINT_ARG_ENTRY(nvmlDeviceGetNvLinkState)
UINT_ARG_ENTRY(nvmlDeviceGetApplicationsClock)
UINT_ARG_ENTRY(nvmlDeviceGetDefaultApplicationsClock)
UINT_ARG_ENTRY(nvmlDeviceGetMaxCustomerBoostClock)
UINT_ARG_ENTRY(nvmlDeviceGetPcieThroughput)

/* ---- One 64-bit value (a count, a bit set). ---- */
static nvmlReturn_t vg_ull(nvmlReturn_t r, const struct vgpuha_nvml_answer *a, unsigned long long *v) {
	if (r == NVML_SUCCESS && v == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) *v = a->v[0];
	return r;
}
#define ULL_ENTRY(name) nvmlReturn_t name(nvmlDevice_t d, unsigned long long *v) { ANSWER; return vg_ull(CALL(d, 0), &a, v); }
ULL_ENTRY(nvmlDeviceGetCurrentClocksEventReasons)
ULL_ENTRY(nvmlDeviceGetCurrentClocksThrottleReasons)
ULL_ENTRY(nvmlDeviceGetSupportedClocksEventReasons)
ULL_ENTRY(nvmlDeviceGetSupportedClocksThrottleReasons)

/* Memory error counts: the enums packed 16 bits apart (a value past 16
 * bits is past every enum: it stays invalid). */
static long long vg_pack(unsigned int lo, unsigned int mid, unsigned int hi) {
	return (long long)(lo > 0xffff ? 0xffff : lo) | (long long)(mid > 0xffff ? 0xffff : mid) << 16 |
		(long long)(hi > 0xffff ? 0xffff : hi) << 32;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int errorType, int counterType, unsigned long long *v) {
	ANSWER;
	return vg_ull(CALL(d, vg_pack((unsigned int)errorType, (unsigned int)counterType, 0)), &a, v);
}
nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t d, int errorType, int counterType, int location, unsigned long long *v) {
	ANSWER;
	return vg_ull(CALL(d, vg_pack((unsigned int)errorType, (unsigned int)counterType, (unsigned int)location)), &a, v);
}

/* Retired pages: how many (the Go half's a.v[0]); the pages' addresses
 * are the node's card's physical addresses, which the guest is not given:
 * a caller that asks for them while pages are retired is told so
 * (NVML_ERROR_NOT_SUPPORTED). */
static nvmlReturn_t vg_retired(const char *fn, nvmlDevice_t d, int cause, unsigned int *count, unsigned long long *addresses) {
	ANSWER;
	nvmlReturn_t r = vg_call(fn, vg_ordinal(d), -1, (unsigned int)cause, NULL, &a);
	if (r != NVML_SUCCESS) return r;
	if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int n = (unsigned int)a.v[0], room = *count;
	*count = n;
	if (n > room) return NVML_ERROR_INSUFFICIENT_SIZE;
	if (n > 0 && addresses != NULL) return NVML_ERROR_NOT_SUPPORTED;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count, unsigned long long *addresses) {
	return vg_retired(__func__, d, cause, count, addresses);
}
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, int cause, unsigned int *count, unsigned long long *addresses,
	unsigned long long *timestamps) {
	(void)timestamps;
	return vg_retired(__func__, d, cause, count, addresses);
}

/* The versioned form (nvidia-smi 580 asks it): the sensor in, °C out. */
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_v1_t *t) {
	ANSWER;
	unsigned int v;
	if (t == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (t->version != NVML_STRUCT_VERSION(nvmlTemperature_v1_t, 1)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlReturn_t r = vg_uint(CALL(d, (long long)t->sensorType), &a, &v);
	if (r == NVML_SUCCESS) t->temperature = (int)v;
	return r;
}

nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t d, unsigned int type, unsigned int id, unsigned int *v) {
	ANSWER;
	return vg_uint(CALL(d, (long long)type | (long long)id << 32), &a, v);
}

/* ---- Two values. ---- */
static nvmlReturn_t vg_pair(nvmlReturn_t r, const struct vgpuha_nvml_answer *a, unsigned int *x, unsigned int *y) {
	if (r == NVML_SUCCESS && (x == NULL || y == NULL)) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) *x = (unsigned int)a->v[0], *y = (unsigned int)a->v[1];
	return r;
}
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) { ANSWER; return vg_pair(CALL(d, 0), &a, cur, pending); }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) { ANSWER; return vg_pair(CALL(d, 0), &a, cur, pending); }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
	ANSWER;
	return vg_pair(CALL(d, 0), &a, (unsigned int *)major, (unsigned int *)minor);
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d, unsigned int *min, unsigned int *max) {
	ANSWER;
	return vg_pair(CALL(d, 0), &a, min, max);
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *util, unsigned int *periodUs) {
	ANSWER;
	return vg_pair(CALL(d, 0), &a, util, periodUs);
}
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *util, unsigned int *periodUs) {
	ANSWER;
	return vg_pair(CALL(d, 0), &a, util, periodUs);
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc, unsigned int *pending, unsigned int *failed) {
	ANSWER;
	nvmlReturn_t r = CALL(d, 0);
	if (r == NVML_SUCCESS && (corr == NULL || unc == NULL || pending == NULL || failed == NULL)) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS)
		*corr = (unsigned int)a.v[0], *unc = (unsigned int)a.v[1], *pending = (unsigned int)a.v[2], *failed = (unsigned int)a.v[3];
	return r;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
	ANSWER;
	return u == NULL ? NVML_ERROR_INVALID_ARGUMENT : vg_pair(CALL(d, 0), &a, &u->gpu, &u->memory);
}

/* ---- Structs. ---- */
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
	ANSWER;
	nvmlReturn_t r = CALL(d, 0);
	if (r != NVML_SUCCESS) return r;
	if (p == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	memset(p, 0, sizeof *p);
	p->domain = (unsigned int)a.v[0], p->bus = (unsigned int)a.v[1], p->device = (unsigned int)a.v[2];
	p->pciDeviceId = (unsigned int)a.v[3], p->pciSubSystemId = (unsigned int)a.v[4];
	/* NVML_DEVICE_PCI_BUS_ID_FMT and NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT */
	snprintf(p->busId, sizeof p->busId, "%08X:%02X:%02X.0", p->domain, p->bus & 0xff, p->device & 0x1f);
	snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.0", p->domain & 0xffff, p->bus & 0xff, p->device & 0x1f);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	ANSWER;
	nvmlReturn_t r = CALL(d, 0);
	if (r == NVML_SUCCESS && m == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) m->total = a.v[0], m->free = a.v[1], m->used = a.v[2];
	return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
	ANSWER;
	if (m != NULL && m->version != NVML_STRUCT_VERSION(nvmlMemory_v2_t, 2)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlReturn_t r = CALL(d, 0);
	if (r == NVML_SUCCESS && m == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) m->total = a.v[0], m->free = a.v[1], m->used = a.v[2], m->reserved = a.v[3];
	return r;
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t d, nvmlBAR1Memory_t *m) {
	ANSWER;
	nvmlReturn_t r = CALL(d, 0);
	if (r == NVML_SUCCESS && m == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) m->bar1Total = a.v[0], m->bar1Free = a.v[1], m->bar1Used = a.v[2];
	return r;
}

/* Process lists: how many in *count; NVML_ERROR_INSUFFICIENT_SIZE (and
 * the count needed) when the caller's array is shorter. The Go half
 * answers at most one process (a.v[1], a.v[2]). */
#define NO_INSTANCE 0xFFFFFFFFu /* not in a MIG instance */
static nvmlReturn_t vg_processes(nvmlReturn_t r, const struct vgpuha_nvml_answer *a, unsigned int *count, void *infos, int v1) {
	if (r != NVML_SUCCESS) return r;
	if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int n = (unsigned int)a->v[0], room = *count;
	*count = n;
	if (n > room) return NVML_ERROR_INSUFFICIENT_SIZE;
	if (n > 0 && infos == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (n > 0 && v1) *(nvmlProcessInfo_v1_t *)infos = (nvmlProcessInfo_v1_t){(unsigned int)a->v[1], a->v[2]};
	if (n > 0 && !v1) *(nvmlProcessInfo_t *)infos = (nvmlProcessInfo_t){(unsigned int)a->v[1], a->v[2], NO_INSTANCE, NO_INSTANCE};
	return NVML_SUCCESS;
}
#define PROCESS_ENTRY(name, v1) \
	nvmlReturn_t name(nvmlDevice_t d, unsigned int *count, void *infos) { ANSWER; return vg_processes(CALL(d, 0), &a, count, infos, v1); }
PROCESS_ENTRY(nvmlDeviceGetComputeRunningProcesses, 1)
PROCESS_ENTRY(nvmlDeviceGetComputeRunningProcesses_v2, 0)
PROCESS_ENTRY(nvmlDeviceGetComputeRunningProcesses_v3, 0)
PROCESS_ENTRY(nvmlDeviceGetGraphicsRunningProcesses, 1)
PROCESS_ENTRY(nvmlDeviceGetGraphicsRunningProcesses_v2, 0)
PROCESS_ENTRY(nvmlDeviceGetGraphicsRunningProcesses_v3, 0)

/* ---- Topology and peers. ---- */
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, int index, int *status) {
	ANSWER;
	return vg_int(vg_call(__func__, vg_ordinal(d1), vg_ordinal(d2), index, NULL, &a), &a, status);
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2, int *level) {
	ANSWER;
	return vg_int(vg_call(__func__, vg_ordinal(d1), vg_ordinal(d2), 0, NULL, &a), &a, level);
}
nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t d, int level, unsigned int *count, nvmlDevice_t *devs) {
	ANSWER;
	nvmlReturn_t r = vg_uint(CALL(d, level), &a, count);
	(void)devs; /* the Go half answers no device near: nothing to write */
	return r;
}

/* ---- Events: a set takes registrations and no event ever arrives (the
 * Go half says why). Every set is the one empty set. ---- */
typedef struct nvmlEventSet_st { int unused; } *nvmlEventSet_t;
static struct nvmlEventSet_st vg_event_set;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
	ANSWER;
	nvmlReturn_t r = CALL(NULL, 0);
	if (r == NVML_SUCCESS && set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) *set = &vg_event_set;
	return r;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { ANSWER; return set != &vg_event_set ? NVML_ERROR_INVALID_ARGUMENT : CALL(NULL, 0); }
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
	ANSWER;
	(void)types;
	return set != &vg_event_set ? NVML_ERROR_INVALID_ARGUMENT : CALL(d, 0);
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
	ANSWER;
	nvmlReturn_t r = CALL(d, 0);
	if (r == NVML_SUCCESS && types == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (r == NVML_SUCCESS) *types = a.v[0];
	return r;
}
static nvmlReturn_t vg_event_wait(const char *fn, nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) {
	ANSWER;
	if (set != &vg_event_set || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	return vg_call(fn, -1, -1, ms, NULL, &a);
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) { return vg_event_wait(__func__, set, data, ms); }
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) { return vg_event_wait(__func__, set, data, ms); }

/* ---- nvidia-smi's private export table. ----
 * nvidia-smi checks it runs against its own driver's NVML by fetching an
 * export table ({6c3efec4-8fc9-4e6c-a327-ee696e12f7c4}) and refuses to run
 * ("Mismatch in versions between nvidia-smi and NVML") without it; its
 * device enumeration and process lists go through some of its slots. The
 * table's layout is NVIDIA's and undocumented; what is known of it comes
 * from NVIDIA's own NVML mock for nvidia-smi 580
 * (NVIDIA/k8s-test-infra, pkg/gpu/mocknvml): slot 0 holds the table's size
 * (over 648), every other slot an entry. Served: a handle by index (slot
 * 81), the process lists (213 to 215: the calling process, as
 * nvmlDeviceGetComputeRunningProcesses answers); host PCIe generation (230)
 * and sparse operation mode (249) are not supported; every other slot
 * answers success and, for a device, an empty list (a zero count), which
 * is what nvidia-smi needs to print its tables. VGPUHA_DEBUG=2 names every
 * slot called. */
static const unsigned char vg_smi_table_id[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
	0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
enum {
	VG_SLOTS = 256,
	SLOT_HANDLE_BY_INDEX = 81,
	SLOT_PROCESSES_FIRST = 213,
	SLOT_PROCESSES_LAST = 215,
	SLOT_HOST_MAX_PCIE_GEN = 230,
	SLOT_SPARSE_MODE = 249,
	HANDLE_BY_INDEX_MAGIC = 0x22, /* the third argument nvidia-smi passes slot 81 */
};

/* One entry of a private process list: nvmlProcessDetail_v1_t's numbers,
 * then the process's name inline. */
struct vg_smi_process {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
	unsigned long long usedGpuCcProtectedMemory;
	char name[4096];
};

static int vg_debug(void) {
	const char *e = getenv("VGPUHA_DEBUG");
	return e != NULL && e[0] == '2';
}

static nvmlReturn_t vg_smi_processes(nvmlDevice_t d, unsigned int *count, struct vg_smi_process *list) {
	ANSWER;
	unsigned int room = *count;
	nvmlReturn_t r = vg_call("nvmlDeviceGetComputeRunningProcesses_v3", vg_ordinal(d), -1, 0, NULL, &a);
	if (r != NVML_SUCCESS) return r;
	unsigned int n = (unsigned int)a.v[0] < room ? (unsigned int)a.v[0] : room;
	if (n > 0) {
		unsigned int pid = (unsigned int)a.v[1];
		memset(&list[0], 0, sizeof list[0]);
		list[0].pid = pid, list[0].usedGpuMemory = a.v[2];
		list[0].gpuInstanceId = list[0].computeInstanceId = NO_INSTANCE;
		if (vg_call("nvmlSystemGetProcessName", -1, -1, pid, NULL, &a) == NVML_SUCCESS)
			snprintf(list[0].name, sizeof list[0].name, "%s", a.s);
	}
	*count = n;
	return NVML_SUCCESS;
}

static nvmlReturn_t vg_slot(unsigned int slot, void *a0, void *a1, void *a2) {
	uintptr_t index = (uintptr_t)a0;
	nvmlDevice_t d = (nvmlDevice_t)a0;
	if (vg_debug()) fprintf(stderr, "vgpuha libnvidia-ml: nvidia-smi's table, slot %u\n", slot);
	if (slot == SLOT_HANDLE_BY_INDEX && index < VG_MAX_DEVICES && a1 != NULL && (uintptr_t)a2 == HANDLE_BY_INDEX_MAGIC)
		return nvmlDeviceGetHandleByIndex_v2((unsigned int)index, (nvmlDevice_t *)a1);
	if (a1 == NULL || vg_ordinal(d) < 0) return NVML_SUCCESS; /* not about a device */
	if (slot >= SLOT_PROCESSES_FIRST && slot <= SLOT_PROCESSES_LAST) {
		unsigned int *count = a1;
		if (a2 == NULL || *count == 0 || *count > 65536) return NVML_ERROR_INVALID_ARGUMENT;
		return vg_smi_processes(d, count, a2);
	}
	if (slot == SLOT_HOST_MAX_PCIE_GEN || slot == SLOT_SPARSE_MODE) return NVML_ERROR_NOT_SUPPORTED;
	*(unsigned int *)a1 = 0;
	return NVML_SUCCESS;
}

#define SLOT(n) static nvmlReturn_t vg_slot_##n(void *a0, void *a1, void *a2) { return vg_slot(n, a0, a1, a2); }
#define SLOT_ROW(M, h) M(h##0) M(h##1) M(h##2) M(h##3) M(h##4) M(h##5) M(h##6) M(h##7) M(h##8) M(h##9)
#define SLOTS(M) SLOT_ROW(M, ) SLOT_ROW(M, 1) SLOT_ROW(M, 2) SLOT_ROW(M, 3) SLOT_ROW(M, 4) SLOT_ROW(M, 5) \
	SLOT_ROW(M, 6) SLOT_ROW(M, 7) SLOT_ROW(M, 8) SLOT_ROW(M, 9) SLOT_ROW(M, 10) SLOT_ROW(M, 11) SLOT_ROW(M, 12) \
	SLOT_ROW(M, 13) SLOT_ROW(M, 14) SLOT_ROW(M, 15) SLOT_ROW(M, 16) SLOT_ROW(M, 17) SLOT_ROW(M, 18) SLOT_ROW(M, 19) \
	SLOT_ROW(M, 20) SLOT_ROW(M, 21) SLOT_ROW(M, 22) SLOT_ROW(M, 23) SLOT_ROW(M, 24) M(250) M(251) M(252) M(253) M(254) M(255)
SLOTS(SLOT)
#define SLOT_ADDR(n) [n] = (uintptr_t)vg_slot_##n,
static uintptr_t vg_smi_table[VG_SLOTS] = {SLOTS(SLOT_ADDR)};

nvmlReturn_t nvmlInternalGetExportTable(const void **table, const void *id) {
	if (table == NULL || id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (memcmp(id, vg_smi_table_id, sizeof vg_smi_table_id) != 0) {
		if (getenv("VGPUHA_DEBUG") != NULL) fprintf(stderr, "vgpuha libnvidia-ml: nvmlInternalGetExportTable: an unknown table\n");
		return NVML_ERROR_NOT_SUPPORTED;
	}
	vg_smi_table[0] = sizeof vg_smi_table;
	*table = vg_smi_table;
	return NVML_SUCCESS;
}

/* ---- Entries this library does not serve. ---- */
static nvmlReturn_t vg_unserved(const char *name) {
	ANSWER;
	nvmlReturn_t r = vg_call(name, -1, -1, 0, NULL, &a); /* the Go half names it (VGPUHA_DEBUG=1) */
	if (r == NVML_ERROR_LIBRARY_NOT_FOUND && getenv("VGPUHA_DEBUG") != NULL)
		fprintf(stderr, "vgpuha libnvidia-ml: %s is not supported (NVML_ERROR_NOT_SUPPORTED)\n", name);
	return NVML_ERROR_NOT_SUPPORTED;
}
#define UNSERVED(name) nvmlReturn_t name() { return vg_unserved(#name); }
#include "unserved.h"
