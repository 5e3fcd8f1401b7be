/* The MIG rules: where a GPU instance or a compute instance may go, and what each MIG
 * record does to a GPU's layout. One implementation, pure functions of a device (its
 * profiles) and a layout (fnv_mig), for every caller:
 *   - the journal replay (journal.c), each MIG record as the driver would take the call;
 *   - the NVML create and destroy calls (mig.c), on a copy of the layout, to resolve and
 *     check a change before appending its record;
 *   - the control plane (fakenvml/mig.py) through fakenvml_mig_change, so that `fakenvml
 *     mig` plans, and refuses with a reason, by these rules rather than a copy of them.
 *
 * The rules (the driver's, as far as public sources show them):
 * - Enabling or disabling MIG is pending until a GPU reset; a reset destroys every
 *   instance. GPU instances can be made only while MIG is enabled.
 * - A GPU instance takes its profile's memory slices at one of the profile's placements
 *   and its compute slices out of the GPU's; it may not overlap another, nor go past its
 *   profile's instance count. Its id follows from its placement, as the driver numbers
 *   the 8-slice tree: 0 the whole GPU, 1-2 halves, 3-6 quarters, 7-14 eighths
 *   (all-1g.10gb on an H100 is GPU instances 7-13).
 * - A compute instance takes 1, 2, 3, 4 or 7 of its GPU instance's compute slices at a
 *   multiple of that size; ids are the lowest free, from 0.
 * - A GPU instance is destroyed only without compute instances. */
#include <stdio.h>
#include <string.h>

#include "fake.h"

/* NVML_COMPUTE_INSTANCE_PROFILE_*: 1, 2, 3, 4, 7, 8, 6 slices, then 1 (REV1). */
static const uint8_t CI_SLICES[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 1};
/* The compute-instance profiles a 7-slice GPU offers: 1, 2, 3, 4 and 7 slices. */
#define CI_LAST NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE

unsigned fnv_ci_slices(uint32_t profile) {
    return profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT ? CI_SLICES[profile] : 0;
}

static int tree_id(uint32_t size, uint32_t start) {
    switch (size) {
    case 8: return 0;
    case 4: return 1 + (int)start / 4;
    case 2: return 3 + (int)start / 2;
    case 1: return 7 + (int)start;
    default: return -1;
    }
}

static const fnv_mig_profile *profile_at(const fnv_device *d, uint32_t id, uint8_t *index) {
    for (unsigned i = 0; i < d->mig_count; i++)
        if (d->mig[i].id == id) {
            *index = (uint8_t)i;
            return &d->mig[i];
        }
    return NULL;
}

const fnv_mig_profile *fnv_mig_profile_by_id(const fnv_device *d, uint32_t id) {
    uint8_t index;
    return profile_at(d, id, &index);
}

unsigned fnv_mig_max_slices(const fnv_device *d) {
    unsigned n = 0;
    for (unsigned i = 0; i < d->mig_count; i++)
        if (d->mig[i].slice_count > n) n = d->mig[i].slice_count;
    return n;
}

/* Whether a GPU instance of p may start at `start` now; its id in *id. */
static enum fnv_mig_why gi_fits(const fnv_device *d, const fnv_mig *m, const fnv_mig_profile *p,
                                uint32_t start, uint32_t *id, uint32_t *other) {
    if (start >= 32 || !(p->placement_starts >> start & 1u)) return FNV_MIG_NOT_A_PLACEMENT;
    unsigned same = 0, slices = p->slice_count;
    for (int g = 0; g < FNV_MIG_GIS; g++)
        if (m->gi[g].used) {
            same += d->mig[m->gi[g].prof].id == p->id;
            slices += d->mig[m->gi[g].prof].slice_count;
        }
    if (same >= p->instance_count) return FNV_MIG_ALL_MADE;
    if (slices > fnv_mig_max_slices(d)) return FNV_MIG_NO_SLICES;
    for (uint32_t g = 0; g < FNV_MIG_GIS; g++) {
        const fnv_gi *x = &m->gi[g];
        if (x->used && x->start < start + p->placement_size &&
            start < (uint32_t)x->start + d->mig[x->prof].placement_size) {
            *other = g; /* its memory slices overlap */
            return FNV_MIG_OVERLAP;
        }
    }
    int tree = tree_id(p->placement_size, start);
    *id = *other = (uint32_t)tree;
    if (tree < 0 || tree >= FNV_MIG_GIS || m->gi[tree].used) return FNV_MIG_ID_TAKEN;
    return FNV_MIG_OK;
}

