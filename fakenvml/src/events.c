/* Event sets: every injected fault reaches every set that registered its device and type,
 * exactly once and in journal order, in every process.
 *
 * MIG devices register too. An Xid that names a GPU instance (and maybe a compute
 * instance) reaches the sets that registered that MIG device, or the parent GPU, as on
 * real drivers; a fault that names no instance concerns the whole GPU and reaches the
 * GPU's MIG devices as well. A set receives each record once: for its MIG device when it
 * registered one that matches, else for the GPU.
 *
 * Each set keeps its own read position in the journal and its own inotify watch on the
 * journal file, so a writer's append wakes every waiter at once: no polling interval.
 * Should inotify be unavailable (instance limits), waits fall back to 1 ms polling. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include "getters.h"

#define SET_MAGIC 0x4E564553u /* "NVES" */
#define ECC_EVENTS (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError)
/* Types a set may register for: every type the r580 driver knows (bits 0-15), supported by
 * the board or not, as a real H100 accepts them; only ECC needs ECC on. */
#define KNOWN_EVENTS 0xFFFFull

/* What a set may register for on the board: every known type, ECC only with ECC on. */
static unsigned long long registrable_events(const fnv_device *d) {
    return KNOWN_EVENTS & (d->ecc_enabled ? ~0ull : ~(unsigned long long)ECC_EVENTS);
}

static unsigned long long supported_events(const fnv_device *d) {
    return d->event_types & (d->ecc_enabled ? ~0ull : ~(unsigned long long)ECC_EVENTS);
}

struct nvmlEventSet_st {
    uint32_t magic;
    pthread_mutex_t mu; /* one waiter at a time; taken before fnv_lock, never after */
    unsigned users;     /* waits in progress; guarded by fnv_lock */
    int freed;          /* nvmlEventSetFree called; the last user destroys */
    uint64_t boot_id;
    int journal_fd, notify_fd;
    uint64_t next; /* next journal position to examine */
    uint32_t count;
    unsigned long long *mask; /* registered types per device; guarded by fnv_lock */
    uint64_t *from;           /* position from which a device's events count */
    struct mig_reg *migs;     /* registered MIG devices; guarded by fnv_lock */
    uint32_t nmigs, capmigs;
    struct nvmlEventSet_st *link;
};

struct mig_reg {
    uint32_t gpu, gi, ci;
    unsigned long long mask;
    uint64_t from;
};

static struct nvmlEventSet_st *live_sets; /* guarded by fnv_lock; validates handles */

static int set_is_live(nvmlEventSet_t set) {
    for (struct nvmlEventSet_st *s = live_sets; s; s = s->link)
        if (s == set) return 1;
    return 0;
}

static uint64_t journal_end(int fd) {
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < (off_t)sizeof(fnv_journal_header)) return 0;
    return ((uint64_t)size - sizeof(fnv_journal_header)) / sizeof(fnv_record);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    if (!eventTypes) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* The profile's types; ECC events exist only where ECC is on, as on real boards. */
    *eventTypes = supported_events(d);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (s) {
        s->mask = calloc(fnv_g->count, sizeof *s->mask);
        s->from = calloc(fnv_g->count, sizeof *s->from);
    }
    if (!s || !s->mask || !s->from) goto oom;
    s->journal_fd = open(fnv_g->journal_path, O_RDONLY | O_CLOEXEC);
    if (s->journal_fd < 0) {
        fnv_log("nvmlEventSetCreate: %s: cannot open journal", fnv_g->journal_path);
        ret = NVML_ERROR_UNKNOWN;
        goto fail;
    }
    s->notify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (s->notify_fd >= 0 && inotify_add_watch(s->notify_fd, fnv_g->journal_path, IN_MODIFY) < 0) {
        close(s->notify_fd);
        s->notify_fd = -1;
    }
    if (s->notify_fd >= 0) {
        /* A writer appends, then commits in journal.gen: a waiter that scanned in between
         * found nothing readable, and only the commit can wake it before its timeout. No
         * journal.gen (an older state): readers go by the journal's size alone. */
        char gen[PATH_MAX + sizeof "/" FNV_GEN_FILE];
        snprintf(gen, sizeof gen, "%s/" FNV_GEN_FILE, fnv_g->dir);
        inotify_add_watch(s->notify_fd, gen, IN_MODIFY);
    }
    if (s->notify_fd < 0) fnv_log("inotify unavailable (%s): event waits poll every 1 ms", strerror(errno));
    s->magic = SET_MAGIC;
    pthread_mutex_init(&s->mu, NULL);
    s->boot_id = fnv_g->header.boot_id;
    s->count = fnv_g->count;
    s->next = journal_end(s->journal_fd); /* only faults injected from now on */
    s->link = live_sets;
    live_sets = s;
    *set = s;
    return fnv_leave(NVML_SUCCESS);
