/* interpose.c: the interposed calls: the host-registration entry points, the pinned host allocations and
 * frees (the KFD ledger, ledger.c), the get-proc-address calls that hand them out, and dlsym/dlvsym/dlopen,
 * which would otherwise hand out the real ones. */
#include "gwpreload.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GW_EXPORT __attribute__((visibility("default")))

enum {
    A_HIP_REGISTER, A_HIP_UNREGISTER, A_CUDA_REGISTER, A_CUDA_UNREGISTER,
    A_CU_REGISTER, A_CU_REGISTER_V2, A_CU_UNREGISTER,
    A_CU_GETPROC, A_CU_GETPROC_V2, A_CU_GETPROC_V2_PTSZ, A_HIP_GETPROC,
    A_HIP_HOST_MALLOC, A_HIP_HOST_ALLOC, A_HIP_EXT_HOST_ALLOC, A_HIP_MALLOC_HOST, A_HIP_MEM_ALLOC_HOST,
    A_HIP_HOST_FREE, A_HIP_FREE_HOST,
    A_CUDA_HOST_ALLOC, A_CUDA_MALLOC_HOST, A_CUDA_FREE_HOST,
    A_CU_HOST_ALLOC, A_CU_ALLOC_HOST, A_CU_ALLOC_HOST_V2, A_CU_FREE_HOST,
    A_COUNT
};

const struct gw_api gw_apis[] = {
    [A_HIP_REGISTER] = {"hipHostRegister", GW_REGISTER},
    [A_HIP_UNREGISTER] = {"hipHostUnregister", GW_UNREGISTER},
    [A_CUDA_REGISTER] = {"cudaHostRegister", GW_REGISTER},
    [A_CUDA_UNREGISTER] = {"cudaHostUnregister", GW_UNREGISTER},
    [A_CU_REGISTER] = {"cuMemHostRegister", GW_REGISTER},
    [A_CU_REGISTER_V2] = {"cuMemHostRegister_v2", GW_REGISTER},
    [A_CU_UNREGISTER] = {"cuMemHostUnregister", GW_UNREGISTER},
    [A_CU_GETPROC] = {"cuGetProcAddress", GW_GETPROC},
    [A_CU_GETPROC_V2] = {"cuGetProcAddress_v2", GW_GETPROC},
    [A_CU_GETPROC_V2_PTSZ] = {"cuGetProcAddress_v2_ptsz", GW_GETPROC},
    [A_HIP_GETPROC] = {"hipGetProcAddress", GW_GETPROC},
    /* Pinned host memory. Signatures from HIP's hip_runtime_api.h (hipHostMalloc, hipHostAlloc, hipExtHostAlloc:
     * (void **ptr, size_t size, unsigned flags); hipMallocHost, hipMemAllocHost: (void **ptr, size_t size);
     * hipHostFree, hipFreeHost: (void *ptr)), CUDA's cuda_runtime_api.h (cudaHostAlloc(void **, size_t, unsigned),
     * cudaMallocHost(void **, size_t), cudaFreeHost(void *)) and cuda.h (cuMemHostAlloc(void **, size_t, unsigned),
     * cuMemAllocHost, #defined to cuMemAllocHost_v2 since CUDA 3.2 (void **, size_t), cuMemFreeHost(void *)).
     * cudaMallocHost's C++ overload with flags is inline in cuda_runtime.h and reaches cudaHostAlloc. */
    [A_HIP_HOST_MALLOC] = {"hipHostMalloc", GW_ALLOC},
    [A_HIP_HOST_ALLOC] = {"hipHostAlloc", GW_ALLOC},
    [A_HIP_EXT_HOST_ALLOC] = {"hipExtHostAlloc", GW_ALLOC},
    [A_HIP_MALLOC_HOST] = {"hipMallocHost", GW_ALLOC_NOFLAGS},
    [A_HIP_MEM_ALLOC_HOST] = {"hipMemAllocHost", GW_ALLOC_NOFLAGS},
    [A_HIP_HOST_FREE] = {"hipHostFree", GW_FREE},
    [A_HIP_FREE_HOST] = {"hipFreeHost", GW_FREE},
    [A_CUDA_HOST_ALLOC] = {"cudaHostAlloc", GW_ALLOC},
    [A_CUDA_MALLOC_HOST] = {"cudaMallocHost", GW_ALLOC_NOFLAGS},
    [A_CUDA_FREE_HOST] = {"cudaFreeHost", GW_FREE},
    [A_CU_HOST_ALLOC] = {"cuMemHostAlloc", GW_ALLOC},
    [A_CU_ALLOC_HOST] = {"cuMemAllocHost", GW_ALLOC_NOFLAGS},
    [A_CU_ALLOC_HOST_V2] = {"cuMemAllocHost_v2", GW_ALLOC_NOFLAGS},
    [A_CU_FREE_HOST] = {"cuMemFreeHost", GW_FREE},
};

