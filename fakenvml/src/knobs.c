/* NVML failure knobs: a chosen call answers a chosen error, or answers late.
 *
 * Knobs are journal records like faults, so `fakenvml fail` reaches every process that
 * loaded the library at its next call, with no extra channel. A call is named by its
 * exported name; the journal carries crc32(name), and a call compares ids only while a
 * knob is in force (fnv_knob_count), so the common path costs one load of that count.
 *
 * The table is process state, not fnv_state: records already folded in are not replayed
 * afresh by nvmlShutdown + nvmlInit (NVIDIA's plugin re-initialises around its calls). A
 * new init of the node (another boot id) starts an empty table.
 *
 * A counted knob (FNV_FAIL_WHEN before it: --after, --probability, --count) counts the
 * calls it matches in its knobs.bin slot, which every process on the node maps and adds
 * to atomically, so "the first 100 calls succeed" are the node's first 100 calls, however
 * many processes make them; each call's fate is a function of its node-wide number alone.
 * Without the slot (no knobs.bin, a read-only mount, a record from an older writer) it
 * counts in this table, per process, as every --count did before.
 *
 * This unit is the table alone: the replay (journal.c) folds records in and maps
 * knobs.bin, and call bracketing (core.c: fnv_gate, fnv_stub) asks it, sleeping a delay
 * without the lock. */
#include <string.h>

#include "fake.h"

#define MAX_KNOBS 64 /* beyond this, new knobs are ignored (the CLI says so) */

typedef struct {
    uint32_t kind; /* FNV_FAIL or FNV_DELAY */
    uint32_t fn, flags, gpu;
    uint64_t value; /* the error, or milliseconds */
    /* FNV_FAIL: counted (an FNV_FAIL_WHEN or a count): every matching call is numbered */
    uint32_t counted, seed, slot;
    uint64_t after, threshold; /* calls that pass first; fnv_roll below this fails */
    uint64_t count;            /* failures before the knob is spent; 0: never spent */
    uint64_t calls, fails;     /* this process's counts, where knobs.bin has no slot */
} knob;

static struct {
    uint64_t boot_id;
    uint64_t applied; /* journal records folded into the table */
    fnv_record when;  /* the last FNV_FAIL_WHEN, waiting for its FNV_FAIL */
    uint64_t when_at; /* its position + 1; 0: none waiting */
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

/* The FNV_FAIL_WHEN written with this FNV_FAIL (the record before it, for its GPU), or NULL. */
static const fnv_record *when_of(const fnv_record *rec, uint64_t position) {
    return kn.when_at == position && kn.when.gpu == rec->gpu ? &kn.when : NULL;
}

void fnv_knobs_apply(const fnv_record *rec, uint64_t position) {
    if (position < kn.applied) return; /* seen before this process's last nvmlShutdown */
    kn.applied = position + 1;
    if (rec->kind == FNV_FAIL_WHEN) {
        kn.when = *rec;
        kn.when_at = position + 1;
        return;
    }
    const fnv_record *when = rec->kind == FNV_FAIL ? when_of(rec, position) : NULL;
    kn.when_at = 0; /* it belongs to the record right after it, or to none */
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
    knob k = {.kind = rec->kind, .fn = rec->arg0, .flags = rec->arg1, .gpu = rec->gpu,
              .value = rec->data, .slot = FNV_NO_SLOT, .threshold = FNV_ALWAYS};
    if (rec->kind == FNV_FAIL) {
        k.count = rec->data2;
        k.counted = when || k.count;
        if (when) {
            k.after = when->data;
            k.threshold = when->data2;
            k.seed = when->arg0;
            k.slot = when->arg1;
        }
    }
    kn.k[i] = k;
}

uint64_t fnv_roll(uint32_t seed, uint64_t i) {
    uint64_t z = seed; /* splitmix64 of splitmix64(seed) + i */
    for (int round = 0; round < 2; round++) {
        z += 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        if (round == 0) z += i;
    }
    return z >> 32;
}

/* Adds one to a counted knob's calls (which = 0) or fails (1), node-wide where knobs.bin
 * has its slot; the value before. */
static uint64_t bump(const fnv_state *st, knob *k, int which) {
    if (st && st->counters && k->slot < st->counter_slots) {
        fnv_counter *c = &st->counters[k->slot];
        return __atomic_fetch_add(which ? &c->fails : &c->calls, 1, __ATOMIC_RELAXED);
    }
    return which ? k->fails++ : k->calls++;
}

/* Whether knob i fails this call (1), lets it pass (0), or is spent (-1: it passes, and
 * the knob is gone). Numbers the call first, so every matching call counts. */
static int trips(const fnv_state *st, unsigned i) {
    knob *k = &kn.k[i];
    if (!k->counted) return 1;
    uint64_t call = bump(st, k, 0);
    if (call < k->after) return 0;
    if (k->threshold < FNV_ALWAYS && fnv_roll(k->seed, call) >= k->threshold) return 0;
    if (k->count && bump(st, k, 1) >= k->count) {
        drop(i);
        return -1;
    }
    return 1;
}

/* crc32 of the name without a trailing _vN, or 0 when it has none. */
static uint32_t unversioned(const char *fn, size_t len) {
    size_t i = len;
    while (i > 0 && fn[i - 1] >= '0' && fn[i - 1] <= '9') i--;
    if (i == len || i < 3 || fn[i - 1] != 'v' || fn[i - 2] != '_') return 0;
    return fnv_crc32(fn, i - 2);
}

nvmlReturn_t fnv_knob_match(const fnv_state *st, const char *fn, uint32_t gpu,
                            uint32_t *delay_ms) {
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
    return trips(st, (unsigned)fail) > 0 ? err : NVML_SUCCESS;
}

nvmlReturn_t fnv_knob_init_error(const fnv_state *st, uint32_t gpu) {
    uint32_t init = fnv_crc32(FNV_INIT_NAME, sizeof FNV_INIT_NAME - 1);
    for (unsigned i = 0; i < fnv_knob_count; i++) {
        knob *k = &kn.k[i];
        if (k->kind != FNV_FAIL || k->fn != init || k->gpu != gpu) continue;
        nvmlReturn_t err = (nvmlReturn_t)k->value;
        return trips(st, i) > 0 ? err : NVML_SUCCESS;
    }
    return NVML_SUCCESS;
}
