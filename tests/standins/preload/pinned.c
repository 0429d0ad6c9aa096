/* An unmodified engine for the ledger tests: allocates SIZE bytes of pinned host memory through every call its
 * MODE reaches, then frees them all, and exits 0. How it reaches the calls is its MODE:
 *   linked    hipHostMalloc, hipHostAlloc, hipExtHostAlloc, hipMallocHost, hipMemAllocHost, linked (-DLINKED)
 *   dlsym     the same, dlopen("libamdhip64.so") + dlsym
 *   dlvsym    the same, dlvsym(handle, name, "hip_4.2") (ROCm versions its symbols hip_4.2)
 *   hipproc   hipGetProcAddress("hipHostMalloc"), ("hipHostFree")
 *   cuproc    cuGetProcAddress_v2("cuMemHostAlloc"), ("cuMemAllocHost"), ("cuMemFreeHost")
 *   driver    dlopen("libcuda.so.1") + dlsym: cuMemHostAlloc, cuMemAllocHost, cuMemAllocHost_v2, cuMemFreeHost
 *   cudart    dlopen("libcudart.so.12") + dlsym: cudaHostAlloc, cudaMallocHost, cudaFreeHost
 *   deepbind  libdeep.so, loaded RTLD_DEEPBIND, calls hipHostMalloc and hipHostFree itself
 * Frees alternate between the runtime's spellings (hipHostFree / hipFreeHost). PINNED_BAD_FREE=1 also frees a
 * pointer no allocation returned; PINNED_CRASH=1 stores to address 8 after a failed allocation, as the engines
 * of the arena incident did ("segfault at 8 ... error 6"). PINNED_REGISTER=N first registers N bytes with
 * hipHostRegister (linked, dlsym modes); PINNED_SERVE=1 prints "serving" and waits for SIGTERM before freeing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*alloc_fn)(void **, size_t, unsigned);
typedef int (*alloc2_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*getproc5_fn)(const char *, void **, int, uint64_t, void *);

#ifdef LINKED
int hipHostMalloc(void **, size_t, unsigned);
int hipHostAlloc(void **, size_t, unsigned);
#ifndef NO_EXT_HOST_ALLOC
int hipExtHostAlloc(void **, size_t, unsigned);
#endif
int hipMallocHost(void **, size_t);
int hipMemAllocHost(void **, size_t);
int hipHostFree(void *);
int hipFreeHost(void *);
int hipHostRegister(void *, size_t, unsigned);
#endif

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

#define MAX 8
static struct { const char *name; void *fn; int flags; } allocs[MAX];
static int nallocs;
static free_fn frees[2];

static void *must(void *p, const char *what) {
    if (!p) {
        fprintf(stderr, "pinned: %s: %s\n", what, dlerror());
        exit(3);
    }
    return p;
}

/* A runtime without one of the calls (ROCm 5.4 has no hipExtHostAlloc) is said, not fatal. */
static void add(const char *name, void *fn, int flags) {
    if (!fn) {
        printf("no %s\n", name);
        return;
    }
    allocs[nallocs].name = name;
    allocs[nallocs].fn = fn;
    allocs[nallocs++].flags = flags;
}

static void *lookup(void *h, const char *name, const char *mode) {
    if (!strcmp(mode, "dlvsym"))
        return dlvsym(h, name, "hip_4.2");
    return dlsym(h, name);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: pinned MODE SIZE\n");
        return 2;
    }
    const char *mode = argv[1];
    size_t size = strtoull(argv[2], NULL, 10);
    signal(SIGTERM, on_term);
    int (*reg)(void *, size_t, unsigned) = NULL;
#ifdef LINKED
    reg = hipHostRegister;
#endif
#ifdef LINKED
    if (!strcmp(mode, "linked")) {
        add("hipHostMalloc", (void *)hipHostMalloc, 1);
        add("hipHostAlloc", (void *)hipHostAlloc, 1);
#ifndef NO_EXT_HOST_ALLOC  /* ROCm 6 and later */
        add("hipExtHostAlloc", (void *)hipExtHostAlloc, 1);
#endif
        add("hipMallocHost", (void *)hipMallocHost, 0);
        add("hipMemAllocHost", (void *)hipMemAllocHost, 0);
        frees[0] = hipHostFree;
        frees[1] = hipFreeHost;
    }
