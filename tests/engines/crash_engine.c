/* A stand-in engine for the arena incident: it says it registered, waits for a go file, then faults at one
 * fixed offset inside a shared library, as every engine faulted inside libamdhip64 at the same offset.
 * Built by tests/integration/ops/triage/test_triage_engines.py with the system compiler; argv[1] is the go file. */
#include <stdio.h>
#include <stdint.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

void gw_register_arena(volatile char *base);

int main(int argc, char **argv) {
    struct rlimit core;
    if (getrlimit(RLIMIT_CORE, &core) == 0) {  /* a core for the bundle to read, as far as the hard limit allows */
        core.rlim_cur = core.rlim_max;
        setrlimit(RLIMIT_CORE, &core);
    }
    printf("session is up\n");
    fflush(stdout);
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; argc > 1 && i < 6000 && access(argv[1], F_OK) != 0; i++)
        nanosleep(&tick, NULL);
    gw_register_arena((volatile char *)0);
    return 0;
}