static unsigned gi_slices(const fnv_device *d, const fnv_gi *g) { return d->mig[g->prof].slice_count; }

enum fnv_mig_why fnv_ci_profile_ok(const fnv_device *d, const fnv_gi *g, uint32_t profile) {
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return FNV_MIG_NO_CI_PROFILE;
    if (profile > CI_LAST || CI_SLICES[profile] > gi_slices(d, g)) return FNV_MIG_CI_TOO_BIG;
    return FNV_MIG_OK;
}

/* Whether a compute instance of `profile` (offered by g) may start at `start` in g. */
static enum fnv_mig_why ci_fits(const fnv_device *d, const fnv_gi *g, uint32_t profile,
                                uint64_t start, uint32_t *other) {
    unsigned s = CI_SLICES[profile];
    if (start >= 32 || start % s || start + s > gi_slices(d, g)) return FNV_MIG_CI_START;
    for (uint32_t c = 0; c < FNV_MIG_CIS; c++) {
        const fnv_ci *x = &g->ci[c];
        if (x->used && x->start < start + s && start < (unsigned)x->start + x->slices) {
            *other = c;
            return FNV_MIG_CI_OVERLAP;
        }
    }
    return FNV_MIG_OK;
}

static int has_cis(const fnv_gi *g) {
    for (int c = 0; c < FNV_MIG_CIS; c++)
        if (g->ci[c].used) return 1;
    return 0;
}

static enum fnv_mig_why create_gi(const fnv_device *d, fnv_mig *m, fnv_record *rec,
                                  uint32_t *other) {
    if (m->current != NVML_DEVICE_MIG_ENABLE) return FNV_MIG_DISABLED;
    uint8_t prof;
    const fnv_mig_profile *p = profile_at(d, rec->arg1, &prof);
    if (!p) return FNV_MIG_NO_PROFILE;
    if (rec->data2 && rec->data2 != p->placement_size) return FNV_MIG_NOT_A_PLACEMENT;
    uint32_t start = 0, id = 0;
    if (rec->data == FNV_ANY) { /* the first placement that fits */
        while (start < 32 && gi_fits(d, m, p, start, &id, other) != FNV_MIG_OK) start++;
        if (start == 32) return FNV_MIG_NO_ROOM;
    } else {
        if (rec->data >= 32) return FNV_MIG_NOT_A_PLACEMENT;
        start = (uint32_t)rec->data;
        enum fnv_mig_why why = gi_fits(d, m, p, start, &id, other);
        if (why != FNV_MIG_OK) return why;
    }
    if (rec->arg0 != FNV_ANY && rec->arg0 != id) return FNV_MIG_WRONG_ID;
    m->gi[id] = (fnv_gi){.used = 1, .prof = prof, .start = (uint8_t)start};
    rec->arg0 = id;
    rec->data = start;
    return FNV_MIG_OK;
}

