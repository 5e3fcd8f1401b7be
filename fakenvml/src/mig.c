/* MIG through NVML: mode, GPU instances, compute instances and the MIG devices they make.
 *
 * The layout is replayed from the journal (FNV_MIG_MODE ... FNV_CI_DESTROY): `fakenvml mig`
 * writes those records, and so do the NVML create/destroy calls here, so a layout made in
 * any process is every process's at its next call. The rules are mig_layout.c's: a call
 * resolves and checks its change on a copy of the layout, appends the record, and the
 * replay makes it (fnv_journal_append).
 *
 * Handles: a GPU instance is (GPU, id), a compute instance (GPU, id, id); each is the
 * address of its own slot in a static table, so a handle stays valid (and names the same
 * instance) for as long as the instance exists. MIG devices' handles are core.c's. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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

#define MIG_ENABLED(m) ((m)->current == NVML_DEVICE_MIG_ENABLE)

/* Checks `rec` against GPU `gpu`'s layout now and, allowed, appends it (resolved: its ids
 * and placement filled in) for every process to replay. Lock held. */
static nvmlReturn_t change(uint32_t gpu, fnv_record *rec) {
    fnv_mig scratch = fnv_g->mig[gpu];
    rec->gpu = gpu;
    enum fnv_mig_why why = fnv_mig_change(&fnv_g->devices[gpu], &scratch, rec, NULL);
    if (why != FNV_MIG_OK) return fnv_mig_error(why);
    return fnv_journal_append(fnv_g, rec);
}

/* ---- handles ---- */

static nvmlGpuInstance_t gi_handle(uint32_t gpu, uint32_t gi) {
    return &gi_handles[(size_t)gpu * FNV_MIG_GIS + gi];
}

static nvmlComputeInstance_t ci_handle(uint32_t gpu, uint32_t gi, uint32_t ci) {
    return &ci_handles[((size_t)gpu * FNV_MIG_GIS + gi) * FNV_MIG_CIS + ci];
}

static int gi_of(nvmlGpuInstance_t h, uint32_t *gpu, uint32_t *gi) {
    long s = fnv_slot_of(h, gi_handles, sizeof gi_handles[0], (size_t)FNV_MAX_DEVICES * FNV_MIG_GIS);
    if (s < 0) return 0;
    *gpu = (uint32_t)(s / FNV_MIG_GIS);
    *gi = (uint32_t)(s % FNV_MIG_GIS);
    return fnv_gi_live(*gpu, *gi);
}