oom:
    ret = NVML_ERROR_MEMORY;
fail:
    if (s) {
        free(s->mask);
        free(s->from);
    }
    free(s);
    return fnv_leave(ret);
}

/* A MIG device's registration: the parent's allowed types, its own read position. */
static nvmlReturn_t register_mig(nvmlDevice_t device, unsigned long long eventTypes,
                                 nvmlEventSet_t set) {
    nvmlReturn_t ret = fnv_enter_as("nvmlDeviceRegisterEvents");
    if (ret != NVML_SUCCESS) return ret;
    uint32_t gpu, gi, ci;
    if (!fnv_mig_handle(device, &gpu, &gi, &ci) || !set_is_live(set) ||
        set->boot_id != fnv_g->header.boot_id)
        return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (fnv_g->faults[gpu].lost) return fnv_leave(NVML_ERROR_GPU_IS_LOST);
    const fnv_device *d = &fnv_g->devices[gpu];
    if (eventTypes & ~registrable_events(d)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    for (uint32_t i = 0; i < set->nmigs; i++) {
        struct mig_reg *r = &set->migs[i];
        if (r->gpu == gpu && r->gi == gi && r->ci == ci) {
            r->mask |= eventTypes;
            return fnv_leave(NVML_SUCCESS);
        }
    }
    if (set->nmigs == set->capmigs) {
        uint32_t cap = set->capmigs ? set->capmigs * 2 : 8;
        struct mig_reg *m = realloc(set->migs, cap * sizeof *m);
        if (!m) return fnv_leave(NVML_ERROR_MEMORY);
        set->migs = m;
        set->capmigs = cap;
    }
    set->migs[set->nmigs++] = (struct mig_reg){gpu, gi, ci, eventTypes, journal_end(set->journal_fd)};
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    if (fnv_is_mig_handle(device)) return register_mig(device, eventTypes, set);
    DEVICE_ENTER(device);
    if (!set_is_live(set) || set->boot_id != fnv_g->header.boot_id)
        return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~registrable_events(d)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    if (set->mask[d->index] == 0) set->from[d->index] = journal_end(set->journal_fd);
    set->mask[d->index] |= eventTypes;
    return fnv_leave(NVML_SUCCESS);
}

static void destroy(struct nvmlEventSet_st *set) {
    pthread_mutex_destroy(&set->mu);
    close(set->journal_fd);
    if (set->notify_fd >= 0) close(set->notify_fd);
    set->magic = 0;
    free(set->mask);
    free(set->from);
    free(set->migs);
    free(set);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&fnv_lock);
    struct nvmlEventSet_st **p = &live_sets;
    while (*p && *p != set) p = &(*p)->link;
    if (!*p) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    *p = set->link;
    set->freed = 1;
    if (set->users == 0) destroy(set); /* else the last waiter does, on its way out */
    return fnv_leave(NVML_SUCCESS);
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The registered MIG device a record concerns, or NULL: the instance it names (a compute
 * instance, or any in the GPU instance), or any MIG device of the GPU for a record that
 * names none. */
static const struct mig_reg *mig_target(const struct nvmlEventSet_st *s, const fnv_record *rec,
                                        uint64_t position) {
    for (uint32_t i = 0; i < s->nmigs; i++) {
        const struct mig_reg *r = &s->migs[i];
        if (r->gpu != rec->gpu || position < r->from) continue;
        if (rec->gpu_instance == FNV_NO_INSTANCE ||
            (rec->gpu_instance == r->gi &&
             (rec->compute_instance == FNV_NO_INSTANCE || rec->compute_instance == r->ci)))
            return r;
    }
    return NULL;
}

/* What a record means to this set: 1 an event (data filled), 2 GPU lost, 0 nothing. */
static int deliver(struct nvmlEventSet_st *s, const fnv_record *rec, uint64_t position,
                   nvmlEventData_t *data) {
    if (rec->kind > FNV_RECOVERY_ACTION) return 0; /* telemetry and knobs: no events */
    const struct mig_reg *mig = s->nmigs ? mig_target(s, rec, position) : NULL;
    unsigned long long mask = 0, type;
    if (mig) mask = mig->mask;
    else if (position >= s->from[rec->gpu]) mask = s->mask[rec->gpu];
    if (!mask) return 0;
    switch (rec->kind) {
    case FNV_XID:
    case FNV_FALLEN_OFF_BUS: type = nvmlEventTypeXidCriticalError; break;
    case FNV_ECC_SINGLE: type = nvmlEventTypeSingleBitEccError; break;
    case FNV_ECC_DOUBLE: type = nvmlEventTypeDoubleBitEccError; break;
    case FNV_RECOVERY_ACTION:
    case FNV_RECOVER: type = nvmlEventTypeGpuRecoveryAction; break;
    case FNV_LOST: return 2;
    default: return 0;
    }
    if (!(mask & type)) return rec->kind == FNV_FALLEN_OFF_BUS ? 2 : 0;
    data->device = mig ? fnv_mig_device(mig->gpu, mig->gi, mig->ci) : &fnv_handles[rec->gpu];
    data->eventType = type;
    /* Xid code, or the recovery action now asked for (RECOVER: none). */
    data->eventData = rec->kind == FNV_RECOVER || rec->kind == FNV_ECC_SINGLE || rec->kind == FNV_ECC_DOUBLE
                          ? 0
                          : rec->data;
    data->gpuInstanceId = rec->gpu_instance;
    data->computeInstanceId = rec->compute_instance;
    return 1;
}

/* How far events may be read: the journal's whole records, but where journal.gen exists only
 * those a writer has committed there. A writer appends, then stores the count; an event read
 * between the two would reach a consumer whose next NVML call still answers from the state
 * before it (a recovered GPU still lost: the recovery event is dropped as a lost GPU's). */
static uint64_t readable_end(const struct nvmlEventSet_st *s) {
    uint64_t end = journal_end(s->journal_fd);
    pthread_mutex_lock(&fnv_lock);
    if (fnv_g && fnv_g->header.boot_id == s->boot_id && fnv_g->committed) {
        uint64_t committed = __atomic_load_n(fnv_g->committed, __ATOMIC_ACQUIRE);
        if (committed < end) end = committed;
    }
    pthread_mutex_unlock(&fnv_lock);
    return end;
}

/* Scans new records; returns SUCCESS / GPU_IS_LOST on a delivery, TIMEOUT when none. */
static nvmlReturn_t scan(struct nvmlEventSet_st *s, nvmlEventData_t *data) {
    uint64_t end = readable_end(s);
    fnv_record rec;
    while (s->next < end && fnv_read_record(s->journal_fd, s->next, &rec) == 1) {
        uint64_t position = s->next++;
        if (!fnv_record_valid(&rec, position, s->count)) continue;
        pthread_mutex_lock(&fnv_lock);
        int what = deliver(s, &rec, position, data);
        pthread_mutex_unlock(&fnv_lock);
        if (what == 1) return NVML_SUCCESS;
        if (what == 2) return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_ERROR_TIMEOUT;
}

/* Is any registered device lost right now? Reads the process's fault state. */
static int registered_device_lost(struct nvmlEventSet_st *s) {
    int lost = 0;
    pthread_mutex_lock(&fnv_lock);
    if (fnv_g && fnv_g->header.boot_id == s->boot_id) {
        fnv_journal_refresh(fnv_g);
        for (uint32_t i = 0; i < s->count && !lost; i++) lost = s->mask[i] && fnv_g->faults[i].lost;
        for (uint32_t i = 0; i < s->nmigs && !lost; i++) lost = fnv_g->faults[s->migs[i].gpu].lost;
    }
    pthread_mutex_unlock(&fnv_lock);
    return lost;
}

static void drain(int fd) {
    char buf[4096];
    while (read(fd, buf, sizeof buf) > 0) {
    }
}

/* Blocks until an event or the timeout — also when the answer is an error, so that a
 * consumer that loops on errors (NVIDIA's plugin does, without backoff) cannot spin. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&fnv_lock);
    if (fnv_g) { /* knobs apply; a failing wait answers at once (docs/fakenvml.md) */
        fnv_journal_refresh(fnv_g);
        nvmlReturn_t knob = fnv_knob_count ? fnv_gate(__func__, FNV_ALL_GPUS) : NVML_SUCCESS;
        if (knob != NVML_SUCCESS) {
            pthread_mutex_unlock(&fnv_lock);
            return knob;
        }
    }
    int ok = set_is_live(set);
    if (ok) set->users++; /* keeps the set alive across a concurrent Free */
    pthread_mutex_unlock(&fnv_lock);
    if (!ok) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&set->mu);
    uint64_t deadline = now_ms() + timeoutms;
    nvmlReturn_t ret;
    for (;;) {
        if (set->notify_fd >= 0) drain(set->notify_fd); /* before scanning: no lost wake-up */
        ret = scan(set, data);
        if (ret != NVML_ERROR_TIMEOUT) break;
        uint64_t now = now_ms();
        if (now >= deadline) {
            if (registered_device_lost(set)) ret = NVML_ERROR_GPU_IS_LOST;
            break;
        }
        uint64_t left = deadline - now;
        if (set->notify_fd >= 0) {
            struct pollfd pfd = {.fd = set->notify_fd, .events = POLLIN};
            poll(&pfd, 1, left > 60000 ? 60000 : (int)left);
        } else {
            nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
        }
    }
    pthread_mutex_unlock(&set->mu);
    pthread_mutex_lock(&fnv_lock);
    if (--set->users == 0 && set->freed) destroy(set);
    pthread_mutex_unlock(&fnv_lock);
    return ret;
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
