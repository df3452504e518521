/*
 * The device of a rank's thread: which GPU, how many of its SMs (a CUDA
 * green context) and how much of its memory. Thread-local state, so the
 * threads of one process can each drive their own GPU, or a throttled
 * part of one. docs/cuda-backend.md ("Devices of a parallel run").
 */
#include "executor/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <stdio.h>

#include "executor/cuda/cuda_check.h"

/* The state of this thread's rank device. */
typedef struct rank_device {
    bool open;
    int device;
    int sm_limit;               /* 0: every SM */
    double memory_limit_bytes;  /* 0: no cap */
    double memory_held_bytes;   /* reserved through this thread */
} rank_device;

static _Thread_local rank_device current;

int cuda_rank_device_open(int device, int sm_limit, double memory_limit_bytes,
                          pt_error *err)
{
    int count = cuda_device_count();
    if (device < 0 || device >= count)
        return pt_fail(err, "cuda device %d does not exist (%d visible)",
                       device, count);
    CUDA_TRY(cudaSetDevice(device));
    if (sm_limit > 0)
        return pt_fail(err, "cuda device %d: an SM limit of %d needs green "
                            "contexts, which this build does not make yet",
                       device, sm_limit);
    current = (rank_device){.open = true,
                            .device = device,
                            .sm_limit = sm_limit,
                            .memory_limit_bytes = memory_limit_bytes};
    return 0;
}

void cuda_rank_device_close(void)
{
    current = (rank_device){0};
}

int cuda_rank_stream_create(cudaStream_t *out, pt_error *err)
{
    CUDA_TRY(cudaStreamCreateWithFlags(out, cudaStreamNonBlocking));
    return 0;
}

int cuda_rank_memory_reserve(size_t bytes, const char *what, pt_error *err)
{
    double after = current.memory_held_bytes + (double)bytes;
    if (current.memory_limit_bytes > 0 && after > current.memory_limit_bytes)
        return pt_fail(err, "cuda device %d: %s needs %.2f GiB more, the "
                            "rank already holds %.2f GiB of its cap of "
                            "%.2f GiB (memory_limit_gib)",
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

int cuda_rank_sm_count(void)
{
    if (current.sm_limit > 0)
        return current.sm_limit;
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                               device) != cudaSuccess)
        return 0;
    return sms;
}