int gw_api_index(const char *name) {
    if (!name || !((name[0] == 'h' && name[1] == 'i') || (name[0] == 'c' && name[1] == 'u')))
        return -1;
    for (int i = 0; i < A_COUNT; i++)
        if (strcmp(name, gw_apis[i].name) == 0)
            return i;
    return -1;
}

/* Calls nested inside a gated one (cudaHostRegister reaching cuMemHostRegister) pass straight through. */
static __thread int depth __attribute__((tls_model("initial-exec")));
/* The same for the ledger: cudaMallocHost reaching cuMemAllocHost, an old hipMallocHost calling hipHostMalloc. */
static __thread int ledger_depth __attribute__((tls_model("initial-exec")));

/* ---- bindings: one wrapper function per (call, real function it forwards to) -------------------- */

struct binding {
    void *_Atomic real;
    int api;
    int has_status;      /* get-proc-address: the 5-argument form with a status pointer */
    const char *via;     /* how the engine found it: symbol, dlsym, procaddress, deepbind */
};

typedef int (*register_fn)(void *, size_t, unsigned);
typedef int (*unregister_fn)(void *);
typedef int (*getproc4_fn)(const char *, void **, int, uint64_t);
typedef int (*getproc5_fn)(const char *, void **, int, uint64_t, void *);
typedef int (*alloc_fn)(void **, size_t, unsigned);
typedef int (*alloc2_fn)(void **, size_t);
typedef int (*free_fn)(void *);

static void *real_of(struct binding *b, const void *caller) {
    void *real = atomic_load_explicit(&b->real, memory_order_acquire);
    if (!real) {
        real = gw_find_real(gw_apis[b->api].name, caller);
        if (real)
            atomic_store_explicit(&b->real, real, memory_order_release);
    }
    return real;
}

/* ---- what happens around a registration --------------------------------------------------------- */

#define NTRACK 256
static struct { void *p; size_t n; } tracked[NTRACK];
static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;

/* Registrations we gated, so that their unregistration is gated too (it takes only the pointer). */
static void remember(void *p, size_t n) {
    pthread_mutex_lock(&track_mu);
    for (int i = 0; i < NTRACK; i++)
        if (!tracked[i].p) {
            tracked[i].p = p;
            tracked[i].n = n;
            break;
        }
    pthread_mutex_unlock(&track_mu);
}

static size_t forget(void *p) {
    size_t n = 0;
    pthread_mutex_lock(&track_mu);
    for (int i = 0; i < NTRACK; i++)
        if (tracked[i].p == p) {
            n = tracked[i].n;
            tracked[i].p = NULL;
            break;
        }
    pthread_mutex_unlock(&track_mu);
    return n;
}

static const char *slot_text(int slot, char *buf, size_t cap) {
    if (slot < 0)
        return "null";
    snprintf(buf, cap, "%d", slot);
    return buf;
}

