// peek: a guest's own kernel that reads 8 bytes at any device address it is
// given (isolation.c aims it at another guest's memory).
extern "C" __global__ void peek(const unsigned long long *addr, unsigned long long *out) {
	*out = *(const volatile unsigned long long *)addr;
}
