// A test guest for the MMIO tracer: maps a memfd (its "aperture"), reports
// where, and on command stores into it with every instruction form the
// tracer's decoder must handle. With VGPUHA_ENDPOINT set it is a CUDA
// program instead: its aperture comes from vgpuha's libcuda.so.1
// (vgpuhaMemMapAperture, through dlopen), so a node traces it. After each store it prints the bytes the
// store left ("expect OFFSET HEX"): the program's own write sequence, which
// the tracer's per-write records must equal. Compiled by the Go test with gcc.
#define _GNU_SOURCE
#include <cpuid.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <errno.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/syscall.h>
#include <linux/userfaultfd.h>

#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

#define PAGES 64
static unsigned char *ap;
static int apfd;

static void expect(unsigned long off, unsigned long n) {
	printf("expect %lu ", off);
	for (unsigned long i = 0; i < n; i++) printf("%02x", ap[off + i]);
	printf("\n");
}

static void forms(void) {
	unsigned char *p = ap;
	uint64_t v = 0x1122334455667788ull;

	__asm__ volatile("movb $0x11, (%0)" ::"r"(p) : "memory"); expect(0, 1);
	__asm__ volatile("movb %b1, 1(%0)" ::"r"(p), "q"(0xa5) : "memory"); expect(1, 1);
	__asm__ volatile("movw %w1, 2(%0)" ::"r"(p), "r"(0xbeef) : "memory"); expect(2, 2);
	__asm__ volatile("movw $0x1234, 4(%0)" ::"r"(p) : "memory"); expect(4, 2);
	__asm__ volatile("movl %1, 8(%0)" ::"r"(p), "r"(0xdeadbeefu) : "memory"); expect(8, 4);
	__asm__ volatile("movl $0x0badf00d, 12(%0)" ::"r"(p) : "memory"); expect(12, 4);
	__asm__ volatile("movq %1, 16(%0)" ::"r"(p), "r"(v) : "memory"); expect(16, 8);
	__asm__ volatile("movq $-2, 24(%0)" ::"r"(p) : "memory"); expect(24, 8);
	__asm__ volatile("movq %1, 8(%0,%2,8)" ::"r"(p), "r"(v + 1), "r"(3L) : "memory"); expect(32, 8);
	__asm__ volatile("movnti %1, 48(%0)" ::"r"(p), "r"(v + 2) : "memory"); expect(48, 8);
	__asm__ volatile("movnti %k1, 56(%0)" ::"r"(p), "r"(0x01020304u) : "memory"); expect(56, 4);

	{ void *d = p + 64; __asm__ volatile("stosq" : "+D"(d) : "a"(v + 3) : "memory"); } expect(64, 8);
	{ void *d = p + 72; __asm__ volatile("stosl" : "+D"(d) : "a"(0x55667788u) : "memory"); } expect(72, 4);
	{ void *d = p + 128; unsigned long c = 100; __asm__ volatile("rep stosb" : "+D"(d), "+c"(c) : "a"(0x5a) : "memory"); } expect(128, 100);
	{ void *d = p + 256; unsigned long c = 16; __asm__ volatile("rep stosq" : "+D"(d), "+c"(c) : "a"(v + 4) : "memory"); } expect(256, 128);

	unsigned char src[256];
	for (int i = 0; i < 256; i++) src[i] = (unsigned char)(i * 13 + 1);
	{ void *d = p + 512; const void *s = src; unsigned long c = 200;
	  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(c) : : "memory"); } expect(512, 200);
	{ void *d = p + 768; const void *s = src; unsigned long c = 8;
	  __asm__ volatile("rep movsq" : "+D"(d), "+S"(s), "+c"(c) : : "memory"); } expect(768, 64);

	__asm__ volatile("movdqu (%1), %%xmm1\n\tmovdqu %%xmm1, 1025(%0)" ::"r"(p), "r"(src) : "xmm1", "memory"); expect(1025, 16);
	__asm__ volatile("movdqu 16(%1), %%xmm2\n\tmovdqa %%xmm2, 1056(%0)" ::"r"(p), "r"(src) : "xmm2", "memory"); expect(1056, 16);
	__asm__ volatile("movups 32(%1), %%xmm3\n\tmovups %%xmm3, 1073(%0)" ::"r"(p), "r"(src) : "xmm3", "memory"); expect(1073, 16);
	__asm__ volatile("movups 48(%1), %%xmm4\n\tmovaps %%xmm4, 1088(%0)" ::"r"(p), "r"(src) : "xmm4", "memory"); expect(1088, 16);
	__asm__ volatile("movups 64(%1), %%xmm9\n\tmovdqu %%xmm9, 1104(%0)" ::"r"(p), "r"(src) : "xmm9", "memory"); expect(1104, 16);
	if (__builtin_cpu_supports("avx")) {
		__asm__ volatile("vmovdqu 80(%1), %%ymm5\n\tvmovdqu %%ymm5, 1121(%0)\n\tvzeroupper" ::"r"(p), "r"(src) : "xmm5", "memory"); expect(1121, 32);
		__asm__ volatile("vmovdqu 112(%1), %%ymm10\n\tvmovdqu %%ymm10, 1160(%0)\n\tvzeroupper" ::"r"(p), "r"(src) : "xmm10", "memory"); expect(1160, 32);
	}

	{ uint64_t r = v + 5; __asm__ volatile("xchgq %0, 1200(%1)" : "+r"(r) : "r"(p) : "memory"); } expect(1200, 8);
	{ unsigned char r = 0x77; __asm__ volatile("xchgb %0, 1208(%1)" : "+q"(r) : "r"(p) : "memory"); } expect(1208, 1);
	__asm__ volatile("lock addq %1, 1216(%0)" ::"r"(p), "r"(5L) : "memory"); expect(1216, 8);
	__asm__ volatile("lock addl $3, 1216(%0)" ::"r"(p) : "memory"); expect(1216, 4);
	{ uint64_t r = 9; __asm__ volatile("lock xaddq %0, 1224(%1)" : "+r"(r) : "r"(p) : "memory"); } expect(1224, 8);
	{ uint64_t r = 9; __asm__ volatile("lock xaddq %0, 1224(%1)" : "+r"(r) : "r"(p) : "memory"); } expect(1224, 8);
	{ uint64_t old = 0; __asm__ volatile("lock cmpxchgq %2, 1232(%1)" : "+a"(old) : "r"(p), "r"(v + 6) : "memory"); } expect(1232, 8);
	__asm__ volatile("lock orl $0xf0f0, 1240(%0)" ::"r"(p) : "memory"); expect(1240, 4);
	__asm__ volatile("lock andl $0x00ff, 1240(%0)" ::"r"(p) : "memory"); expect(1240, 4);
	__asm__ volatile("lock orb $0x81, 1244(%0)" ::"r"(p) : "memory"); expect(1244, 1);

	// Stores straddling a page boundary (8 and 16 bytes).
	__asm__ volatile("movq %1, 4092(%0)" ::"r"(p), "r"(v + 7) : "memory"); expect(4092, 8);
	__asm__ volatile("movdqu (%1), %%xmm6\n\tmovdqu %%xmm6, 8184(%0)" ::"r"(p), "r"(src + 100) : "xmm6", "memory"); expect(8184, 16);
}