static int do_register(struct binding *b, const void *caller, void *p, size_t n, unsigned flags) {
    register_fn real = (register_fn)real_of(b, caller);
    if (!real)
        return GW_ERROR_UNKNOWN;
    if (n < gw_cfg.threshold || depth > 0)
        return real(p, n, flags);
    gw_config_load();
    if (n < gw_cfg.threshold)
        return real(p, n, flags);
    depth++;
    const char *call = gw_apis[b->api].name;
    struct gw_ticket t;
    char s[16];
    gw_gate_enter(&t, call, n);
    gw_emit("registering", ",\"call\":\"%s\",\"bytes\":%zu,\"slot\":%s,\"wait_s\":%.6f,\"via\":\"%s\"",
            call, n, slot_text(t.slot, s, sizeof s), t.wait_s, b->via);
    double t0 = gw_mono();
    int r = real(p, n, flags);
    double took = gw_mono() - t0;
    if (r == 0)
        remember(p, n);
    int late = gw_gate_settle(&t);
    gw_emit(r == 0 ? "registered" : "register-failed",
            ",\"call\":\"%s\",\"bytes\":%zu,\"seconds\":%.6f,\"wait_s\":%.6f,\"result\":%d,\"slot\":%s,"
            "\"via\":\"%s\"%s",
            call, n, took, t.wait_s, r, slot_text(t.slot, s, sizeof s), b->via, late ? ",\"late\":true" : "");
    gw_gate_leave(&t, r == 0);  /* after the line: a failed call has nothing to hold the slot for */
    depth--;
    return r;
}

static int do_unregister(struct binding *b, const void *caller, void *p) {
    unregister_fn real = (unregister_fn)real_of(b, caller);
    if (!real)
        return GW_ERROR_UNKNOWN;
    size_t n;
    if (depth > 0 || (n = forget(p)) == 0)
        return real(p);
    depth++;
    const char *call = gw_apis[b->api].name;
    struct gw_ticket t;
    char s[16];
    gw_gate_enter(&t, call, n);
    gw_emit("unregistering", ",\"call\":\"%s\",\"bytes\":%zu,\"slot\":%s,\"wait_s\":%.6f,\"via\":\"%s\"",
            call, n, slot_text(t.slot, s, sizeof s), t.wait_s, b->via);
    double t0 = gw_mono();
    int r = real(p);
    double took = gw_mono() - t0;
    if (r != 0)
        remember(p, n);
    gw_gate_settle(&t);
    gw_emit(r == 0 ? "unregistered" : "unregister-failed",
            ",\"call\":\"%s\",\"bytes\":%zu,\"seconds\":%.6f,\"result\":%d,\"via\":\"%s\"",
            call, n, took, r, b->via);
    gw_gate_leave(&t, 0);
    depth--;
    return r;
}

/* ---- what happens around a pinned allocation or free (the KFD ledger) --------------------------- */

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void emit_host_call(const char *phase, const struct binding *b, void *p, size_t n, long flags, int r,
                           uint64_t took_ns, const struct gw_ledger *t) {
    char fl[24];
    if (flags < 0)
        strcpy(fl, "null");
    else
        snprintf(fl, sizeof fl, "%ld", flags);
    gw_emit(phase, ",\"call\":\"%s\",\"bytes\":%zu,\"flags\":%s,\"result\":%d,\"seconds\":%.6f,\"ptr\":\"%p\","
            "\"via\":\"%s\",\"pinned_bytes\":%zu,\"pinned_count\":%zu,\"peak_bytes\":%zu,\"allocs\":%zu,"
            "\"frees\":%zu,\"alloc_bytes\":%zu,\"failed\":%zu,\"untracked\":%zu,\"unknown_frees\":%zu",
            gw_apis[b->api].name, n, fl, r, took_ns / 1e9, p, b->via, t->pinned_bytes, t->pinned_count,
            t->peak_bytes, t->allocs, t->frees, t->alloc_bytes, t->failed, t->untracked, t->unknown_frees);
}

/* `flags` < 0: the call takes none. A failed call, or one of ledger_threshold bytes or more, is written before
 * the engine sees its result; smaller ones only move the totals (ledger.c says when those are written). */
