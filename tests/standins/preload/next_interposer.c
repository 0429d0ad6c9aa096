/* libnext.so: another LD_PRELOAD library, loaded after ours, that wraps getpid() the usual way,
 * dlsym(RTLD_NEXT, "getpid"). glibc answers RTLD_NEXT relative to the caller: if our dlsym made
 * itself the caller, "next" would be this library's own getpid and the engine would print pid -1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

pid_t getpid(void) {
    static pid_t (*next)(void);
    if (!next)
        next = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
    if (!next || next == getpid)
        return -1;
    return next();
}
