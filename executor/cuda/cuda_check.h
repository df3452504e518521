/*
 * Error checks for the host code of the cuda backend: every CUDA runtime
 * and cuBLASLt call goes through one of these, which fill a pt_error
 * naming the call, the file and the line, and return -1 from the calling
 * function (which must have a `pt_error *err` in scope).
 */
#ifndef PARTITA_EXECUTOR_CUDA_CHECK_H
#define PARTITA_EXECUTOR_CUDA_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "common/common.h"

#define CUDA_TRY(call)                                                       \
    do {                                                                     \
        cudaError_t cuda_status_ = (call);                                   \
        if (cuda_status_ != cudaSuccess)                                     \
            return pt_fail(err, "cuda backend: %s failed at %s:%d: %s",      \
                           #call, __FILE__, __LINE__,                        \
                           cudaGetErrorString(cuda_status_));                \
    } while (0)

#define CUBLAS_TRY(call)                                                     \
    do {                                                                     \
        cublasStatus_t cublas_status_ = (call);                              \
        if (cublas_status_ != CUBLAS_STATUS_SUCCESS)                         \
            return pt_fail(err, "cuda backend: %s failed at %s:%d: %s",      \
                           #call, __FILE__, __LINE__,                        \
                           cublasLtGetStatusString(cublas_status_));         \
    } while (0)

#endif