static int do_alloc(struct binding *b, const void *caller, void **pp, size_t n, long flags) {
    void *real = real_of(b, caller);
    if (!real)
        return GW_ERROR_UNKNOWN;
    if (ledger_depth > 0)
        return flags >= 0 ? ((alloc_fn)real)(pp, n, (unsigned)flags) : ((alloc2_fn)real)(pp, n);
    ledger_depth++;
    uint64_t t0 = mono_ns();
    int r = flags >= 0 ? ((alloc_fn)real)(pp, n, (unsigned)flags) : ((alloc2_fn)real)(pp, n);
    uint64_t t1 = mono_ns();
    gw_config_load();
    void *p = r == 0 && pp ? *pp : NULL;
    struct gw_ledger t;
    int due = gw_ledger_alloc(p, n, r, t1, &t);
    if (r != 0 || n >= gw_cfg.ledger_threshold) {
        emit_host_call(r == 0 ? "host-alloc" : "host-alloc-failed", b, p, n, flags, r, t1 - t0, &t);
        gw_ledger_sent(t1);
    } else if (due) {
        gw_ledger_emit_totals("host-ledger", &t);
        gw_ledger_sent(t1);
    }
    ledger_depth--;
    return r;
}

static int do_free(struct binding *b, const void *caller, void *p) {
    free_fn real = (free_fn)real_of(b, caller);
    if (!real)
        return GW_ERROR_UNKNOWN;
    if (ledger_depth > 0 || !p)
        return real(p);
    ledger_depth++;
    /* Off the books before the call: once freed, another thread may be handed the same address. */
    size_t n = gw_ledger_forget(p);
    uint64_t t0 = mono_ns();
    int r = real(p);
    uint64_t t1 = mono_ns();
    gw_config_load();
    struct gw_ledger t;
    int due = gw_ledger_free(p, n, r, t1, &t);
    if (r != 0 || n >= gw_cfg.ledger_threshold) {
        emit_host_call(r == 0 ? "host-free" : "host-free-failed", b, p, n, -1, r, t1 - t0, &t);
        gw_ledger_sent(t1);
    } else if (due) {
        gw_ledger_emit_totals("host-ledger", &t);
        gw_ledger_sent(t1);
    }
    ledger_depth--;
    return r;
}

/* The 4-argument cuGetProcAddress answers "cuGetProcAddress" itself with the 5-argument form from 12.0. */
static int getproc_has_status(int api, int version) {
    if (api == A_CU_GETPROC)
        return version >= 12000;
    return 1;
}

static int do_getproc(struct binding *b, const void *caller, const char *sym, void **pfn, int version,
                      uint64_t flags, void *status) {
    void *real = real_of(b, caller);
    if (!real)
        return GW_ERROR_UNKNOWN;
    int r = b->has_status ? ((getproc5_fn)real)(sym, pfn, version, flags, status)
                          : ((getproc4_fn)real)(sym, pfn, version, flags);
    if (r == 0 && sym && pfn && *pfn) {
        int api = gw_api_index(sym);
        if (api >= 0 && !gw_is_ours(*pfn))
            *pfn = gw_bind(api, *pfn, "procaddress",
                           gw_apis[api].kind == GW_GETPROC ? getproc_has_status(api, version) : 0);
    }
    return r;
}

/* ---- the wrapper functions: NBIND of each kind, each bound to one real function ----------------- */

/* Per kind: each (real function, call, way it was reached) takes one; the ledger's kinds hold up to 5 calls x 3 ways
 * per runtime copy. */
#define NBIND 32
static struct binding bind_tab[GW_KINDS][NBIND];
static atomic_int bind_used[GW_KINDS];

/* These are bound to a known real function, so they need no caller to find it. */
#define REG_W(i) static int reg_w##i(void *p, size_t n, unsigned f) { \
        return do_register(&bind_tab[GW_REGISTER][i], NULL, p, n, f); }
#define UNREG_W(i) static int unreg_w##i(void *p) { return do_unregister(&bind_tab[GW_UNREGISTER][i], NULL, p); }
#define GP_W(i) static int gp_w##i(const char *s, void **pfn, int v, uint64_t fl, void *st) { \
        return do_getproc(&bind_tab[GW_GETPROC][i], NULL, s, pfn, v, fl, st); }
#define SIXTEEN(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define THIRTYTWO(M) SIXTEEN(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27) M(28) \
    M(29) M(30) M(31)
