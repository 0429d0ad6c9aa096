/* gate.c: the registration gate from inside the engine: the flock slot protocol of ops/gate.py,
 * held around registration calls, kept until ready or N seconds when asked, and let go by a watchdog
 * when a call hangs past the registration timeout, so one stuck engine never wedges the others. */
#include "gwpreload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define POLL_S 0.02  /* as ops/gate.py polls when every slot is held */

/* One slot per process: concurrent or back-to-back registrations of one engine share it. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* CLOCK_MONOTONIC */
    pthread_mutex_t acquire_mu;   /* one thread of this process waits at the gate at a time */
    int fd;
    int slot;
    unsigned gen;                 /* bumped at each release: a ticket of an older holding is stale */
    int calls;                    /* gated calls running now */
    double taken_at;
    double call_deadline;         /* monotonic: a call still running then is hung */
    double hold_until;            /* monotonic: with no call running, the slot goes then */
    int watcher;                  /* the watchdog thread runs */
    const char *call;             /* what the oldest running call is, for the hung report */
    size_t bytes;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER, .acquire_mu = PTHREAD_MUTEX_INITIALIZER, .fd = -1, .slot = -1};

static void before_fork(void) { pthread_mutex_lock(&G.mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&G.mu); }

static void init_sync(void) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&G.cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* A child must not keep its parent's slot: the flock lives as long as any copy of the fd. */
static void after_fork_child(void) {
    pthread_mutex_init(&G.mu, NULL);
    pthread_mutex_init(&G.acquire_mu, NULL);
    init_sync();
    if (G.fd >= 0)
        close(G.fd);
    G.fd = -1;
    G.slot = -1;
    G.calls = 0;
    G.watcher = 0;
}

void gw_gate_init(void) {
    init_sync();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---- the slot protocol ------------------------------------------------------------------------- */

/* The slot's fd; -1 when another process holds it, -2 when the slot file cannot be opened at all. */
static int try_slot(int i, int blocking) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/slot-%d.lock", gw_cfg.gate_dir, i);
    /* O_NOFOLLOW and a regular file only, as ops/statedir opens it: a slot planted as a symlink must not
     * get its target truncated by the ftruncate below (the engine may run as root). */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd < 0)
        return -2;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -2;
    }
    int r;
    do r = flock(fd, LOCK_EX | (blocking ? 0 : LOCK_NB)); while (r < 0 && errno == EINTR);
    if (r < 0) {
        close(fd);
        return -1;
    }
    char info[192];
    int n = snprintf(info, sizeof info, "{\"pid\": %d, \"who\": \"%s\", \"since\": %.6f}",
                     (int)getpid(), gw_cfg.who, gw_wall());
    if (ftruncate(fd, 0) == 0 && n > 0)
        (void)!pwrite(fd, info, (size_t)n, 0);
    return fd;
}

/* Wait for a free slot: poll like ops/gate.py, or simply block on the only one when there is one.
 * -1 when no slot file can be opened: a broken gate must not stop the engine from registering. */
