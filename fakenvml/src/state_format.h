/* The contract with the Python control plane: the on-disk formats (state.bin, journal.bin,
 * journal.gen), their numbers, and the MIG layout that fakenvml_mig_change works on.
 * Little-endian, fixed size, no pointers: every bound is known before a byte is parsed.
 *
 * This header is the source. Python reads and writes the same bytes through one table,
 * fakenvml/layout.py (every struct field by field, every FNV_ constant by name), which
 * tests/fakenvml/test_layout.py holds to what a compiler makes of this file: a field or
 * number changed here and not there fails that test, naming it. Change a format's version
 * with its layout. */
#ifndef FAKENVML_STATE_FORMAT_H
#define FAKENVML_STATE_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define FNV_STATE_FILE "state.bin"
#define FNV_JOURNAL_FILE "journal.bin"
#define FNV_GEN_FILE "journal.gen"
#define FNV_STATE_MAGIC "FNVMLST1"
#define FNV_JOURNAL_MAGIC "FNVMLJR1"
#define FNV_GEN_MAGIC "FNVMLGN1"
#define FNV_COUNTERS_FILE "knobs.bin"
#define FNV_COUNTERS_MAGIC "FNVMLKC1"
#define FNV_FORMAT_VERSION 2 /* state.bin; 2 added the driver branch and the profile tail.
                                Still 2 since the platform and the board's NVLink count took
                                a reserved and a padding word: older files read as bare
                                metal with no link count, as before. */
#define FNV_JOURNAL_VERSION 1
#define FNV_MAX_DEVICES 4096
#define FNV_MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS */
#define FNV_NO_NUMA 0xFFFFFFFFu
#define FNV_MAX_MIG_PROFILES 8
#define FNV_MAX_FIELDS 80
#define FNV_MAX_MEM_CLOCKS 4
#define FNV_MAX_PSTATES 4
#define FNV_FIELD_UNKNOWN 0xFFFFFFFFu /* fnv_field.type: ids the driver rejects */
#define FNV_PLATFORM_BARE_METAL 0
#define FNV_PLATFORM_VM_PASSTHROUGH 1 /* the GPUs passed through to a virtual machine */

#pragma pack(push, 1)
typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t device_size;
    uint32_t device_count;
    uint64_t boot_id; /* ties a journal to the state it was created with */
    int32_t cuda_driver_version;
    uint32_t platform; /* FNV_PLATFORM_*; 0 (bare metal) in files written before it */
    char driver_version[32];
    char nvml_version[32];
    char node_name[64];
    char driver_branch[32]; /* nvmlSystemGetDriverBranch, e.g. "r582_49" */
} fnv_header;

typedef struct {
    uint32_t active;
    uint32_t remote_kind; /* nvmlIntNvLinkDeviceType_t */
    uint32_t remote_index;
    uint32_t remote_device_id;
    char remote_bus_id[32];
} fnv_link;

/* One GPU-instance profile a MIG-capable GPU offers (nvmlGpuInstanceProfileInfo_v2_t). */
typedef struct {
    uint32_t profile; /* NVML_GPU_INSTANCE_PROFILE_* the caller asks with */
    uint32_t id, is_p2p, slice_count, instance_count, multiprocessors;
    uint32_t copy_engines, decoders, encoders, jpegs, ofas;
    uint32_t placement_size, placement_starts; /* bit i set: a placement starts at slice i */
    uint32_t pad;
    uint64_t memory_mib;
    char name[32];
} fnv_mig_profile;

/* A field value the profile answers (nvmlFieldValue_t), or ids the driver rejects: a
 * FNV_FIELD_UNKNOWN entry rejects id..value (a value below id: id alone). */
typedef struct {
    uint32_t id, type; /* nvmlValueType_t, or FNV_FIELD_UNKNOWN */
    uint64_t value;    /* the bits of the value: a double's, or a signed value's */
} fnv_field;

