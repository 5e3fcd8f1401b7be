/* The journal: replaying it into per-device fault, telemetry and MIG state and the
 * process's knobs, and appending to it (the NVML calls that change a MIG layout). Records
 * are validated one by one (CRC, position, kind, device range); a bad record, or one of a
 * kind this library does not know (a newer writer's), is skipped, never trusted.
 *
 * Below the call bracketing (core.c), above what a record changes: knobs.c's table,
 * wave.c's energy, mig_layout.c's rules. Every refresh of a process's state is one of
 * fnv_journal_start (at load) or fnv_journal_refresh (each call, and after an append). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

static int node_wide(uint32_t kind) {
    return kind == FNV_FAIL || kind == FNV_DELAY || kind == FNV_CLEAR || kind == FNV_FAIL_WHEN;
}

int fnv_record_valid(const fnv_record *rec, uint64_t position, uint32_t device_count) {
    if (fnv_crc32(rec, offsetof(fnv_record, crc)) != rec->crc || rec->seq != position + 1)
        return 0;
    if (rec->kind < FNV_XID || rec->kind > FNV_FAIL_WHEN) return 0;
    if (rec->kind == FNV_SET && (rec->arg0 == 0 || rec->arg0 >= FNV_S_COUNT)) return 0;
    return rec->gpu < device_count || (node_wide(rec->kind) && rec->gpu == FNV_ALL_GPUS);
}

/* 1: a whole record was read; 0: not (yet) there. */
ssize_t fnv_read_record(int fd, uint64_t position, fnv_record *rec) {
    off_t off = (off_t)(sizeof(fnv_journal_header) + position * sizeof(fnv_record));
    return pread(fd, rec, sizeof *rec, off) == (ssize_t)sizeof *rec;
}

static void apply_fault(fnv_fault *f, const fnv_record *rec) {
    switch (rec->kind) {
    case FNV_XID: f->last_xid = (uint32_t)rec->data; break;
    case FNV_ECC_SINGLE: f->ecc_sbe += rec->data; break;
    case FNV_ECC_DOUBLE:
        f->ecc_dbe += rec->data;
        f->retired_dbe_pages += rec->data; /* a double-bit error retires its page */
        break;
    case FNV_LOST: f->lost = FNV_LOST; break;
    case FNV_FALLEN_OFF_BUS:
        f->lost = FNV_FALLEN_OFF_BUS;
        f->last_xid = 79;
        break;
    case FNV_RECOVER:
        f->lost = 0;
        f->recovery_action = NVML_GPU_RECOVERY_ACTION_NONE;
        break;
    case FNV_RECOVERY_ACTION: f->recovery_action = (uint32_t)rec->data; break;
    }
}

static void set_sensor(fnv_state *st, const fnv_record *rec) {
    if (rec->arg0 == FNV_S_POWER) fnv_energy_fold(st, rec->gpu, rec->monotonic_ns);
    fnv_wave *w = &st->live[rec->gpu].sensor[rec->arg0];
    if (rec->arg1 == FNV_SET_IDLE) {
        memset(w, 0, sizeof *w);
        return;
    }
    *w = (fnv_wave){.set = 1, .period_ms = rec->arg1, .from = rec->data, .to = rec->data2,
                    .since_ns = rec->monotonic_ns};
}

static void add_process(fnv_live *l, const fnv_record *rec) {
    uint32_t i = 0;
    while (i < l->nprocs && l->procs[i].pid != rec->arg0) i++;
    if (i == l->nprocs) { /* a new pid; else the same pid's entry is replaced */
        if (l->nprocs == FNV_MAX_PROCESSES) return;
        if (l->nprocs == l->cap) {
            uint32_t cap = l->cap ? l->cap * 2 : 4;
            fnv_process *p = realloc(l->procs, cap * sizeof *p);
            if (!p) return; /* out of memory: the process is not listed, nothing breaks */
            l->procs = p;
            l->cap = cap;
        }
        l->nprocs++;
    }
    l->procs[i] = (fnv_process){.pid = rec->arg0, .kinds = rec->arg1, .used = rec->data,
                                .util_set = (rec->data2 & FNV_PROC_UTIL) != 0,
                                .sm = (uint32_t)(rec->data2 & 0xFF),
                                .mem = (uint32_t)(rec->data2 >> 8 & 0xFF),
                                .since_us = rec->realtime_ns / 1000};
}

static void remove_process(fnv_live *l, uint32_t pid) {
    for (uint32_t i = 0; i < l->nprocs; i++)
        if (l->procs[i].pid == pid) {
            l->procs[i] = l->procs[--l->nprocs]; /* order is not NVML's promise either */
            return;
        }
}

static void apply(fnv_state *st, const fnv_record *rec) {
    switch (rec->kind) {
    case FNV_SET: set_sensor(st, rec); break;
    case FNV_PROCESS_ADD: add_process(&st->live[rec->gpu], rec); break;
    case FNV_PROCESS_REMOVE: remove_process(&st->live[rec->gpu], rec->arg0); break;
    case FNV_FAIL:
    case FNV_FAIL_WHEN:
    case FNV_DELAY:
    case FNV_CLEAR: break; /* fnv_knobs_apply's */
    case FNV_MIG_MODE:
    case FNV_GPU_RESET:
    case FNV_GI_CREATE:
    case FNV_GI_DESTROY:
    case FNV_CI_CREATE:
    case FNV_CI_DESTROY: {
        /* What the driver would refuse changes nothing (journal records are resolved:
           their writers checked them with the same rules). */
        fnv_record change = *rec;
        fnv_mig_change(&st->devices[rec->gpu], &st->mig[rec->gpu], &change, NULL);
        break;
    }
    default: apply_fault(&st->faults[rec->gpu], rec);
    }
}

