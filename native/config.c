/* config.c: the interposer's settings, read once from the environment the shim gives the engine.
 * Unset or unreadable values fall back to the defaults the README documents. */
#include "gwpreload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_THRESHOLD ((size_t)256 << 20)
#define DEFAULT_TIMEOUT 600.0
#define DEFAULT_LEDGER_THRESHOLD ((size_t)1 << 20)

struct gw_config gw_cfg;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void copy_env(char *dst, size_t cap, const char *name) {
    const char *v = getenv(name);
    dst[0] = '\0';
    if (v && strlen(v) < cap)
        strcpy(dst, v);
}

static double number_env(const char *name, double fallback, double lowest) {
    const char *v = getenv(name);
    if (!v || !*v)
        return fallback;
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || d < lowest)
        return fallback;
    return d;
}

static void parse_release(const char *v) {
    gw_cfg.release = GW_RELEASE_REGISTERED;
    if (!v || !*v || !strcmp(v, "registered"))
        return;
    if (!strcmp(v, "ready")) {
        gw_cfg.release = GW_RELEASE_READY;
        return;
    }
    char *end;
    double secs = strtod(v, &end);
    if (end != v && end[0] == 's' && end[1] == '\0' && secs >= 0) {
        gw_cfg.release = GW_RELEASE_AFTER;
        gw_cfg.release_after = secs;
    }
}

static void load(void) {
    gw_cfg.threshold = (size_t)number_env("GPUWARDEN_PRELOAD_THRESHOLD", (double)DEFAULT_THRESHOLD, 0);
    gw_cfg.ledger_threshold = (size_t)number_env("GPUWARDEN_LEDGER_THRESHOLD", (double)DEFAULT_LEDGER_THRESHOLD, 0);
    gw_cfg.registration_timeout = number_env("GPUWARDEN_REGISTRATION_TIMEOUT", DEFAULT_TIMEOUT, 0.001);
    parse_release(getenv("GPUWARDEN_GATE_RELEASE"));
    copy_env(gw_cfg.gate_dir, sizeof gw_cfg.gate_dir, "GPUWARDEN_GATE_DIR");
    gw_cfg.slots = (int)number_env("GPUWARDEN_GATE_SLOTS", 1, 1);
    copy_env(gw_cfg.ready_file, sizeof gw_cfg.ready_file, "GPUWARDEN_GATE_READY_FILE");
    if (gw_cfg.release == GW_RELEASE_READY && !gw_cfg.ready_file[0])
        gw_cfg.release = GW_RELEASE_REGISTERED;  /* nobody could ever say "ready": don't hold for nothing */
    const char *engine = getenv("GPUWARDEN_ENGINE");
    snprintf(gw_cfg.who, sizeof gw_cfg.who, "preload:%.80s", engine && *engine ? engine : "engine");
    /* The slot file is JSON: keep the name to characters that need no escaping. */
    for (char *c = gw_cfg.who; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            *c = '_';
    gw_cfg.status_fd = -1;
    const char *fd = getenv("GPUWARDEN_STATUS_FD");
    if (fd && *fd) {
        char *end;
        long n = strtol(fd, &end, 10);
        if (!*end && n >= 0 && n < INT_MAX && fcntl((int)n, F_GETFD) != -1)
            gw_cfg.status_fd = (int)n;
    }
    copy_env(gw_cfg.status_file, sizeof gw_cfg.status_file, "GPUWARDEN_STATUS_FILE");
    gw_gate_init();
}

void gw_config_load(void) {
    pthread_once(&once, load);
}