typedef struct {
    uint32_t index, minor;
    char uuid[96], name[96], serial[32], part_number[80], vbios[32], inforom[16];
    uint32_t pci_domain, pci_bus, pci_device, pci_function;
    uint32_t pci_device_id, pci_subsystem_id;
    char bus_id[32];
    uint32_t brand, arch, cc_major, cc_minor;
    uint64_t memory_total, memory_reserved, memory_used, bar1_total;
    uint32_t power_usage_mw, power_limit_mw, power_min_mw, power_max_mw, power_default_mw;
    uint32_t nvlink_board; /* the board's NVLinks, seen or not (a VM may hide them all): the
                              driver checks link indices against it; 0: nvlink_count */
    uint64_t energy_mj;
    uint32_t temp_gpu, temp_slowdown, temp_shutdown, temp_gpu_max, temp_mem_max;
    uint32_t fan_count, fan_speed;
    uint32_t clocks[4], max_clocks[4]; /* graphics, sm, mem, video (nvmlClockType_t order) */
    uint32_t util_gpu, util_mem, pstate;
    uint32_t ecc_enabled, persistence, compute_mode;
    uint32_t numa_node, cpu_first, cpu_count;
    uint32_t pcie_switch, pcie_upper_switch, host_bridge;
    uint32_t pcie_gen, pcie_width;
    uint32_t board_id, multi_gpu_board;
    uint32_t nvlink_version, nvlink_count;
    uint32_t num_cores, memory_bus_width;
    fnv_link links[FNV_MAX_LINKS];
    /* The profile's capabilities (format 2). */
    uint64_t event_types;         /* nvmlDeviceGetSupportedEventTypes */
    uint64_t clock_event_reasons; /* nvmlDeviceGetSupportedClocksEventReasons */
    uint32_t ecc_locations;       /* bit per nvmlMemoryLocation_t that counts ECC errors */
    uint32_t display_mode;
    uint32_t app_clocks[4], boost_clocks[4]; /* per clock type; 0: NOT_SUPPORTED */
    uint32_t mem_clocks[FNV_MAX_MEM_CLOCKS]; /* supported, highest first */
    uint32_t mem_clock_count;
    uint32_t gfx_clock_min, gfx_clock_step; /* graphics clocks: max_clocks[0] down to min */
    uint32_t pstates[FNV_MAX_PSTATES];      /* in the order the driver lists them */
    uint32_t pstate_count;
    uint32_t row_remap_max; /* nvmlRowRemapperHistogramValues_t.max; 0: NOT_SUPPORTED */
    uint32_t conf_compute;  /* 1: Confidential Computing capable */
    uint32_t mig_count, field_count;
    fnv_mig_profile mig[FNV_MAX_MIG_PROFILES];
    fnv_field fields[FNV_MAX_FIELDS];
} fnv_device;

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t record_size;
    uint64_t boot_id;
    uint8_t reserved[40];
} fnv_journal_header;

/* journal.gen: how many whole records the journal holds, stored by every writer after its
 * records (under the journal's flock). Libraries map it read-only and compare one word per
 * call, so a fault written a moment ago is seen by the very next call without a system call.
 * Written once by `fakenvml init` (renamed into place) and never truncated: a mapped file
 * that shrank would fault its readers. Missing or foreign: the library checks the journal's
 * size per call instead (fstat). */
typedef struct {
    char magic[8];
    uint64_t boot_id;
    uint64_t committed; /* 8-aligned: one store for writers, one load for readers */
    uint8_t reserved[40];
} fnv_gen;

/* knobs.bin: the node's call counters of counted `fail` knobs (an --after, a --probability
 * or a --count), one fnv_counter per knob, so every process on the node counts the same
 * calls: each library maps it MAP_SHARED and adds with __atomic_fetch_add. Written once by
 * `fakenvml init` (renamed into place), all counters zero; the control plane hands out slots
 * in order (`next`, under the file's flock), one per counted knob, never reused within an
 * init; never truncated (a mapped file that shrank would fault its users). A process that
 * cannot map it writable (a read-only mount, a state from before it) counts alone. */
