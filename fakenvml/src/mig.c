/* MIG: mode, GPU instances, compute instances and the MIG devices they make.
 *
 * The layout is replayed from the journal (FNV_MIG_MODE ... FNV_CI_DESTROY): `fakenvml mig`
 * writes those records, and so do the NVML create/destroy calls here, so a layout made in
 * any process is every process's at its next call. Replay checks each record as the
 * driver checks the call and ignores what the driver would refuse.
 *
 * Handles: a GPU instance is (GPU, id), a compute instance (GPU, id, id), a MIG device the
 * same; each is the address of its own slot in a static table, so a handle stays valid
 * (and names the same instance) for as long as the instance exists. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"
#include "getters.h"

struct nvmlGpuInstance_st {
    char slot;
};
struct nvmlComputeInstance_st {
    char slot;
};

#define SLOTS ((size_t)FNV_MAX_DEVICES * FNV_MIG_GIS * FNV_MIG_CIS)
static struct nvmlGpuInstance_st gi_handles[(size_t)FNV_MAX_DEVICES * FNV_MIG_GIS];
static struct nvmlComputeInstance_st ci_handles[SLOTS];
static struct nvmlDevice_st mig_handles[SLOTS];

/* NVML_COMPUTE_INSTANCE_PROFILE_*: 1, 2, 3, 4, 7, 8, 6 slices, then 1 (REV1). */
static const uint8_t CI_SLICES[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 1};
/* The compute-instance profiles a 7-slice GPU offers: 1, 2, 3, 4 and 7 slices. */
#define CI_LAST NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE
#define MIG_ENABLED(m) ((m)->current == NVML_DEVICE_MIG_ENABLE)

/* ---- layout rules (shared by replay and the create calls) ---- */

static int tree_id(uint32_t size, uint32_t start) {
    switch (size) {
    case 8: return 0;
    case 4: return 1 + (int)start / 4;
    case 2: return 3 + (int)start / 2;
    case 1: return 7 + (int)start;
    default: return -1;
    }
}

static const fnv_mig_profile *profile_by_id(const fnv_device *d, uint32_t id, uint8_t *index) {
    for (unsigned i = 0; i < d->mig_count; i++)
        if (d->mig[i].id == id) {
            if (index) *index = (uint8_t)i;
            return &d->mig[i];
        }
    return NULL;
}

static unsigned max_slices(const fnv_device *d) {
    unsigned n = 0;
    for (unsigned i = 0; i < d->mig_count; i++)
        if (d->mig[i].slice_count > n) n = d->mig[i].slice_count;
    return n;
}

