/* Replaying the fault journal into per-device fault state. Records are validated one by
 * one (CRC, position, device range); a bad record is skipped, never trusted. */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

int fnv_record_valid(const fnv_record *rec, uint64_t position, uint32_t device_count) {
    return fnv_crc32(rec, offsetof(fnv_record, crc)) == rec->crc && rec->seq == position + 1 &&
           rec->gpu < device_count && rec->kind >= FNV_XID && rec->kind <= FNV_RECOVERY_ACTION;
}

/* 1: a whole record was read; 0: not (yet) there. */
ssize_t fnv_read_record(int fd, uint64_t position, fnv_record *rec) {
    off_t off = (off_t)(sizeof(fnv_journal_header) + position * sizeof(fnv_record));
    return pread(fd, rec, sizeof *rec, off) == (ssize_t)sizeof *rec;
}

static void apply(fnv_fault *f, const fnv_record *rec) {
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

void fnv_journal_refresh(fnv_state *st) {
    struct stat sb;
    if (fstat(st->journal_fd, &sb) != 0 || sb.st_size < (off_t)sizeof(fnv_journal_header)) return;
    uint64_t available = ((uint64_t)sb.st_size - sizeof(fnv_journal_header)) / sizeof(fnv_record);
    fnv_record rec;
    while (st->journal_applied < available &&
           fnv_read_record(st->journal_fd, st->journal_applied, &rec) == 1) {
        if (fnv_record_valid(&rec, st->journal_applied, st->count))
            apply(&st->faults[rec.gpu], &rec);
        st->journal_applied++;
    }
}
