/* The subset of NVIDIA's NVML (nvml.h, NVML API version 12) the NVML test
 * program uses, declared here so it builds without NVIDIA's headers; the
 * types are nvml.h's, the plain names are mapped to the versioned entries
 * as nvml.h maps them. */
#ifndef NVMLAPI_H
#define NVMLAPI_H

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24U)))

const char *nvmlErrorString(nvmlReturn_t r);
nvmlReturn_t nvmlInit(void);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n);
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int n);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v);
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v);
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int n);
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n);
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *d);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *d);
nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *d);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int n);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int n);
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *s, unsigned int n);
nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t d, char *s, unsigned int n);
nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t d, char *s, unsigned int n);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m);
nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t d, nvmlBAR1Memory_t *m);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u);
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor);
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending);
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending);
nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t d, unsigned int type, unsigned int id, unsigned int *mhz);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v1_t *p);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v1_t *p);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status);
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level);
nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t d, int level, unsigned int *n, nvmlDevice_t *devs);
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set);
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set);
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set);
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types);
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms);
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms);
nvmlReturn_t nvmlInternalGetExportTable(const void **table, const void *id);
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj); /* not served */
/* Entries answering one unsigned int, and one with an argument (a sensor,
 * threshold, clock type or link). */
#define NVML_UINT_ENTRIES(X) X(nvmlDeviceGetMinorNumber) X(nvmlDeviceGetBrand) X(nvmlDeviceGetArchitecture) \
	X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetEnforcedPowerLimit) X(nvmlDeviceGetPowerManagementLimit) \
	X(nvmlDeviceGetPowerManagementDefaultLimit) X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetPowerState) \
	X(nvmlDeviceGetComputeMode) X(nvmlDeviceGetPersistenceMode) X(nvmlDeviceGetFanSpeed) \
	X(nvmlDeviceGetCurrPcieLinkGeneration) X(nvmlDeviceGetCurrPcieLinkWidth) X(nvmlDeviceGetMaxPcieLinkGeneration) \
	X(nvmlDeviceGetMaxPcieLinkWidth) X(nvmlDeviceGetDisplayMode) X(nvmlDeviceGetDisplayActive) \
	X(nvmlDeviceGetMaxMigDeviceCount) X(nvmlDeviceIsMigDeviceHandle) X(nvmlDeviceGetRetiredPagesPendingStatus) \
	X(nvmlDeviceGetInforomConfigurationChecksum) X(nvmlDeviceGetPcieReplayCounter) X(nvmlDeviceGetVirtualizationMode) \
	X(nvmlDeviceGetHostVgpuMode)
#define NVML_UINT_ARG_ENTRIES(X) X(nvmlDeviceGetTemperature) X(nvmlDeviceGetTemperatureThreshold) \
	X(nvmlDeviceGetClockInfo) X(nvmlDeviceGetMaxClockInfo) X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetApplicationsClock) \
	X(nvmlDeviceGetDefaultApplicationsClock) X(nvmlDeviceGetMaxCustomerBoostClock) X(nvmlDeviceGetPcieThroughput)
/* Entries answering one unsigned long long. */
#define NVML_ULL_ENTRIES(X) X(nvmlDeviceGetCurrentClocksEventReasons) X(nvmlDeviceGetCurrentClocksThrottleReasons) \
	X(nvmlDeviceGetSupportedClocksEventReasons) X(nvmlDeviceGetSupportedClocksThrottleReasons)
/* Entries answering two unsigned ints. */
#define NVML_PAIR_ENTRIES(X) X(nvmlDeviceGetPowerManagementLimitConstraints) X(nvmlDeviceGetEncoderUtilization) \
	X(nvmlDeviceGetDecoderUtilization)
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int errorType, int counterType, unsigned long long *v);
nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t d, int errorType, int counterType, int location, unsigned long long *v);
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count, unsigned long long *addresses);
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, int cause, unsigned int *count, unsigned long long *addresses,
	unsigned long long *timestamps);
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc, unsigned int *pending, unsigned int *failed);
nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t d, int object, char *s, unsigned int n);
nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t d, char *s, unsigned int n);
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_t;
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t);
#define DECLARE_UINT(name) nvmlReturn_t name(nvmlDevice_t d, unsigned int *v);
#define DECLARE_UINT_ARG(name) nvmlReturn_t name(nvmlDevice_t d, unsigned int arg, unsigned int *v);
#define DECLARE_ULL(name) nvmlReturn_t name(nvmlDevice_t d, unsigned long long *v);
#define DECLARE_PAIR(name) nvmlReturn_t name(nvmlDevice_t d, unsigned int *a, unsigned int *b);
NVML_UINT_ENTRIES(DECLARE_UINT)
NVML_UINT_ARG_ENTRIES(DECLARE_UINT_ARG)
NVML_ULL_ENTRIES(DECLARE_ULL)
NVML_PAIR_ENTRIES(DECLARE_PAIR)
#endif
