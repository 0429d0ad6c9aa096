/* A stand-in libcuda.so.1 (driver API): cuMemHostRegister(_v2) as standin_common.h describes, and
 * cuGetProcAddress(_v2), through which runtimes find the driver's entry points. */
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

int cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    (void)version;
    (void)flags;
    if (!strcmp(symbol, "cuMemHostRegister"))
        *pfn = (void *)driver_register;
    else if (!strcmp(symbol, "cuMemHostUnregister"))
        *pfn = (void *)driver_unregister;
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