#define FNV_MAX_COUNTED 4096 /* counted knobs per init */
#define FNV_NO_SLOT 0xFFFFFFFFu
typedef struct {
    char magic[8];
    uint64_t boot_id;
    uint32_t slots; /* counters that follow: FNV_MAX_COUNTED */
    uint32_t next;  /* the next slot to hand out; the control plane's alone */
    uint8_t reserved[40];
} fnv_counters;
typedef struct {
    uint64_t calls; /* calls the knob matched, node-wide: call i is the (i+1)-th */
    uint64_t fails; /* of those, the ones it failed that counted towards its --count */
} fnv_counter;

/* Names as in fakenvml/journal.py's Kind, whose spellings (xid, ecc-single, ...) every
   command, file and report uses; the numbers are the format. */
enum fnv_record_kind {
    FNV_XID = 1,
    FNV_ECC_SINGLE = 2,
    FNV_ECC_DOUBLE = 3,
    FNV_LOST = 4,
    FNV_FALLEN_OFF_BUS = 5,
    FNV_RECOVER = 6,         /* clears lost and the recovery action */
    FNV_RECOVERY_ACTION = 7, /* data: nvmlDeviceGpuRecoveryAction_t the driver asks for */
    /* Telemetry and processes: live values a monitoring stack reads. */
    FNV_SET = 8,            /* arg0: fnv_sensor; data: value, or a wave's start; data2: its
                               turn; arg1: the wave's period in ms (0: constant);
                               FNV_SET_IDLE in arg1 with data 0: back to the profile's */
    FNV_PROCESS_ADD = 9,    /* arg0: pid; arg1: FNV_PROC_* bits; data: used memory, bytes;
                               data2: FNV_PROC_UTIL | SM % | memory % << 8 when given, else
                               0: an even share of the GPU's utilisation */
    FNV_PROCESS_REMOVE = 10, /* arg0: pid */
    /* NVML failure knobs. gpu: one GPU, or FNV_ALL_GPUS. arg0: the function's id (crc32 of
       its exported name); arg1: FNV_KNOB_* flags. */
    FNV_FAIL = 11,  /* data: the nvmlReturn_t to answer; data2: how many calls fail (0: all);
                       an FNV_FAIL_WHEN before it says when, and counts them node-wide */
    FNV_DELAY = 12, /* data: milliseconds to sleep before answering (0: none) */
    FNV_CLEAR = 13, /* data: FNV_CLEAR_* bits; arg0: one function's id, or 0 for all */
    /* MIG (fakenvml/mig.py, src/mig.c; replayed by src/mig_layout.c, which checks each
       one as the driver would and ignores what it would refuse). */
    FNV_MIG_MODE = 14,   /* data: the pending MIG mode (0 off, 1 on) */
    FNV_GPU_RESET = 15,  /* the pending MIG mode becomes current; no instances survive */
    FNV_GI_CREATE = 16,  /* arg0: GPU instance id; arg1: GPU-instance profile id (19 for
                            1g.10gb); data: placement start (memory slice); data2: the
                            placement's size (0: the profile's) */
    FNV_GI_DESTROY = 17, /* arg0: GPU instance id */
    FNV_CI_CREATE = 18,  /* arg0: GPU instance id; arg1: compute instance id; data:
                            NVML_COMPUTE_INSTANCE_PROFILE_*; data2: placement start */
    FNV_CI_DESTROY = 19, /* arg0: GPU instance id; arg1: compute instance id */
    /* When the FNV_FAIL right after it (same append, same gpu) fails a call: counted in
       knobs.bin slot arg1 (FNV_NO_SLOT: per process), matching call i (0-based) passes
       while i < data (--after), then fails when fnv_roll(seed arg0, i) < data2 (a 2^-32
       fixed-point probability; FNV_ALWAYS: every call), and the knob is spent after its
       data2 (--count) failures. Before its FAIL, so a reader that sees one record of the
       pair alone never fails a call it should not. */
    FNV_FAIL_WHEN = 20,
};

