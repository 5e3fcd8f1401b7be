/* NVML failure knobs: a chosen call answers a chosen error, or answers late.
 *
 * Knobs are journal records like faults, so `fakenvml fail` reaches every process that
 * loaded the library at its next call, with no extra channel. A call is named by its
 * exported name; the journal carries crc32(name), and a call compares ids only while a
 * knob is in force (fnv_knob_count), so the common path costs one load of that count.
 *
 * The table is process state, not fnv_state: a `--count N` knob fails the next N calls
 * in each process, and those N are not replayed afresh by nvmlShutdown + nvmlInit (NVIDIA's
 * plugin re-initialises around its calls). A new init of the node (another boot id)
 * starts an empty table.
 *
 * This unit is the table alone: the replay (journal.c) folds records in, and call
 * bracketing (core.c: fnv_gate, fnv_stub) asks it, sleeping a delay without the lock. */
#include <string.h>

#include "fake.h"

#define MAX_KNOBS 64 /* beyond this, new knobs are ignored (the CLI says so) */

typedef struct {
    uint32_t kind; /* FNV_FAIL or FNV_DELAY */
    uint32_t fn, flags, gpu;
    uint64_t value; /* the error, or milliseconds */
    uint64_t left;  /* FNV_FAIL: calls left to fail; 0: every call */
} knob;

static struct {
    uint64_t boot_id;
    uint64_t applied; /* journal records folded into the table */
    knob k[MAX_KNOBS];
} kn;
unsigned fnv_knob_count;

void fnv_knobs_begin(const fnv_state *st) {
    if (kn.boot_id == st->header.boot_id) return;
    memset(&kn, 0, sizeof kn);
    kn.boot_id = st->header.boot_id;
    fnv_knob_count = 0;
}

static void drop(unsigned i) { kn.k[i] = kn.k[--fnv_knob_count]; }

static void clear(const fnv_record *rec) {
    for (unsigned i = fnv_knob_count; i-- > 0;) {
        const knob *k = &kn.k[i];
        int what = k->kind == FNV_FAIL ? FNV_CLEAR_FAIL : FNV_CLEAR_DELAY;
        if ((rec->data & what) && (rec->arg0 == 0 || rec->arg0 == k->fn)) drop(i);
    }
}

void fnv_knobs_apply(const fnv_record *rec, uint64_t position) {
    if (position < kn.applied) return; /* seen before this process's last nvmlShutdown */
    kn.applied = position + 1;
    if (rec->kind == FNV_CLEAR) {
        clear(rec);
        return;
    }
    if (rec->kind != FNV_FAIL && rec->kind != FNV_DELAY) return;
    unsigned i = 0; /* one knob per kind, function and GPU: the newest wins */
    while (i < fnv_knob_count && !(kn.k[i].kind == rec->kind && kn.k[i].fn == rec->arg0 &&
                                   kn.k[i].gpu == rec->gpu))
        i++;
    if (rec->data == 0) { /* SUCCESS, or no delay: the knob is off */
        if (i < fnv_knob_count) drop(i);
        return;
    }
    if (i == fnv_knob_count) {
        if (fnv_knob_count == MAX_KNOBS) return;
        fnv_knob_count++;
    }
    kn.k[i] = (knob){.kind = rec->kind, .fn = rec->arg0, .flags = rec->arg1, .gpu = rec->gpu,
                     .value = rec->data, .left = rec->kind == FNV_FAIL ? rec->data2 : 0};
}

/* crc32 of the name without a trailing _vN, or 0 when it has none. */
static uint32_t unversioned(const char *fn, size_t len) {
    size_t i = len;
    while (i > 0 && fn[i - 1] >= '0' && fn[i - 1] <= '9') i--;
    if (i == len || i < 3 || fn[i - 1] != 'v' || fn[i - 2] != '_') return 0;
    return fnv_crc32(fn, i - 2);
}

nvmlReturn_t fnv_knob_match(const char *fn, uint32_t gpu, uint32_t *delay_ms) {
    size_t len = strlen(fn);
    uint32_t exact = fnv_crc32(fn, len), base = unversioned(fn, len);
    int fail = -1; /* a GPU's own knob wins over the node-wide one */
    for (unsigned i = 0; i < fnv_knob_count; i++) {
        const knob *k = &kn.k[i];
        if (k->gpu != FNV_ALL_GPUS && k->gpu != gpu) continue;
        if (k->fn != exact && !(base && k->fn == base && (k->flags & FNV_KNOB_VERSIONS)))
            continue;
        if (k->kind == FNV_DELAY) {
            if (k->value > *delay_ms) *delay_ms = k->value > UINT32_MAX ? UINT32_MAX : (uint32_t)k->value;
        } else if (fail < 0 || k->gpu != FNV_ALL_GPUS) {
            fail = (int)i;
        }
    }
    if (fail < 0) return NVML_SUCCESS;
    nvmlReturn_t err = (nvmlReturn_t)kn.k[fail].value;
    if (kn.k[fail].left && --kn.k[fail].left == 0) drop((unsigned)fail);
    return err;
}

nvmlReturn_t fnv_knob_init_error(uint32_t gpu) {
    uint32_t init = fnv_crc32(FNV_INIT_NAME, sizeof FNV_INIT_NAME - 1);
    for (unsigned i = 0; i < fnv_knob_count; i++) {
        knob *k = &kn.k[i];
        if (k->kind != FNV_FAIL || k->fn != init || k->gpu != gpu) continue;
        nvmlReturn_t err = (nvmlReturn_t)k->value;
        if (k->left && --k->left == 0) drop(i);
        return err;
    }
    return NVML_SUCCESS;
}