// fallback: stores the decoder cannot describe (the tracer steps them and
// compares the page): FXSAVE, and MOVDIRI where the CPU has it.
static void fallback(void) {
	unsigned char *p = ap + 3 * 4096;
	__asm__ volatile("fxsave (%0)" ::"r"(p) : "memory");
	unsigned a, b, c, d;
	if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 27))) {
		__asm__ volatile(".byte 0x48, 0x0f, 0x38, 0xf9, 0x07" ::"D"(p + 1024), "a"(0xfeedfacecafebeefull) : "memory"); // movdiri %rax, (%rdi)
		printf("movdiri\n");
	}
}

__attribute__((target("avx512f"))) static void scatter(void) {
	int idx[16], val[16];
	for (int i = 0; i < 16; i++) { idx[i] = (i * 977 + 13) % (PAGES * 1024); val[i] = 0x5a000000 + i; }
	__asm__ volatile("vmovdqu32 (%1), %%zmm1\n\tvmovdqu32 (%2), %%zmm2\n\tkxnorw %%k1, %%k1, %%k1\n\t"
		"vpscatterdd %%zmm2, (%0,%%zmm1,4) %{%%k1%}\n\tvzeroupper"
		::"r"(ap), "r"(idx), "r"(val) : "xmm1", "xmm2", "k1", "memory");
}

