/* gwpreload.h: what the parts of the registration interposer (libgwpreload.so) share.
 * The library is preloaded into unmodified engines; see README.md, "Engines nobody changed". */
#ifndef GWPRELOAD_H
#define GWPRELOAD_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>

#define GW_HIDDEN __attribute__((visibility("hidden")))

/* The runtimes' "unknown error": 999 is hipErrorUnknown, cudaErrorUnknown and CUDA_ERROR_UNKNOWN alike. */
#define GW_ERROR_UNKNOWN 999

/* ---- the calls we interpose (interpose.c) ---------------------------------------------------- */

enum gw_kind {
    GW_REGISTER, GW_UNREGISTER, GW_GETPROC,
    GW_ALLOC,         /* (void **ptr, size_t bytes, unsigned flags): hipHostMalloc, cudaHostAlloc, cuMemHostAlloc */
    GW_ALLOC_NOFLAGS, /* (void **ptr, size_t bytes): hipMallocHost, cudaMallocHost, cuMemAllocHost(_v2) */
    GW_FREE,          /* (void *ptr): hipHostFree, hipFreeHost, cudaFreeHost, cuMemFreeHost */
    GW_KINDS
};

struct gw_api {
    const char *name;
    enum gw_kind kind;
};

GW_HIDDEN extern const struct gw_api gw_apis[];
/* Index into gw_apis of `name`, or -1; cheap for the names it rejects (dlsym asks for thousands). */
GW_HIDDEN int gw_api_index(const char *name);
/* A wrapper that calls `real` for api `api`; `real` itself when no binding is left. */
GW_HIDDEN void *gw_bind(int api, void *real, const char *via, int has_status);
/* Wrap `found` when `name` is one of ours and `found` is not already ours. */
GW_HIDDEN void *gw_wrap_found(const char *name, void *found, const char *via);

/* ---- finding real definitions (realsym.c) ---------------------------------------------------- */

GW_HIDDEN extern void *(*gw_real_dlsym)(void *, const char *);
GW_HIDDEN extern void *(*gw_real_dlvsym)(void *, const char *, const char *);
GW_HIDDEN extern void *(*gw_real_dlopen)(const char *, int);
/* Fill the three pointers above from libc's (or libdl's) own symbol table; safe to call any time. */
GW_HIDDEN void gw_resolve_dl(void);
/* The definition of `name` that our export hides from `caller` (an address in the calling object):
 * the global scope after us, else the caller's own dependencies, else any loaded object. */
GW_HIDDEN void *gw_find_real(const char *name, const void *caller);
/* True when `addr` lies inside libgwpreload.so itself. */
GW_HIDDEN int gw_is_ours(const void *addr);

/* One loaded object's dynamic section, read once (elf.c). */
struct gw_elf {
    ElfW(Addr) base;
    const char *name;
    ElfW(Addr) lo, hi;           /* the mapped range, for "does this address belong to it" */
    ElfW(Addr) relro_lo, relro_hi;
    const ElfW(Sym) *symtab;
    const char *strtab;
    const ElfW(Half) *versym;
    const uint32_t *gnu_hash;
    const uint32_t *sysv_hash;
    const ElfW(Rela) *rela;
    size_t rela_count;
    const ElfW(Rela) *jmprel;
    size_t jmprel_count;
    const char *runpath;          /* DT_RUNPATH, else DT_RPATH; NULL when neither */
    int runpath_is_rpath;         /* DT_RPATH: searched before LD_LIBRARY_PATH, DT_RUNPATH after */
};

GW_HIDDEN int gw_elf_read(const struct dl_phdr_info *info, struct gw_elf *out);
/* The default-version definition of `name` in this object alone, or NULL. */
GW_HIDDEN void *gw_elf_lookup(const struct gw_elf *elf, const char *name);
/* The loaded object whose mapped range holds `addr`: 0, or -1 when none does. */
GW_HIDDEN int gw_elf_at(const void *addr, struct gw_elf *out);

/* ---- configuration from the environment (config.c) ------------------------------------------- */

enum gw_release { GW_RELEASE_REGISTERED, GW_RELEASE_READY, GW_RELEASE_AFTER };

