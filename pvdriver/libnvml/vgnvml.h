/* The one call between the guest's libnvidia-ml.so.1 (nvml.c) and the
 * libcuda.so.1 beside it, which holds the NVML's logic in Go
 * (pvdriver/nvmlapi, through pvdriver/libcuda/glue_nvml_cgo.go):
 *
 *   int vgpuhaNvml(name, dev, dev2, arg, in, out)
 *
 * runs NVML entry point name (NVIDIA's exported name) for device ordinal
 * dev (and dev2, for the calls that take two devices) with a numeric
 * argument arg and a text argument in (NULL for none), and returns its
 * nvmlReturn_t; out gets the entry's numbers and text, whose meaning the
 * entry's row in nvmlapi's table says. */
#ifndef VGPUHA_NVML_H
#define VGPUHA_NVML_H

#define VGPUHA_NVML_TEXT 256

struct vgpuha_nvml_answer {
	unsigned long long v[8];
	char s[VGPUHA_NVML_TEXT];
};

typedef int (*vgpuha_nvml_fn)(const char *name, int dev, int dev2, long long arg, const char *in,
	struct vgpuha_nvml_answer *out);

#endif