static enum fnv_mig_why create_ci(const fnv_device *d, fnv_mig *m, fnv_record *rec,
                                  uint32_t *other) {
    if (rec->arg0 >= FNV_MIG_GIS || !m->gi[rec->arg0].used) return FNV_MIG_NO_GI;
    fnv_gi *g = &m->gi[rec->arg0];
    if (rec->data >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return FNV_MIG_NO_CI_PROFILE;
    uint32_t profile = (uint32_t)rec->data;
    enum fnv_mig_why why = fnv_ci_profile_ok(d, g, profile);
    if (why != FNV_MIG_OK) return why;
    unsigned s = CI_SLICES[profile];
    uint64_t start = rec->data2;
    if (start == FNV_ANY) { /* the first placement that fits, at a multiple of its size */
        for (start = 0; start + s <= gi_slices(d, g); start += s)
            if (ci_fits(d, g, profile, start, other) == FNV_MIG_OK) break;
        if (start + s > gi_slices(d, g)) return FNV_MIG_CI_NO_ROOM;
    } else if ((why = ci_fits(d, g, profile, start, other)) != FNV_MIG_OK) {
        return why;
    }
    uint32_t id = rec->arg1;
    if (id == FNV_ANY) /* the lowest free */
        for (id = 0; id < FNV_MIG_CIS && g->ci[id].used; id++) {
        }
    if (id >= FNV_MIG_CIS || g->ci[id].used) return FNV_MIG_NO_CI_ID;
    g->ci[id] = (fnv_ci){.used = 1, .profile = (uint8_t)profile, .start = (uint8_t)start,
                         .slices = (uint8_t)s};
    rec->arg1 = id;
    rec->data2 = start;
    return FNV_MIG_OK;
}

enum fnv_mig_why fnv_mig_change(const fnv_device *d, fnv_mig *m, fnv_record *rec,
                                uint32_t *other) {
    uint32_t ignored;
    if (!other) other = &ignored;
    if (rec->kind < FNV_MIG_MODE || rec->kind > FNV_CI_DESTROY) return FNV_MIG_NOT_MIG;
    if (!d->mig_count) return FNV_MIG_UNSUPPORTED; /* a board without MIG: nothing changes */
    switch (rec->kind) {
    case FNV_MIG_MODE:
        m->pending = rec->data ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
        return FNV_MIG_OK;
    case FNV_GPU_RESET:
        m->current = m->pending;
        memset(m->gi, 0, sizeof m->gi);
        return FNV_MIG_OK;
    case FNV_GI_CREATE: return create_gi(d, m, rec, other);
    case FNV_GI_DESTROY:
        if (rec->arg0 >= FNV_MIG_GIS || !m->gi[rec->arg0].used) return FNV_MIG_NO_GI;
        if (has_cis(&m->gi[rec->arg0])) return FNV_MIG_IN_USE;
        m->gi[rec->arg0].used = 0;
        return FNV_MIG_OK;
    case FNV_CI_CREATE: return create_ci(d, m, rec, other);
    default: /* FNV_CI_DESTROY */
        if (rec->arg0 >= FNV_MIG_GIS || rec->arg1 >= FNV_MIG_CIS || !m->gi[rec->arg0].used ||
            !m->gi[rec->arg0].ci[rec->arg1].used)
            return FNV_MIG_NO_CI;
        m->gi[rec->arg0].ci[rec->arg1].used = 0;
        return FNV_MIG_OK;
    }
}

nvmlReturn_t fnv_mig_error(enum fnv_mig_why why) {
    switch (why) {
    case FNV_MIG_OK: return NVML_SUCCESS;
    case FNV_MIG_UNSUPPORTED:
    case FNV_MIG_DISABLED:
    case FNV_MIG_CI_TOO_BIG: return NVML_ERROR_NOT_SUPPORTED;
    case FNV_MIG_ALL_MADE:
    case FNV_MIG_NO_SLICES:
    case FNV_MIG_OVERLAP:
    case FNV_MIG_ID_TAKEN:
    case FNV_MIG_NO_ROOM:
    case FNV_MIG_CI_OVERLAP:
    case FNV_MIG_CI_NO_ROOM:
    case FNV_MIG_NO_CI_ID: return NVML_ERROR_INSUFFICIENT_RESOURCES;
    case FNV_MIG_IN_USE: return NVML_ERROR_IN_USE;
    default: return NVML_ERROR_INVALID_ARGUMENT; /* no such profile, placement, instance */
    }
}

/* MIG-<32 hex digits>: CRC-32s of "<parent UUID>/<gi>/<ci>/<k>" for k = 0..3; stable for
 * a GPU's given instance. */
void fnv_mig_uuid(const char *parent_uuid, uint32_t gi, uint32_t ci, char out[96]) {
    char key[160], hex[33];
    for (int k = 0; k < 4; k++) {
        int n = snprintf(key, sizeof key, "%s/%u/%u/%d", parent_uuid, gi, ci, k);
        snprintf(hex + 8 * k, 9, "%08x", fnv_crc32(key, (size_t)n));
    }
    snprintf(out, 96, "MIG-%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

/* ---- the control plane's entries (state_format.h; exports.map) ---- */

uint32_t fakenvml_mig_change(const fnv_device *device, fnv_mig *layout, fnv_record *rec,
                             uint32_t *other) {
    /* The caller's device record is trusted no more than state.bin's: counts past the
       arrays, or a layout naming profiles the device lacks, change nothing. */
    if (!device || !layout || !rec || device->mig_count > FNV_MAX_MIG_PROFILES)
        return FNV_MIG_UNSUPPORTED;
    for (int g = 0; g < FNV_MIG_GIS; g++)
        if (layout->gi[g].used && layout->gi[g].prof >= device->mig_count) return FNV_MIG_NO_GI;
    return fnv_mig_change(device, layout, rec, other);
}

void fakenvml_mig_uuid(const char *parent_uuid, uint32_t gi, uint32_t ci, char out[96]) {
    fnv_mig_uuid(parent_uuid, gi, ci, out);
}
