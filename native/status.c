/* status.c: the engine status protocol from C: one JSON object per line, one write() per line.
 * Same contract as ops/status_protocol.py: GPUWARDEN_STATUS_FD first, else append to GPUWARDEN_STATUS_FILE. */
#include "gwpreload.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double gw_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double gw_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void gw_emit(const char *phase, const char *extra_fmt, ...) {
    if (gw_cfg.status_fd < 0 && !gw_cfg.status_file[0])
        return;
    int saved = errno;  /* the engine's errno is none of our business */
    char line[768];
    int n = snprintf(line, sizeof line, "{\"phase\":\"%s\",\"ts\":%.6f,\"pid\":%d,\"source\":\"preload\"",
                     phase, gw_wall(), (int)getpid());
    if (extra_fmt && n > 0 && (size_t)n < sizeof line) {
        va_list ap;
        va_start(ap, extra_fmt);
        n += vsnprintf(line + n, sizeof line - n, extra_fmt, ap);
        va_end(ap);
    }
    if (n < 0 || (size_t)n + 2 >= sizeof line) {
        errno = saved;
        return;  /* never write half a line */
    }
    line[n++] = '}';
    line[n++] = '\n';
    if (gw_cfg.status_fd >= 0) {
        ssize_t w;
        do w = write(gw_cfg.status_fd, line, n); while (w < 0 && errno == EINTR);
    } else {
        int fd = open(gw_cfg.status_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
        if (fd >= 0) {
            ssize_t w;
            do w = write(fd, line, n); while (w < 0 && errno == EINTR);
            close(fd);
        }
    }
    errno = saved;
}