/* Whether a GPU instance of profile p may start at `start` now; its id in *id. */
static nvmlReturn_t gi_fits(const fnv_device *d, const fnv_mig *m, const fnv_mig_profile *p,
                            uint32_t start, int *id) {
    if (start >= 32 || !(p->placement_starts >> start & 1u)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned same = 0, slices = p->slice_count;
    uint32_t lo = start, hi = start + p->placement_size;
    for (int g = 0; g < FNV_MIG_GIS; g++) {
        const fnv_gi *x = &m->gi[g];
        if (!x->used) continue;
        const fnv_mig_profile *q = &d->mig[x->prof];
        same += q->id == p->id;
        slices += q->slice_count;
        if (x->start < hi && lo < (uint32_t)x->start + q->placement_size)
            return NVML_ERROR_INSUFFICIENT_RESOURCES; /* overlaps in memory */
    }
    if (same >= p->instance_count || slices > max_slices(d)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    *id = tree_id(p->placement_size, start);
    if (*id < 0 || *id >= FNV_MIG_GIS || m->gi[*id].used) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

static int first_fit(const fnv_device *d, const fnv_mig *m, const fnv_mig_profile *p,
                     uint32_t *start, int *id) {
    for (uint32_t s = 0; s < 32; s++)
        if (gi_fits(d, m, p, s, id) == NVML_SUCCESS) {
            *start = s;
            return 1;
        }
    return 0;
}

static unsigned gi_slices(const fnv_device *d, const fnv_gi *g) { return d->mig[g->prof].slice_count; }

/* Whether a compute instance of `profile` may start at `start` in GPU instance g. */
static nvmlReturn_t ci_fits(const fnv_device *d, const fnv_gi *g, uint32_t profile, uint32_t start) {
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned s = CI_SLICES[profile], n = gi_slices(d, g);
    if (s > n || profile > CI_LAST) return NVML_ERROR_NOT_SUPPORTED;
    if (start % s || start + s > n) return NVML_ERROR_INVALID_ARGUMENT;
    for (int c = 0; c < FNV_MIG_CIS; c++) {
        const fnv_ci *x = &g->ci[c];
        if (x->used && x->start < start + s && start < (unsigned)x->start + x->slices)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    return NVML_SUCCESS;
}

static int ci_free_id(const fnv_gi *g) {
    for (int c = 0; c < FNV_MIG_CIS; c++)
        if (!g->ci[c].used) return c;
    return -1;
}

static int ci_first_fit(const fnv_device *d, const fnv_gi *g, uint32_t profile, uint32_t *start) {
    unsigned s = profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT ? CI_SLICES[profile] : 1;
    for (uint32_t x = 0; x + s <= gi_slices(d, g); x += s)
        if (ci_fits(d, g, profile, x) == NVML_SUCCESS) {
            *start = x;
            return 1;
        }
    return 0;
}

static int has_cis(const fnv_gi *g) {
    for (int c = 0; c < FNV_MIG_CIS; c++)
        if (g->ci[c].used) return 1;
    return 0;
}

/* ---- replay ---- */

void fnv_mig_apply(fnv_state *st, const fnv_record *rec) {
    const fnv_device *d = &st->devices[rec->gpu];
    fnv_mig *m = &st->mig[rec->gpu];
    if (!d->mig_count) return; /* a board without MIG: nothing to change */
    switch (rec->kind) {
    case FNV_MIG_MODE: m->pending = rec->data ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE; break;
    case FNV_GPU_RESET:
        m->current = m->pending;
        memset(m->gi, 0, sizeof m->gi);
        break;
    case FNV_GI_CREATE: {
        uint8_t prof;
        const fnv_mig_profile *p = profile_by_id(d, rec->arg1, &prof);
        int id;
        if (!MIG_ENABLED(m) || !p || gi_fits(d, m, p, (uint32_t)rec->data, &id) != NVML_SUCCESS ||
            (uint32_t)id != rec->arg0)
            return;
        m->gi[id] = (fnv_gi){.used = 1, .prof = prof, .start = (uint8_t)rec->data};
        break;
    }
    case FNV_GI_DESTROY:
        if (rec->arg0 < FNV_MIG_GIS && !has_cis(&m->gi[rec->arg0])) m->gi[rec->arg0].used = 0;
        break;
    case FNV_CI_CREATE: {
        if (rec->arg0 >= FNV_MIG_GIS || rec->arg1 >= FNV_MIG_CIS) return;
        fnv_gi *g = &m->gi[rec->arg0];
        if (!g->used || g->ci[rec->arg1].used ||
            ci_fits(d, g, (uint32_t)rec->data, (uint32_t)rec->data2) != NVML_SUCCESS)
            return;
        g->ci[rec->arg1] = (fnv_ci){.used = 1, .profile = (uint8_t)rec->data,
                                    .start = (uint8_t)rec->data2,
                                    .slices = CI_SLICES[rec->data]};
        break;
    }
    case FNV_CI_DESTROY:
        if (rec->arg0 < FNV_MIG_GIS && rec->arg1 < FNV_MIG_CIS)
            m->gi[rec->arg0].ci[rec->arg1].used = 0;
        break;
    }
}

/* Appends a MIG record for another process to replay, as the Python writer does: under
 * flock, one whole record, seq one past the last; then replays it here. Lock held. */
static nvmlReturn_t journal_append(uint32_t kind, uint32_t gpu, uint32_t arg0, uint32_t arg1,
                                   uint64_t data, uint64_t data2) {
    int fd = open(fnv_g->journal_path, O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0) return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t ret = NVML_ERROR_UNKNOWN;
    struct stat sb;
    fnv_journal_header h;
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &sb) == 0 &&
        pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.boot_id == fnv_g->header.boot_id &&
        sb.st_size >= (off_t)sizeof h && (sb.st_size - (off_t)sizeof h) % sizeof(fnv_record) == 0) {
        struct timespec rt, mono;
        clock_gettime(CLOCK_REALTIME, &rt);
        clock_gettime(CLOCK_MONOTONIC, &mono);
        fnv_record rec = {
            .seq = (uint64_t)(sb.st_size - (off_t)sizeof h) / sizeof(fnv_record) + 1,
            .realtime_ns = (uint64_t)rt.tv_sec * 1000000000u + (uint64_t)rt.tv_nsec,
            .monotonic_ns = (uint64_t)mono.tv_sec * 1000000000u + (uint64_t)mono.tv_nsec,
            .kind = kind, .gpu = gpu, .data = data, .arg0 = arg0, .arg1 = arg1, .data2 = data2,
        };
        rec.crc = fnv_crc32(&rec, offsetof(fnv_record, crc));
        if (write(fd, &rec, sizeof rec) == (ssize_t)sizeof rec) {
            fnv_gen_store(fnv_g, rec.seq);
            ret = NVML_SUCCESS;
        }
    }
    close(fd); /* releases the flock */
    if (ret == NVML_SUCCESS) fnv_journal_refresh(fnv_g);
    return ret;
}

/* ---- handles ---- */

static nvmlGpuInstance_t gi_handle(uint32_t gpu, uint32_t gi) {
    return &gi_handles[(size_t)gpu * FNV_MIG_GIS + gi];
}

static nvmlComputeInstance_t ci_handle(uint32_t gpu, uint32_t gi, uint32_t ci) {
    return &ci_handles[((size_t)gpu * FNV_MIG_GIS + gi) * FNV_MIG_CIS + ci];
}

static nvmlDevice_t mig_handle(uint32_t gpu, uint32_t gi, uint32_t ci) {
    return &mig_handles[((size_t)gpu * FNV_MIG_GIS + gi) * FNV_MIG_CIS + ci];
}

/* The slot an address names in a table of `n` entries of `size` bytes, or -1. */
static long slot_of(const void *p, const void *table, size_t size, size_t n) {
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)table;
    if (!p || a < base || a >= base + size * n || (a - base) % size) return -1;
    return (long)((a - base) / size);
}

nvmlDevice_t fnv_mig_device(uint32_t gpu, uint32_t gi, uint32_t ci) { return mig_handle(gpu, gi, ci); }

int fnv_is_mig_handle(nvmlDevice_t device) {
    return slot_of(device, mig_handles, sizeof mig_handles[0], SLOTS) >= 0;
}

static int live_gi(uint32_t gpu, uint32_t gi) {
    return fnv_g && gpu < fnv_g->count && gi < FNV_MIG_GIS && MIG_ENABLED(&fnv_g->mig[gpu]) &&
           fnv_g->mig[gpu].gi[gi].used;
}

int fnv_mig_handle(nvmlDevice_t device, uint32_t *gpu, uint32_t *gi, uint32_t *ci) {
    long s = slot_of(device, mig_handles, sizeof mig_handles[0], SLOTS);
    if (s < 0) return 0;
    *ci = (uint32_t)(s % FNV_MIG_CIS);
    *gi = (uint32_t)(s / FNV_MIG_CIS % FNV_MIG_GIS);
    *gpu = (uint32_t)(s / FNV_MIG_CIS / FNV_MIG_GIS);
    return live_gi(*gpu, *gi) && fnv_g->mig[*gpu].gi[*gi].ci[*ci].used;
}

static int gi_of(nvmlGpuInstance_t h, uint32_t *gpu, uint32_t *gi) {
    long s = slot_of(h, gi_handles, sizeof gi_handles[0], (size_t)FNV_MAX_DEVICES * FNV_MIG_GIS);
    if (s < 0) return 0;
    *gpu = (uint32_t)(s / FNV_MIG_GIS);
    *gi = (uint32_t)(s % FNV_MIG_GIS);
    return live_gi(*gpu, *gi);
}

static int ci_of(nvmlComputeInstance_t h, uint32_t *gpu, uint32_t *gi, uint32_t *ci) {
    long s = slot_of(h, ci_handles, sizeof ci_handles[0], SLOTS);
    if (s < 0) return 0;
    *ci = (uint32_t)(s % FNV_MIG_CIS);
    *gi = (uint32_t)(s / FNV_MIG_CIS % FNV_MIG_GIS);
    *gpu = (uint32_t)(s / FNV_MIG_CIS / FNV_MIG_GIS);
    return live_gi(*gpu, *gi) && fnv_g->mig[*gpu].gi[*gi].ci[*ci].used;
}

/* MIG-<32 hex digits>: CRC-32s of "<parent UUID>/<gi>/<ci>/<k>" for k = 0..3, the rule
 * fakenvml/mig.py's mig_uuid follows too; stable for a GPU's given instance. */
void fnv_mig_uuid(const char *parent_uuid, uint32_t gi, uint32_t ci, char out[96]) {
    char key[160], hex[33];
    for (int k = 0; k < 4; k++) {
        int n = snprintf(key, sizeof key, "%s/%u/%u/%d", parent_uuid, gi, ci, k);
        snprintf(hex + 8 * k, 9, "%08x", fnv_crc32(key, (size_t)n));
    }
    snprintf(out, 96, "MIG-%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

nvmlReturn_t fnv_mig_by_uuid(const char *uuid, nvmlDevice_t *device) {
    if (strncasecmp(uuid, "MIG-", 4) != 0) return NVML_ERROR_NOT_FOUND;
    char want[96];
    for (uint32_t g = 0; g < fnv_g->count; g++)
        for (uint32_t i = 0; i < FNV_MIG_GIS; i++)
            for (uint32_t c = 0; live_gi(g, i) && c < FNV_MIG_CIS; c++) {
                if (!fnv_g->mig[g].gi[i].ci[c].used) continue;
                fnv_mig_uuid(fnv_g->devices[g].uuid, i, c, want);
                if (strcasecmp(want, uuid) == 0) {
                    *device = mig_handle(g, i, c);
                    return NVML_SUCCESS;
                }
            }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- MIG mode ---- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    if (!currentMode || !pendingMode) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* A board without MIG answers NOT_SUPPORTED, which is how readers (GFD's mig.capable,
       go-nvlib's IsMigCapable) tell it from a MIG board with MIG disabled. */
    if (!d->mig_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    const fnv_mig *m = &fnv_g->mig[d - fnv_g->devices];
    *currentMode = m->current;
    *pendingMode = m->pending;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                  nvmlReturn_t *activationStatus) {
    if (!activationStatus || mode > NVML_DEVICE_MIG_ENABLE) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (!d->mig_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    nvmlReturn_t ret = journal_append(FNV_MIG_MODE, gpu, 0, 0, mode, 0);
    /* The mode is pending until a GPU reset (`fakenvml reset`), as on boards whose
       driver cannot reset the GPU itself while it is in use. */
    *activationStatus = NVML_ERROR_RESET_REQUIRED;
    return fnv_leave(ret);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* Zero unless MIG is enabled (as the H100 capture answers with MIG off). */
    *count = MIG_ENABLED(&fnv_g->mig[d - fnv_g->devices]) ? max_slices(d) : 0;
    return fnv_leave(NVML_SUCCESS);
}

/* ---- GPU instances ---- */

static void gi_info(uint32_t gpu, uint32_t id, nvmlGpuInstanceInfo_t *info) {
    const fnv_gi *g = &fnv_g->mig[gpu].gi[id];
    const fnv_mig_profile *p = &fnv_g->devices[gpu].mig[g->prof];
    *info = (nvmlGpuInstanceInfo_t){
        .device = &fnv_handles[gpu], .id = id, .profileId = p->id,
        .placement = {.start = g->start, .size = p->placement_size},
    };
}

static nvmlReturn_t create_gi(const char *fn, nvmlDevice_t device, unsigned profileId,
                              const nvmlGpuInstancePlacement_t *placement,
                              nvmlGpuInstance_t *out) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn, device);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    const fnv_mig *m = &fnv_g->mig[gpu];
    if (!d->mig_count || !MIG_ENABLED(m)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    const fnv_mig_profile *p = profile_by_id(d, profileId, NULL);
    if (!p) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    uint32_t start = 0;
    int id = -1;
    nvmlReturn_t ret;
    if (placement) {
        if (placement->size != p->placement_size) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
        start = placement->start;
        ret = gi_fits(d, m, p, start, &id);
    } else {
        ret = first_fit(d, m, p, &start, &id) ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (ret == NVML_SUCCESS) ret = journal_append(FNV_GI_CREATE, gpu, (uint32_t)id, p->id, start, 0);
    if (ret == NVML_SUCCESS) *out = gi_handle(gpu, (uint32_t)id);
    return fnv_leave(ret);
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                         nvmlGpuInstance_t *gpuInstance) {
    return create_gi(__func__, device, profileId, NULL, gpuInstance);
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *gpuInstance) {
    if (!placement) return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(__func__, device, profileId, placement, gpuInstance);
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    uint32_t gpu, gi;
    if (!gi_of(gpuInstance, &gpu, &gi)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (has_cis(&fnv_g->mig[gpu].gi[gi])) return fnv_leave(NVML_ERROR_IN_USE);
    return fnv_leave(journal_append(FNV_GI_DESTROY, gpu, gi, 0, 0, 0));
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    if (!gpuInstances || !count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    if (!d->mig_count || !MIG_ENABLED(&fnv_g->mig[gpu])) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    const fnv_mig_profile *p = profile_by_id(d, profileId, NULL);
    if (!p) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (uint32_t i = 0; i < FNV_MIG_GIS; i++) {
        const fnv_gi *g = &fnv_g->mig[gpu].gi[i];
        if (g->used && d->mig[g->prof].id == profileId) gpuInstances[n++] = gi_handle(gpu, i);
    }
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance) {
    if (!gpuInstance) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    if (!d->mig_count || !MIG_ENABLED(&fnv_g->mig[gpu])) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    if (id >= FNV_MIG_GIS) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!fnv_g->mig[gpu].gi[id].used) return fnv_leave(NVML_ERROR_NOT_FOUND);
    *gpuInstance = gi_handle(gpu, id);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    uint32_t gpu, gi;
    if (!gi_of(gpuInstance, &gpu, &gi)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    gi_info(gpu, gi, info);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                       unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    const fnv_mig_profile *p = profile_by_id(d, profileId, NULL);
    if (!p) return fnv_leave(d->mig_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED);
    /* How many more would fit now: created one after another, each at its first fit. */
    fnv_mig m = fnv_g->mig[d - fnv_g->devices];
    m.current = NVML_DEVICE_MIG_ENABLE; /* with MIG off, what an empty GPU could take */
    uint8_t prof = 0;
    profile_by_id(d, profileId, &prof);
    unsigned n = 0;
    uint32_t start;
    int id;
    while (first_fit(d, &m, p, &start, &id)) {
        m.gi[id] = (fnv_gi){.used = 1, .prof = prof, .start = (uint8_t)start};
        n++;
    }
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}

/* ---- compute instances ---- */

static void ci_profile_info(const fnv_device *d, const fnv_gi *g, unsigned profile,
                            nvmlComputeInstanceProfileInfo_v2_t *info) {
    const fnv_mig_profile *p = &d->mig[g->prof];
    unsigned s = CI_SLICES[profile], n = p->slice_count;
    *info = (nvmlComputeInstanceProfileInfo_v2_t){
        .version = info->version, .id = profile, .sliceCount = s, .instanceCount = n / s,
        .multiprocessorCount = p->multiprocessors * s / n,
        .sharedCopyEngineCount = p->copy_engines, .sharedDecoderCount = p->decoders,
        .sharedEncoderCount = p->encoders, .sharedJpegCount = p->jpegs,
        .sharedOfaCount = p->ofas,
    };
    /* "MIG 1c.3g.40gb", or the GPU instance's own name when it spans the instance. */
    const char *gname = strncmp(p->name, "MIG ", 4) == 0 ? p->name + 4 : p->name;
    if (s == n)
        snprintf(info->name, sizeof info->name, "MIG %s", gname);
    else
        snprintf(info->name, sizeof info->name, "MIG %uc.%s", s, gname);
}

/* Enters with a live GPU instance: *dev, *gpu, *g; fnv_leave after. */
#define GI_ENTER(handle)                                                                           \
    uint32_t gpu, gid;                                                                             \
    do {                                                                                           \
        nvmlReturn_t r_ = fnv_enter();                                                             \
        if (r_ != NVML_SUCCESS) return r_;                                                         \
        if (!gi_of(handle, &gpu, &gid)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);            \
    } while (0);                                                                                   \
    const fnv_device *dev = &fnv_g->devices[gpu];                                                  \
    const fnv_gi *g = &fnv_g->mig[gpu].gi[gid]

static nvmlReturn_t ci_profile_ok(const fnv_device *dev, const fnv_gi *g, unsigned profile) {
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (profile > CI_LAST || CI_SLICES[profile] > gi_slices(dev, g)) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
                                                           unsigned int profile,
                                                           unsigned int engProfile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    GI_ENTER(gpuInstance);
    if (engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    nvmlReturn_t ret = ci_profile_ok(dev, g, profile);
    if (ret == NVML_SUCCESS) ci_profile_info(dev, g, profile, info);
    return fnv_leave(ret);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance,
                                                          unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstanceProfileInfo_v2_t v2 = {.version = nvmlComputeInstanceProfileInfo_v2};
    nvmlReturn_t ret =
        nvmlGpuInstanceGetComputeInstanceProfileInfoV(gpuInstance, profile, engProfile, &v2);
    if (ret == NVML_SUCCESS)
        *info = (nvmlComputeInstanceProfileInfo_t){
            .id = v2.id, .sliceCount = v2.sliceCount, .instanceCount = v2.instanceCount,
            .multiprocessorCount = v2.multiprocessorCount,
            .sharedCopyEngineCount = v2.sharedCopyEngineCount,
            .sharedDecoderCount = v2.sharedDecoderCount,
            .sharedEncoderCount = v2.sharedEncoderCount, .sharedJpegCount = v2.sharedJpegCount,
            .sharedOfaCount = v2.sharedOfaCount,
        };
    return ret;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                unsigned int profileId,
                                                                unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    GI_ENTER(gpuInstance);
    nvmlReturn_t ret = ci_profile_ok(dev, g, profileId);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    fnv_gi copy = *g;
    unsigned n = 0;
    uint32_t start;
    int id;
    while ((id = ci_free_id(&copy)) >= 0 && ci_first_fit(dev, &copy, profileId, &start)) {
        copy.ci[id] = (fnv_ci){.used = 1, .profile = (uint8_t)profileId, .start = (uint8_t)start,
                               .slices = CI_SLICES[profileId]};
        n++;
    }
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstancePlacement_t *placements, unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    GI_ENTER(gpuInstance);
    nvmlReturn_t ret = ci_profile_ok(dev, g, profileId);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    unsigned s = CI_SLICES[profileId], n = gi_slices(dev, g) / s;
    if (!placements) {
        *count = n;
        return fnv_leave(NVML_SUCCESS);
    }
    if (*count < n) return fnv_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    for (unsigned i = 0; i < n; i++)
        placements[i] = (nvmlComputeInstancePlacement_t){.start = i * s, .size = s};
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned profileId,
                              const nvmlComputeInstancePlacement_t *placement,
                              nvmlComputeInstance_t *out) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    GI_ENTER(gpuInstance);
    nvmlReturn_t ret = ci_profile_ok(dev, g, profileId);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    uint32_t start = 0;
    if (placement) {
        if (placement->size != CI_SLICES[profileId]) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
        start = placement->start;
        ret = ci_fits(dev, g, profileId, start);
    } else if (!ci_first_fit(dev, g, profileId, &start)) {
        ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    int id = ci_free_id(g);
    if (ret == NVML_SUCCESS && id < 0) ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (ret == NVML_SUCCESS)
        ret = journal_append(FNV_CI_CREATE, gpu, gid, (uint32_t)id, profileId, start);
    if (ret == NVML_SUCCESS) *out = ci_handle(gpu, gid, (uint32_t)id);
    return fnv_leave(ret);
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                  unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance) {
    return create_ci(gpuInstance, profileId, NULL, computeInstance);
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *computeInstance) {
    if (!placement) return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(gpuInstance, profileId, placement, computeInstance);
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    uint32_t gpu, gi, ci;
    if (!ci_of(computeInstance, &gpu, &gi, &ci)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    return fnv_leave(journal_append(FNV_CI_DESTROY, gpu, gi, ci, 0, 0));
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances,
                                                unsigned int *count) {
    if (!computeInstances || !count) return NVML_ERROR_INVALID_ARGUMENT;
    GI_ENTER(gpuInstance);
    nvmlReturn_t ret = ci_profile_ok(dev, g, profileId);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    unsigned n = 0;
    for (uint32_t c = 0; c < FNV_MIG_CIS; c++)
        if (g->ci[c].used && g->ci[c].profile == profileId)
            computeInstances[n++] = ci_handle(gpu, gid, c);
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                   nvmlComputeInstance_t *computeInstance) {
    if (!computeInstance) return NVML_ERROR_INVALID_ARGUMENT;
    GI_ENTER(gpuInstance);
    (void)dev;
    if (id >= FNV_MIG_CIS) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->ci[id].used) return fnv_leave(NVML_ERROR_NOT_FOUND);
    *computeInstance = ci_handle(gpu, gid, id);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                           nvmlComputeInstanceInfo_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    uint32_t gpu, gi, ci;
    if (!ci_of(computeInstance, &gpu, &gi, &ci)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fnv_ci *c = &fnv_g->mig[gpu].gi[gi].ci[ci];
    *info = (nvmlComputeInstanceInfo_t){
        .device = &fnv_handles[gpu], .gpuInstance = gi_handle(gpu, gi), .id = ci,
        .profileId = c->profile, .placement = {.start = c->start, .size = c->slices},
    };
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                        nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

/* ---- MIG devices ---- */

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    if (!migDevice) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    if (!d->mig_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    /* MIG off: no MIG device at any index (NOT_FOUND, as the H100 capture answers). */
    if (!MIG_ENABLED(&fnv_g->mig[gpu])) return fnv_leave(NVML_ERROR_NOT_FOUND);
    if (index >= max_slices(d)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* The index-th MIG device, by GPU instance id then compute instance id. */
    unsigned k = 0;
    for (uint32_t i = 0; i < FNV_MIG_GIS; i++)
        for (uint32_t c = 0; live_gi(gpu, i) && c < FNV_MIG_CIS; c++)
            if (fnv_g->mig[gpu].gi[i].ci[c].used && k++ == index) {
                *migDevice = mig_handle(gpu, i, c);
                return fnv_leave(NVML_SUCCESS);
            }
    return fnv_leave(NVML_ERROR_NOT_FOUND);
}

/* Enters for a call that takes a MIG device handle: SUCCESS with the lock held and the
 * instance named, or an error (lock released). A whole GPU's handle is INVALID_ARGUMENT
 * unless `whole` is given, which is then answered instead. */
static nvmlReturn_t mig_enter(const char *fn, nvmlDevice_t device, uint32_t *gpu, uint32_t *gi,
                              uint32_t *ci) {
    nvmlReturn_t ret = fnv_enter_as(fn);
    if (ret != NVML_SUCCESS) return ret;
    if (!fnv_mig_handle(device, gpu, gi, ci)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (fnv_g->faults[*gpu].lost) return fnv_leave(NVML_ERROR_GPU_IS_LOST);
    return NVML_SUCCESS;
}

/* A getter that answers for both kinds of handle: the whole GPU's answer, or `expr` for a
 * MIG device (gpu, gi, ci, g: its GPU instance, p: its profile, c: its compute instance). */
#define MIG_AWARE(whole_call, expr)                                                                \
    if (!fnv_is_mig_handle(device)) return whole_call;                                            \
    uint32_t gpu, gi, ci;                                                                          \
    nvmlReturn_t ret_ = mig_enter(__func__, device, &gpu, &gi, &ci);                               \
    if (ret_ != NVML_SUCCESS) return ret_;                                                         \
    const fnv_gi *g = &fnv_g->mig[gpu].gi[gi];                                                     \
    const fnv_mig_profile *p = &fnv_g->devices[gpu].mig[g->prof];                                  \
    const fnv_ci *c = &g->ci[ci];                                                                  \
    (void)p;                                                                                       \
    (void)c;                                                                                       \
    return fnv_leave(expr)

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    if (!isMigDevice) return NVML_ERROR_INVALID_ARGUMENT;
    if (!fnv_is_mig_handle(device)) {
        DEVICE_ENTER(device);
        (void)d;
        *isMigDevice = 0;
        return fnv_leave(NVML_SUCCESS);
    }
    MIG_AWARE(NVML_ERROR_INVALID_ARGUMENT, (*isMigDevice = 1, NVML_SUCCESS));
}

static nvmlReturn_t whole_gpu_refused(const char *fn, nvmlDevice_t device) {
    DEVICE_ENTER_AS(fn, device);
    (void)d;
    return fnv_leave(NVML_ERROR_INVALID_ARGUMENT); /* a full GPU is no MIG device */
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    MIG_AWARE(whole_gpu_refused(__func__, device), (*id = gi, NVML_SUCCESS));
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    MIG_AWARE(whole_gpu_refused(__func__, device), (*id = ci, NVML_SUCCESS));
}

static nvmlReturn_t parent_of(nvmlDevice_t device, nvmlDevice_t *parent) {
    MIG_AWARE(whole_gpu_refused("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", device),
              (*parent = &fnv_handles[gpu], NVML_SUCCESS));
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device) {
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    return parent_of(migDevice, device);
}

static nvmlReturn_t whole_attributes(const char *fn, nvmlDevice_t device) {
    DEVICE_ENTER_AS(fn, device);
    (void)d;
    return fnv_leave(NVML_ERROR_NOT_SUPPORTED); /* MIG devices only, as the H100 answers */
}

static nvmlReturn_t attributes(const fnv_mig_profile *p, const fnv_ci *c,
                               nvmlDeviceAttributes_t *a) {
    *a = (nvmlDeviceAttributes_t){
        .multiprocessorCount = p->multiprocessors * c->slices / p->slice_count,
        .sharedCopyEngineCount = p->copy_engines, .sharedDecoderCount = p->decoders,
        .sharedEncoderCount = p->encoders, .sharedJpegCount = p->jpegs, .sharedOfaCount = p->ofas,
        .gpuInstanceSliceCount = p->slice_count, .computeInstanceSliceCount = c->slices,
        .memorySizeMB = p->memory_mib,
    };
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *a) {
    if (!a) return NVML_ERROR_INVALID_ARGUMENT;
    MIG_AWARE(whole_attributes(__func__, device), attributes(p, c, a));
}

nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *a) {
    return nvmlDeviceGetAttributes_v2(device, a);
}

/* "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "... MIG 1c.3g.40gb" */
static nvmlReturn_t mig_name(uint32_t gpu, const fnv_mig_profile *p, const fnv_ci *c, char *out,
                             unsigned length) {
    char text[160];
    const char *gname = strncmp(p->name, "MIG ", 4) == 0 ? p->name + 4 : p->name;
    if (c->slices == p->slice_count)
        snprintf(text, sizeof text, "%s MIG %s", fnv_g->devices[gpu].name, gname);
    else
        snprintf(text, sizeof text, "%s MIG %uc.%s", fnv_g->devices[gpu].name, c->slices, gname);
    return fnv_copy_str(out, length, text);
}

static nvmlReturn_t whole_name(const char *fn, nvmlDevice_t device, char *out, unsigned length) {
    DEVICE_ENTER_AS(fn, device);
    return fnv_leave(fnv_copy_str(out, length, d->name));
}

static nvmlReturn_t whole_uuid(const char *fn, nvmlDevice_t device, char *out, unsigned length) {
    DEVICE_ENTER_AS(fn, device);
    return fnv_leave(fnv_copy_str(out, length, d->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    MIG_AWARE(whole_name(__func__, device, name, length), mig_name(gpu, p, c, name, length));
}

static nvmlReturn_t uuid_of(uint32_t gpu, uint32_t gi, uint32_t ci, char *out, unsigned length) {
    char text[96];
    fnv_mig_uuid(fnv_g->devices[gpu].uuid, gi, ci, text);
    return fnv_copy_str(out, length, text);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    MIG_AWARE(whole_uuid(__func__, device, uuid, length), uuid_of(gpu, gi, ci, uuid, length));
}

/* A MIG device's memory is its GPU instance's: all free (no processes run in the fake). */
nvmlReturn_t fnv_mig_memory(nvmlDevice_t device, unsigned long long *total) {
    uint32_t gpu, gi, ci;
    nvmlReturn_t ret = mig_enter("nvmlDeviceGetMemoryInfo", device, &gpu, &gi, &ci);
    if (ret != NVML_SUCCESS) return ret;
    const fnv_gi *g = &fnv_g->mig[gpu].gi[gi];
    *total = (unsigned long long)fnv_g->devices[gpu].mig[g->prof].memory_mib << 20;
    return fnv_leave(NVML_SUCCESS);
}
