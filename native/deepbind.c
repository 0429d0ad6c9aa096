/* deepbind.c: a library dlopen()ed with RTLD_DEEPBIND binds to its own dependencies before the global
 * scope, so past our exports. After loading one, point its GOT entries for our calls at our wrappers. */
#include "gwpreload.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

#ifdef GW_HAVE_STUBS

/* ---- where glibc would have found `file` for the caller ---------------------------------------- */

static int exists_in(const char *dirs, const char *origin, const char *file, char *out, size_t cap) {
    while (dirs && *dirs) {
        size_t len = strcspn(dirs, ":");
        char dir[PATH_MAX];
        size_t d = 0;
        for (size_t i = 0; i < len && d + 1 < sizeof dir;) {
            if (!strncmp(dirs + i, "$ORIGIN", 7) || !strncmp(dirs + i, "${ORIGIN}", 9)) {
                size_t skip = dirs[i + 1] == '{' ? 9 : 7;
                size_t olen = strlen(origin);
                if (d + olen >= sizeof dir)
                    break;
                memcpy(dir + d, origin, olen);
                d += olen;
                i += skip;
            } else {
                dir[d++] = dirs[i++];
            }
        }
        dir[d] = '\0';
        /* $LIB and $PLATFORM are not expanded: such entries are left to glibc. */
        if (d && !strchr(dir, '$') && (size_t)snprintf(out, cap, "%s/%s", dir, file) < cap &&
            access(out, F_OK) == 0)
            return 1;
        dirs += len;
        if (*dirs == ':')
            dirs++;
    }
    return 0;
}

/* glibc searches the caller's DT_RPATH (before LD_LIBRARY_PATH) or DT_RUNPATH (after it); since we,
 * not the engine, call the real dlopen, apply the caller's path here and hand glibc a full path. */
static const char *as_caller_would(const char *file, const void *caller, char *out, size_t cap) {
    if (!file || strchr(file, '/'))
        return file;
    void *loaded = gw_real_dlopen(file, RTLD_LAZY | RTLD_NOLOAD);
    if (loaded) {
        dlclose(loaded);
        return file;  /* already loaded under that name: glibc will not search */
    }
    struct gw_elf elf;
    if (gw_elf_at(caller, &elf) != 0 || !elf.runpath)
        return file;
    char origin[PATH_MAX];
    if (elf.name && elf.name[0]) {
        snprintf(origin, sizeof origin, "%s", elf.name);
    } else {
        ssize_t n = readlink("/proc/self/exe", origin, sizeof origin - 1);
        origin[n > 0 ? n : 0] = '\0';
    }
    char *slash = strrchr(origin, '/');
    if (slash)
        *slash = '\0';
    if (!elf.runpath_is_rpath && exists_in(getenv("LD_LIBRARY_PATH"), origin, file, out, cap))
        return file;
    return exists_in(elf.runpath, origin, file, out, cap) ? out : file;
}

/* ---- which objects a dlopen() brought in -------------------------------------------------------- */

struct seen {
    const void **phdrs;
    size_t count, cap;
};

static int note_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct seen *s = data;
    if (s->count == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        const void **grown = realloc(s->phdrs, cap * sizeof *grown);
        if (!grown)
            return 1;
        s->phdrs = grown;
        s->cap = cap;
    }
    s->phdrs[s->count++] = info->dlpi_phdr;
    return 0;
}

/* ---- patching --------------------------------------------------------------------------------- */

static void write_slot(const struct gw_elf *elf, void **slot, void *target) {
    long page = sysconf(_SC_PAGESIZE);
    ElfW(Addr) at = (ElfW(Addr))slot;
    ElfW(Addr) start = at & ~(ElfW(Addr))(page - 1);
    /* glibc made [relro start, relro end) read-only, both rounded down to pages. */
    int relro = elf->relro_hi && at >= (elf->relro_lo & ~(ElfW(Addr))(page - 1)) &&
                at < (elf->relro_hi & ~(ElfW(Addr))(page - 1));
    if (relro && mprotect((void *)start, page, PROT_READ | PROT_WRITE) != 0)
        return;
    __atomic_store_n(slot, target, __ATOMIC_RELEASE);
    if (relro)
        mprotect((void *)start, page, PROT_READ);
}

static void patch_table(const struct gw_elf *elf, const ElfW(Rela) *rel, size_t count, void *handle) {
    for (size_t i = 0; i < count; i++) {
        unsigned long type = ELF64_R_TYPE(rel[i].r_info);
        unsigned long sym = ELF64_R_SYM(rel[i].r_info);
        if ((type != R_JUMP_SLOT && type != R_GLOB_DAT) || sym == 0)
            continue;
        const char *name = elf->strtab + elf->symtab[sym].st_name;
        void **slot = (void **)(elf->base + rel[i].r_offset);
        void *target = NULL;
        if (!strcmp(name, "dlsym")) {
            target = (void *)gw_stub_dlsym;
        } else if (!strcmp(name, "dlvsym")) {
            target = (void *)gw_stub_dlvsym;
        } else if (!strcmp(name, "dlopen")) {
            target = (void *)gw_stub_dlopen;
        } else if (gw_api_index(name) >= 0) {
            void *cur = *slot;
            if (gw_is_ours(cur))
                continue;
            /* Still pointing into its own PLT (lazy binding): ask the deep-bound scope for the target. */
            void *real = ((ElfW(Addr))cur >= elf->lo && (ElfW(Addr))cur < elf->hi) ? gw_real_dlsym(handle, name) : cur;
            if (!real)
                continue;
            target = gw_wrap_found(name, real, "deepbind");
        }
        if (target && *slot != target)
            write_slot(elf, slot, target);
    }
}

struct patch_pass {
    struct seen *before;
    void *handle;
};

static int patch_new(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct patch_pass *p = data;
    for (size_t i = 0; i < p->before->count; i++)
        if (p->before->phdrs[i] == info->dlpi_phdr)
            return 0;
    struct gw_elf elf;
    if (gw_elf_read(info, &elf) != 0 || gw_is_ours((const void *)elf.lo))
        return 0;
    patch_table(&elf, elf.jmprel, elf.jmprel_count, p->handle);
    patch_table(&elf, elf.rela, elf.rela_count, p->handle);
    return 0;
}

void *gw_dlopen_deepbind(const char *file, int flags, const void *caller) {
    gw_resolve_dl();
    if (!gw_real_dlopen || !gw_real_dlsym)
        return NULL;
    char path[PATH_MAX];
    const char *what = as_caller_would(file, caller, path, sizeof path);
    struct seen before = {0};
    dl_iterate_phdr(note_object, &before);
    void *handle = gw_real_dlopen(what, flags);
    if (handle) {
        struct patch_pass pass = {&before, handle};
        dl_iterate_phdr(patch_new, &pass);
    }
    free(before.phdrs);
    return handle;
}

#else

void *gw_dlopen_deepbind(const char *file, int flags, const void *caller) {
    (void)caller;
    gw_resolve_dl();
    return gw_real_dlopen ? gw_real_dlopen(file, flags) : NULL;
}

#endif
