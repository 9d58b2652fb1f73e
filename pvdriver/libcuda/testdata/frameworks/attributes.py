# Prints every device attribute, limit and property the driver reports for
# device 0, one per line, as "name value" (or "name error N"): run natively
# and through the library, the two outputs must be equal except where a
# guest's quota says otherwise (issue 42's "same numbers as native").
import ctypes, sys

cu = ctypes.CDLL("libcuda.so.1")


def check(name, rc):
    if rc != 0:
        print(f"{name} error {rc}")
        return False
    return True


assert cu.cuInit(0) == 0
dev = ctypes.c_int()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
count = ctypes.c_int()
if check("count", cu.cuDeviceGetCount(ctypes.byref(count))):
    print("count", count.value)
name = ctypes.create_string_buffer(256)
if check("name", cu.cuDeviceGetName(name, 256, dev)):
    print("name", name.value.decode())
total = ctypes.c_size_t()
if check("total_mem", cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev)):
    print("total_mem", total.value)
major, minor = ctypes.c_int(), ctypes.c_int()
ver = ctypes.c_int()
if check("driver_version", cu.cuDriverGetVersion(ctypes.byref(ver))):
    print("driver_version", ver.value)
for attr in range(1, 160):
    v = ctypes.c_int()
    rc = cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
    print(f"attr {attr} {v.value}" if rc == 0 else f"attr {attr} error {rc}")
ctx = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
for limit in range(0, 8):
    v = ctypes.c_size_t()
    rc = cu.cuCtxGetLimit(ctypes.byref(v), limit)
    print(f"limit {limit} {v.value}" if rc == 0 else f"limit {limit} error {rc}")
free, tot = ctypes.c_size_t(), ctypes.c_size_t()
if check("mem_get_info", cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(tot))):
    print("mem_get_info_total", tot.value)
lo, hi = ctypes.c_int(), ctypes.c_int()
if check("stream_priority", cu.cuCtxGetStreamPriorityRange(ctypes.byref(lo), ctypes.byref(hi))):
    print("stream_priority", lo.value, hi.value)
cfg = ctypes.c_int()
if check("cache_config", cu.cuCtxGetCacheConfig(ctypes.byref(cfg))):
    print("cache_config", cfg.value)
for kind in (1, 2, 3):  # CU_MEM_ALLOC_GRANULARITY_MINIMUM / RECOMMENDED via props
    pass
sys.stdout.flush()
