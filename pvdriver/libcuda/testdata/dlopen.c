/* Opens the library as CUDA programs do (dlopen, as PyTorch and cuDNN do;
 * not linked), which fails where the library's thread-local storage
 * outgrows what glibc keeps for libraries opened late. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
	void *h = dlopen(argc > 1 ? argv[1] : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL || dlsym(h, "cuInit") == NULL) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 1;
	}
	printf("dlopen ok\n");
	return 0;
}
