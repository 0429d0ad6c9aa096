/* standin_common.h: what the stand-in runtimes share: a registration that sleeps, counts the callers
 * inside it at once through lock files in $STANDIN_DIR, and faults when $STANDIN_FAULT_AT overlap.
 * The fault is a real store to address 8, as in the incident ("segfault at 8 ... error 6").
 * $STANDIN_RESULT is what the call returns (default 0, success). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

static double standin_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long standin_env(const char *name, long fallback) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : fallback;
}

/* Callers inside a registration now: lock files whose flock a live process holds. */
static int standin_inside(const char *dir) {
    int count = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "inside-", 7))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        if (flock(fd, LOCK_SH | LOCK_NB) != 0)
            count++;
        else
            flock(fd, LOCK_UN);
        close(fd);
    }
    closedir(d);
    return count;
}

static void standin_log(const char *dir, const char *line) {
    char path[4096];
    snprintf(path, sizeof path, "%s/calls.log", dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd >= 0) {
        (void)!write(fd, line, strlen(line));
        close(fd);
    }
}

static int standin_register(const char *call, void *p, size_t n) {
    (void)p;
    static const char *dir;
    static long ms = -1, fault_at, result;
    if (ms < 0) {  /* read once: the benchmark times this call as the peer of the interposer's */
        dir = getenv("STANDIN_DIR");
        fault_at = standin_env("STANDIN_FAULT_AT", 3);
        result = standin_env("STANDIN_RESULT", 0);  /* e.g. 1061, hipErrorHostMemoryAlreadyRegistered */
        ms = standin_env("STANDIN_REGISTER_MS", 200);
    }
    if (!dir && ms == 0)
        return (int)result;
    double start = standin_now();
    int fd = -1, most = 0;
    char marker[4096];
    if (dir) {
        snprintf(marker, sizeof marker, "%s/inside-%d", dir, (int)getpid());
        fd = open(marker, O_RDWR | O_CREAT, 0600);
        flock(fd, LOCK_EX);
    }
    while (standin_now() - start < ms / 1000.0) {
        if (dir) {
            int inside = standin_inside(dir);
            if (inside > most)
                most = inside;
            if (fault_at && inside >= fault_at) {
                char line[256];
                snprintf(line, sizeof line, "fault %d %s inside=%d\n", (int)getpid(), call, inside);
                standin_log(dir, line);
                fprintf(stderr, "stand-in %s: %d registrations overlap, faulting\n", call, inside);
                volatile long *bad = (volatile long *)(uintptr_t)standin_env("STANDIN_FAULT_ADDR", 8);
                *bad = 0;
            }
        }
        struct timespec pause = {0, 5 * 1000000L};
        nanosleep(&pause, NULL);
    }
    if (dir) {
        char line[256];
        snprintf(line, sizeof line, "call %d %s %.6f %.6f %zu %d\n", (int)getpid(), call, start, standin_now(), n, most);
        standin_log(dir, line);
        unlink(marker);
        close(fd);
    }
    return (int)result;
}

/* ---- pinned host memory ---------------------------------------------------------------------------
 * An allocation is a page of bookkeeping (magic, size) and then the caller's bytes, so that a free of a
 * pointer no allocation returned fails as the real runtimes do (invalid value). Allocations past
 * $STANDIN_PINNED_LIMIT live bytes fail with `oom` (2 in every runtime: hipErrorOutOfMemory,
 * cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY), as KFD's system-memory limit makes them fail. */
#include <pthread.h>
#include <stdatomic.h>

#define STANDIN_PAGE 4096
#define STANDIN_MAGIC 0x70696e6e6564ul  /* "pinned" */

static atomic_size_t standin_pinned;

static int standin_host_alloc(void **pp, size_t n) {
    if (!pp)
        return 1;
    *pp = NULL;
    long limit = standin_env("STANDIN_PINNED_LIMIT", 0);
    if (limit && standin_pinned + n > (size_t)limit)
        return 2;
    /* Only the bookkeeping page is touched: a "GiB" allocation costs no memory until written. */
    char *base = malloc(STANDIN_PAGE + (n < 64 ? 64 : n));
    if (!base)
        return 2;
    ((unsigned long *)base)[0] = STANDIN_MAGIC;
    ((size_t *)base)[1] = n;
    standin_pinned += n;
    *pp = base + STANDIN_PAGE;
    return 0;
}

static int standin_host_free(void *p) {
    if (!p)
        return 0;
    char *base = (char *)p - STANDIN_PAGE;
    if (((unsigned long *)base)[0] != STANDIN_MAGIC)
        return 1;
    ((unsigned long *)base)[0] = 0;
    standin_pinned -= ((size_t *)base)[1];
    free(base);
    return 0;
}
