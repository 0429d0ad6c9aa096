/* A stand-in libcudart.so.12 (runtime API): cudaHostRegister reaches the driver the way the real
 * runtime does, dlopen("libcuda.so.1") + dlsym("cuGetProcAddress_v2") + cuGetProcAddress. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

typedef int (*getproc_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*register_fn)(void *, size_t, unsigned);
typedef int (*unregister_fn)(void *);

static void *driver(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return NULL;
    getproc_fn getproc = (getproc_fn)dlsym(h, "cuGetProcAddress_v2");
    void *fn = NULL;
    int status;
    if (!getproc || getproc(name, &fn, 12000, 0, &status) != 0)
        return NULL;
    return fn;
}

int cudaHostRegister(void *p, size_t n, unsigned flags) {
    register_fn fn = (register_fn)driver("cuMemHostRegister");
    return fn ? fn(p, n, flags) : 35;  /* cudaErrorInsufficientDriver */
}

int cudaHostUnregister(void *p) {
    unregister_fn fn = (unregister_fn)driver("cuMemHostUnregister");
    return fn ? fn(p) : 35;
}

/* Pinned host memory through the driver, as the runtime does: the driver's call nested inside ours. */
typedef int (*host_alloc_fn)(void **, size_t, unsigned);
typedef int (*free_host_fn)(void *);

int cudaHostAlloc(void **pp, size_t n, unsigned flags) {
    host_alloc_fn fn = (host_alloc_fn)driver("cuMemHostAlloc");
    return fn ? fn(pp, n, flags) : 35;
}

int cudaMallocHost(void **pp, size_t n) { return cudaHostAlloc(pp, n, 0); }

int cudaFreeHost(void *p) {
    free_host_fn fn = (free_host_fn)driver("cuMemFreeHost");
    return fn ? fn(p) : 35;
}