struct gw_config {
    size_t threshold;             /* GPUWARDEN_PRELOAD_THRESHOLD: smaller calls pass straight through */
    double registration_timeout;  /* GPUWARDEN_REGISTRATION_TIMEOUT: a call running longer is hung */
    enum gw_release release;      /* GPUWARDEN_GATE_RELEASE: registered | ready | <N>s */
    double release_after;         /* N of "<N>s" */
    char gate_dir[PATH_MAX];      /* GPUWARDEN_GATE_DIR; empty: report only, no gate */
    int slots;                    /* GPUWARDEN_GATE_SLOTS */
    char ready_file[PATH_MAX];    /* GPUWARDEN_GATE_READY_FILE: the shim creates it once the engine is ready */
    char who[96];                 /* written into the slot file: "preload:<engine>" */
    int status_fd;                /* GPUWARDEN_STATUS_FD, or -1 */
    char status_file[PATH_MAX];   /* GPUWARDEN_STATUS_FILE */
    size_t ledger_threshold;      /* GPUWARDEN_LEDGER_THRESHOLD: pinned calls this big get a status line each */
};

GW_HIDDEN extern struct gw_config gw_cfg;
GW_HIDDEN void gw_config_load(void);   /* once; every entry point calls it */

/* ---- status protocol lines (status.c) -------------------------------------------------------- */

GW_HIDDEN double gw_wall(void);
GW_HIDDEN double gw_mono(void);
/* Append {"phase":..,"ts":..,"pid":..,"source":"preload"<extra>} as one write(); extra starts with ','. */
GW_HIDDEN void gw_emit(const char *phase, const char *extra_fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- the KFD ledger: pinned host allocations and frees (ledger.c) ---------------------------- */

struct gw_ledger {
    size_t pinned_bytes, pinned_count;  /* live now */
    size_t peak_bytes;                  /* the most live at once */
    size_t allocs, frees, alloc_bytes;  /* successful calls; bytes ever allocated */
    size_t failed;                      /* calls that returned an error */
    size_t untracked;                   /* allocations the pointer table had no room for (their free is unknown) */
    size_t unknown_frees;               /* frees of pointers no call we saw allocated */
    int pending;                        /* changed since the last line that carried the totals */
};

/* After an allocation call (result 0 and p: on the books). Fills `out` with the totals; 1 when a line is due. */
GW_HIDDEN int gw_ledger_alloc(void *p, size_t n, int result, uint64_t now_ns, struct gw_ledger *out);
/* Before a free call: take p off the books; its bytes, 0 when unknown. */
GW_HIDDEN size_t gw_ledger_forget(void *p);
/* After the free call (`n` from gw_ledger_forget; a failed free puts it back). */
GW_HIDDEN int gw_ledger_free(void *p, size_t n, int result, uint64_t now_ns, struct gw_ledger *out);
/* A line carrying the totals was written at `now_ns`. */
GW_HIDDEN void gw_ledger_sent(uint64_t now_ns);
GW_HIDDEN void gw_ledger_emit_totals(const char *phase, const struct gw_ledger *t);

/* ---- the registration gate (gate.c) ---------------------------------------------------------- */

struct gw_ticket {
    int slot;           /* -1: no gate configured */
    unsigned gen;       /* which holding of the slot this call belongs to */
    double wait_s;      /* time spent waiting for a slot */
};

GW_HIDDEN void gw_gate_init(void);
/* Take (or share this process's) slot before a registration call of `bytes` through `call`. */
GW_HIDDEN void gw_gate_enter(struct gw_ticket *t, const char *call, size_t bytes);
/* After the call, before its result line is written: 1 when the watchdog already let the slot go. Keeps the
 * gate locked until gw_gate_leave, so the result line is written while the slot is still this call's: under a
 * 1-slot gate no other engine's "registering" can come before it (the protocol's windows never overlap). */
GW_HIDDEN int gw_gate_settle(const struct gw_ticket *t);
/* Then: release the slot, or hold it as configured when `hold`, and unlock. */
GW_HIDDEN void gw_gate_leave(const struct gw_ticket *t, int hold);

/* ---- RTLD_DEEPBIND (deepbind.c) -------------------------------------------------------------- */

#if defined(__x86_64__) || defined(__aarch64__)
#define GW_HAVE_STUBS 1
/* The assembly entry points of interpose.c, under hidden names. */
GW_HIDDEN void *gw_stub_dlsym(void *, const char *);
GW_HIDDEN void *gw_stub_dlvsym(void *, const char *, const char *);
GW_HIDDEN void *gw_stub_dlopen(const char *, int);
#endif

GW_HIDDEN void *gw_dlopen_deepbind(const char *file, int flags, const void *caller);

#endif