// torture: stores whose reach the operand does not tell. BTS with a
// register bit offset sets a bit pages away from its operand (forwards
// and backwards); an AVX-512 scatter stores 16 elements across pages.
static void torture(void) {
	unsigned char *p = ap + 8 * 4096;
	long far = (5L * 4096 + 100) * 8 + 3, back = -(6L * 4096 - 7) * 8 + 6;
	__asm__ volatile("lock btsq %1, (%0)" ::"r"(p), "r"(far) : "memory", "cc");
	__asm__ volatile("btsq %1, (%0)" ::"r"(p), "r"(back) : "memory", "cc");
	__asm__ volatile("lock btrq %1, (%0)" ::"r"(p), "r"(far) : "memory", "cc");
	__asm__ volatile("lock btcq %1, (%0)" ::"r"(p), "r"(far + 9) : "memory", "cc");
	if (__builtin_cpu_supports("avx512f")) {
		scatter();
		printf("scatter\n");
	}
}

// movs: overlapping string moves (memmove up and down by a few bytes, and
// a direction-flag copy), 3 pages each; prints the bytes it stored.
static void movs(void) {
	unsigned long stored = 0, n = 3 * 4096;
	for (int i = 0; i < 3; i++) {
		unsigned char *s = ap + 4096 + i, *d = s + 1 + 2 * i;
		unsigned long c = n;
		__asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
		stored += n;
		s = ap + 6 * 4096 + 5; d = s - 3 - i; c = n;
		__asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
		stored += n;
		s = ap + 10 * 4096 + n - 1; d = s + 4; c = n;
		__asm__ volatile("std\n\trep movsb\n\tcld" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
		stored += n;
	}
	printf("stored %lu\n", stored);
}

// bypass: writes that do not go through a CPU store to the mapping. Each
// prints "result NAME RET ERRNO" (or the child's fate for fork).
static void bypass(const char *how) {
	unsigned char buf[4096];
	memset(buf, 0xee, sizeof buf);
	long ret = 0;
	errno = 0;
	if (strcmp(how, "pwrite") == 0) ret = pwrite(apfd, buf, sizeof buf, 2 * 4096);
	else if (strcmp(how, "punch") == 0) ret = fallocate(apfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 3 * 4096, 4096);
	else if (strcmp(how, "remove") == 0) ret = madvise(ap + 4 * 4096, 4096, MADV_REMOVE);
	else if (strcmp(how, "reopen") == 0) {
		char path[64];
		snprintf(path, sizeof path, "/proc/self/fd/%d", apfd);
		int fd = open(path, O_RDWR);
		ret = fd < 0 ? -1 : pwrite(fd, buf, 16, 5 * 4096);
		if (fd >= 0) close(fd);
	} else if (strcmp(how, "mmap") == 0) {
		void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, apfd, 6 * 4096);
		ret = m == MAP_FAILED ? -1 : 0;
		if (m != MAP_FAILED) { memset(m, 0xee, 16); munmap(m, 4096); }
	} else if (strcmp(how, "fork") == 0) {
		pid_t pid = fork();
		if (pid == 0) { ap[7 * 4096] = 0xee; _exit(0); }
		int st = 0;
		waitpid(pid, &st, 0);
		printf("result fork %s %d\n", WIFSIGNALED(st) ? "signaled" : "exited", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
		return;
	}
	printf("result %s %ld %d\n", how, ret, ret < 0 ? errno : 0);
}

// guestrw: the guest makes part of its aperture writable itself and
// writes it (a tracer that relies on its protection sees no fault), then
// read-only again (as its own, with no handler) and read-write once more.
static void guestrw(void) {
	if (mprotect(ap + 2 * 4096, 3 * 4096, PROT_READ | PROT_WRITE)) perror("error: mprotect");
	memset(ap + 2 * 4096 + 100, 0x3c, 3 * 4096 - 200);
	ap[3 * 4096 + 1] = 0x42;
}

// guestro: the guest makes a page of its aperture read-only itself and
// stores to it, as it would to catch its own writes. "jump": its SIGSEGV
// handler runs and jumps past the store (which must not happen); "fix":
// its handler makes the page writable and returns (the store then
// happens); "die": no handler, the store kills it. Prints "result guestro
// HOW FAULT_OFFSET BYTE" (-1: no fault reached the handler).
static sigjmp_buf segv_jump;
static volatile long segv_off;
static volatile int segv_fix;

static void on_segv(int sig, siginfo_t *si, void *uc) {
	(void)sig; (void)uc;
	segv_off = (unsigned char *)si->si_addr - ap;
	if (segv_fix) {
		mprotect((void *)((unsigned long)si->si_addr & ~4095ul), 4096, PROT_READ | PROT_WRITE);
		return;
	}
	siglongjmp(segv_jump, 1);
}

static void guestro(const char *how) {
	unsigned char *pg = ap + 5 * 4096;
	struct sigaction sa = {0};
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	if (strcmp(how, "die") == 0) signal(SIGSEGV, SIG_DFL);
	else sigaction(SIGSEGV, &sa, NULL);
	segv_fix = strcmp(how, "fix") == 0;
	segv_off = -1;
	pg[8] = 0x11;
	if (mprotect(pg, 4096, PROT_READ)) perror("error: mprotect");
	if (sigsetjmp(segv_jump, 1) == 0) *(volatile unsigned char *)(pg + 8) = 0x77;
	printf("result guestro %s %ld %02x\n", how, segv_off, pg[8]);
	signal(SIGSEGV, SIG_DFL);
	if (mprotect(pg, 4096, PROT_READ | PROT_WRITE)) perror("error: mprotect");
	pg[9] = 0x22;
}

// altstack: the guest's signal stack is in its aperture (pages 8-11), so
// the kernel writes a signal frame there, and the handler its locals.
// Prints "result altstack ONSTACK" (1: the handler ran on that stack).
static volatile long alt_off = -1;

static void on_usr1(int sig) {
	volatile unsigned char local[64];
	local[0] = (unsigned char)sig;
	alt_off = (long)((unsigned char *)local - ap);
}

static void altstack(void) {
	stack_t ss = {.ss_sp = ap + 8 * 4096, .ss_size = 4 * 4096}, old;
	struct sigaction sa = {0};
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_ONSTACK;
	if (sigaltstack(&ss, &old) || sigaction(SIGUSR1, &sa, NULL)) perror("error: altstack");
	alt_off = -1;
	raise(SIGUSR1);
	printf("result altstack %d\n", alt_off >= 8 * 4096 && alt_off < 12 * 4096);
	// Put back the stack there was (under libcuda.so.1 the Go runtime's:
	// Go aborts on a signal to a thread whose stack was disabled).
	sigaltstack(&old, NULL);
	signal(SIGUSR1, SIG_DFL);
}

// readinto: pread(2) of 20 pages from a file into the aperture at page
// PAGE, after a store to that page if TOUCH is 1. Prints "result pread RET
// ERRNO": the whole 81920 bytes or an error, never a short count.
static void readinto(int page, int touch) {
	static unsigned char data[20 * 4096];
	char path[] = "/tmp/vgpuha-cguest-XXXXXX";
	int fd = mkstemp(path);
	for (unsigned i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 7 + page);
	if (fd < 0 || write(fd, data, sizeof data) != sizeof data) { perror("error: temp file"); return; }
	unlink(path);
	if (touch) ap[page * 4096] = 1;
	errno = 0;
	long ret = pread(fd, ap + page * 4096, sizeof data, 0);
	printf("result pread %ld %d\n", ret, ret < 0 ? errno : 0);
	close(fd);
}

// odirect: ROUNDS O_DIRECT reads of 32 pages into the aperture at page 16
// (the device writes pinned pages), from two files in turn, each after a
// store to the first page, on a thread of its own (the main thread waits,
// where a tracer's wake-up reaches it). Prints "result odirect OK EFAULT
// OTHER".
static void *odirect_reads(void *arg);

static void odirect(int rounds) {
	pthread_t th;
	if (pthread_create(&th, NULL, odirect_reads, (void *)(long)rounds) || pthread_join(th, NULL)) perror("error: thread");
}

static void *odirect_reads(void *arg) {
	int rounds = (int)(long)arg;
	static unsigned char data[32 * 4096];
	int fds[2];
	for (int f = 0; f < 2; f++) {
		char path[] = "/tmp/vgpuha-cguest-XXXXXX";
		int fd = mkstemp(path);
		for (unsigned i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 13 + f * 101 + 1);
		if (fd < 0 || write(fd, data, sizeof data) != sizeof data || fsync(fd)) { perror("error: temp file"); return NULL; }
		fds[f] = open(path, O_RDONLY | O_DIRECT);
		unlink(path);
		close(fd);
		if (fds[f] < 0) { perror("error: O_DIRECT"); return NULL; }
	}
	int ok = 0, efault = 0, other = 0;
	for (int i = 0; i < rounds; i++) {
		ap[16 * 4096] = (unsigned char)i;
		long ret = pread(fds[i % 2], ap + 16 * 4096, sizeof data, 0);
		if (ret == sizeof data) ok++;
		else if (ret < 0 && errno == EFAULT) efault++;
		else other++;
	}
	printf("result odirect %d %d %d\n", ok, efault, other);
	close(fds[0]);
	close(fds[1]);
	return NULL;
}

// remap: the guest unmaps its aperture and maps anonymous memory at the
// upper half of its address (the tracer has not been told yet), then
// stores there; again: stores there once more. Prints "result remap OK"
// (1: the memory holds what it stored).
static void remap(int again) {
	static unsigned char v = 0x50;
	unsigned char *half = ap + PAGES / 2 * 4096;
	if (!again && (munmap(ap, PAGES * 4096) || mmap(half, PAGES / 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != half))
		perror("error: remap");
	v++;
	memset(half, v, PAGES / 2 * 4096);
	int ok = 1;
	for (int i = 0; i < PAGES / 2 * 4096; i++) ok = ok && half[i] == v;
	printf("result remap %d\n", ok);
}

// arm: what the guest driver does in uffd mode: asynchronous userfaultfd
// write-protection of the aperture (the tracer then scans the pagemap).
static int serve(void);

static int arm(void) {
	int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	if (uffd < 0) return -1;
	struct uffdio_api api = {.api = UFFD_API,
		.features = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_UNPOPULATED};
	struct uffdio_register reg = {.range = {(unsigned long)ap, PAGES * 4096}, .mode = UFFDIO_REGISTER_MODE_WP};
	struct uffdio_writeprotect wp = {.range = {(unsigned long)ap, PAGES * 4096}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
	if (ioctl(uffd, UFFDIO_API, &api) || ioctl(uffd, UFFDIO_REGISTER, &reg) || ioctl(uffd, UFFDIO_WRITEPROTECT, &wp)) return -1;
	return uffd;
}

// node_aperture maps the aperture through vgpuha's libcuda.so.1 and finds
// the file behind it among the open descriptors (for the bypass cases).
static int node_aperture(void) {
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return -1; }
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
	int (*devget)(int *, int) = (int (*)(int *, int))dlsym(lib, "cuDeviceGet");
	int (*retain)(void **, int) = (int (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
	int (*setcur)(void *) = (int (*)(void *))dlsym(lib, "cuCtxSetCurrent");
	int (*map)(unsigned long long *, void **, size_t, unsigned) =
		(int (*)(unsigned long long *, void **, size_t, unsigned))dlsym(lib, "vgpuhaMemMapAperture");
	int dev; void *ctx, *host; unsigned long long dptr;
	if (!init || !devget || !retain || !setcur || !map || init(0) || devget(&dev, 0) || retain(&ctx, dev) || setcur(ctx) ||
		map(&dptr, &host, PAGES * 4096, 0)) { fprintf(stderr, "libcuda: no aperture\n"); return -1; }
	ap = host;
	char path[128];
	struct stat want, st;
	snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", (unsigned long)ap, (unsigned long)ap + PAGES * 4096);
	if (stat(path, &want)) { perror(path); return -1; }
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		int fd = atoi(e->d_name);
		if (e->d_name[0] != '.' && fstat(fd, &st) == 0 && st.st_ino == want.st_ino && st.st_dev == want.st_dev) {
			closedir(d);
			return fd;
		}
	}
	fprintf(stderr, "the aperture's file is not among the open descriptors\n");
	return -1;
}

int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (getenv("VGPUHA_ENDPOINT")) {
		if ((apfd = node_aperture()) < 0) return 1;
		printf("fd=%d addr=%lu\n", apfd, (unsigned long)ap);
		return serve();
	}
	int fd = memfd_create("vgpuha-test-aperture", MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, PAGES * 4096) != 0) { perror("memfd"); return 1; }
	ap = mmap(NULL, PAGES * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ap == MAP_FAILED) { perror("mmap"); return 1; }
	// As the guest driver does: size sealed, mapping kept from children.
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) || madvise(ap, PAGES * 4096, MADV_DONTFORK)) { perror("seal"); return 1; }
	apfd = fd;
	printf("fd=%d addr=%lu\n", fd, (unsigned long)ap);
	return serve();
}

