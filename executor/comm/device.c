/*
 * The send path of the comms of device memory (NCCL, the device
 * exchange; the host-staged comm follows the caller the same way): a
 * send's floats go into a staging buffer of the comm on one of its
 * streams, after whatever the caller left on the default streams, and the
 * buffers are counted against the rank's memory cap. Written once here so
 * that both comms order a send against its caller alike.
 */
#include "executor/comm/device_internal.h"

#include <stdio.h>

int comm_device_reserve(comm_device_bytes *bytes, size_t count,
                        const char *what, pt_error *err)
{
    if (cuda_rank_memory_reserve(count, what, err) != 0)
        return -1;
    bytes->held += (double)count;
    if (bytes->held > bytes->peak)
        bytes->peak = bytes->held;
    return 0;
}

void comm_device_release(comm_device_bytes *bytes, size_t count)
{
    cuda_rank_memory_release(count);
    bytes->held -= (double)count;
}

void comm_cuda_describe(char *what, size_t size, const char *call,
                        cudaError_t status)
{
    snprintf(what, size, "%s failed: %s", call, cudaGetErrorString(status));
    cudaGetLastError();
}

cudaError_t comm_follow_caller(cudaStream_t stream, cudaEvent_t scratch)
{
    /* cudaStreamWaitEvent takes the event as recorded at the call, so one
     * event serves both default streams in turn */
    cudaStream_t defaults[] = {cudaStreamLegacy, cudaStreamPerThread};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
        cudaError_t status = cudaEventRecord(scratch, defaults[i]);
        if (status == cudaSuccess)
            status = cudaStreamWaitEvent(stream, scratch, 0);
        if (status != cudaSuccess)
            return status;
    }
    return cudaSuccess;
}

/* Gives b room for `count` floats on `stream`. */
static int grow(comm_staging *b, size_t count, cudaStream_t stream,
                comm_device_bytes *bytes, comm_cuda_failure *failed,
                pt_error *err)
{
    if (b->data != NULL) {
        cudaError_t status = b->stream_ordered
                                 ? cudaFreeAsync(b->data, stream)
                                 : cudaFree(b->data);
        if (status != cudaSuccess) {
            *failed = (comm_cuda_failure){"freeing a staging buffer", status};
            return -1;
        }
        comm_device_release(bytes, b->capacity * sizeof(float));
        b->data = NULL;
        b->capacity = 0;
    }
    size_t size = count * sizeof(float);
    if (comm_device_reserve(bytes, size, "a send's staging buffer", err) != 0)
        return -1;
    /* a device or stream without stream-ordered allocation: plain
     * cudaMalloc, which does not wait for the device either (only
     * freeing does, and buffers are freed when the rank closes) */
    b->stream_ordered =
        cudaMallocAsync((void **)&b->data, size, stream) == cudaSuccess;
    if (!b->stream_ordered) {
        cudaGetLastError();
        cudaError_t status = cudaMalloc((void **)&b->data, size);
        if (status != cudaSuccess) {
            comm_device_release(bytes, size);
            b->data = NULL;
            *failed = (comm_cuda_failure){"cudaMalloc of a staging buffer",
                                          status};
            return -1;
        }
    }
    b->capacity = count;
    return 0;
}

int comm_staging_copy_in(comm_staging *b, const float *data, size_t count,
                         cudaStream_t stream, cudaEvent_t scratch,
                         comm_device_bytes *bytes, comm_cuda_failure *failed,
                         pt_error *err)
{
    *failed = (comm_cuda_failure){NULL, cudaSuccess};
    cudaError_t status = comm_follow_caller(stream, scratch);
    if (status != cudaSuccess) {
        *failed = (comm_cuda_failure){"waiting for the caller's default "
                                      "stream",
                                      status};
        return -1;
    }
    if (b->capacity < count && grow(b, count, stream, bytes, failed, err) != 0)
        return -1;
    status = cudaMemcpyAsync(b->data, data, count * sizeof(float),
                             cudaMemcpyDeviceToDevice, stream);
    if (status != cudaSuccess) {
        *failed = (comm_cuda_failure){"cudaMemcpyAsync into a staging buffer",
                                      status};
        return -1;
    }
    return 0;
}

void comm_staging_free(comm_staging *b, comm_device_bytes *bytes)
{
    if (b->data != NULL) {
        cudaFree(b->data);
        comm_device_release(bytes, b->capacity * sizeof(float));
    }
    *b = (comm_staging){0};
}
