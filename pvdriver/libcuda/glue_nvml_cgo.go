package main

/*
#cgo CFLAGS: -I${SRCDIR}/../libnvml
#include <string.h>
#include "vgnvml.h"
int vg_debug_enabled(void);
*/
import "C"

import (
	"io"
	"os"
	"sync"
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver/nvmlapi"
)

// The Go entry of the guest's libnvidia-ml.so.1 (pvdriver/libnvml), which
// loads this library and calls vgpuhaNvml for every NVML entry point: the
// NVML shares this process's session and view of the devices with the
// driver (drv), so one Go runtime and one session serve both.

var nvml = sync.OnceValue(func() *nvmlapi.API {
	var debug io.Writer
	if C.vg_debug_enabled() > 0 {
		debug = os.Stderr
	}
	return nvmlapi.New(drv, debug)
})

//export vgpuhaNvml
func vgpuhaNvml(name *C.char, dev, dev2 C.int, arg C.longlong, in *C.char, out *C.struct_vgpuha_nvml_answer) C.int {
	if name == nil || out == nil {
		return C.int(nvmlapi.ErrorInvalidArgument)
	}
	r := nvmlapi.Request{Dev: int(dev), Dev2: int(dev2), Arg: int64(arg)}
	if in != nil {
		r.In = C.GoStringN(in, C.int(C.strnlen(in, C.VGPUHA_NVML_TEXT)))
	}
	var a nvmlapi.Answer
	res := nvml().Call(C.GoString(name), r, &a)
	for i, v := range a.V {
		out.v[i] = C.ulonglong(v)
	}
	s := unsafe.Slice((*byte)(unsafe.Pointer(&out.s[0])), C.VGPUHA_NVML_TEXT)
	s[copy(s[:len(s)-1], a.S)] = 0
	return C.int(res)
}