#define ALLOC_W(i) static int alloc_w##i(void **pp, size_t n, unsigned f) { \
        return do_alloc(&bind_tab[GW_ALLOC][i], NULL, pp, n, (long)f); }
#define ALLOC2_W(i) static int alloc2_w##i(void **pp, size_t n) { \
        return do_alloc(&bind_tab[GW_ALLOC_NOFLAGS][i], NULL, pp, n, -1); }
#define FREE_W(i) static int free_w##i(void *p) { return do_free(&bind_tab[GW_FREE][i], NULL, p); }
THIRTYTWO(REG_W)
THIRTYTWO(UNREG_W)
THIRTYTWO(GP_W)
THIRTYTWO(ALLOC_W)
THIRTYTWO(ALLOC2_W)
THIRTYTWO(FREE_W)
#define REF(prefix) (void *)prefix##0, (void *)prefix##1, (void *)prefix##2, (void *)prefix##3, \
    (void *)prefix##4, (void *)prefix##5, (void *)prefix##6, (void *)prefix##7, (void *)prefix##8, \
    (void *)prefix##9, (void *)prefix##10, (void *)prefix##11, (void *)prefix##12, (void *)prefix##13, \
    (void *)prefix##14, (void *)prefix##15, (void *)prefix##16, (void *)prefix##17, (void *)prefix##18, \
    (void *)prefix##19, (void *)prefix##20, (void *)prefix##21, (void *)prefix##22, (void *)prefix##23, \
    (void *)prefix##24, (void *)prefix##25, (void *)prefix##26, (void *)prefix##27, (void *)prefix##28, \
    (void *)prefix##29, (void *)prefix##30, (void *)prefix##31
static void *const wrappers[GW_KINDS][NBIND] = {
    [GW_REGISTER] = {REF(reg_w)}, [GW_UNREGISTER] = {REF(unreg_w)}, [GW_GETPROC] = {REF(gp_w)},
    [GW_ALLOC] = {REF(alloc_w)}, [GW_ALLOC_NOFLAGS] = {REF(alloc2_w)}, [GW_FREE] = {REF(free_w)},
};

void *gw_bind(int api, void *real, const char *via, int has_status) {
    int kind = gw_apis[api].kind;
    struct binding *tab = bind_tab[kind];
    int used = atomic_load(&bind_used[kind]);
    for (int i = 0; i < used && i < NBIND; i++)
        if (atomic_load_explicit(&tab[i].real, memory_order_acquire) == real && tab[i].api == api &&
            tab[i].has_status == has_status && tab[i].via == via)
            return wrappers[kind][i];
    int i = atomic_fetch_add(&bind_used[kind], 1);
    if (i >= NBIND) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            gw_emit("preload-warning", ",\"message\":\"more than %d distinct %s functions: the rest pass ungated "
                    "and unrecorded\"",
                    NBIND, gw_apis[api].name);
        return real;
    }
    tab[i].api = api;
    tab[i].has_status = has_status;
    tab[i].via = via;
    atomic_store_explicit(&tab[i].real, real, memory_order_release);
    return wrappers[kind][i];
}

void *gw_wrap_found(const char *name, void *found, const char *via) {
    if (!found)
        return found;
    int api = gw_api_index(name);
    if (api < 0 || gw_is_ours(found))
        return found;
    return gw_bind(api, found, via, gw_apis[api].kind == GW_GETPROC ? getproc_has_status(api, 0) : 0);
}

/* ---- the exports: what the dynamic linker binds the engine's own references to ------------------ */

