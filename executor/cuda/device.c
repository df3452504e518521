/*
 * The GPUs of this machine (how many, what the current one is) and the
 * device of a rank's thread: which GPU, how many of its SMs (a CUDA
 * green context) and how much of its memory. Thread-local state, so the
 * threads of one process can each drive their own GPU, or a throttled
 * part of one. docs/cuda-backend.md ("Devices of a parallel run").
 *
 * Green contexts are driver-API objects. Their functions are looked up at
 * run time through the CUDA runtime (cudaGetDriverEntryPointByVersion)
 * rather than linked from libcuda: the build machine has only a stub
 * libcuda, binaries built there must start on machines without a GPU
 * (the cpu tests), and the runtime already loaded the driver anyway.
 */
#include "executor/cuda/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_check.h"

/* The driver functions a green context needs, at the ABI of the headers
 * this file is compiled with (CUDA_VERSION). */
typedef struct green_api {
    CUresult (*device_get)(CUdevice *device, int ordinal);
    CUresult (*get_resource)(CUdevice device, CUdevResource *resource,
                             CUdevResourceType type);
    CUresult (*split_by_count)(CUdevResource *result, unsigned int *groups,
                               const CUdevResource *input,
                               CUdevResource *remaining,
                               unsigned int flags, unsigned int min_count);
    CUresult (*generate_desc)(CUdevResourceDesc *desc,
                              CUdevResource *resources, unsigned int count);
    CUresult (*create)(CUgreenCtx *context, CUdevResourceDesc desc,
                       CUdevice device, unsigned int flags);
    CUresult (*destroy)(CUgreenCtx context);
    CUresult (*stream_create)(CUstream *stream, CUgreenCtx context,
                              unsigned int flags, int priority);
    CUresult (*error_string)(CUresult status, const char **text);
} green_api;

/* The state of this thread's rank device. */
typedef struct rank_device {
    bool open;
    int device;
    int sm_limit;               /* asked for; 0: every SM */
    int sm_count;               /* SMs the green context got (the limit
                                   rounded up to the device's granularity);
                                   0 without one */
    CUgreenCtx green;           /* NULL: the device's primary context */
    green_api api;              /* set when green is */
    double memory_limit_bytes;  /* 0: no cap */
    double memory_held_bytes;   /* reserved through this thread */
    bool shares_device;         /* a slice beside other ranks' slices */
} rank_device;

static _Thread_local rank_device current;

/* ------------------------------------------------------ green contexts */

static int load_green_api(green_api *api, int device, pt_error *err)
{
    struct {
        const char *name;
        void **slot;
    } symbols[] = {
        {"cuDeviceGet", (void **)&api->device_get},
        {"cuDeviceGetDevResource", (void **)&api->get_resource},
        {"cuDevSmResourceSplitByCount", (void **)&api->split_by_count},
        {"cuDevResourceGenerateDesc", (void **)&api->generate_desc},
        {"cuGreenCtxCreate", (void **)&api->create},
        {"cuGreenCtxDestroy", (void **)&api->destroy},
        {"cuGreenCtxStreamCreate", (void **)&api->stream_create},
        {"cuGetErrorString", (void **)&api->error_string},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        enum cudaDriverEntryPointQueryResult found =
            cudaDriverEntryPointSymbolNotFound;
        cudaError_t status = cudaGetDriverEntryPointByVersion(
            symbols[i].name, symbols[i].slot, CUDA_VERSION,
            cudaEnableDefault, &found);
        if (status != cudaSuccess ||
            found != cudaDriverEntryPointSuccess || *symbols[i].slot == NULL) {
            cudaGetLastError();
            return pt_fail(err, "cuda device %d: sm_limit needs CUDA green "
                                "contexts, but the driver does not provide "
                                "%s for CUDA %d.%d",
                           device, symbols[i].name, CUDA_VERSION / 1000,
                           CUDA_VERSION % 1000 / 10);
        }
    }
    return 0;
}

static int driver_failed(const green_api *api, CUresult status,
                         const char *call, int device, pt_error *err)
{
    const char *text = NULL;
    if (api->error_string == NULL ||
        api->error_string(status, &text) != CUDA_SUCCESS || text == NULL)
        text = "unknown error";
    return pt_fail(err, "cuda device %d: %s failed: %s (error %d)", device,
                   call, text, (int)status);
}

