/* A stand-in libcuda.so.1 (driver API): cuMemHostRegister(_v2) as standin_common.h describes, and
 * cuGetProcAddress(_v2), through which runtimes find the driver's entry points; pinned host memory. */
#include "standin_common.h"

static int driver_register(void *p, size_t n, unsigned flags) {
    (void)flags;
    return standin_register("cuMemHostRegister", p, n);
}

static int driver_unregister(void *p) {
    (void)p;
    return 0;
}

int cuMemHostRegister_v2(void *p, size_t n, unsigned flags) { return driver_register(p, n, flags); }
int cuMemHostRegister(void *p, size_t n, unsigned flags) { return driver_register(p, n, flags); }
int cuMemHostUnregister(void *p) { return driver_unregister(p); }

/* Pinned host memory (standin_common.h). cuMemAllocHost is cuMemAllocHost_v2 in cuda.h; the old name stays. */
static int driver_host_alloc(void **pp, size_t n, unsigned flags) {
    (void)flags;
    return standin_host_alloc(pp, n);
}
static int driver_alloc_host(void **pp, size_t n) { return standin_host_alloc(pp, n); }
static int driver_free_host(void *p) { return standin_host_free(p); }
int cuMemHostAlloc(void **pp, size_t n, unsigned flags) { return driver_host_alloc(pp, n, flags); }
int cuMemAllocHost(void **pp, size_t n) { return driver_alloc_host(pp, n); }
int cuMemAllocHost_v2(void **pp, size_t n) { return driver_alloc_host(pp, n); }
int cuMemFreeHost(void *p) { return driver_free_host(p); }

int cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    (void)version;
    (void)flags;
    if (!strcmp(symbol, "cuMemHostRegister"))
        *pfn = (void *)driver_register;
    else if (!strcmp(symbol, "cuMemHostUnregister"))
        *pfn = (void *)driver_unregister;
    else if (!strcmp(symbol, "cuMemHostAlloc"))
        *pfn = (void *)driver_host_alloc;
    else if (!strcmp(symbol, "cuMemAllocHost"))  /* the base name; the driver hands out the _v2 function */
        *pfn = (void *)driver_alloc_host;
    else if (!strcmp(symbol, "cuMemFreeHost"))
        *pfn = (void *)driver_free_host;
    else
        return 500;  /* CUDA_ERROR_NOT_FOUND */
    return 0;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    int r = cuGetProcAddress(symbol, pfn, version, flags);
    if (status)
        *status = r == 0 ? 0 : 1;
    return r;
}
