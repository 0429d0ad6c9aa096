/* An unmodified engine that ignores its registration's result, as the arena incident's engines did: it registers
 * SIZE bytes with hipHostRegister (linked against the runtime), asks for the buffer's device pointer, waits
 * DELAY_MS as if loading weights, then writes its first batch through that pointer. When the registration
 * failed, the pointer it got is NULL and the write faults: SIGSEGV, 0 + DELAY_MS after the failed call.
 * Usage: unchecked_engine SIZE DELAY_MS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int hipHostRegister(void *p, size_t n, unsigned flags);
int hipHostGetDevicePointer(void **device, void *host, unsigned flags);

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: unchecked_engine SIZE DELAY_MS\n");
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    long delay_ms = strtol(argv[2], NULL, 10);
    static char arena[4096];
    printf("engine pid %d starting (unchecked)\n", (int)getpid());
    fflush(stdout);
    int r = hipHostRegister(arena, size, 0);
    printf("register returned %d\n", r);  /* ...and goes on regardless */
    fflush(stdout);
    volatile char *device = NULL;
    hipHostGetDevicePointer((void **)&device, arena, 0);
    struct timespec pause = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    printf("session is up\n");
    fflush(stdout);
    device[0] = 1;
    printf("serving\n");
    fflush(stdout);
    for (;;)
        sleep(60);
}
