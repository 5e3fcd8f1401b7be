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
/* nvidia-persistenced's socket, which NVIDIA's CDI specs bind into every GPU container when
 * the driver root has it: where a workload container's library asks for the node's state
 * (fakenvml/persistenced.py hands over the state directory). */
#define FNV_PERSISTENCED_SOCKET "/run/nvidia-persistenced/socket"
#define FNV_PERSISTENCED_HELLO "fakenvml-state 1"

/* Fault state replayed from the journal; never written to disk by the library. */
typedef struct {
    uint64_t ecc_sbe, ecc_dbe; /* error counts: volatile and aggregate alike */
    uint64_t retired_dbe_pages;
    uint32_t lost; /* 0, FNV_LOST or FNV_FALLEN_OFF_BUS */
    uint32_t last_xid;
    uint32_t recovery_action; /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */
    nvmlReturn_t init_error;  /* a `fail nvmlInit --gpu` knob met this process's nvmlInit */
} fnv_fault;

/* A sensor set at run time: a constant (period 0) or a triangle wave from `from` to `to`
 * and back every period, whose phase starts at the record's CLOCK_MONOTONIC stamp. */
typedef struct {
    uint32_t set, period_ms;
    uint64_t from, to;
    uint64_t since_ns;
} fnv_wave;

typedef struct {
    uint32_t pid, kinds; /* FNV_PROC_* */
    uint64_t used;
    uint32_t util_set, sm, mem; /* its own utilisation (%), else a share of the GPU's */
    uint64_t since_us;          /* added at, CLOCK_REALTIME microseconds */
} fnv_process;

/* Telemetry replayed from the journal, like fnv_fault. */
typedef struct {
    fnv_wave sensor[FNV_S_COUNT];
    fnv_process *procs; /* grown on demand, at most FNV_MAX_PROCESSES */
    uint32_t nprocs, cap;
    /* Energy so far: mJ at energy_ns (CLOCK_MONOTONIC), power integrated piecewise. */
    double energy_mj;
    uint64_t energy_ns;
} fnv_live;

typedef struct {
    fnv_header header;
    fnv_device *devices; /* header.device_count entries */
    fnv_fault *faults;
    fnv_live *live;
    fnv_mig *mig;
    uint32_t count;
    int journal_fd;
    uint64_t journal_applied; /* records folded into faults */
    const fnv_gen *gen;       /* journal.gen mapped, or NULL: fstat per call */
    const uint64_t *committed; /* gen->committed: 8-aligned in the page-aligned mapping */
    uint64_t gen_seen;        /* gen->committed when the journal was last read */
    fnv_counter *counters;    /* knobs.bin's counters mapped writable, or NULL: knobs count
                                 in this process (knobs.c) */
    uint32_t counter_slots;   /* how many, as checked when mapped */
    /* What this process may see. On a node, every GPU. In a workload container (the state
     * came through the persistenced socket), as the kernel driver lets NVML see there: the
     * GPUs whose /dev/nvidia<minor> the container has, renumbered from 0. */
    int contained;
    uint32_t nvisible;
    uint32_t *visible;  /* NVML index -> state index, nvisible entries */
    uint32_t *position; /* state index -> NVML index, or UINT32_MAX where not visible */
    char dir[PATH_MAX];
    char journal_path[PATH_MAX];
} fnv_state;

/* The opaque nvmlDevice_t: a stable slot per index, valid across Init/Shutdown cycles. */
struct nvmlDevice_st {
    uint32_t index;
};

/* The units in layers, each calling only those above it here (none calls back up):
 *   base.c       helpers that call nothing of ours
 *   state.c      reading state.bin (and opening the journal it names)
 *   knobs.c      the failure-knob table      wave.c   sensor waves, energy
 *   mig_layout.c the MIG rules and layout changes
 *   journal.c    replaying the journal into the above, and appending to it
 *   core.c       Init/Shutdown, the lock and call bracketing, device handles
 *   the NVML API: identity, sensors, capabilities, topology, ecc, events, mig, export_table */