// serve runs the commands on stdin, one per line, each answered "done".
static int serve(void) {
	char line[128];
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "run forms", 9) == 0) forms();
		else if (strncmp(line, "run fallback", 12) == 0) fallback();
		else if (strncmp(line, "run torture", 11) == 0) torture();
		else if (strncmp(line, "run movs", 8) == 0) movs();
		else if (strncmp(line, "run guestrw", 11) == 0) guestrw();
		else if (strncmp(line, "run altstack", 12) == 0) altstack();
		else if (strncmp(line, "run remap", 9) == 0) remap(strncmp(line, "run remap again", 15) == 0);
		else if (strncmp(line, "run odirect ", 12) == 0) odirect(atoi(line + 12));
		else if (strncmp(line, "run pread ", 10) == 0) { int pg = 0, touch = 0; sscanf(line + 10, "%d %d", &pg, &touch); readinto(pg, touch); }
		else if (strncmp(line, "run guestro ", 12) == 0) { line[strcspn(line, "\n")] = 0; guestro(line + 12); }
		else if (strncmp(line, "bypass ", 7) == 0) { line[strcspn(line, "\n")] = 0; bypass(line + 7); }
		else if (strncmp(line, "arm", 3) == 0 && arm() < 0) perror("error: arm");
		else if (strncmp(line, "exit", 4) == 0) return 0;
		printf("done\n");
	}
	return 0;
}
