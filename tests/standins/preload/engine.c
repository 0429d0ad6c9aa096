/* An unmodified engine for the preload tests: registers SIZE bytes once, says so on stdout, serves
 * until SIGTERM, unregisters, exits 0. How it reaches the register call is its MODE:
 *   linked    calls hipHostRegister, linked against libamdhip64.so (built with -DLINKED)
 *   dlopen    dlopen("libamdhip64.so") + dlsym(handle, "hipHostRegister")
 *   hipproc   dlopen + dlsym("hipGetProcAddress") + hipGetProcAddress("hipHostRegister")
 *   cuproc    dlopen("libcuda.so.1") + dlsym("cuGetProcAddress_v2") + cuGetProcAddress("cuMemHostRegister")
 *   cudart    dlopen("libcudart.so.12") + dlsym("cudaHostRegister"), which reaches the driver itself
 *   deepbind  dlopen("libdeep.so", RTLD_DEEPBIND), whose code calls hipHostRegister directly
 *   deepdlsym the same library, calling it through its own dlopen + dlsym
 * With STANDIN_GATHER=N (and STANDIN_DIR) it first waits until N engines have reached that point, so that
 * N engines call register at the same moment however far apart they were started. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*register_fn)(void *, size_t, unsigned);
typedef int (*unregister_fn)(void *);
typedef int (*getproc5_fn)(const char *, void **, int, uint64_t, void *);

#ifdef LINKED
int hipHostRegister(void *p, size_t n, unsigned flags);
int hipHostUnregister(void *p);
#endif

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static void gather(void) {
    const char *dir = getenv("STANDIN_DIR"), *want = getenv("STANDIN_GATHER");
    if (!dir || !want)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s/ready-%d", dir, (int)getpid());
    close(open(path, O_WRONLY | O_CREAT, 0600));
    for (int tries = 0; tries < 6000; tries++) {  /* at most 60 s */
        int count = 0;
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)))
            count += strncmp(e->d_name, "ready-", 6) == 0;
        if (d)
            closedir(d);
        if (count >= atoi(want))
            return;
        usleep(10000);
    }
}

static void *must(void *p, const char *what) {
    if (!p) {
        fprintf(stderr, "engine: %s: %s\n", what, dlerror());
        exit(3);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: engine SIZE MODE\n");
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    const char *mode = argv[2];
    static char arena[4096];
    register_fn reg = NULL;
    unregister_fn unreg = NULL;
    signal(SIGTERM, on_term);
    printf("engine pid %d starting (%s)\n", (int)getpid(), mode);
    fflush(stdout);
#ifdef LINKED
    if (!strcmp(mode, "linked")) {
        reg = hipHostRegister;
        unreg = hipHostUnregister;
    }
#endif
    if (!strcmp(mode, "dlopen") || !strcmp(mode, "hipproc")) {
        void *h = must(dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL), "dlopen libamdhip64.so");
        if (!strcmp(mode, "dlopen")) {
            reg = (register_fn)must(dlsym(h, "hipHostRegister"), "dlsym");
            unreg = (unregister_fn)must(dlsym(h, "hipHostUnregister"), "dlsym");
        } else {
            getproc5_fn gp = (getproc5_fn)must(dlsym(h, "hipGetProcAddress"), "dlsym");
            gp("hipHostRegister", (void **)&reg, 600, 0, NULL);
            gp("hipHostUnregister", (void **)&unreg, 600, 0, NULL);
        }
    } else if (!strcmp(mode, "cuproc")) {
        void *h = must(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "dlopen libcuda.so.1");
        getproc5_fn gp = (getproc5_fn)must(dlsym(h, "cuGetProcAddress_v2"), "dlsym");
        int status;
        gp("cuMemHostRegister", (void **)&reg, 12000, 0, &status);
        gp("cuMemHostUnregister", (void **)&unreg, 12000, 0, &status);
    } else if (!strcmp(mode, "cudart")) {
        void *h = must(dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL), "dlopen libcudart.so.12");
        reg = (register_fn)must(dlsym(h, "cudaHostRegister"), "dlsym");
        unreg = (unregister_fn)must(dlsym(h, "cudaHostUnregister"), "dlsym");
    } else if (!strcmp(mode, "deepbind") || !strcmp(mode, "deepdlsym")) {
        void *h = must(dlopen("libdeep.so", RTLD_NOW | RTLD_DEEPBIND), "dlopen libdeep.so");
        gather();
        if (!strcmp(mode, "deepbind")) {
            int (*deep)(void *, size_t) = (int (*)(void *, size_t))must(dlsym(h, "deep_register"), "dlsym");
            int r = deep(arena, size);
            printf("register returned %d\n", r);
        } else {
            int (*deep)(void *, size_t) = (int (*)(void *, size_t))must(dlsym(h, "deep_register_dlsym"), "dlsym");
            int r = deep(arena, size);
            printf("register returned %d\n", r);
        }
        unreg = (unregister_fn)must(dlsym(h, "deep_unregister"), "dlsym");
    }
    if (reg) {
        gather();
        int r = reg(arena, size, 0);
        printf("register returned %d\n", r);
    } else if (!unreg) {
        fprintf(stderr, "engine: unknown mode %s\n", mode);
        return 2;
    }
    printf("session is up\nserving\n");
    fflush(stdout);
    while (!stop)
        pause();
    if (unreg)
        printf("unregister returned %d\n", unreg(arena));
    printf("stopping\n");
    return 0;
}