/* An architecture family and those after it (nvml.h's "For <arch> or newer"). */
static inline int fnv_arch_since(const fnv_device *d, unsigned arch) {
    return d->arch >= arch && d->arch != NVML_DEVICE_ARCH_UNKNOWN;
}

/* base.c */
uint32_t fnv_crc32(const void *buf, size_t len);
void fnv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
nvmlReturn_t fnv_copy_str(char *dst, unsigned int length, const char *src);
void fnv_fill_pci(const fnv_device *d, nvmlPciInfo_t *pci);
int fnv_parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *dev,
                     unsigned *fn);
/* The slot an address names in a table of `n` entries of `size` bytes, or -1. */
long fnv_slot_of(const void *p, const void *table, size_t size, size_t n);

/* state.c: pure parsing (the fuzz target) and loading. */
int fnv_parse_state(const uint8_t *buf, size_t len, fnv_header *header, fnv_device **devices,
                    char *err, size_t errlen);
nvmlReturn_t fnv_load(fnv_state **out); /* the state and its journal, opened, not replayed */
void fnv_free(fnv_state *st);

/* knobs.c: failure and latency knobs (FNV_FAIL, FNV_FAIL_WHEN, FNV_DELAY, FNV_CLEAR). The
 * table lives outside fnv_state so that replay does not renew it at nvmlShutdown/nvmlInit;
 * a counted knob's calls are counted in st's knobs.bin (the node's), else in the table. */
extern unsigned fnv_knob_count; /* knobs in force; lock held. 0: the cheap path */
void fnv_knobs_begin(const fnv_state *st);                        /* at load; lock held */
void fnv_knobs_apply(const fnv_record *rec, uint64_t position); /* lock held */
/* The error a knob makes `fn` answer on `gpu` (FNV_ALL_GPUS: a call naming no GPU), and
 * the delay to sleep first; counts the call for a counted knob. Lock held. */
nvmlReturn_t fnv_knob_match(const fnv_state *st, const char *fn, uint32_t gpu,
                            uint32_t *delay_ms);
/* nvmlInit, nvmlInit_v2 and nvmlInitWithFlags are one knob, named so. */
#define FNV_INIT_NAME "nvmlInit"
/* The error a `fail nvmlInit --gpu` knob gives that GPU at a first nvmlInit. */
nvmlReturn_t fnv_knob_init_error(const fnv_state *st, uint32_t gpu);
/* A probability knob's draw for its matching call i: uniform in [0, 2^32), a function of
 * (seed, i) alone, so a node replays the same failures whichever process makes each call. */
uint64_t fnv_roll(uint32_t seed, uint64_t i);

/* wave.c: a set sensor's value at a time, and the energy drawn under the power set. */
uint64_t fnv_now_ns(void); /* CLOCK_MONOTONIC, the journal's clock for waves */
uint64_t fnv_wave_at(const fnv_wave *w, uint64_t t);
double fnv_energy_between(const fnv_device *d, const fnv_wave *power, uint64_t t0, uint64_t t1);
void fnv_energy_fold(fnv_state *st, uint32_t gpu, uint64_t at_ns); /* before power changes */

/* mig_layout.c: the MIG rules (state_format.h: fnv_mig, enum fnv_mig_why). */
enum fnv_mig_why fnv_mig_change(const fnv_device *d, fnv_mig *m, fnv_record *rec,
                                uint32_t *other);
