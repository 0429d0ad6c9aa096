/* libdeep.so: a library that engines dlopen() with RTLD_DEEPBIND; it calls hipHostRegister directly
 * (bound to its own dependency, the stand-in libamdhip64.so) and through dlopen + dlsym. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

int hipHostRegister(void *p, size_t n, unsigned flags);
int hipHostUnregister(void *p);

int deep_register(void *p, size_t n) { return hipHostRegister(p, n, 0); }
int deep_unregister(void *p) { return hipHostUnregister(p); }

int deep_register_dlsym(void *p, size_t n) {
    void *h = dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL);
    int (*fn)(void *, size_t, unsigned) = h ? (int (*)(void *, size_t, unsigned))dlsym(h, "hipHostRegister") : NULL;
    return fn ? fn(p, n, 0) : -1;
}

int hipHostMalloc(void **pp, size_t n, unsigned flags);
int hipHostFree(void *p);
int deep_host_malloc(void **pp, size_t n, unsigned flags) { return hipHostMalloc(pp, n, flags); }
int deep_host_free(void *p) { return hipHostFree(p); }