static int acquire(int *slot_out, const char *call, size_t bytes) {
    int slots = gw_cfg.slots;
    int start = (int)(getpid() % slots);
    int announced = 0;
    mkdir(gw_cfg.gate_dir, 0700);
    for (;;) {
        int unusable = 0;
        for (int k = 0; k < slots; k++) {
            int i = (start + k) % slots;
            int fd = try_slot(i, 0);
            if (fd >= 0) {
                *slot_out = i;
                return fd;
            }
            unusable += fd == -2;
        }
        if (unusable == slots) {
            gw_emit("preload-warning", ",\"message\":\"cannot open the gate's slot files in %s (errno %d): "
                    "registering without a slot\"", gw_cfg.gate_dir, errno);
            *slot_out = -1;
            return -1;
        }
        if (!announced) {
            gw_emit("waiting", ",\"call\":\"%s\",\"bytes\":%zu,\"slots\":%d", call, bytes, slots);
            announced = 1;
        }
        if (slots == 1) {
            int fd = try_slot(0, 1);
            if (fd >= 0) {
                *slot_out = 0;
                return fd;
            }
        }
        struct timespec ts = {0, (long)(POLL_S * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* With G.mu held. */
static void release_locked(const char *reason) {
    if (G.fd < 0)
        return;
    double held = gw_mono() - G.taken_at;
    if (ftruncate(G.fd, 0) != 0) {
        /* the slot file's contents are advisory; closing is what releases */
    }
    close(G.fd);
    G.fd = -1;
    G.gen++;
    if (reason)
        gw_emit("gate-released", ",\"slot\":%d,\"reason\":\"%s\",\"held_s\":%.6f", G.slot, reason, held);
    pthread_cond_broadcast(&G.cv);
}

static void wait_until(double mono_deadline) {
    struct timespec ts;
    double whole = (double)(long long)mono_deadline;
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((mono_deadline - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&G.cv, &G.mu, &ts);
}

/* The watchdog: ends a hung call's hold, and ends a hold kept past the call (ready or N seconds). */
static void *watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&G.mu);
    while (G.fd >= 0) {
        double now = gw_mono();
        if (G.calls > 0) {
            if (now >= G.call_deadline) {
                gw_emit("register-hung", ",\"call\":\"%s\",\"bytes\":%zu,\"slot\":%d,\"seconds\":%.3f",
                        G.call, G.bytes, G.slot, now - (G.call_deadline - gw_cfg.registration_timeout));
                release_locked("hung");
                break;
            }
            wait_until(G.call_deadline);
            continue;
        }
        struct stat st;
        if (gw_cfg.release == GW_RELEASE_READY && stat(gw_cfg.ready_file, &st) == 0) {
            release_locked("ready");
            break;
        }
        if (now >= G.hold_until) {
            release_locked(gw_cfg.release == GW_RELEASE_AFTER ? "after" : "timeout");
            break;
        }
        double wake = G.hold_until;
        if (gw_cfg.release == GW_RELEASE_READY && now + POLL_S < wake)
            wake = now + POLL_S;
        wait_until(wake);
    }
    G.watcher = 0;
    pthread_mutex_unlock(&G.mu);
    return NULL;
}

/* With G.mu held. */
static void start_watcher(void) {
    if (G.watcher)
        return;
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    if (pthread_create(&t, &attr, watch, NULL) == 0)
        G.watcher = 1;
    pthread_attr_destroy(&attr);
}

void gw_gate_enter(struct gw_ticket *t, const char *call, size_t bytes) {
    t->slot = -1;
    t->gen = 0;
    t->wait_s = 0;
    if (!gw_cfg.gate_dir[0])
        return;
    pthread_mutex_lock(&G.acquire_mu);
    pthread_mutex_lock(&G.mu);
    if (G.fd < 0) {
        pthread_mutex_unlock(&G.mu);
        double t0 = gw_mono();
        int slot;
        int fd = acquire(&slot, call, bytes);
        t->wait_s = gw_mono() - t0;
        pthread_mutex_lock(&G.mu);
        if (fd < 0) {
            pthread_mutex_unlock(&G.mu);
            pthread_mutex_unlock(&G.acquire_mu);
            return;  /* t->slot stays -1: the call goes ahead ungated, and says so */
        }
        G.fd = fd;
        G.slot = slot;
        G.taken_at = gw_mono();
    }
    if (G.calls++ == 0) {
        G.call_deadline = gw_mono() + gw_cfg.registration_timeout;
        G.call = call;
        G.bytes = bytes;
    }
    t->slot = G.slot;
    t->gen = G.gen;
    start_watcher();
    pthread_cond_broadcast(&G.cv);  /* a watcher holding the slot past a call now watches this one */
    pthread_mutex_unlock(&G.mu);
    pthread_mutex_unlock(&G.acquire_mu);
}

int gw_gate_settle(const struct gw_ticket *t) {
    if (t->slot < 0)
        return 0;
    pthread_mutex_lock(&G.mu);
    return G.fd < 0 || G.gen != t->gen;  /* the watchdog let the slot go while this call hung */
}

void gw_gate_leave(const struct gw_ticket *t, int hold) {
    if (t->slot < 0)
        return;
    if (G.fd < 0 || G.gen != t->gen) {
        pthread_mutex_unlock(&G.mu);
        return;
    }
    if (--G.calls == 0) {
        switch (hold ? gw_cfg.release : GW_RELEASE_REGISTERED) {
        case GW_RELEASE_REGISTERED:
            release_locked(NULL);  /* the "registered" line, written under the slot, says it */
            break;
        case GW_RELEASE_AFTER:
            G.hold_until = gw_mono() + gw_cfg.release_after;
            break;
        case GW_RELEASE_READY:
            G.hold_until = gw_mono() + gw_cfg.registration_timeout;
            break;
        }
        pthread_cond_broadcast(&G.cv);
    }
    pthread_mutex_unlock(&G.mu);
}