enum fnv_sensor { /* FNV_SET's arg0; fakenvml/telemetry.py's Sensor */
    FNV_S_TEMPERATURE = 1, /* degrees C */
    FNV_S_MEM_TEMPERATURE, /* degrees C (field NVML_FI_DEV_MEMORY_TEMP) */
    FNV_S_POWER,           /* mW */
    FNV_S_UTIL,            /* percent */
    FNV_S_MEM_UTIL,        /* percent */
    FNV_S_GRAPHICS_CLOCK,  /* MHz, then sm, mem, video: nvmlClockType_t order */
    FNV_S_SM_CLOCK,
    FNV_S_MEM_CLOCK,
    FNV_S_VIDEO_CLOCK,
    FNV_S_PSTATE,        /* nvmlPstates_t */
    FNV_S_CLOCK_REASONS, /* nvmlClocksEventReason* bits */
    FNV_S_COMPUTE_MODE,  /* nvmlComputeMode_t: nvmlDeviceSetComputeMode's, never a wave */
    FNV_S_COUNT
};

#define FNV_ALL_GPUS 0xFFFFFFFFu /* FNV_FAIL / FNV_DELAY / FNV_CLEAR: every GPU, and calls
                                    that name none */
#define FNV_SET_IDLE 0xFFFFFFFFu
#define FNV_NO_INSTANCE 0xFFFFFFFFu /* a fault record's gpu/compute instance: none named */
#define FNV_PROC_COMPUTE 1u
#define FNV_PROC_GRAPHICS 2u
#define FNV_MAX_PROCESSES 64 /* per GPU; adds beyond it are ignored */
#define FNV_PROC_UTIL 0x10000u /* FNV_PROCESS_ADD's data2: the process's own utilisation */
#define FNV_KNOB_VERSIONS 1u /* also the function's _vN versions (a name given without one) */
#define FNV_CLEAR_FAIL 1u
#define FNV_CLEAR_DELAY 2u
#define FNV_ALWAYS 0x100000000ull /* FNV_FAIL_WHEN's probability 1 */

typedef struct {
    uint64_t seq; /* 1-based, equal to the record's position + 1 */
    uint64_t realtime_ns, monotonic_ns;
    uint32_t kind, gpu;
    uint64_t data; /* Xid code or ECC error count; other kinds: above */
    union {
        uint32_t gpu_instance; /* faults */
        uint32_t arg0;         /* FNV_SET and later */
    };
    union {
        uint32_t compute_instance;
        uint32_t arg1;
    };
    uint64_t data2;
    uint8_t reserved[4];
    uint32_t crc; /* crc32 of the preceding 60 bytes */
} fnv_record;

/* ---- One GPU's MIG layout, replayed from its MIG records (never on disk). The control
 * plane holds one per GPU and changes it only through fakenvml_mig_change, so `fakenvml
 * mig` plans with the library's rules, not a copy of them; it reads the layout back. A
 * GPU instance's id follows from its placement (the driver numbers the nodes of the
 * 8-slice tree: 0 whole, 1-2 halves, 3-6 quarters, 7-14 eighths), so the same layout has
 * the same ids in every process. */
#define FNV_MIG_GIS 15 /* GPU instance ids 0-14, the driver's capability range */
#define FNV_MIG_CIS 8  /* compute instance ids 0-7 */
#define FNV_ANY 0xFFFFFFFFu /* a create's instance id or placement start: the first that fits */
typedef struct {
    uint8_t used, profile, start, slices; /* profile: NVML_COMPUTE_INSTANCE_PROFILE_* */
} fnv_ci;
typedef struct {
    uint8_t used, prof, start, pad; /* prof: index into the device's mig[] profiles */
    fnv_ci ci[FNV_MIG_CIS];
} fnv_gi;
typedef struct {
    uint32_t current, pending; /* NVML_DEVICE_MIG_ENABLE (1) / _DISABLE (0) */
    fnv_gi gi[FNV_MIG_GIS];
} fnv_mig;
#pragma pack(pop)

/* Why a MIG change is refused (fakenvml_mig_change): the NVML calls answer the error each
 * maps to (fnv_mig_error), the control plane words it (fakenvml/mig.py). `other`: the
 * instance in the way, where one is. */
