/*
 * A fake NVIDIA Management Library (libnvidia-ml) for testing pipeprof without a GPU.
 *
 * Load it through nvml-wrapper with `Nvml::builder().lib_path(..)`, or point pipeprof at it
 * with `PIPEPROF_NVML_LIB=/path/libfake_nvml.so`. Only the functions pipeprof's GPU sampler
 * calls are here: nvml-wrapper resolves every other symbol lazily and reports a missing one
 * as an error of that call only.
 *
 * Values are scripted through environment variables, read again on every nvmlInit_v2:
 *   FAKE_NVML_INIT_FAIL=N     nvmlInit_v2 returns NVML code N (9 = driver not loaded,
 *                             999 = unknown); unset or 0 = success
 *   FAKE_NVML_DEVICES=N       number of GPUs (default 1, at most 16)
 *   FAKE_NVML_UTIL=a,b,c,...  GPU utilisation %, one value per call of
 *                             nvmlDeviceGetUtilizationRates per device; the last repeats
 *                             (default 50)
 *   FAKE_NVML_MEM_UTIL=...    memory utilisation %, same rules (default 20)
 *   FAKE_NVML_MEM_TOTAL_MIB=N memory per device (default 16384); used = 1024 MiB * (index + 1)
 *   FAKE_NVML_MEM_USED_MIB=N  memory in use on every device instead (0 = an idle device)
 *   FAKE_NVML_PID=P[,Q,...]   processes with a compute context on device 0 (and only there)
 *   FAKE_NVML_PID_FILE=PATH   more such processes: the PIDs in this file (one per line, read
 *                             again at every process-list call, so a test's child can write its
 *                             own once it runs)
 *   FAKE_NVML_SEEN_FILE=PATH  one byte appended to this file at each process-list call that
 *                             listed a PID from FAKE_NVML_PID_FILE (a test's child waits on it
 *                             to know it was sampled alive)
 *   FAKE_NVML_PID_MEM_MIB=N   device memory each of them uses (default 512); "na" = NVML's
 *                             "not available" value (as under MIG or without permission)
 *   FAKE_NVML_PCIE_GEN_MAX=N  PCIe generation the link can reach (default 4)
 *   FAKE_NVML_PCIE_GEN_CUR=N  PCIe generation in use now (default 1: an idle GPU saves power)
 *   FAKE_NVML_PCIE_WIDTH_MAX=N  PCIe lanes the link can use (default 16)
 *   FAKE_NVML_PCIE_WIDTH_CUR=N  PCIe lanes in use now (default 16)
 *   FAKE_NVML_NO_POWER=1      nvmlDeviceGetPowerUsage returns NVML_ERROR_NOT_SUPPORTED
 *   FAKE_NVML_PCIE_RX_KBS=N   PCIe receive throughput in KB/s (default 1000)
 *   FAKE_NVML_PCIE_TX_KBS=N   PCIe transmit throughput in KB/s (default 500)
 *
 * Devices are named "Fake GPU 0", "Fake GPU 1", ...
 *
 * Compiled with -DFAKE_NVML_OLD_DRIVER it leaves out the PCIe link functions and
 * nvmlDeviceGetComputeRunningProcesses_v3, as a driver older than the bindings would.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_UNKNOWN 999

#define MAX_DEVICES 16
#define MAX_SEQ 64

/* Layouts as in nvml.h (and nvml-wrapper-sys's bindings). */
typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* nvmlProcessInfo_t as used by nvmlDeviceGetComputeRunningProcesses_v3. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

struct fake_device {
    int index;
    int util_pos;
    int mem_util_pos;
};
typedef struct fake_device *nvmlDevice_t;

static struct fake_device devices[MAX_DEVICES];
static int initialized;
static unsigned int device_count = 1;
static unsigned int util_seq[MAX_SEQ], util_len;
static unsigned int mem_util_seq[MAX_SEQ], mem_util_len;
static unsigned long long mem_total_mib = 16384;
static unsigned int fake_pids[MAX_SEQ], fake_pid_count;
static unsigned long long fake_pid_mem;
static long long mem_used_mib = -1;
static char pid_file[4096];
static char seen_file[4096];
static unsigned int pcie_gen_max, pcie_gen_cur, pcie_width_max, pcie_width_cur;
static int no_power;
static unsigned int pcie_rx_kbs = 1000, pcie_tx_kbs = 500;

static unsigned long long env_u64(const char *name, unsigned long long dflt) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return dflt;
    return strtoull(v, NULL, 10);
}

static unsigned int parse_seq(const char *name, unsigned int *seq, unsigned int dflt) {
    const char *v = getenv(name);
    unsigned int n = 0;
    if (v != NULL) {
        const char *p = v;
        while (*p != '\0' && n < MAX_SEQ) {
            char *end;
            unsigned long x = strtoul(p, &end, 10);
            if (end == p) break;
            seq[n++] = (unsigned int)x;
            p = end;
            while (*p == ',' || *p == ' ') p++;
        }
    }
    if (n == 0) seq[n++] = dflt;
    return n;
}

static unsigned int next_in(const unsigned int *seq, unsigned int len, int *pos) {
    unsigned int i = (unsigned int)*pos < len ? (unsigned int)*pos : len - 1;
    if ((unsigned int)*pos < len) (*pos)++;
    return seq[i];
}

static int valid(nvmlDevice_t d) {
    return initialized && d != NULL && d >= devices && d < devices + device_count;
}

