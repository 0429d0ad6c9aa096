/* Times a runtime's own pinned allocation and free, reached as engines reach them (dlopen + dlsym), so that
 * the same program measures the call with libgwpreload.so preloaded and without it (the peer).
 * Usage: pinned_real_bench LIBRARY ALLOC FREE N SIZE   e.g. libcudart.so.12 cudaHostAlloc cudaFreeHost 20000 4096
 * ALLOC takes (void **, size_t, unsigned flags); flags 0. Prints one JSON object: per-call ns (a pair / 2). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*alloc_fn)(void **, size_t, unsigned);
typedef int (*free_fn)(void *);

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 6)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    alloc_fn alloc = h ? (alloc_fn)dlsym(h, argv[2]) : NULL;
    free_fn release = h ? (free_fn)dlsym(h, argv[3]) : NULL;
    if (!alloc || !release) {
        fprintf(stderr, "pinned_real_bench: %s\n", dlerror());
        return 3;
    }
    long n = strtol(argv[4], NULL, 10);
    size_t size = strtoull(argv[5], NULL, 10);
    long bad = 0;
    void *p = NULL;
    for (long i = 0; i < n / 10 + 1; i++) {  /* the first call initialises the runtime and its context */
        bad += alloc(&p, size, 0) != 0;
        release(p);
    }
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        bad += alloc(&p, size, 0) != 0;
        bad += release(p) != 0;
    }
    printf("{\"per_call_ns\": %.1f, \"failed\": %ld}\n", (now_ns() - t0) / (2.0 * n), bad);
    return 0;
}
