/* elf.c: reading a loaded object's dynamic section: its symbols (GNU or SysV hash), relocations, run path.
 * Used to find libc's dl* functions without calling dlsym, and to patch RTLD_DEEPBIND objects. */
#include "gwpreload.h"

#include <elf.h>
#include <string.h>

/* glibc relocates most d_ptr entries in place; other loaders leave them relative to the base. */
static ElfW(Addr) absolute(ElfW(Addr) base, ElfW(Addr) p) {
    return p < base ? p + base : p;
}

int gw_elf_read(const struct dl_phdr_info *info, struct gw_elf *out) {
    memset(out, 0, sizeof *out);
    out->base = info->dlpi_addr;
    out->name = info->dlpi_name;
    out->lo = (ElfW(Addr))-1;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD) {
            if (info->dlpi_addr + ph->p_vaddr < out->lo)
                out->lo = info->dlpi_addr + ph->p_vaddr;
            if (info->dlpi_addr + ph->p_vaddr + ph->p_memsz > out->hi)
                out->hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
        } else if (ph->p_type == PT_DYNAMIC) {
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
        } else if (ph->p_type == PT_GNU_RELRO) {
            out->relro_lo = info->dlpi_addr + ph->p_vaddr;
            out->relro_hi = out->relro_lo + ph->p_memsz;
        }
    }
    if (!dyn)
        return -1;
    size_t rela_size = 0, jmprel_size = 0;
    ElfW(Sxword) pltrel = DT_RELA;
    ElfW(Addr) runpath = 0, rpath = 0;
    int have_runpath = 0, have_rpath = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: out->symtab = (const ElfW(Sym) *)absolute(out->base, d->d_un.d_ptr); break;
        case DT_STRTAB: out->strtab = (const char *)absolute(out->base, d->d_un.d_ptr); break;
        case DT_VERSYM: out->versym = (const ElfW(Half) *)absolute(out->base, d->d_un.d_ptr); break;
        case DT_GNU_HASH: out->gnu_hash = (const uint32_t *)absolute(out->base, d->d_un.d_ptr); break;
        case DT_HASH: out->sysv_hash = (const uint32_t *)absolute(out->base, d->d_un.d_ptr); break;
        case DT_RELA: out->rela = (const ElfW(Rela) *)absolute(out->base, d->d_un.d_ptr); break;
        case DT_RELASZ: rela_size = d->d_un.d_val; break;
        case DT_JMPREL: out->jmprel = (const ElfW(Rela) *)absolute(out->base, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmprel_size = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = d->d_un.d_val; break;
        case DT_RUNPATH: runpath = d->d_un.d_val; have_runpath = 1; break;
        case DT_RPATH: rpath = d->d_un.d_val; have_rpath = 1; break;
        }
    }
    if (!out->symtab || !out->strtab)
        return -1;
    out->rela_count = out->rela ? rela_size / sizeof(ElfW(Rela)) : 0;
    /* Only RELA objects (x86_64, aarch64) have their PLT relocations read; REL ones are left alone. */
    out->jmprel_count = (out->jmprel && pltrel == DT_RELA) ? jmprel_size / sizeof(ElfW(Rela)) : 0;
    if (have_runpath)
        out->runpath = out->strtab + runpath;
    else if (have_rpath) {
        out->runpath = out->strtab + rpath;
        out->runpath_is_rpath = 1;
    }
    return 0;
}

static int defines(const struct gw_elf *elf, uint32_t i, const char *name) {
    const ElfW(Sym) *s = &elf->symtab[i];
    if (s->st_shndx == SHN_UNDEF || s->st_value == 0)
        return 0;
    int type = ELF64_ST_TYPE(s->st_info);
    if (type != STT_FUNC && type != STT_OBJECT && type != STT_NOTYPE)
        return 0;  /* an IFUNC would need its resolver run: leave those to dlsym */
    if (ELF64_ST_BIND(s->st_info) == STB_LOCAL)
        return 0;
    if (elf->versym && (elf->versym[i] & 0x8000))
        return 0;  /* a hidden, non-default version (e.g. an old ABI's compat symbol) */
    return strcmp(elf->strtab + s->st_name, name) == 0;
}

static void *gnu_lookup(const struct gw_elf *elf, const char *name) {
    const uint32_t *h = elf->gnu_hash;
    uint32_t nbuckets = h[0], symoffset = h[1], bloom_size = h[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(h + 4) + bloom_size);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t hash = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        hash = hash * 33 + *c;
    if (nbuckets == 0)
        return NULL;
    uint32_t i = buckets[hash % nbuckets];
    if (i < symoffset)
        return NULL;
    for (;; i++) {
        uint32_t ch = chain[i - symoffset];
        if ((ch | 1) == (hash | 1) && defines(elf, i, name))
            return (void *)(elf->base + elf->symtab[i].st_value);
        if (ch & 1)
            return NULL;
    }
}

static void *sysv_lookup(const struct gw_elf *elf, const char *name) {
    const uint32_t *h = elf->sysv_hash;
    uint32_t nbucket = h[0];
    const uint32_t *bucket = h + 2, *chain = h + 2 + nbucket;
    uint32_t hash = 0;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        hash = (hash << 4) + *c;
        uint32_t g = hash & 0xf0000000u;
        if (g)
            hash ^= g >> 24;
        hash &= ~g;
    }
    if (nbucket == 0)
        return NULL;
    for (uint32_t i = bucket[hash % nbucket]; i != 0; i = chain[i])
        if (defines(elf, i, name))
            return (void *)(elf->base + elf->symtab[i].st_value);
    return NULL;
}

void *gw_elf_lookup(const struct gw_elf *elf, const char *name) {
    if (elf->gnu_hash)
        return gnu_lookup(elf, name);
    if (elf->sysv_hash)
        return sysv_lookup(elf, name);
    return NULL;
}

struct containing {
    ElfW(Addr) addr;
    struct gw_elf *out;
    int found;
};

static int contains(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct containing *c = data;
    struct gw_elf elf;
    if (gw_elf_read(info, &elf) == 0 && c->addr >= elf.lo && c->addr < elf.hi) {
        *c->out = elf;
        c->found = 1;
        return 1;
    }
    return 0;
}

int gw_elf_at(const void *addr, struct gw_elf *out) {
    struct containing c = {(ElfW(Addr))addr, out, 0};
    dl_iterate_phdr(contains, &c);
    return c.found ? 0 : -1;
}
