/* realsym.c: finding the real definitions our exports hide, and libc's own dlsym/dlvsym/dlopen.
 * We export dlsym, dlvsym and dlopen ourselves, so their real ones are read from libc's symbol table. */
#include "gwpreload.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

void *(*gw_real_dlsym)(void *, const char *);
void *(*gw_real_dlvsym)(void *, const char *, const char *);
void *(*gw_real_dlopen)(const char *, int);

static _Atomic ElfW(Addr) our_lo, our_hi;

int gw_is_ours(const void *addr) {
    if (!atomic_load(&our_hi)) {
        struct gw_elf self;
        if (gw_elf_at((const void *)&gw_is_ours, &self) == 0) {
            atomic_store(&our_lo, self.lo);
            atomic_store(&our_hi, self.hi);
        }
    }
    ElfW(Addr) a = (ElfW(Addr))addr;
    return a >= atomic_load(&our_lo) && a < atomic_load(&our_hi);
}

struct search {
    const char *name;
    void *found;
};

/* The first object in load order, other than us, that defines the name (the main program included). */
static int search_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct search *s = data;
    struct gw_elf elf;
    if (gw_elf_read(info, &elf) != 0)
        return 0;
    if (gw_is_ours((const void *)(elf.lo + (elf.hi - elf.lo) / 2)))
        return 0;
    void *p = gw_elf_lookup(&elf, s->name);
    if (p && !gw_is_ours(p)) {
        s->found = p;
        return 1;
    }
    return 0;
}

static void *first_definition(const char *name) {
    struct search s = {name, NULL};
    dl_iterate_phdr(search_object, &s);
    return s.found;
}

void gw_resolve_dl(void) {
    /* Racing threads find the same addresses; a plain store is enough. */
    if (!gw_real_dlsym)
        gw_real_dlsym = (void *(*)(void *, const char *))first_definition("dlsym");
    if (!gw_real_dlvsym)
        gw_real_dlvsym = (void *(*)(void *, const char *, const char *))first_definition("dlvsym");
    if (!gw_real_dlopen)
        gw_real_dlopen = (void *(*)(const char *, int))first_definition("dlopen");
}

void *gw_find_real(const char *name, const void *caller) {
    gw_resolve_dl();
    if (gw_real_dlsym) {
        /* The ordinary answer: the next definition in the global scope after this library. */
        void *p = gw_real_dlsym(RTLD_NEXT, name);
        if (p && !gw_is_ours(p))
            return p;
        /* Not global: the caller's own dependencies (libtorch_python.so's libcudart, itself loaded
         * RTLD_LOCAL under Python's dlopen of torch._C), as the caller would have been bound. */
        Dl_info info;
        if (caller && gw_real_dlopen && dladdr(caller, &info) && info.dli_fname && info.dli_fname[0]) {
            void *handle = gw_real_dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
            if (handle) {
                p = gw_real_dlsym(handle, name);
                dlclose(handle);
                if (p && !gw_is_ours(p)) {
                    dlerror();
                    return p;
                }
            }
        }
        dlerror();  /* leave no error of ours for the engine's next dlerror() */
    }
    /* Any loaded object at all, in load order. */
    return first_definition(name);
}