#define DRIVER_TRY(call, name)                                               \
    do {                                                                     \
        CUresult driver_status_ = (call);                                    \
        if (driver_status_ != CUDA_SUCCESS)                                  \
            return driver_failed(api, driver_status_, name, device, err);    \
    } while (0)

/* How many partitions of `granularity` SMs hold sm_limit SMs. */
static unsigned int partitions_for(int sm_limit, unsigned int granularity)
{
    return ((unsigned int)sm_limit + granularity - 1) / granularity;
}

/* Slice `index` of a split of the device into groups of at least
 * min_count SMs (flags: the driver's split flags), taking `wanted`
 * consecutive groups joined into one descriptor (groups of one split may
 * be joined). Returns 1 when the split has too few groups (nothing
 * made; *groups_out says how many it has), 0 when *out was made, -1 on a
 * driver error. */
static int take_split_groups(green_api *api, int device, CUdevice handle,
                             const CUdevResource *all, unsigned int flags,
                             unsigned int min_count, unsigned int first,
                             unsigned int wanted, CUgreenCtx *out,
                             int *sm_count, unsigned int *groups_out,
                             pt_error *err)
{
    unsigned int groups = 0;
    DRIVER_TRY(api->split_by_count(NULL, &groups, all, NULL, flags,
                                   min_count),
               "cuDevSmResourceSplitByCount");
    *groups_out = groups;
    if (first + wanted > groups)
        return 1;
    CUdevResource *parts = calloc(groups, sizeof *parts);
    if (parts == NULL)
        return pt_fail(err, "cuda device %d: out of memory", device);
    CUresult status = api->split_by_count(parts, &groups, all, NULL, flags,
                                          min_count);
    CUdevResourceDesc desc;
    int sms = 0;
    if (status == CUDA_SUCCESS && first + wanted > groups)
        status = CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    if (status == CUDA_SUCCESS) {
        for (unsigned int i = 0; i < wanted; i++)
            sms += (int)parts[first + i].sm.smCount;
        status = api->generate_desc(&desc, parts + first, wanted);
    }
    free(parts);
    if (status != CUDA_SUCCESS)
        return driver_failed(api, status, "splitting the device into "
                                          "slices", device, err);
    DRIVER_TRY(api->create(out, desc, handle, CU_GREEN_CTX_DEFAULT_STREAM),
               "cuGreenCtxCreate");
    *sm_count = sms;
    return 0;
}

/* A green context of sm_slices[index] SMs that does not overlap the
 * slices of the other ranks on the device (sm_slices[0 .. slice_count),
 * the sm_limits of every sliced rank on it, this one included, in rank
 * order). Every rank makes the same split (the
 * driver's split is deterministic, and a split's outputs cannot be split
 * again) and takes its own groups of it, tried in this order:
 *   1. equal slices (every rank on the device has this sm_limit): a
 *      split into groups of sm_limit SMs, group `index` (the driver keeps its
 *      groups symmetrical and whole-cluster: on a 132-SM H100 or H200,
 *      two of 64 where partitions of 8 give only 15 x 8);
 *   2. a split into partitions of the device's granularity (8 SMs on
 *      Hopper), each rank taking the next ceil(limit / granularity);
 *   3. the same split ignoring SM co-scheduling (the driver's own flag:
 *      finer groups, at the cost of large thread-block clusters).
 * The first that fits is used; none fitting is an error naming each. */