#define EXPORTED(a) {.api = (a), .via = "symbol", .has_status = 0}
static struct binding exported[A_COUNT] = {
    [A_HIP_REGISTER] = EXPORTED(A_HIP_REGISTER), [A_HIP_UNREGISTER] = EXPORTED(A_HIP_UNREGISTER),
    [A_CUDA_REGISTER] = EXPORTED(A_CUDA_REGISTER), [A_CUDA_UNREGISTER] = EXPORTED(A_CUDA_UNREGISTER),
    [A_CU_REGISTER] = EXPORTED(A_CU_REGISTER), [A_CU_REGISTER_V2] = EXPORTED(A_CU_REGISTER_V2),
    [A_CU_UNREGISTER] = EXPORTED(A_CU_UNREGISTER),
    [A_CU_GETPROC] = EXPORTED(A_CU_GETPROC),
    [A_CU_GETPROC_V2] = {.api = A_CU_GETPROC_V2, .via = "symbol", .has_status = 1},
    [A_CU_GETPROC_V2_PTSZ] = {.api = A_CU_GETPROC_V2_PTSZ, .via = "symbol", .has_status = 1},
    [A_HIP_GETPROC] = {.api = A_HIP_GETPROC, .via = "symbol", .has_status = 1},
    [A_HIP_HOST_MALLOC] = EXPORTED(A_HIP_HOST_MALLOC), [A_HIP_HOST_ALLOC] = EXPORTED(A_HIP_HOST_ALLOC),
    [A_HIP_EXT_HOST_ALLOC] = EXPORTED(A_HIP_EXT_HOST_ALLOC), [A_HIP_MALLOC_HOST] = EXPORTED(A_HIP_MALLOC_HOST),
    [A_HIP_MEM_ALLOC_HOST] = EXPORTED(A_HIP_MEM_ALLOC_HOST), [A_HIP_HOST_FREE] = EXPORTED(A_HIP_HOST_FREE),
    [A_HIP_FREE_HOST] = EXPORTED(A_HIP_FREE_HOST), [A_CUDA_HOST_ALLOC] = EXPORTED(A_CUDA_HOST_ALLOC),
    [A_CUDA_MALLOC_HOST] = EXPORTED(A_CUDA_MALLOC_HOST), [A_CUDA_FREE_HOST] = EXPORTED(A_CUDA_FREE_HOST),
    [A_CU_HOST_ALLOC] = EXPORTED(A_CU_HOST_ALLOC), [A_CU_ALLOC_HOST] = EXPORTED(A_CU_ALLOC_HOST),
    [A_CU_ALLOC_HOST_V2] = EXPORTED(A_CU_ALLOC_HOST_V2), [A_CU_FREE_HOST] = EXPORTED(A_CU_FREE_HOST),
};

#define CALLER __builtin_return_address(0)
GW_EXPORT int hipHostRegister(void *p, size_t n, unsigned f) {
    return do_register(&exported[A_HIP_REGISTER], CALLER, p, n, f);
}
GW_EXPORT int hipHostUnregister(void *p) { return do_unregister(&exported[A_HIP_UNREGISTER], CALLER, p); }
GW_EXPORT int cudaHostRegister(void *p, size_t n, unsigned f) {
    return do_register(&exported[A_CUDA_REGISTER], CALLER, p, n, f);
}
GW_EXPORT int cudaHostUnregister(void *p) { return do_unregister(&exported[A_CUDA_UNREGISTER], CALLER, p); }
GW_EXPORT int cuMemHostRegister(void *p, size_t n, unsigned f) {
    return do_register(&exported[A_CU_REGISTER], CALLER, p, n, f);
}
GW_EXPORT int cuMemHostRegister_v2(void *p, size_t n, unsigned f) {
    return do_register(&exported[A_CU_REGISTER_V2], CALLER, p, n, f);
}
GW_EXPORT int cuMemHostUnregister(void *p) { return do_unregister(&exported[A_CU_UNREGISTER], CALLER, p); }
GW_EXPORT int cuGetProcAddress(const char *s, void **pfn, int v, uint64_t fl) {
    return do_getproc(&exported[A_CU_GETPROC], CALLER, s, pfn, v, fl, NULL);
}
GW_EXPORT int cuGetProcAddress_v2(const char *s, void **pfn, int v, uint64_t fl, void *st) {
    return do_getproc(&exported[A_CU_GETPROC_V2], CALLER, s, pfn, v, fl, st);
}
GW_EXPORT int cuGetProcAddress_v2_ptsz(const char *s, void **pfn, int v, uint64_t fl, void *st) {
    return do_getproc(&exported[A_CU_GETPROC_V2_PTSZ], CALLER, s, pfn, v, fl, st);
}
GW_EXPORT int hipGetProcAddress(const char *s, void **pfn, int v, uint64_t fl, void *st) {
    return do_getproc(&exported[A_HIP_GETPROC], CALLER, s, pfn, v, fl, st);
}
#define ALLOC_EXPORT(fn, a) GW_EXPORT int fn(void **pp, size_t n, unsigned f) { \
        return do_alloc(&exported[a], CALLER, pp, n, (long)f); }
