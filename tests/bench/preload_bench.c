/* Times hipHostRegister as the dynamic linker binds it: through libgwpreload.so when preloaded,
 * else straight into the stand-in runtime (the peer). Prints one JSON object.
 * "pinned" times hipHostMalloc + hipHostFree pairs the same way (the KFD ledger's calls): per call, the pair / 2.
 * Usage: preload_bench pass|gated|pinned N SIZE */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int hipHostRegister(void *p, size_t n, unsigned flags);
int hipHostMalloc(void **p, size_t n, unsigned flags);
int hipHostFree(void *p);

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    long n = strtol(argv[2], NULL, 10);
    size_t size = strtoull(argv[3], NULL, 10);
    static char buf[4096];
    if (!strcmp(argv[1], "pass")) {
        /* A batch: one clock read per call would cost more than what is measured. */
        for (long i = 0; i < n / 10; i++)
            hipHostRegister(buf, size, 0);
        double t0 = now_ns();
        for (long i = 0; i < n; i++)
            hipHostRegister(buf, size, 0);
        printf("{\"per_call_ns\": %.2f}\n", (now_ns() - t0) / n);
        return 0;
    }
    if (!strcmp(argv[1], "pinned")) {
        void *p = NULL;
        long bad = 0;
        for (long i = 0; i < n / 10; i++) {
            bad += hipHostMalloc(&p, size, 0) != 0;
            hipHostFree(p);
        }
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            bad += hipHostMalloc(&p, size, 0) != 0;
            bad += hipHostFree(p) != 0;
        }
        printf("{\"per_call_ns\": %.2f, \"failed\": %ld}\n", (now_ns() - t0) / (2.0 * n), bad);
        return 0;
    }
    double *t = malloc(n * sizeof *t);
    for (long i = 0; i < n; i++) {
        double t0 = now_ns();
        hipHostRegister(buf + (i % 64), size, 0);
        t[i] = now_ns() - t0;
    }
    qsort(t, n, sizeof *t, by_value);
    printf("{\"median_ns\": %.0f, \"p90_ns\": %.0f, \"p99_ns\": %.0f, \"min_ns\": %.0f}\n", t[n / 2], t[n * 9 / 10],
           t[n * 99 / 100], t[0]);
    return 0;
}
