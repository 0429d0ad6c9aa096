/* A stand-in libamdhip64.so: hipHostRegister as standin_common.h describes, hipHostUnregister, and
 * hipGetProcAddress handing out this library's own functions (as ROCm's does). */
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

int hipGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags, void *status) {
    (void)version;
    (void)flags;
    (void)status;
    if (!strcmp(symbol, "hipHostRegister"))
        *pfn = (void *)own_register;
    else if (!strcmp(symbol, "hipHostUnregister"))
        *pfn = (void *)own_unregister;
    else
        return 1;  /* hipErrorInvalidValue */
    return 0;
}