#define ALLOC2_EXPORT(fn, a) GW_EXPORT int fn(void **pp, size_t n) { return do_alloc(&exported[a], CALLER, pp, n, -1); }
#define FREE_EXPORT(fn, a) GW_EXPORT int fn(void *p) { return do_free(&exported[a], CALLER, p); }
ALLOC_EXPORT(hipHostMalloc, A_HIP_HOST_MALLOC)
ALLOC_EXPORT(hipHostAlloc, A_HIP_HOST_ALLOC)
ALLOC_EXPORT(hipExtHostAlloc, A_HIP_EXT_HOST_ALLOC)
ALLOC2_EXPORT(hipMallocHost, A_HIP_MALLOC_HOST)
ALLOC2_EXPORT(hipMemAllocHost, A_HIP_MEM_ALLOC_HOST)
FREE_EXPORT(hipHostFree, A_HIP_HOST_FREE)
FREE_EXPORT(hipFreeHost, A_HIP_FREE_HOST)
ALLOC_EXPORT(cudaHostAlloc, A_CUDA_HOST_ALLOC)
ALLOC2_EXPORT(cudaMallocHost, A_CUDA_MALLOC_HOST)
FREE_EXPORT(cudaFreeHost, A_CUDA_FREE_HOST)
ALLOC_EXPORT(cuMemHostAlloc, A_CU_HOST_ALLOC)
ALLOC2_EXPORT(cuMemAllocHost, A_CU_ALLOC_HOST)
ALLOC2_EXPORT(cuMemAllocHost_v2, A_CU_ALLOC_HOST_V2)
FREE_EXPORT(cuMemFreeHost, A_CU_FREE_HOST)

/* ---- dlsym, dlvsym, dlopen ------------------------------------------------------------------------
 * glibc answers dlsym(RTLD_NEXT, ...) and resolves dlopen's search path relative to the *caller's*
 * object, found from the return address. Calling the real functions from C would make us the caller,
 * so the exported entry points are assembly that jumps (not calls) to the real ones in those cases:
 * the engine's return address is still on the stack and glibc sees the engine as the caller. */

GW_HIDDEN void *gw_dlsym_hook(void *handle, const char *name) {
    gw_resolve_dl();
    return gw_real_dlsym ? gw_wrap_found(name, gw_real_dlsym(handle, name), "dlsym") : NULL;
}

GW_HIDDEN void *gw_dlvsym_hook(void *handle, const char *name, const char *version) {
    gw_resolve_dl();
    return gw_real_dlvsym ? gw_wrap_found(name, gw_real_dlvsym(handle, name, version), "dlsym") : NULL;
}

_Static_assert(RTLD_DEEPBIND == 8, "the dlopen stub tests flag bit 8 for RTLD_DEEPBIND");

#if defined(__x86_64__)
/* RESOLVED(real): %rax = real, filled on first use; arguments in rdi, rsi, rdx survive the fill. */
#define RESOLVED(real)                                                                              \
    "  movq " real "(%rip), %rax\n"                                                                 \
    "  testq %rax, %rax\n"                                                                          \
    "  jnz 1f\n"                                                                                    \
    "  pushq %rdi\n  pushq %rsi\n  pushq %rdx\n"                                                    \
    "  call gw_resolve_dl\n"                                                                        \
    "  popq %rdx\n  popq %rsi\n  popq %rdi\n"                                                       \
    "  movq " real "(%rip), %rax\n"                                                                 \
    "  testq %rax, %rax\n"                                                                          \
    "  jz 2f\n"                                                                                     \
    "1:\n  jmp *%rax\n"                                                                             \
    "2:\n  xorl %eax, %eax\n  ret\n"
