/* ledger.c: the KFD ledger: every pinned host allocation (hipHostMalloc, cudaHostAlloc, cuMemHostAlloc...)
 * and its free, kept as running totals in the engine and reported through the status protocol.
 *
 * Why: KFD charges each pinned host allocation to the same node-wide system-memory counter as a host
 * registration (amdgpu_amdkfd_gpuvm.c, amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu -> amdgpu_amdkfd_reserve_mem_limit
 * for GTT and USERPTR objects). An engine whose registration fit may still fail its next pinned allocation.
 *
 * Cost: the common call (under GPUWARDEN_LEDGER_THRESHOLD, succeeded) takes one uncontended mutex and a hash
 * table step; no line is written for it. A failed call, and one of threshold bytes or more, writes its own line
 * at once, before the engine sees the result (a crash right after must not lose it). Small calls' totals go out
 * with the next line, at most a second late while the engine keeps calling, and when the process exits. */
#include "gwpreload.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* Live allocations: pointer -> bytes, open addressing with linear probing (frees name only the pointer). */
#ifndef GW_LIVE_CAP
#define GW_LIVE_CAP (1u << 16)  /* the tests build a small one, to fill probe chains */
#endif
#define LIVE_CAP ((unsigned)GW_LIVE_CAP)
static struct live { uintptr_t p; size_t n; } live[LIVE_CAP];
static unsigned live_used;

static struct gw_ledger totals;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t last_sent_ns, last_changed_ns;  /* monotonic ns, under mu */

#define FLUSH_NS 1000000000ull  /* a small call's totals are written at most this late (while calls go on) */

static unsigned slot_of(uintptr_t p) {
    /* Pinned buffers are page aligned: drop the low bits before mixing. */
    uint64_t h = (uint64_t)(p >> 12) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 48) & (LIVE_CAP - 1);
}

static int live_add(uintptr_t p, size_t n) {
    if (live_used >= LIVE_CAP - LIVE_CAP / 8)
        return 0;  /* too full to probe cheaply: counted, not tracked */
    unsigned i = slot_of(p);
    while (live[i].p && live[i].p != p)
        i = (i + 1) & (LIVE_CAP - 1);
    if (!live[i].p)
        live_used++;
    live[i].p = p;
    live[i].n = n;
    return 1;
}

/* Remove p; its bytes, or 0 when it was never tracked. Backward-shift deletion keeps probe chains whole. */
static size_t live_take(uintptr_t p) {
    unsigned i = slot_of(p);
    while (live[i].p != p) {
        if (!live[i].p)
            return 0;
        i = (i + 1) & (LIVE_CAP - 1);
    }
    size_t n = live[i].n;
    unsigned hole = i;
    for (unsigned j = (i + 1) & (LIVE_CAP - 1); live[j].p; j = (j + 1) & (LIVE_CAP - 1)) {
        unsigned home = slot_of(live[j].p);
        /* j's entry may move into the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            live[hole] = live[j];
            hole = j;
        }
    }
    live[hole].p = 0;
    live[hole].n = 0;
    live_used--;
    return n;
}

static int worth_a_line(uint64_t now_ns) {
    return totals.pending && now_ns - last_sent_ns >= FLUSH_NS;
}

int gw_ledger_alloc(void *p, size_t n, int result, uint64_t now_ns, struct gw_ledger *out) {
    pthread_mutex_lock(&mu);
    if (result == 0 && p) {
        totals.allocs++;
        totals.alloc_bytes += n;
        totals.pinned_bytes += n;
        totals.pinned_count++;
        if (totals.pinned_bytes > totals.peak_bytes)
            totals.peak_bytes = totals.pinned_bytes;
        if (!live_add((uintptr_t)p, n))
            totals.untracked++;
    } else if (result != 0) {
        totals.failed++;
    }
    totals.pending = 1;
    last_changed_ns = now_ns;
    int send = worth_a_line(now_ns);
    *out = totals;
    pthread_mutex_unlock(&mu);
    return send;
}

size_t gw_ledger_forget(void *p) {
    pthread_mutex_lock(&mu);
    size_t n = live_take((uintptr_t)p);
    pthread_mutex_unlock(&mu);
    return n;
}

int gw_ledger_free(void *p, size_t n, int result, uint64_t now_ns, struct gw_ledger *out) {
    pthread_mutex_lock(&mu);
    if (result == 0) {
        totals.frees++;
        if (n) {
            totals.pinned_bytes -= n;
            totals.pinned_count--;
        } else {
            totals.unknown_frees++;  /* not allocated through a call we saw (or not tracked) */
        }
    } else {
        totals.failed++;
        if (n && !live_add((uintptr_t)p, n))  /* still allocated: keep it on the books */
            totals.untracked++;
    }
    totals.pending = 1;
    last_changed_ns = now_ns;
    int send = worth_a_line(now_ns);
    *out = totals;
    pthread_mutex_unlock(&mu);
    return send;
}

void gw_ledger_sent(uint64_t now_ns) {
    pthread_mutex_lock(&mu);
    last_sent_ns = now_ns;
    if (last_changed_ns <= now_ns)
        totals.pending = 0;
    pthread_mutex_unlock(&mu);
}

void gw_ledger_emit_totals(const char *phase, const struct gw_ledger *t) {
    gw_emit(phase, ",\"pinned_bytes\":%zu,\"pinned_count\":%zu,\"peak_bytes\":%zu,\"allocs\":%zu,\"frees\":%zu,"
            "\"alloc_bytes\":%zu,\"failed\":%zu,\"untracked\":%zu,\"unknown_frees\":%zu",
            t->pinned_bytes, t->pinned_count, t->peak_bytes, t->allocs, t->frees, t->alloc_bytes, t->failed,
            t->untracked, t->unknown_frees);
}

/* A child starts with its parent's pointers but none of its calls: the books start empty. */
static void after_fork_child(void) {
    pthread_mutex_init(&mu, NULL);
    memset(&totals, 0, sizeof totals);
    if (live_used)  /* untouched pages stay shared with the parent */
        memset(live, 0, sizeof live);
    live_used = 0;
    last_sent_ns = last_changed_ns = 0;
}

__attribute__((constructor)) static void ledger_init(void) {
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* What small calls changed since the last line, once more as the process ends normally. */
__attribute__((destructor)) static void ledger_fini(void) {
    struct gw_ledger t;
    pthread_mutex_lock(&mu);
    t = totals;
    pthread_mutex_unlock(&mu);
    if (t.pending)
        gw_ledger_emit_totals("host-ledger", &t);
}
