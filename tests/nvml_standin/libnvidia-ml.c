/* A stand-in for NVIDIA's libnvidia-ml.so.1, for tests on machines without an NVIDIA GPU.
 *
 * pynvml (nvidia-ml-py) loads it exactly as it loads the real library (dlopen of
 * "libnvidia-ml.so.1", found through LD_LIBRARY_PATH) and resolves the same symbols, so
 * gpuq's discovery, telemetry, health and energy code run through pynvml's real code path.
 * Only the functions gpuq calls are here (plus what pynvml itself needs: init, shutdown,
 * error strings); pynvml answers NVML_ERROR_FUNCTION_NOT_FOUND for the rest, as it would
 * with an old driver.
 *
 * The inventory is a text file named by NVML_STANDIN_CONFIG (tests/nvml_standin/__init__.py
 * writes it), re-read whenever it changes, so a test can change a reading or lose a GPU
 * while the processes under test run. One record per line, tab-separated key=value fields:
 *
 *   driver   version=550.54.15
 *   gpu      uuid=GPU-...  name=NVIDIA H100 80GB HBM3  memory_mib=81559  used_mib=0
 *            util=0  mem_util=0  temp=35  power_mw=70000  energy_mj=0  energy_since=<unix s>
 *            cc=9.0  energy=1  power=1  lost=0  mig=0  max_mig=0
 *   mig      parent=<gpu line index>  slot=<0..>  uuid=MIG-...  name=...  memory_mib=  used_mib=
 *   process  device=<uuid>  pid=<pid>  used_mib=<MiB>
 *
 * The energy counter runs as a real one does: energy_mj + power_mw x (now - energy_since).
 * A GPU with lost=1 answers NVML_ERROR_GPU_IS_LOST to everything, handles included, as a
 * GPU that fell off the bus after an Xid error does. Without NVML_STANDIN_CONFIG (or with
 * no such file) nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED, as on a host without a
 * driver. If NVML_STANDIN_LOG names a file, each call appends "<pid> <function>" to it.
 */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_DEVICES 64
#define MAX_PROCESSES 256
#define MIB (1024ULL * 1024ULL)

typedef struct Device {
    int present;
    int is_mig;
    int parent;  /* for a MIG device: the index of its GPU */
    int slot;    /* for a MIG device: its place on the parent, 0..max_mig-1 */
    char uuid[96];
    char name[96];
    unsigned long long memory_bytes, used_bytes;
    unsigned util, mem_util, temp, power_mw;
    double energy_mj, energy_since;
    int cc_major, cc_minor;
    int has_energy, has_power, lost, mig_mode, max_mig;
} Device;

typedef struct Process {
    char device[96];
    unsigned pid;
    unsigned long long used_bytes;
} Process;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef Device *nvmlDevice_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Device gpus[MAX_DEVICES]; /* whole GPUs, by NVML index */
static int gpu_count;
static Device migs[MAX_DEVICES];
static int mig_count;
static Process processes[MAX_PROCESSES];
static int process_count;
static char driver_version[80] = "550.54.15";
static int initialised;
static char loaded_path[4096];
static struct stat loaded_stat;