#endif
    if (!strcmp(mode, "dlsym") || !strcmp(mode, "dlvsym")) {
        void *h = must(dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL), "dlopen libamdhip64.so");
        add("hipHostMalloc", lookup(h, "hipHostMalloc", mode), 1);
        add("hipHostAlloc", lookup(h, "hipHostAlloc", mode), 1);
        add("hipExtHostAlloc", lookup(h, "hipExtHostAlloc", mode), 1);
        add("hipMallocHost", lookup(h, "hipMallocHost", mode), 0);
        add("hipMemAllocHost", lookup(h, "hipMemAllocHost", mode), 0);
        frees[0] = (free_fn)must(lookup(h, "hipHostFree", mode), "hipHostFree");
        frees[1] = (free_fn)must(lookup(h, "hipFreeHost", mode), "hipFreeHost");
        reg = (int (*)(void *, size_t, unsigned))lookup(h, "hipHostRegister", mode);
    } else if (!strcmp(mode, "hipproc")) {
        void *h = must(dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL), "dlopen libamdhip64.so");
        getproc5_fn gp = (getproc5_fn)must(dlsym(h, "hipGetProcAddress"), "dlsym");
        void *fn = NULL;
        gp("hipHostMalloc", &fn, 600, 0, NULL);
        add("hipHostMalloc", fn, 1);
        gp("hipHostFree", (void **)&frees[0], 600, 0, NULL);
    } else if (!strcmp(mode, "cuproc")) {
        void *h = must(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "dlopen libcuda.so.1");
        getproc5_fn gp = (getproc5_fn)must(dlsym(h, "cuGetProcAddress_v2"), "dlsym");
        int status;
        void *fn = NULL;
        gp("cuMemHostAlloc", &fn, 12000, 0, &status);
        add("cuMemHostAlloc", fn, 1);
        fn = NULL;
        gp("cuMemAllocHost", &fn, 12000, 0, &status);
        add("cuMemAllocHost", fn, 0);
        gp("cuMemFreeHost", (void **)&frees[0], 12000, 0, &status);
    } else if (!strcmp(mode, "driver")) {
        void *h = must(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "dlopen libcuda.so.1");
        add("cuMemHostAlloc", dlsym(h, "cuMemHostAlloc"), 1);
        add("cuMemAllocHost", dlsym(h, "cuMemAllocHost"), 0);
        add("cuMemAllocHost_v2", dlsym(h, "cuMemAllocHost_v2"), 0);
        frees[0] = (free_fn)must(dlsym(h, "cuMemFreeHost"), "cuMemFreeHost");
    } else if (!strcmp(mode, "cudart")) {
        void *h = must(dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL), "dlopen libcudart.so.12");
        add("cudaHostAlloc", dlsym(h, "cudaHostAlloc"), 1);
        add("cudaMallocHost", dlsym(h, "cudaMallocHost"), 0);
        frees[0] = (free_fn)must(dlsym(h, "cudaFreeHost"), "cudaFreeHost");
    } else if (!strcmp(mode, "deepbind")) {
        void *h = must(dlopen("libdeep.so", RTLD_NOW | RTLD_DEEPBIND), "dlopen libdeep.so");
        add("hipHostMalloc", dlsym(h, "deep_host_malloc"), 1);
        frees[0] = (free_fn)must(dlsym(h, "deep_host_free"), "deep_host_free");
    }
    if (!nallocs || !frees[0]) {
        fprintf(stderr, "pinned: unknown mode %s\n", mode);
        return 2;
    }
    printf("pinned pid %d starting (%s)\n", (int)getpid(), mode);
    if (getenv("PINNED_REGISTER") && reg) {
        static char arena[4096];
        printf("register returned %d\n", reg(arena, strtoull(getenv("PINNED_REGISTER"), NULL, 10), 0));
    }
    void *got[MAX] = {0};
    int failed = 0;
    for (int i = 0; i < nallocs; i++) {
        /* Flags as engines pass them: hipHostMallocPortable | hipHostMallocMapped (1 | 2), the same in CUDA. */
        int r = allocs[i].flags ? ((alloc_fn)allocs[i].fn)(&got[i], size, 3)
                                : ((alloc2_fn)allocs[i].fn)(&got[i], size);
        printf("alloc %s returned %d\n", allocs[i].name, r);
        failed |= r != 0;
    }
    fflush(stdout);
    if (failed && getenv("PINNED_CRASH")) {
        volatile long *bad = (volatile long *)(uintptr_t)8;
        *bad = 0;
    }
    if (getenv("PINNED_SERVE")) {
        printf("session is up\nserving\n");
        fflush(stdout);
        while (!stop)
            pause();
    }
    for (int i = 0; i < nallocs; i++)
        if (got[i])
            printf("free returned %d\n", frees[frees[1] && i % 2 ? 1 : 0](got[i]));
    if (getenv("PINNED_BAD_FREE")) {
        static char not_ours[3 * 4096];
        printf("bad free returned %d\n", frees[0](not_ours + 2 * 4096));
    }
    printf("done\n");
    return 0;
}