/* Each stub also gets a hidden name, gw_stub_<name>, for deepbind.c to point GOT entries at. */
#define STUB(name, body)                                                                            \
    ".text\n.p2align 4\n.globl " name "\n.type " name ",@function\n.globl gw_stub_" name "\n"          \
    ".hidden gw_stub_" name "\n" name ":\ngw_stub_" name ":\n  endbr64\n" body ".size " name ",.-" name "\n"

__asm__(
    STUB("dlsym",
         "  cmpq $-1, %rdi\n"  /* RTLD_NEXT: glibc's own answer, relative to the caller */
         "  jne gw_dlsym_hook\n"
         RESOLVED("gw_real_dlsym"))
    STUB("dlvsym",
         "  cmpq $-1, %rdi\n"
         "  jne gw_dlvsym_hook\n"
         RESOLVED("gw_real_dlvsym"))
    STUB("dlopen",
         "  testl $8, %esi\n"  /* RTLD_DEEPBIND: we must see what it loads */
         "  jz 3f\n"
         "  movq (%rsp), %rdx\n"
         "  jmp gw_dlopen_deepbind\n"
         "3:\n"
         RESOLVED("gw_real_dlopen")));

#elif defined(__aarch64__)
#define RESOLVED(real)                                                                              \
    "  adrp x16, " real "\n"                                                                        \
    "  ldr x16, [x16, #:lo12:" real "]\n"                                                           \
    "  cbnz x16, 1f\n"                                                                              \
    "  stp x29, x30, [sp, #-48]!\n"                                                                 \
    "  mov x29, sp\n"                                                                               \
    "  stp x0, x1, [sp, #16]\n"                                                                     \
    "  str x2, [sp, #32]\n"                                                                         \
    "  bl gw_resolve_dl\n"                                                                          \
    "  ldp x0, x1, [sp, #16]\n"                                                                     \
    "  ldr x2, [sp, #32]\n"                                                                         \
    "  ldp x29, x30, [sp], #48\n"                                                                   \
    "  adrp x16, " real "\n"                                                                        \
    "  ldr x16, [x16, #:lo12:" real "]\n"                                                           \
    "  cbz x16, 2f\n"                                                                               \
    "1:\n  br x16\n"                                                                                \
    "2:\n  mov x0, #0\n  ret\n"
#define STUB(name, body)                                                                            \
    ".text\n.p2align 4\n.globl " name "\n.type " name ",%function\n.globl gw_stub_" name "\n"          \
    ".hidden gw_stub_" name "\n" name ":\ngw_stub_" name ":\n  hint #34\n" body ".size " name ",.-" name "\n"

__asm__(
    STUB("dlsym",
         "  cmn x0, #1\n"
         "  b.ne gw_dlsym_hook\n"
         RESOLVED("gw_real_dlsym"))
    STUB("dlvsym",
         "  cmn x0, #1\n"
         "  b.ne gw_dlvsym_hook\n"
         RESOLVED("gw_real_dlvsym"))
    STUB("dlopen",
         "  tbz w1, #3, 3f\n"
         "  mov x2, x30\n"
         "  b gw_dlopen_deepbind\n"
         "3:\n"
         RESOLVED("gw_real_dlopen")));

#else
/* Elsewhere the engine's direct calls are interposed, but dlsym/dlopen are left to glibc. */
#warning "libgwpreload: no dlsym/dlopen stubs for this architecture; dlopen+dlsym lookups are not gated"
#endif

__attribute__((constructor)) static void preloaded(void) {
    gw_resolve_dl();
    gw_config_load();
    gw_emit("preloaded", ",\"threshold\":%zu,\"gate\":%s,\"slots\":%d,\"release\":\"%s\"", gw_cfg.threshold,
            gw_cfg.gate_dir[0] ? "true" : "false", gw_cfg.slots,
            gw_cfg.release == GW_RELEASE_READY ? "ready" : gw_cfg.release == GW_RELEASE_AFTER ? "after" : "registered");
}