static int make_sliced_context(green_api *api, int device, CUdevice handle,
                               const CUdevResource *all, const int *sm_slices,
                               int slice_count, int index, CUgreenCtx *out,
                               int *sm_count, pt_error *err)
{
    int sm_limit = sm_slices[index];
    unsigned int granularity = all->sm.minSmPartitionSize;
    if (all->sm.smCoscheduledAlignment > granularity)
        granularity = all->sm.smCoscheduledAlignment;
    if (granularity == 0)
        granularity = 1;
    unsigned int wanted = partitions_for(sm_limit, granularity);
    bool equal = true;
    unsigned int first = 0;
    for (int i = 0; i < slice_count; i++) {
        equal = equal && sm_slices[i] == sm_limit;
        if (i < index)
            first += partitions_for(sm_slices[i], granularity);
    }
    unsigned int equal_groups = 0, fine_groups = 0, loose_groups = 0;
    int made = 1;
    if (equal)
        made = take_split_groups(api, device, handle, all, 0,
                                 wanted * granularity,
                                 (unsigned int)index, 1, out,
                                 sm_count, &equal_groups, err);
    if (made == 1)
        made = take_split_groups(api, device, handle, all, 0, granularity,
                                 first, wanted, out, sm_count,
                                 &fine_groups, err);
    if (made == 1)
        made = take_split_groups(
            api, device, handle, all,
            CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, granularity,
            first, wanted, out, sm_count, &loose_groups, err);
    if (made != 1)
        return made;
    return pt_fail(err, "cuda device %d: slice %d of %d SMs after %d "
                        "others on the device does not fit: the "
                        "device's %u SMs split into %u groups of %u SMs "
                        "(equal slices), %u partitions of %u (this rank "
                        "needs partitions %u-%u), %u ignoring co-scheduling",
                   device, index, sm_limit, index, all->sm.smCount,
                   equal_groups, wanted * granularity, fine_groups,
                   granularity, first, first + wanted - 1, loose_groups);
}

/* A green context of sm_limit SMs of the device (rounded up by the
 * driver to its partition granularity: 8 SMs on Hopper); *sm_count gets
 * the real count. sliced: the rank shares the device with other ranks
 * that have an sm_limit (make_sliced_context). */
static int make_green_context(green_api *api, int device, bool sliced,
                              const int *sm_slices, int slice_count,
                              int index, int sm_limit, CUgreenCtx *out,
                              int *sm_count, pt_error *err)
{
    if (load_green_api(api, device, err) != 0)
        return -1;
    CUdevice handle;
    CUdevResource all, part, rest;
    CUdevResourceDesc desc;
    unsigned int groups = 1;
    DRIVER_TRY(api->device_get(&handle, device), "cuDeviceGet");
    DRIVER_TRY(api->get_resource(handle, &all, CU_DEV_RESOURCE_TYPE_SM),
               "cuDeviceGetDevResource");
    if ((unsigned int)sm_limit > all.sm.smCount)
        return pt_fail(err, "cuda device %d: sm_limit %d, but the device "
                            "has %u SMs",
                       device, sm_limit, all.sm.smCount);
    if (sliced)
        return make_sliced_context(api, device, handle, &all, sm_slices,
                                   slice_count, index, out, sm_count, err);
    if ((unsigned int)sm_limit == all.sm.smCount) {
        *out = NULL; /* every SM: the primary context will do */
        *sm_count = (int)all.sm.smCount;
        return 0;
    }
    DRIVER_TRY(api->split_by_count(&part, &groups, &all, &rest, 0,
                                   (unsigned int)sm_limit),
               "cuDevSmResourceSplitByCount");
    if (groups < 1)
        return pt_fail(err, "cuda device %d: cannot split off %d of its %u "
                            "SMs (the smallest part is %u)",
                       device, sm_limit, all.sm.smCount,
                       all.sm.minSmPartitionSize);
    DRIVER_TRY(api->generate_desc(&desc, &part, 1),
               "cuDevResourceGenerateDesc");
    DRIVER_TRY(api->create(out, desc, handle, CU_GREEN_CTX_DEFAULT_STREAM),
               "cuGreenCtxCreate");
    *sm_count = (int)part.sm.smCount;
    return 0;
}

/* ------------------------------------------------------------ the rank */

static int rank_device_open(int device, bool sliced, const int *sm_slices,
                            int slice_count, int index, int sm_limit,
                            double memory_limit_bytes, pt_error *err);

int cuda_rank_device_open(int device, int sm_limit, double memory_limit_bytes,
                          pt_error *err)
{
    return rank_device_open(device, false, NULL, 0, 0, sm_limit,
                            memory_limit_bytes, err);
}

int cuda_rank_device_open_slice(int device, const int *sm_slices,
                                int slice_count, int index,
                                double memory_limit_bytes, pt_error *err)
{
    if (sm_slices == NULL || index < 0 || index >= slice_count)
        return pt_fail(err, "cuda device %d: slice %d of %d sliced ranks",
                       device, index, slice_count);
    return rank_device_open(device, true, sm_slices, slice_count, index,
                            sm_slices[index], memory_limit_bytes, err);
}

