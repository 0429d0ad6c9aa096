/* A statically linked engine: the dynamic linker never runs, so LD_PRELOAD cannot reach it. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("serving\n");
    fflush(stdout);
    for (;;)
        pause();
}