static int ci_of(nvmlComputeInstance_t h, uint32_t *gpu, uint32_t *gi, uint32_t *ci) {
    long s = fnv_slot_of(h, ci_handles, sizeof ci_handles[0], SLOTS);
    if (s < 0) return 0;
    *ci = (uint32_t)(s % FNV_MIG_CIS);
    *gi = (uint32_t)(s / FNV_MIG_CIS % FNV_MIG_GIS);
    *gpu = (uint32_t)(s / FNV_MIG_CIS / FNV_MIG_GIS);
    return fnv_gi_live(*gpu, *gi) && fnv_g->mig[*gpu].gi[*gi].ci[*ci].used;
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
    /* MIG mode stays on while a GPU instance exists: the call answers SUCCESS (activation
     * SUCCESS too) and changes nothing; the instances and what runs in them stay. The
     * evidence: NVIDIA's DRA driver authors saw a disable succeed with nvidia-smi still
     * showing current and pending Enabled (dra-driver-nvidia-gpu PR 852), and their
     * driver (v0.4.1) asks for a disable after every DynamicMIG release whatever else the
     * GPU holds (it reads a GPU's MIG mode once, at start) and fails the release on any
     * activation status but SUCCESS, yet its two-devices-per-GPU tests pass on H100s.
     * Before, the fake reset the GPU here: one claim's release took the others' devices. */
    if (!mode && fnv_g->mig[gpu].current == NVML_DEVICE_MIG_ENABLE) {
        for (unsigned g = 0; g < FNV_MIG_GIS; g++) {
            if (fnv_g->mig[gpu].gi[g].used) {
                *activationStatus = NVML_SUCCESS;
                return fnv_leave(NVML_SUCCESS);
            }
        }
    }
    nvmlReturn_t ret = change(gpu, &(fnv_record){.kind = FNV_MIG_MODE, .data = mode});
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    /* A family rule. Hopper and later toggle MIG mode without a GPU reset; on Ampere the
     * call only sets the pending mode, which a GPU reset activates (`fakenvml reset`):
     * NVIDIA's DRA driver, cmd/gpu-kubelet-plugin/nvlib.go supportsMIGModeToggle, which
     * builds DynamicMIG on it. A device that is not idle answers IN_USE, its mode pending
     * (nvml.h: "the caller ... is expected to idle the device and retry"). */
    if (fnv_g->mig[gpu].current == (mode ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE))
        *activationStatus = NVML_SUCCESS; /* already so: nothing to activate, nothing reset */
    else if (!fnv_arch_since(d, NVML_DEVICE_ARCH_HOPPER))
        *activationStatus = NVML_ERROR_RESET_REQUIRED;
    else if (fnv_g->live[gpu].nprocs)
        *activationStatus = NVML_ERROR_IN_USE;
    else
        *activationStatus = change(gpu, &(fnv_record){.kind = FNV_GPU_RESET});
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* Zero unless MIG is enabled (as the H100 capture answers with MIG off). */
    *count = MIG_ENABLED(&fnv_g->mig[d - fnv_g->devices]) ? fnv_mig_max_slices(d) : 0;
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

/* How many more of `want` (a create naming FNV_ANY for what it may) would fit in layout m,
 * made one after another, each where it first fits. */
static unsigned room_for(const fnv_device *d, fnv_mig m, fnv_record want) {
    unsigned n = 0;
    for (fnv_record rec = want; fnv_mig_change(d, &m, &rec, NULL) == FNV_MIG_OK; rec = want) n++;
    return n;
}

/* A placement start no profile has (32) stands for one past the slices, so the rules
 * refuse it rather than read FNV_ANY into it. */
static uint64_t start_of(unsigned start) { return start < 32 ? start : 32; }

static nvmlReturn_t create_gi(const char *fn, nvmlDevice_t device, unsigned profileId,
                              const nvmlGpuInstancePlacement_t *placement,
                              nvmlGpuInstance_t *out) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn, device);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    fnv_record rec = {.kind = FNV_GI_CREATE, .arg0 = FNV_ANY, .arg1 = profileId,
                      .data = placement ? start_of(placement->start) : FNV_ANY};
    /* The placement's size must be the profile's; 0 (a record's "the profile's") is none. */
    if (placement) rec.data2 = placement->size ? placement->size : UINT64_MAX;
    nvmlReturn_t ret = change(gpu, &rec);
    if (ret == NVML_SUCCESS) *out = gi_handle(gpu, rec.arg0);
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
    return fnv_leave(change(gpu, &(fnv_record){.kind = FNV_GI_DESTROY, .arg0 = gi}));
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    if (!gpuInstances || !count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    if (!d->mig_count || !MIG_ENABLED(&fnv_g->mig[gpu])) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    if (!fnv_mig_profile_by_id(d, profileId)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
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
    if (!fnv_mig_profile_by_id(d, profileId))
        return fnv_leave(d->mig_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED);
    /* How many more would fit now; with MIG off, what an empty GPU could take. */
    fnv_mig m = fnv_g->mig[d - fnv_g->devices];
    m.current = NVML_DEVICE_MIG_ENABLE;
    *count = room_for(d, m, (fnv_record){.kind = FNV_GI_CREATE, .arg0 = FNV_ANY,
                                         .arg1 = profileId, .data = FNV_ANY});
    return fnv_leave(NVML_SUCCESS);
}

/* ---- compute instances ---- */

static void ci_profile_info(const fnv_device *d, const fnv_gi *g, unsigned profile,
                            nvmlComputeInstanceProfileInfo_v2_t *info) {
    const fnv_mig_profile *p = &d->mig[g->prof];
    unsigned s = fnv_ci_slices(profile), n = p->slice_count;
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
    return fnv_mig_error(fnv_ci_profile_ok(dev, g, profile));
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
    *count = room_for(dev, fnv_g->mig[gpu],
                      (fnv_record){.kind = FNV_CI_CREATE, .arg0 = gid, .arg1 = FNV_ANY,
                                   .data = profileId, .data2 = FNV_ANY});
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstancePlacement_t *placements, unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    GI_ENTER(gpuInstance);
    nvmlReturn_t ret = ci_profile_ok(dev, g, profileId);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    unsigned s = fnv_ci_slices(profileId), n = dev->mig[g->prof].slice_count / s;
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
    if (placement && placement->size != fnv_ci_slices(profileId))
        return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    fnv_record rec = {.kind = FNV_CI_CREATE, .arg0 = gid, .arg1 = FNV_ANY, .data = profileId,
                      .data2 = placement ? start_of(placement->start) : FNV_ANY};
    ret = change(gpu, &rec);
    if (ret == NVML_SUCCESS) *out = ci_handle(gpu, gid, rec.arg1);
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
    return fnv_leave(change(gpu, &(fnv_record){.kind = FNV_CI_DESTROY, .arg0 = gi, .arg1 = ci}));
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

/* The driver's fixed table of capability minors (fakenvml/driver.py cap_minor, NVIDIA's MIG
 * user guide: "gpu0/gi0/access 3 ... gpu31/gi14/ci7/access 4322"): a GPU instance's access
 * minor, and its compute instances' after it; the table spans the state's instance ids. */
static uint32_t cap_minor(uint32_t gpu_minor, uint32_t gi, int ci) {
    uint32_t base = 3 + (gpu_minor * FNV_MIG_GIS + gi) * (1 + FNV_MIG_CIS);
    return ci < 0 ? base : base + 1 + (uint32_t)ci;
}

static int has_cap(uint32_t minor) {
    char path[48];
    struct stat sb;
    snprintf(path, sizeof path, "/dev/nvidia-caps/nvidia-cap%u", minor);
    return stat(path, &sb) == 0 && S_ISCHR(sb.st_mode);
}

/* Whether this process sees the MIG device: on a node, every one; in a workload container
 * (the state came through the persistenced socket), as the kernel driver decides there,
 * those whose GPU-instance and compute-instance access nodes it has (what a device plugin
 * or the DRA driver's CDI spec hands a container with its MIG device). */
static int mig_visible(uint32_t gpu, uint32_t gi, uint32_t ci) {
    if (!fnv_g->contained) return 1;
    uint32_t m = fnv_g->devices[gpu].minor;
    return has_cap(cap_minor(m, gi, -1)) && has_cap(cap_minor(m, gi, (int)ci));
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    if (!migDevice) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    uint32_t gpu = (uint32_t)(d - fnv_g->devices);
    if (!d->mig_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    /* MIG off: no MIG device at any index (NOT_FOUND, as the H100 capture answers). */
    if (!MIG_ENABLED(&fnv_g->mig[gpu])) return fnv_leave(NVML_ERROR_NOT_FOUND);
    if (index >= fnv_mig_max_slices(d)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* The index-th MIG device this process sees, by GPU instance id then compute instance
     * id. */
    unsigned k = 0;
    for (uint32_t i = 0; i < FNV_MIG_GIS; i++)
        for (uint32_t c = 0; fnv_gi_live(gpu, i) && c < FNV_MIG_CIS; c++)
            if (fnv_g->mig[gpu].gi[i].ci[c].used && mig_visible(gpu, i, c) && k++ == index) {
                *migDevice = fnv_mig_device(gpu, i, c);
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

static nvmlReturn_t whole_index(const char *fn, nvmlDevice_t device, unsigned int *index) {
    DEVICE_ENTER_AS(fn, device);
    *index = fnv_g->position[d->index]; /* NVML's index: renumbered in a container */
    return fnv_leave(NVML_SUCCESS);
}

/* A MIG device's index among its GPU's, as nvmlDeviceGetMigDeviceHandleByIndex counts
 * them (nvml.h: "indices that can be passed to nvmlDeviceGetMigDeviceHandleByIndex to
 * retrieve an identical handle"); nvidia-smi -q lists MIG devices by it. */
static unsigned mig_index(uint32_t gpu, uint32_t gi, uint32_t ci) {
    unsigned k = 0;
    for (uint32_t i = 0; i < FNV_MIG_GIS; i++)
        for (uint32_t c = 0; fnv_gi_live(gpu, i) && c < FNV_MIG_CIS; c++) {
            if (i == gi && c == ci) return k;
            k += fnv_g->mig[gpu].gi[i].ci[c].used && mig_visible(gpu, i, c);
        }
    return k;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    MIG_AWARE(whole_index(__func__, device, index), (*index = mig_index(gpu, gi, ci), NVML_SUCCESS));
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

/* A MIG device's BAR1 is its GPU instance's share of the GPU's: memory slices (placement
 * size) out of 8. unsourced: no capture of a MIG device's BAR1; NVIDIA's MIG guide shows
 * half of an A100's BAR1 for a 4-memory-slice instance. */
nvmlReturn_t fnv_mig_bar1(nvmlDevice_t device, unsigned long long *total) {
    uint32_t gpu, gi, ci;
    nvmlReturn_t ret = mig_enter("nvmlDeviceGetBAR1MemoryInfo", device, &gpu, &gi, &ci);
    if (ret != NVML_SUCCESS) return ret;
    const fnv_device *d = &fnv_g->devices[gpu];
    *total = d->bar1_total / 8 * d->mig[fnv_g->mig[gpu].gi[gi].prof].placement_size;
    return fnv_leave(NVML_SUCCESS);
}