nvmlReturn_t nvmlInit_v2(void) {
    unsigned long long fail = env_u64("FAKE_NVML_INIT_FAIL", 0);
    if (fail != 0) return (nvmlReturn_t)fail;
    device_count = (unsigned int)env_u64("FAKE_NVML_DEVICES", 1);
    if (device_count > MAX_DEVICES) device_count = MAX_DEVICES;
    util_len = parse_seq("FAKE_NVML_UTIL", util_seq, 50);
    mem_util_len = parse_seq("FAKE_NVML_MEM_UTIL", mem_util_seq, 20);
    mem_total_mib = env_u64("FAKE_NVML_MEM_TOTAL_MIB", 16384);
    {
        const char *u = getenv("FAKE_NVML_MEM_USED_MIB");
        mem_used_mib = (u == NULL || *u == '\0') ? -1 : (long long)strtoull(u, NULL, 10);
        const char *f = getenv("FAKE_NVML_PID_FILE");
        pid_file[0] = '\0';
        if (f != NULL && strlen(f) < sizeof pid_file) strcpy(pid_file, f);
        const char *seen = getenv("FAKE_NVML_SEEN_FILE");
        seen_file[0] = '\0';
        if (seen != NULL && strlen(seen) < sizeof seen_file) strcpy(seen_file, seen);
    }
    fake_pid_count = parse_seq("FAKE_NVML_PID", fake_pids, 0);
    if (fake_pid_count == 1 && fake_pids[0] == 0) fake_pid_count = 0;
    {
        const char *m = getenv("FAKE_NVML_PID_MEM_MIB");
        /* nvml.h's NVML_VALUE_NOT_AVAILABLE for an unsigned long long. */
        fake_pid_mem = (m != NULL && strcmp(m, "na") == 0)
                           ? 0xFFFFFFFFFFFFFFFFULL
                           : env_u64("FAKE_NVML_PID_MEM_MIB", 512) * 1024ULL * 1024ULL;
    }
    pcie_gen_max = (unsigned int)env_u64("FAKE_NVML_PCIE_GEN_MAX", 4);
    pcie_gen_cur = (unsigned int)env_u64("FAKE_NVML_PCIE_GEN_CUR", 1);
    pcie_width_max = (unsigned int)env_u64("FAKE_NVML_PCIE_WIDTH_MAX", 16);
    pcie_width_cur = (unsigned int)env_u64("FAKE_NVML_PCIE_WIDTH_CUR", 16);
    no_power = env_u64("FAKE_NVML_NO_POWER", 0) != 0;
    pcie_rx_kbs = (unsigned int)env_u64("FAKE_NVML_PCIE_RX_KBS", 1000);
    pcie_tx_kbs = (unsigned int)env_u64("FAKE_NVML_PCIE_TX_KBS", 500);
    for (int i = 0; i < MAX_DEVICES; i++) {
        devices[i].index = i;
        devices[i].util_pos = 0;
        devices[i].mem_util_pos = 0;
    }
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (version == NULL || length < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "555.55.fake");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= device_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!valid(device) || name == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, length, "Fake GPU %d", device->index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    if (!valid(device) || util == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = next_in(util_seq, util_len, &device->util_pos);
    util->memory = next_in(mem_util_seq, mem_util_len, &device->mem_util_pos);
    return NVML_SUCCESS;
}

static void fill_memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                        unsigned long long *free_) {
    unsigned long long mib = 1024ULL * 1024ULL;
    *total = mem_total_mib * mib;
    *used = mem_used_mib >= 0 ? (unsigned long long)mem_used_mib * mib
                              : 1024ULL * mib * (unsigned long long)(device->index + 1);
    if (*used > *total) *used = *total;
    *free_ = *total - *used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (!valid(device) || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memory->reserved = 0;
    fill_memory(device, &memory->total, &memory->used, &memory->free);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!valid(device) || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    fill_memory(device, &memory->total, &memory->used, &memory->free);
    return NVML_SUCCESS;
}

/* counter: 0 = TX bytes, 1 = RX bytes; value in KB/s. */
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *value) {
    if (!valid(device) || value == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (counter == 0) *value = pcie_tx_kbs;
    else if (counter == 1) *value = pcie_rx_kbs;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* Milliwatts. */
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    if (!valid(device) || power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (no_power) return NVML_ERROR_NOT_SUPPORTED;
    *power = 75000u + 1000u * (unsigned int)device->index;
    return NVML_SUCCESS;
}

/* type: 0 = graphics, 1 = SM, 2 = memory, 3 = video; MHz. */
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    if (!valid(device) || clock == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case 0:
    case 1: *clock = 1410; break;
    case 2: *clock = 1215; break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD_DRIVER
static nvmlReturn_t link_value(nvmlDevice_t device, unsigned int *out, unsigned int v) {
    if (!valid(device) || out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *out = v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return link_value(device, gen, pcie_gen_max);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return link_value(device, gen, pcie_gen_cur);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return link_value(device, width, pcie_width_max);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return link_value(device, width, pcie_width_cur);
}

/* Called first with *count = 0 (and maybe NULL infos) to learn the size, as NVML does. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    if (!valid(device) || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int pids[2 * MAX_SEQ];
    unsigned int n = 0;
    if (device->index == 0) {
        for (unsigned int i = 0; i < fake_pid_count; i++) pids[n++] = fake_pids[i];
        FILE *f = pid_file[0] != '\0' ? fopen(pid_file, "r") : NULL;
        if (f != NULL) {
            unsigned int p;
            unsigned int from_file = 0;
            while (n < 2 * MAX_SEQ && fscanf(f, "%u", &p) == 1) {
                pids[n++] = p;
                from_file++;
            }
            fclose(f);
            FILE *s = from_file > 0 && seen_file[0] != '\0' ? fopen(seen_file, "a") : NULL;
            if (s != NULL) {
                fputc('x', s);
                fclose(s);
            }
        }
    }
    if (*count < n || (n > 0 && infos == NULL)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = fake_pid_mem;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}
#endif
