/* A stand-in libamdhip64.so: hipHostRegister as standin_common.h describes, hipHostUnregister, and
 * hipGetProcAddress handing out this library's own functions (as ROCm's does), and pinned host memory. */
#include "standin_common.h"

int hipHostRegister(void *p, size_t n, unsigned flags) {
    (void)flags;
    return standin_register("hipHostRegister", p, n);
}

int hipHostUnregister(void *p) {
    (void)p;
    return 0;
}

static int own_register(void *p, size_t n, unsigned flags) {
    (void)flags;
    return standin_register("hipHostRegister", p, n);
}

static int own_unregister(void *p) {
    (void)p;
    return 0;
}

static int own_host_malloc(void **pp, size_t n, unsigned flags) {
    (void)flags;
    return standin_host_alloc(pp, n);
}

static int own_host_free(void *p) { return standin_host_free(p); }

int hipGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags, void *status) {
    (void)version;
    (void)flags;
    (void)status;
    if (!strcmp(symbol, "hipHostRegister"))
        *pfn = (void *)own_register;
    else if (!strcmp(symbol, "hipHostUnregister"))
        *pfn = (void *)own_unregister;
    else if (!strcmp(symbol, "hipHostMalloc"))
        *pfn = (void *)own_host_malloc;
    else if (!strcmp(symbol, "hipHostFree"))
        *pfn = (void *)own_host_free;
    else
        return 1;  /* hipErrorInvalidValue */
    return 0;
}

/* Pinned host memory (standin_common.h): every HIP spelling, all on the same books. */
int hipHostMalloc(void **pp, size_t n, unsigned flags) {
    (void)flags;
    return standin_host_alloc(pp, n);
}
int hipHostAlloc(void **pp, size_t n, unsigned flags) { return hipHostMalloc(pp, n, flags); }
int hipExtHostAlloc(void **pp, size_t n, unsigned flags) { return hipHostMalloc(pp, n, flags); }
int hipMallocHost(void **pp, size_t n) { return hipHostMalloc(pp, n, 0); }
int hipMemAllocHost(void **pp, size_t n) { return hipHostMalloc(pp, n, 0); }
int hipHostFree(void *p) { return standin_host_free(p); }
int hipFreeHost(void *p) { return standin_host_free(p); }