static int rank_device_open(int device, bool sliced, const int *sm_slices,
                            int slice_count, int index, int sm_limit,
                            double memory_limit_bytes, pt_error *err)
{
    int count = cuda_device_count();
    if (device < 0 || device >= count)
        return pt_fail(err, "cuda device %d does not exist (%d visible)",
                       device, count);
    if (sm_limit < 0 || memory_limit_bytes < 0 || (sliced && sm_limit == 0))
        return pt_fail(err, "cuda device %d: sm_limit %d (needed for a "
                            "slice beside %d others) and memory_limit_gib %g "
                            "must not be negative",
                       device, sm_limit, slice_count - 1,
                       memory_limit_bytes / PT_GIB);
    cuda_rank_device_close();
    CUDA_TRY(cudaSetDevice(device));
    /* the primary context first: the green context retains it, and
     * making it here keeps that cost out of cuGreenCtxCreate */
    CUDA_TRY(cudaFree(NULL));
    rank_device opened = {.open = true,
                          .device = device,
                          .sm_limit = sm_limit,
                          .memory_limit_bytes = memory_limit_bytes,
                          .shares_device = sliced && slice_count > 1};
    if (sm_limit > 0 &&
        make_green_context(&opened.api, device, sliced, sm_slices,
                           slice_count, index, sm_limit, &opened.green,
                           &opened.sm_count, err) != 0)
        return -1;
    current = opened;
    return 0;
}

void cuda_rank_device_close(void)
{
    if (current.green != NULL)
        current.api.destroy(current.green);
    current = (rank_device){0};
}

int cuda_rank_stream_create(cudaStream_t *out, pt_error *err)
{
    if (current.green == NULL) {
        CUDA_TRY(cudaStreamCreateWithFlags(out, cudaStreamNonBlocking));
        return 0;
    }
    const green_api *api = &current.api;
    int device = current.device;
    DRIVER_TRY(api->stream_create(out, current.green, CU_STREAM_NON_BLOCKING,
                                  0),
               "cuGreenCtxStreamCreate");
    return 0;
}

int cuda_rank_memory_reserve(size_t bytes, const char *what, pt_error *err)
{
    double after = current.memory_held_bytes + (double)bytes;
    if (current.memory_limit_bytes > 0 && after > current.memory_limit_bytes)
        return pt_fail(err, "cuda device %d: %s needs %.2f GiB more, but the "
                            "rank already holds %.2f GiB of the %.2f GiB its "
                            "cluster entry allows (memory_limit_gib of the "
                            "device)",
                       current.device, what, (double)bytes / PT_GIB,
                       current.memory_held_bytes / PT_GIB,
                       current.memory_limit_bytes / PT_GIB);
    current.memory_held_bytes = after;
    return 0;
}

void cuda_rank_memory_release(size_t bytes)
{
    current.memory_held_bytes -= (double)bytes;
    if (current.memory_held_bytes < 0)
        current.memory_held_bytes = 0;
}

bool cuda_rank_shares_device(void)
{
    return current.shares_device;
}

int cuda_rank_sm_count(void)
{
    if (current.sm_count > 0)
        return current.sm_count;
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                               device) != cudaSuccess)
        return 0;
    return sms;
}

/* ------------------------------------------------------------ devices */

int cuda_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return count;
}

int cuda_device_describe(cuda_device_info *out)
{
    memset(out, 0, sizeof *out);
    int device = 0;
    struct cudaDeviceProp properties;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaGetDeviceProperties(&properties, device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    snprintf(out->name, sizeof out->name, "%s", properties.name);
    out->multiprocessors = properties.multiProcessorCount;
    out->memory_bytes = (double)properties.totalGlobalMem;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    snprintf(out->driver_cuda_version, sizeof out->driver_cuda_version,
             "%d.%d", driver / 1000, driver % 1000 / 10);
    snprintf(out->runtime_cuda_version, sizeof out->runtime_cuda_version,
             "%d.%d", runtime / 1000, runtime % 1000 / 10);
    return 0;
}