static void log_call(const char *name) {
    const char *path = getenv("NVML_STANDIN_LOG");
    if (path == NULL || *path == '\0') return;
    FILE *f = fopen(path, "a");
    if (f == NULL) return;
    fprintf(f, "%d %s\n", (int)getpid(), name);
    fclose(f);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void copy_field(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

static void set_field(Device *d, const char *key, const char *value) {
    if (!strcmp(key, "uuid")) copy_field(d->uuid, sizeof d->uuid, value);
    else if (!strcmp(key, "name")) copy_field(d->name, sizeof d->name, value);
    else if (!strcmp(key, "memory_mib")) d->memory_bytes = strtoull(value, NULL, 10) * MIB;
    else if (!strcmp(key, "used_mib")) d->used_bytes = strtoull(value, NULL, 10) * MIB;
    else if (!strcmp(key, "util")) d->util = (unsigned)strtoul(value, NULL, 10);
    else if (!strcmp(key, "mem_util")) d->mem_util = (unsigned)strtoul(value, NULL, 10);
    else if (!strcmp(key, "temp")) d->temp = (unsigned)strtoul(value, NULL, 10);
    else if (!strcmp(key, "power_mw")) d->power_mw = (unsigned)strtoul(value, NULL, 10);
    else if (!strcmp(key, "energy_mj")) d->energy_mj = strtod(value, NULL);
    else if (!strcmp(key, "energy_since")) d->energy_since = strtod(value, NULL);
    else if (!strcmp(key, "cc")) sscanf(value, "%d.%d", &d->cc_major, &d->cc_minor);
    else if (!strcmp(key, "energy")) d->has_energy = atoi(value);
    else if (!strcmp(key, "power")) d->has_power = atoi(value);
    else if (!strcmp(key, "lost")) d->lost = atoi(value);
    else if (!strcmp(key, "mig")) d->mig_mode = atoi(value);
    else if (!strcmp(key, "max_mig")) d->max_mig = atoi(value);
    else if (!strcmp(key, "parent")) d->parent = atoi(value);
    else if (!strcmp(key, "slot")) d->slot = atoi(value);
}

static void parse_line(char *line) {
    char *saveptr = NULL;
    char *kind = strtok_r(line, "\t\n", &saveptr);
    if (kind == NULL || kind[0] == '#') return;
    Device *device = NULL;
    Process *process = NULL;
    if (!strcmp(kind, "gpu") && gpu_count < MAX_DEVICES) {
        device = &gpus[gpu_count++];
    } else if (!strcmp(kind, "mig") && mig_count < MAX_DEVICES) {
        device = &migs[mig_count++];
        device->is_mig = 1;
    } else if (!strcmp(kind, "process") && process_count < MAX_PROCESSES) {
        process = &processes[process_count++];
    }
    if (device != NULL) {
        memset(device, 0, sizeof *device);
        device->present = 1;
        device->is_mig = !strcmp(kind, "mig");
        device->has_energy = device->has_power = 1;
        device->cc_major = 8;
    }
    for (char *field; (field = strtok_r(NULL, "\t\n", &saveptr)) != NULL;) {
        char *eq = strchr(field, '=');
        if (eq == NULL) continue;
        *eq = '\0';
        const char *key = field, *value = eq + 1;
        if (device != NULL) set_field(device, key, value);
        else if (process != NULL) {
            if (!strcmp(key, "device")) copy_field(process->device, sizeof process->device, value);
            else if (!strcmp(key, "pid")) process->pid = (unsigned)strtoul(value, NULL, 10);
            else if (!strcmp(key, "used_mib")) process->used_bytes = strtoull(value, NULL, 10) * MIB;
        } else if (!strcmp(kind, "driver") && !strcmp(key, "version")) {
            copy_field(driver_version, sizeof driver_version, value);
        }
    }
}

/* Re-reads the inventory when the file changed (the caller holds the lock). Handles stay
 * valid: they point into the fixed arrays, which keep their order. */
static int reload(void) {
    const char *path = getenv("NVML_STANDIN_CONFIG");
    struct stat st;
    if (path == NULL || *path == '\0' || stat(path, &st) != 0) return 0;
    if (!strcmp(path, loaded_path) && st.st_ino == loaded_stat.st_ino && st.st_size == loaded_stat.st_size &&
        st.st_mtim.tv_sec == loaded_stat.st_mtim.tv_sec && st.st_mtim.tv_nsec == loaded_stat.st_mtim.tv_nsec)
        return 1;
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    for (int i = 0; i < MAX_DEVICES; i++) gpus[i].present = migs[i].present = 0;
    gpu_count = mig_count = process_count = 0;
    char line[1024];
    while (fgets(line, sizeof line, f) != NULL) parse_line(line);
    fclose(f);
    copy_field(loaded_path, sizeof loaded_path, path);
    loaded_stat = st;
    return 1;
}

/* Every device call: take the lock, re-read, check the handle. Returns with the lock held
 * on success; on failure the lock is released and the error is in *ret. */
static int enter(const char *name, nvmlDevice_t device, nvmlReturn_t *ret) {
    log_call(name);
    pthread_mutex_lock(&lock);
    if (!initialised) {
        *ret = NVML_ERROR_UNINITIALIZED;
    } else if (!reload()) {
        *ret = NVML_ERROR_DRIVER_NOT_LOADED;
    } else if (device == NULL || !device->present) {
        *ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (device->lost || (device->is_mig && gpus[device->parent].lost)) {
        *ret = NVML_ERROR_GPU_IS_LOST;
    } else {
        return 1;
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

#define ENTER(device)                                                                                                 \
    nvmlReturn_t error_;                                                                                              \
    if (!enter(__func__, (device), &error_)) return error_
#define LEAVE(value)                                                                                                  \
    do {                                                                                                              \
        pthread_mutex_unlock(&lock);                                                                                  \
        return (value);                                                                                               \
    } while (0)

static unsigned long long used_bytes(const Device *d) {
    unsigned long long used = d->used_bytes;
    for (int i = 0; i < process_count; i++)
        if (!strcmp(processes[i].device, d->uuid)) used += processes[i].used_bytes;
    return used > d->memory_bytes ? d->memory_bytes : used;
}

/* ------------------------------------------------------------------ init, errors, system */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    log_call(__func__);
    pthread_mutex_lock(&lock);
    int ok = reload();
    if (ok) initialised++;
    pthread_mutex_unlock(&lock);
    return ok ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    log_call(__func__);
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = initialised ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialised) initialised--;
    pthread_mutex_unlock(&lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    log_call(__func__);
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = !initialised ? NVML_ERROR_UNINITIALIZED
                       : strlen(driver_version) >= length ? NVML_ERROR_INSUFFICIENT_SIZE
                                                          : NVML_SUCCESS;
    if (ret == NVML_SUCCESS) copy_field(version, length, driver_version);
    pthread_mutex_unlock(&lock);
    return ret;
}

/* ------------------------------------------------------------------ handles */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    log_call(__func__);
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = !initialised ? NVML_ERROR_UNINITIALIZED : !reload() ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
    if (ret == NVML_SUCCESS) *count = (unsigned)gpu_count;
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    log_call(__func__);
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = !initialised              ? NVML_ERROR_UNINITIALIZED
                       : !reload()               ? NVML_ERROR_DRIVER_NOT_LOADED
                       : index >= (unsigned)gpu_count ? NVML_ERROR_INVALID_ARGUMENT
                       : gpus[index].lost        ? NVML_ERROR_GPU_IS_LOST
                                                 : NVML_SUCCESS;
    if (ret == NVML_SUCCESS) *device = &gpus[index];
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    log_call(__func__);
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = !initialised ? NVML_ERROR_UNINITIALIZED : !reload() ? NVML_ERROR_DRIVER_NOT_LOADED
                                                                           : NVML_ERROR_NOT_FOUND;
    for (int i = 0; ret == NVML_ERROR_NOT_FOUND && i < gpu_count + mig_count; i++) {
        Device *d = i < gpu_count ? &gpus[i] : &migs[i - gpu_count];
        if (strcmp(d->uuid, uuid) != 0) continue;
        if (d->lost || (d->is_mig && gpus[d->parent].lost)) ret = NVML_ERROR_GPU_IS_LOST;
        else {
            *device = d;
            ret = NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

/* ------------------------------------------------------------------ identity */

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER(device);
    if (strlen(device->uuid) >= length) LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    copy_field(uuid, length, device->uuid);
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER(device);
    if (strlen(device->name) >= length) LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    copy_field(name, length, device->name);
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    ENTER(device);
    if (device->is_mig) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *index = (unsigned)(device - gpus);
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    ENTER(device);
    const Device *d = device->is_mig ? &gpus[device->parent] : device;
    *major = d->cc_major;
    *minor = d->cc_minor;
    LEAVE(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ memory and telemetry */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER(device);
    memory->total = device->memory_bytes;
    memory->used = used_bytes(device);
    memory->free = memory->total - memory->used;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    ENTER(device);
    memory->total = device->memory_bytes;
    memory->reserved = 0;
    memory->used = used_bytes(device);
    memory->free = memory->total - memory->used;
    LEAVE(NVML_SUCCESS);
}

/* Utilisation, temperature, power and energy are the physical GPU's: NVML does not report
 * them per MIG device. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    ENTER(device);
    if (device->is_mig) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = device->util;
    utilization->memory = device->mem_util;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    ENTER(device);
    if (device->is_mig) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    if (sensor != 0) LEAVE(NVML_ERROR_INVALID_ARGUMENT); /* NVML_TEMPERATURE_GPU */
    *temp = device->temp;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    ENTER(device);
    if (device->is_mig || !device->has_power) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    *power = device->power_mw;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    ENTER(device);
    if (device->is_mig || !device->has_energy) LEAVE(NVML_ERROR_NOT_SUPPORTED);
    double elapsed = device->energy_since > 0 ? now_s() - device->energy_since : 0.0;
    *energy = (unsigned long long)(device->energy_mj + device->power_mw * (elapsed > 0 ? elapsed : 0.0));
    LEAVE(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ MIG */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    ENTER(device);
    if (device->is_mig) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    if (device->max_mig == 0 && !device->mig_mode) LEAVE(NVML_ERROR_NOT_SUPPORTED); /* not a MIG-capable GPU */
    *current = *pending = (unsigned)device->mig_mode;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    ENTER(device);
    if (device->is_mig) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)device->max_mig;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    ENTER(device);
    if (device->is_mig || index >= (unsigned)device->max_mig) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    int parent = (int)(device - gpus);
    for (int i = 0; i < mig_count; i++) {
        if (migs[i].parent == parent && migs[i].slot == (int)index) {
            *mig = &migs[i];
            LEAVE(NVML_SUCCESS);
        }
    }
    LEAVE(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    ENTER(device);
    *is_mig = (unsigned)device->is_mig;
    LEAVE(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t device, nvmlDevice_t *parent) {
    ENTER(device);
    if (!device->is_mig) LEAVE(NVML_ERROR_INVALID_ARGUMENT);
    *parent = &gpus[device->parent];
    LEAVE(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ processes */

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    ENTER(device);
    unsigned n = 0;
    for (int i = 0; i < process_count; i++)
        if (!strcmp(processes[i].device, device->uuid)) n++;
    if (n == 0) {
        *count = 0;
        LEAVE(NVML_SUCCESS);
    }
    if (infos == NULL || *count < n) {
        *count = n;
        LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned k = 0;
    for (int i = 0; i < process_count; i++) {
        if (strcmp(processes[i].device, device->uuid) != 0) continue;
        infos[k].pid = processes[i].pid;
        infos[k].usedGpuMemory = processes[i].used_bytes;
        infos[k].gpuInstanceId = infos[k].computeInstanceId = 0xFFFFFFFFu;
        k++;
    }
    *count = k;
    LEAVE(NVML_SUCCESS);
}