nvmlReturn_t fnv_mig_error(enum fnv_mig_why why); /* what an NVML call answers for it */
const fnv_mig_profile *fnv_mig_profile_by_id(const fnv_device *d, uint32_t id);
unsigned fnv_mig_max_slices(const fnv_device *d); /* the GPU's compute slices */
unsigned fnv_ci_slices(uint32_t profile); /* of NVML_COMPUTE_INSTANCE_PROFILE_*; 0: none */
/* Whether GPU instance g offers compute-instance `profile` (FNV_MIG_OK), or why not. */
enum fnv_mig_why fnv_ci_profile_ok(const fnv_device *d, const fnv_gi *g, uint32_t profile);
void fnv_mig_uuid(const char *parent_uuid, uint32_t gi, uint32_t ci, char out[96]);

/* journal.c */
int fnv_record_valid(const fnv_record *rec, uint64_t position, uint32_t device_count);
ssize_t fnv_read_record(int fd, uint64_t position, fnv_record *rec);
void fnv_journal_start(fnv_state *st);   /* after fnv_load: knobs, journal.gen, replay */
void fnv_journal_refresh(fnv_state *st); /* folds in what the journal gained; lock held */
/* Appends one record (seq, clocks and CRC filled in) under the journal's flock, as the
 * Python writer does, then refreshes `st`. Lock held. */
nvmlReturn_t fnv_journal_append(fnv_state *st, fnv_record *rec);

/* core.c: the lock, the loaded state, call bracketing and device handles. Every entry
 * names its caller (the exported function), which the knobs match against; a static
 * helper passes its exported caller's name on. */
extern struct nvmlDevice_st fnv_handles[FNV_MAX_DEVICES];
extern pthread_mutex_t fnv_lock;
extern fnv_state *fnv_g; /* NULL while not initialised */
nvmlReturn_t fnv_enter_as(const char *fn);
nvmlReturn_t fnv_device_enter_as(const char *fn, nvmlDevice_t device, const fnv_device **dev);
#define fnv_enter() fnv_enter_as(__func__)
#define fnv_device_enter(device, dev) fnv_device_enter_as(__func__, device, dev)
nvmlReturn_t fnv_leave(nvmlReturn_t ret);
/* Applies the knobs for `fn`: sleeps without the lock, then answers their error or
 * SUCCESS. Lock held on entry and on return, but fnv_g may have changed: re-check. */
nvmlReturn_t fnv_gate(const char *fn, uint32_t gpu);
nvmlReturn_t fnv_stub(const char *fn); /* the generated stubs: NOT_SUPPORTED or a knob's */
int fnv_handle_index(nvmlDevice_t device, uint32_t *index); /* lock held */
/* MIG device handles: the GPU, GPU instance and compute instance one names, if it names
 * one that exists now (lock held). */
int fnv_mig_handle(nvmlDevice_t device, uint32_t *gpu, uint32_t *gi, uint32_t *ci);
int fnv_is_mig_handle(nvmlDevice_t device); /* by address alone: no lock needed */
nvmlDevice_t fnv_mig_device(uint32_t gpu, uint32_t gi, uint32_t ci);
int fnv_gi_live(uint32_t gpu, uint32_t gi); /* GPU instance gi exists now; lock held */
int fnv_process_name(uint32_t pid, char *name, size_t length); /* 0: no such pid */

/* sensors.c: a sensor's value now: the journal's setting, else the profile's. */
uint64_t fnv_sensor(const fnv_device *d, enum fnv_sensor s);
uint64_t fnv_memory_used(const fnv_device *d); /* the profile's, plus the processes' */
unsigned long long fnv_energy_mj(const fnv_device *d);

/* topology.c: how two GPUs are connected (lock held). */
nvmlGpuTopologyLevel_t fnv_common_ancestor(const fnv_device *a, const fnv_device *b);
unsigned fnv_nvlinks_between(const fnv_device *a, const fnv_device *b);

/* mig.c */
/* A MIG device's memory (its GPU instance's), entering and leaving itself. */
nvmlReturn_t fnv_mig_memory(nvmlDevice_t device, unsigned long long *total);
/* A MIG device's BAR1 size, the same way. */
nvmlReturn_t fnv_mig_bar1(nvmlDevice_t device, unsigned long long *total);

#endif
