/* Lifecycle (ref-counted Init/Shutdown), call bracketing, handles, system queries.
 * No constructors, destructors or threads: the library may be dlopen'ed and dlclose'd
 * any number of times, and nothing of ours runs unless NVML is called.
 *
 * The top of the library's own layers (fake.h): it loads the state (state.c), replays the
 * journal into it (journal.c), gates calls on the knobs (knobs.c), and hands out device
 * handles, MIG devices' included; the NVML API units above call it, never the reverse. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "fake.h"

struct nvmlDevice_st fnv_handles[FNV_MAX_DEVICES];
pthread_mutex_t fnv_lock = PTHREAD_MUTEX_INITIALIZER;
fnv_state *fnv_g;
static unsigned fnv_refcount;

/* Sleeps out a delay knob (the caller has let go of the lock). */
static void sleep_ms(uint32_t ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- Init / Shutdown ---- */

/* A GPU that a `fail nvmlInit --gpu N` knob fails stays failed in this process until its
 * next first nvmlInit, as a GPU that failed to initialise does on a real node. */
static void mark_init_failures(fnv_state *st) {
    for (uint32_t i = 0; i < st->count; i++) st->faults[i].init_error = fnv_knob_init_error(st, i);
}

/* Every init entry point: knobs name them all FNV_INIT_NAME. A delay knob sleeps after
 * the work and outside the lock, so other threads' calls go on meanwhile. */
static nvmlReturn_t init(void) {
    uint32_t delay = 0;
    pthread_mutex_lock(&fnv_lock);
    if (fnv_refcount == 0)
        for (unsigned i = 0; i < FNV_MAX_DEVICES; i++) fnv_handles[i].index = i;
    fnv_state *st = fnv_g;
    nvmlReturn_t ret = NVML_SUCCESS;
    if (st)
        fnv_journal_refresh(st);
    else if ((ret = fnv_load(&st)) == NVML_SUCCESS)
        fnv_journal_start(st);
    if (ret == NVML_SUCCESS && fnv_knob_count) {
        ret = fnv_knob_match(st, FNV_INIT_NAME, FNV_ALL_GPUS, &delay);
        if (ret == NVML_SUCCESS && st != fnv_g) mark_init_failures(st);
    }
    if (ret == NVML_SUCCESS) {
        fnv_g = st;
        fnv_refcount++;
    } else if (st != fnv_g) {
        fnv_free(st);
    }
    pthread_mutex_unlock(&fnv_lock);
    if (delay) sleep_ms(delay);
    return ret;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init();
}

nvmlReturn_t nvmlInit_v2(void) { return init(); }
nvmlReturn_t nvmlInit(void) { return init(); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&fnv_lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (fnv_refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (--fnv_refcount == 0) {
        fnv_free(fnv_g);
        fnv_g = NULL;
    }
    pthread_mutex_unlock(&fnv_lock);
    return ret;
}

/* ---- call bracketing ---- */

/* Lock, then fold in what the journal gained since the last call. */
static nvmlReturn_t lock_fresh(void) {
    pthread_mutex_lock(&fnv_lock);
    if (!fnv_g) {
        pthread_mutex_unlock(&fnv_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    fnv_journal_refresh(fnv_g); /* one load from journal.gen: faults injected a moment ago
                                   are visible without a system call */
    return NVML_SUCCESS;
}

nvmlReturn_t fnv_enter_as(const char *fn) {
    nvmlReturn_t ret = lock_fresh();
    if (ret != NVML_SUCCESS || !fnv_knob_count) return ret;
    ret = fnv_gate(fn, FNV_ALL_GPUS);
    return ret == NVML_SUCCESS ? ret : fnv_leave(ret);
}

nvmlReturn_t fnv_leave(nvmlReturn_t ret) {
    pthread_mutex_unlock(&fnv_lock);
    return ret;
}

/* ---- knobs: the table is knobs.c's; waiting out a delay is the lock's business ---- */

nvmlReturn_t fnv_gate(const char *fn, uint32_t gpu) {
    uint32_t delay = 0;
    nvmlReturn_t err = fnv_knob_match(fnv_g, fn, gpu, &delay);
    if (delay) { /* other threads' calls go on meanwhile */
        pthread_mutex_unlock(&fnv_lock);
        sleep_ms(delay);
        pthread_mutex_lock(&fnv_lock);
        if (!fnv_g) return NVML_ERROR_UNINITIALIZED;
        fnv_journal_refresh(fnv_g);
    }
    return err;
}

nvmlReturn_t fnv_stub(const char *fn) {
    nvmlReturn_t ret = NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&fnv_lock);
    if (fnv_g) {
        fnv_journal_refresh(fnv_g);
        if (fnv_knob_count) {
            nvmlReturn_t knob = fnv_gate(fn, FNV_ALL_GPUS);
            if (knob != NVML_SUCCESS) ret = knob;
        }
    }
    pthread_mutex_unlock(&fnv_lock);
    return ret;
}

/* ---- handles ---- */

int fnv_handle_index(nvmlDevice_t device, uint32_t *index) {
    uintptr_t p = (uintptr_t)device, base = (uintptr_t)fnv_handles;
    if (!fnv_g || p < base || p >= base + fnv_g->count * sizeof fnv_handles[0] ||
        (p - base) % sizeof fnv_handles[0])
        return 0;
    *index = (uint32_t)((p - base) / sizeof fnv_handles[0]);
    return 1;
}

/* On success the lock is held and *dev points at the device; pair with fnv_leave. */
nvmlReturn_t fnv_device_enter_as(const char *fn, nvmlDevice_t device, const fnv_device **dev) {
    nvmlReturn_t ret = lock_fresh();
    if (ret != NVML_SUCCESS) return ret;
    uint32_t i;
    if (!fnv_handle_index(device, &i)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fnv_fault *f = &fnv_g->faults[i];
    if (f->lost) return fnv_leave(NVML_ERROR_GPU_IS_LOST);
    if (f->init_error) return fnv_leave(f->init_error);
    if (fnv_knob_count) {
        ret = fnv_gate(fn, i);
        if (ret != NVML_SUCCESS) return fnv_leave(ret);
        /* A delay let go of the lock: the handle must still name a GPU. */
        if (!fnv_handle_index(device, &i)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    *dev = &fnv_g->devices[i];
    return NVML_SUCCESS;
}

/* MIG devices are nvmlDevice_t too: (GPU, GPU instance, compute instance), each the
 * address of its own slot, so a handle stays valid (and names the same instance) for as
 * long as the instance exists. */
#define MIG_SLOTS ((size_t)FNV_MAX_DEVICES * FNV_MIG_GIS * FNV_MIG_CIS)
static struct nvmlDevice_st mig_handles[MIG_SLOTS];

nvmlDevice_t fnv_mig_device(uint32_t gpu, uint32_t gi, uint32_t ci) {
    return &mig_handles[((size_t)gpu * FNV_MIG_GIS + gi) * FNV_MIG_CIS + ci];
}

int fnv_is_mig_handle(nvmlDevice_t device) {
    return fnv_slot_of(device, mig_handles, sizeof mig_handles[0], MIG_SLOTS) >= 0;
}

int fnv_gi_live(uint32_t gpu, uint32_t gi) {
    return fnv_g && gpu < fnv_g->count && gi < FNV_MIG_GIS &&
           fnv_g->mig[gpu].current == NVML_DEVICE_MIG_ENABLE && fnv_g->mig[gpu].gi[gi].used;
}

int fnv_mig_handle(nvmlDevice_t device, uint32_t *gpu, uint32_t *gi, uint32_t *ci) {
    long s = fnv_slot_of(device, mig_handles, sizeof mig_handles[0], MIG_SLOTS);
    if (s < 0) return 0;
    *ci = (uint32_t)(s % FNV_MIG_CIS);
    *gi = (uint32_t)(s / FNV_MIG_CIS % FNV_MIG_GIS);
    *gpu = (uint32_t)(s / FNV_MIG_CIS / FNV_MIG_GIS);
    return fnv_gi_live(*gpu, *gi) && fnv_g->mig[*gpu].gi[*gi].ci[*ci].used;
}

/* The MIG device whose UUID (fnv_mig_uuid) is `uuid`; lock held. */
static nvmlReturn_t mig_by_uuid(const char *uuid, nvmlDevice_t *device) {
    char want[96];
    for (uint32_t g = 0; g < fnv_g->count; g++)
        for (uint32_t i = 0; i < FNV_MIG_GIS; i++)
            for (uint32_t c = 0; fnv_gi_live(g, i) && c < FNV_MIG_CIS; c++) {
                if (!fnv_g->mig[g].gi[i].ci[c].used) continue;
                fnv_mig_uuid(fnv_g->devices[g].uuid, i, c, want);
                if (strcasecmp(want, uuid) == 0) {
                    *device = fnv_mig_device(g, i, c);
                    return NVML_SUCCESS;
                }
            }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- errors ---- */

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC is not supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system ---- */

#define WITH_STATE(body) WITH_STATE_AS(__func__, body)
#define WITH_STATE_AS(fn, body)                                                                    \
    do {                                                                                           \
        nvmlReturn_t ret_ = fnv_enter_as(fn);                                                      \
        if (ret_ != NVML_SUCCESS) return ret_;                                                     \
        body;                                                                                      \
    } while (0)

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    WITH_STATE(return fnv_leave(fnv_copy_str(version, length, fnv_g->header.driver_version)));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    WITH_STATE(return fnv_leave(fnv_copy_str(version, length, fnv_g->header.nvml_version)));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(*cudaDriverVersion = fnv_g->header.cuda_driver_version;
               return fnv_leave(NVML_SUCCESS));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t nvmlSystemGetDriverBranch(nvmlSystemDriverBranchInfo_t *branchInfo,
                                       unsigned int length) {
    if (!branchInfo) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE({
        char branch[sizeof fnv_g->header.driver_version + 1];
        snprintf(branch, sizeof branch, "r%s", fnv_g->header.driver_version);
        char *dot = strchr(branch, '.');
        if (dot) *dot = '\0';
        /* The inventory's branch when it names one: r580 drivers may report r582_49. */
        if (fnv_g->header.driver_branch[0])
            snprintf(branch, sizeof branch, "%s", fnv_g->header.driver_branch);
        return fnv_leave(fnv_copy_str(branchInfo->branch, length, branch));
    });
}

/* A process's name as the driver reports it: its command (argv[0]) as this host's /proc
 * has it. 0 when there is no such process here: the fake processes `fakenvml process add`
 * lists need not exist. */
int fnv_process_name(uint32_t pid, char *name, size_t length) {
    char path[32];
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    FILE *f = length ? fopen(path, "re") : NULL;
    if (!f) {
        if (length) name[0] = 0;
        return 0;
    }
    size_t n = fread(name, 1, length - 1, f);
    fclose(f);
    name[n] = 0; /* argv[0] ends at its NUL */
    return n > 0;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    if (!name || !length) return NVML_ERROR_INVALID_ARGUMENT;
    char full[4096];
    WITH_STATE({
        if (!fnv_process_name(pid, full, sizeof full)) return fnv_leave(NVML_ERROR_NOT_FOUND);
        return fnv_leave(fnv_copy_str(name, length, full));
    });
}

nvmlReturn_t nvmlGetExcludedDeviceCount(unsigned int *deviceCount) {
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(*deviceCount = 0; return fnv_leave(NVML_SUCCESS));
}

nvmlReturn_t nvmlGetExcludedDeviceInfoByIndex(unsigned int index, nvmlExcludedDeviceInfo_t *info) {
    (void)index;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(return fnv_leave(NVML_ERROR_INVALID_ARGUMENT));
}

/* ---- count and handles ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE(*deviceCount = fnv_g->nvisible; return fnv_leave(NVML_SUCCESS));
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return nvmlDeviceGetCount_v2(deviceCount);
}

/* Lock held; fn: the exported lookup, whose knobs for GPU i apply. */
static nvmlReturn_t handle_for(const char *fn, uint32_t i, nvmlDevice_t *device) {
    if (fnv_g->faults[i].lost) return NVML_ERROR_GPU_IS_LOST;
    if (fnv_g->faults[i].init_error) return fnv_g->faults[i].init_error;
    if (fnv_knob_count) {
        nvmlReturn_t ret = fnv_gate(fn, i);
        if (ret != NVML_SUCCESS) return ret;
        if (i >= fnv_g->count) return NVML_ERROR_INVALID_ARGUMENT; /* re-initialised meanwhile */
    }
    *device = &fnv_handles[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE({
        if (index >= fnv_g->nvisible) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
        return fnv_leave(handle_for(__func__, fnv_g->visible[index], device));
    });
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* Finds the device whose string field at `offset` equals `key`. */
static nvmlReturn_t handle_by_field(const char *fn, size_t offset, const char *key,
                                    nvmlDevice_t *device) {
    if (!key || !device) return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE_AS(fn, {
        for (uint32_t i = 0; i < fnv_g->count; i++) {
            if (fnv_g->position[i] == UINT32_MAX) continue; /* another container's GPU */
            const char *field = (const char *)&fnv_g->devices[i] + offset;
            if (strcasecmp(field, key) == 0) return fnv_leave(handle_for(fn, i, device));
        }
        return fnv_leave(NVML_ERROR_NOT_FOUND);
    });
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (uuid && device && strncasecmp(uuid, "MIG-", 4) == 0) /* a MIG device's UUID */
        WITH_STATE({ return fnv_leave(mig_by_uuid(uuid, device)); });
    return handle_by_field(__func__, offsetof(fnv_device, uuid), uuid, device);
}

nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    return handle_by_field(__func__, offsetof(fnv_device, serial), serial, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUIDV(const nvmlUUID_t *uuid, nvmlDevice_t *device) {
    if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
    char text[sizeof uuid->value.str + 1];
    if (uuid->type == NVML_UUID_TYPE_ASCII) {
        memcpy(text, uuid->value.str, sizeof uuid->value.str);
        text[sizeof uuid->value.str] = '\0';
    } else if (uuid->type == NVML_UUID_TYPE_BINARY) {
        /* The 16 bytes behind "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
        const unsigned char *b = uuid->value.bytes;
        snprintf(text, sizeof text,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return handle_by_field(__func__, offsetof(fnv_device, uuid), text, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    unsigned dom, bus, dev, fn;
    if (!pciBusId || !device || !fnv_parse_bus_id(pciBusId, &dom, &bus, &dev, &fn))
        return NVML_ERROR_INVALID_ARGUMENT;
    WITH_STATE({
        for (uint32_t i = 0; i < fnv_g->count; i++) {
            const fnv_device *d = &fnv_g->devices[i];
            if (fnv_g->position[i] == UINT32_MAX) continue; /* another container's GPU */
            if (d->pci_domain == dom && d->pci_bus == bus && d->pci_device == dev &&
                d->pci_function == fn)
                return fnv_leave(handle_for(__func__, i, device));
        }
        return fnv_leave(NVML_ERROR_NOT_FOUND);
    });
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}