/* Reads every record the journal gained since the last read: an fstat, then preads. */
static void catch_up(fnv_state *st) {
    struct stat sb;
    if (fstat(st->journal_fd, &sb) != 0 || sb.st_size < (off_t)sizeof(fnv_journal_header)) return;
    uint64_t available = ((uint64_t)sb.st_size - sizeof(fnv_journal_header)) / sizeof(fnv_record);
    fnv_record rec;
    while (st->journal_applied < available &&
           fnv_read_record(st->journal_fd, st->journal_applied, &rec) == 1) {
        if (fnv_record_valid(&rec, st->journal_applied, st->count)) {
            apply(st, &rec);
            fnv_knobs_apply(&rec, st->journal_applied);
        }
        st->journal_applied++;
    }
}

/* Every call's check: one load from the mapped journal.gen while nothing was written. A
 * changed word (a writer's store, or garbage) only means the journal is read again. */
void fnv_journal_refresh(fnv_state *st) {
    if (st->gen) {
        uint64_t committed = __atomic_load_n(st->committed, __ATOMIC_ACQUIRE);
        if (committed == st->gen_seen) return;
        st->gen_seen = committed;
    }
    catch_up(st);
}

static char *gen_path(const fnv_state *st, char *buf, size_t len) {
    snprintf(buf, len, "%s/" FNV_GEN_FILE, st->dir);
    return buf;
}

/* Maps journal.gen if it is whole and belongs to this state; else st->gen stays NULL. */
static void gen_map(fnv_state *st) {
    char path[PATH_MAX + 16];
    int fd = open(gen_path(st, path, sizeof path), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat sb;
    void *map = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && sb.st_size >= (off_t)sizeof(fnv_gen))
        map = mmap(NULL, sizeof(fnv_gen), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return;
    const fnv_gen *g = map;
    if (memcmp(g->magic, FNV_GEN_MAGIC, 8) != 0 || g->boot_id != st->header.boot_id) {
        munmap(map, sizeof(fnv_gen));
        return;
    }
    st->gen = g;
    st->committed = (const uint64_t *)((const char *)map + offsetof(fnv_gen, committed));
    st->gen_seen = __atomic_load_n(st->committed, __ATOMIC_ACQUIRE);
}

/* A writer's part after appending (journal flock held): readers' next call reads them. */
static void gen_store(const fnv_state *st, uint64_t committed) {
    char path[PATH_MAX + 16];
    int fd = open(gen_path(st, path, sizeof path), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return; /* no journal.gen: readers check the journal's size themselves */
    ssize_t n = pwrite(fd, &committed, sizeof committed, offsetof(fnv_gen, committed));
    (void)n; /* a failed store leaves readers on the old word until the next writer's */
    close(fd);
}

/* Maps knobs.bin writable if it is whole and belongs to this state; else st->counters stays
 * NULL and counted knobs count in this process. The slot count is the one checked here:
 * what the shared page says later is never trusted as a bound. */
static void counters_map(fnv_state *st) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/" FNV_COUNTERS_FILE, st->dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return; /* none, or read-only here (a container's read-only mount) */
    fnv_counters h;
    struct stat sb;
    void *map = MAP_FAILED;
    size_t len = 0;
    if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && memcmp(h.magic, FNV_COUNTERS_MAGIC, 8) == 0 &&
        h.boot_id == st->header.boot_id && h.slots <= FNV_MAX_COUNTED && fstat(fd, &sb) == 0) {
        len = sizeof h + (size_t)h.slots * sizeof(fnv_counter);
        if (h.slots && (size_t)sb.st_size >= len)
            map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (map == MAP_FAILED) return;
    st->counters = (fnv_counter *)((char *)map + sizeof h); /* 64: 8-aligned in the page */
    st->counter_slots = h.slots;
}

void fnv_journal_start(fnv_state *st) {
    fnv_knobs_begin(st);
    counters_map(st);
    gen_map(st); /* before reading: a record stored meanwhile is read on the next call */
    catch_up(st);
}

/* As the Python writer appends (fakenvml/journal.py): under flock, one whole record, seq
 * one past the last, then journal.gen. The record is replayed here like anyone's. */
nvmlReturn_t fnv_journal_append(fnv_state *st, fnv_record *rec) {
    int fd = open(st->journal_path, O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0) return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t ret = NVML_ERROR_UNKNOWN;
    struct stat sb;
    fnv_journal_header h;
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &sb) == 0 &&
        pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.boot_id == st->header.boot_id &&
        sb.st_size >= (off_t)sizeof h && (sb.st_size - (off_t)sizeof h) % sizeof(fnv_record) == 0) {
        struct timespec rt, mono;
        clock_gettime(CLOCK_REALTIME, &rt);
        clock_gettime(CLOCK_MONOTONIC, &mono);
        rec->seq = (uint64_t)(sb.st_size - (off_t)sizeof h) / sizeof(fnv_record) + 1;
        rec->realtime_ns = (uint64_t)rt.tv_sec * 1000000000u + (uint64_t)rt.tv_nsec;
        rec->monotonic_ns = (uint64_t)mono.tv_sec * 1000000000u + (uint64_t)mono.tv_nsec;
        memset(rec->reserved, 0, sizeof rec->reserved);
        rec->crc = fnv_crc32(rec, offsetof(fnv_record, crc));
        if (write(fd, rec, sizeof *rec) == (ssize_t)sizeof *rec) {
            gen_store(st, rec->seq);
            ret = NVML_SUCCESS;
        }
    }
    close(fd); /* releases the flock */
    if (ret == NVML_SUCCESS) fnv_journal_refresh(st);
    return ret;
}
