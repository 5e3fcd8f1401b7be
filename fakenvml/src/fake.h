/* Internal interface of the fake NVML data plane. Every exported function takes the one
 * global lock for the duration of the call (fnv_enter / fnv_device_enter ... fnv_leave),
 * so a concurrent nvmlShutdown can never free state under a reader. */
#ifndef FAKENVML_FAKE_H
#define FAKENVML_FAKE_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nvml.h>

#include "state_format.h"

#define FNV_STATE_DIR_ENV "FAKENVML_STATE_DIR"
#define FNV_DEFAULT_STATE_DIR "/var/lib/fakenvml"
/* Where `fakenvml install-driver` puts the library under a driver root (fakenvml/driver.py). */
#define FNV_DRIVER_LIB_DIR "/usr/lib/x86_64-linux-gnu/"

/* Fault state replayed from the journal; never written to disk by the library. */
typedef struct {
    uint64_t ecc_sbe, ecc_dbe; /* error counts: volatile and aggregate alike */
    uint64_t retired_dbe_pages;
    uint32_t lost; /* 0, FNV_LOST or FNV_FALLEN_OFF_BUS */
    uint32_t last_xid;
    uint32_t recovery_action; /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */
} fnv_fault;

typedef struct {
    fnv_header header;
    fnv_device *devices; /* header.device_count entries */
    fnv_fault *faults;
    uint32_t count;
    int journal_fd;
    uint64_t journal_applied; /* records folded into faults */
    char dir[PATH_MAX];
    char journal_path[PATH_MAX];
} fnv_state;

/* The opaque nvmlDevice_t: a stable slot per index, valid across Init/Shutdown cycles. */
struct nvmlDevice_st {
    uint32_t index;
};
extern struct nvmlDevice_st fnv_handles[FNV_MAX_DEVICES];

extern pthread_mutex_t fnv_lock;
extern fnv_state *fnv_g; /* NULL while not initialised */

/* state.c: pure parsing (the fuzz target) and loading. */
uint32_t fnv_crc32(const void *buf, size_t len);
int fnv_parse_state(const uint8_t *buf, size_t len, fnv_header *header, fnv_device **devices,
                    char *err, size_t errlen);
nvmlReturn_t fnv_load(fnv_state **out);
void fnv_free(fnv_state *st);

/* journal.c */
int fnv_record_valid(const fnv_record *rec, uint64_t position, uint32_t device_count);
ssize_t fnv_read_record(int fd, uint64_t position, fnv_record *rec);
void fnv_journal_refresh(fnv_state *st);

/* core.c: call bracketing. */
nvmlReturn_t fnv_enter(void);
nvmlReturn_t fnv_device_enter(nvmlDevice_t device, const fnv_device **dev);
nvmlReturn_t fnv_leave(nvmlReturn_t ret);
int fnv_handle_index(nvmlDevice_t device, uint32_t *index); /* lock held */
void fnv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* util */
nvmlReturn_t fnv_copy_str(char *dst, unsigned int length, const char *src);
void fnv_fill_pci(const fnv_device *d, nvmlPciInfo_t *pci);
int fnv_parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *dev,
                     unsigned *fn);

#endif