enum fnv_mig_why {
    FNV_MIG_OK = 0,
    FNV_MIG_UNSUPPORTED = 1,     /* the board has no MIG profiles */
    FNV_MIG_DISABLED = 2,        /* GPU instances need MIG enabled (and a reset since) */
    FNV_MIG_NO_PROFILE = 3,      /* no GPU-instance profile of that id */
    FNV_MIG_NOT_A_PLACEMENT = 4, /* the profile has no placement at that slice, or size */
    FNV_MIG_ALL_MADE = 5,        /* the profile's instance count is reached */
    FNV_MIG_NO_SLICES = 6,       /* too few compute slices left */
    FNV_MIG_OVERLAP = 7,         /* other: the GPU instance whose memory slices it overlaps */
    FNV_MIG_ID_TAKEN = 8,        /* other: the id its placement gives, which is in use */
    FNV_MIG_WRONG_ID = 9,        /* a record naming an id its placement does not give */
    FNV_MIG_NO_ROOM = 10,        /* no placement of the profile fits */
    FNV_MIG_NO_GI = 11,          /* no such GPU instance */
    FNV_MIG_IN_USE = 12,         /* the GPU instance still has compute instances */
    FNV_MIG_NO_CI_PROFILE = 13,  /* no compute-instance profile of that id */
    FNV_MIG_CI_TOO_BIG = 14,     /* a compute-instance profile the GPU instance lacks */
    FNV_MIG_CI_START = 15,       /* the compute instance cannot start at that slice */
    FNV_MIG_CI_OVERLAP = 16,     /* other: the compute instance it overlaps */
    FNV_MIG_CI_NO_ROOM = 17,     /* no placement of the compute instance fits */
    FNV_MIG_NO_CI_ID = 18,       /* no compute-instance id free, or the one named is taken */
    FNV_MIG_NO_CI = 19,          /* no such compute instance */
    FNV_MIG_NOT_MIG = 20,        /* not a MIG record */
};

/* The library's exports beyond NVML (exports.map), for the control plane alone.
 * fakenvml_mig_change: checks one MIG record against a GPU's layout as the driver checks
 * the call, and makes the change (FNV_MIG_OK), or says why not and changes nothing. A
 * create may name FNV_ANY for its instance id or placement start: the first that fits,
 * which *rec holds afterwards. The device is a state.bin device record; the layout one
 * this function made (or zeroes: MIG off, no instances).
 * fakenvml_mig_uuid: a MIG device's UUID, "MIG-" and CRC-32s of "<parent>/<gi>/<ci>/<k>". */
uint32_t fakenvml_mig_change(const fnv_device *device, fnv_mig *layout, fnv_record *rec,
                             uint32_t *other);
void fakenvml_mig_uuid(const char *parent_uuid, uint32_t gi, uint32_t ci, char out[96]);

_Static_assert(sizeof(fnv_header) == 200, "header layout changed: update fakenvml/layout.py");
_Static_assert(sizeof(fnv_link) == 48, "link layout changed: update fakenvml/layout.py");
_Static_assert(sizeof(fnv_mig_profile) == 96, "MIG profile layout changed: update layout.py");
_Static_assert(sizeof(fnv_field) == 16, "field layout changed: update fakenvml/layout.py");
_Static_assert(sizeof(fnv_device) == 636 + FNV_MAX_LINKS * 48 + 120 + FNV_MAX_MIG_PROFILES * 96 +
                                         FNV_MAX_FIELDS * 16,
               "device layout changed");
_Static_assert(sizeof(fnv_journal_header) == 64, "journal header layout changed");
_Static_assert(sizeof(fnv_gen) == 64 && offsetof(fnv_gen, committed) == 16, "gen layout changed");
_Static_assert(sizeof(fnv_counters) == 64 && sizeof(fnv_counter) == 16, "counters layout changed");
_Static_assert(sizeof(fnv_record) == 64, "record layout changed: update fakenvml/layout.py");
_Static_assert(sizeof(fnv_mig) == 8 + FNV_MIG_GIS * (4 + FNV_MIG_CIS * 4), "MIG layout changed");

#endif
