/*
 * The cuda backend of the executor: a model stage on one NVIDIA GPU
 * (Hopper, sm_90), bf16 matrix products on cuBLASLt with fp32 master
 * weights, fp32 gradients and fp32 AdamW state. Private to the executor:
 * backend_find hands it out for BACKEND_CUDA; the GPU tests and the
 * benchmark use the helpers below. docs/cuda-backend.md describes it.
 *
 * Semantics are those of stage_backend (executor/stage/stage.h), with these
 * specifics:
 *   - the four float buffers of model_stage (params, grads, adam_m,
 *     adam_v) and the activation pointers (stage_input_buffer,
 *     stage_output, stage_input_grad, stage_io.input / output_grad) are
 *     device memory of the GPU that was current when the stage was made;
 *   - every call returns with its work finished (the stage's stream is
 *     synchronised), so its outputs can go to NCCL on any stream;
 *   - the model needs hidden and ffn_hidden divisible by 8 x tp (16-byte
 *     rows of bf16 in every tensor-parallel shard); head sizes 64 and 128
 *     run on the fast attention kernels, others on a slow fallback;
 *   - tensor parallelism (spec.tp > 1): the stage holds its shard and
 *     reduces partial results over its group inside forward and backward,
 *     on DEVICE pointers. With a comm that has stream-ordered collectives
 *     (comm_has_stream_ops: NCCL, the device exchange) every sum is
 *     enqueued on the stage's stream (the layers' four in bf16, the
 *     embedding's and the loss's in fp32) and the stream's waits go
 *     through comm_wait_stream; otherwise (the host-staged comm) by
 *     stage_tp_all_reduce_sum / _max in fp32, the backend synchronising
 *     its stream before each call and the comm returning with the result
 *     in place. Every member of the group makes the same reductions in
 *     the same order. A compute-only stage (tp_compute_only) skips them;
 *   - memory: every cudaMalloc of a stage is first counted against the
 *     calling thread's cap (cuda_rank_memory_reserve below) and given back
 *     when the stage is released, so a stage must be created and destroyed
 *     on the same thread (the rank's).
 *
 * Environment (read when a stage is allocated):
 *   PARTITA_CUDA_RECOMPUTE  comma list of what the backward recomputes
 *                           instead of keeping: "gelu" (the MLP's GELU
 *                           output), "norm" (the layer-norm outputs),
 *                           "all", "none". Default: gelu. At tp 1 the
 *                           norm's backward writes its output again as
 *                           it goes (one write of the rows); at tp > 1
 *                           a forward pass of its own makes it.
 *   PARTITA_CUDA_FUSE       "0" turns off the cuBLASLt GELU and
 *                           bias-gradient epilogues (separate kernels then
 *                           do that work); for tests and measurements.
 *   PARTITA_CUDA_RESIDUAL_IN_NORM  "0" puts a layer's residual adds back
 *                           in its products' epilogues (beta = 1) where
 *                           they otherwise ride in the norm after them
 *                           (tp 1); for measurements.
 *   PARTITA_CUDA_DETERMINISTIC  "1": as a plan's "deterministic" (cuDNN's
 *                           deterministic attention backward, the same
 *                           bits on every run) whatever the plan says;
 *                           for tests that compare bits between runs.
 *                           Otherwise cuDNN 9.6 and later sum dQ in an
 *                           fp32 accumulator with atomics (cudnn-
 *                           frontend's, Megatron-LM's default).
 *   PARTITA_CUDA_ATTENTION  "auto" (default): cuDNN's fused attention
 *                           where the build has cuDNN and it plans the
 *                           shape, else the own kernels; "own" or
 *                           "cudnn" force one (cudnn fails when cuDNN
 *                           cannot run the shape).
 *   PARTITA_CUDA_HEAD_ROWS  rows of logits the fused head computes at a
 *                           time (buffers.h, buffer_layout.head_rows);
 *                           default: every row under bf16 gradients,
 *                           else chunks of at most 256 MiB. For tests
 *                           and measurements (the cost model prices the
 *                           default).
 *   PARTITA_CUDA_GRAPHS     "0" turns off the CUDA graphs that replay a
 *                           one-stage step's forward and backward
 *                           (cuda_stage.h, cuda_pass_graphs); default on.
 *                           For tests and measurements.
 *   PARTITA_CUDA_UNIT_HOLDS "0": ZeRO-3 gathers every unit of every pass
 *                           again, even one its buffer still holds since
 *                           the parameters last changed (unit_holds.h);
 *                           default: it does not. Must give the same
 *                           bits; for tests and measurements (the cost
 *                           model prices the default).
 */
#ifndef PARTITA_EXECUTOR_CUDA_BACKEND_H
#define PARTITA_EXECUTOR_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "executor/stage/stage.h"

const stage_backend *cuda_stage_backend(void);

/* model_stage_create with BACKEND_CUDA (kept for the GPU tests and the
 * benchmark). Release with model_stage_destroy. Inline: the backend's
 * files call nothing that hands the backend out (no circle through
 * backend_find). */
static inline int cuda_model_stage_create(model_stage *out,
                                          const model_shape *shape,
                                          const stage_spec *spec,
                                          int mbs_capacity, int slot_count,
                                          pt_error *err)
{
    return model_stage_create(out, shape, spec, BACKEND_CUDA, mbs_capacity,
                              slot_count, err);
}

/* One line on the attention the stage runs: cuDNN's fused attention
 * (version, engines, workspace) or the own kernels and why. */
const char *cuda_stage_attention(const model_stage *stage);

/* Device bytes the stage holds: parameters, gradients, AdamW state, the
 * bf16 weight mirror, activations of every slot, backward scratch, the
 * cuBLASLt workspace and cuDNN's attention workspace. */
size_t cuda_stage_device_bytes(const model_stage *stage);
/* How many passes of the stage ran as replays of a CUDA graph
 * (PARTITA_CUDA_GRAPHS): 0 where none could, e.g. off the one-stage step
 * kept on the device. */
long cuda_stage_graph_replays(const model_stage *stage);
/* How many units ZeRO-3 all-gathered on the stage since it was made (0
 * without params_by_unit): what unit_holds.h's rule asked for, units
 * still held from an earlier pass not counted (PARTITA_CUDA_UNIT_HOLDS=0:
 * every unit of every pass). */
long cuda_stage_param_gathers(const model_stage *stage);

/* The same by memory term (common.h), with the allocator's rounding:
 * what executor/cuda/buffers.c's plan says for the stage's shape. The
 * comm and the context are not the stage's (0 here). */
void cuda_stage_memory_terms(const model_stage *stage, pt_memory_terms *out);

/* The stream a cuda stage runs on (for NCCL work ordered with it). */
cudaStream_t cuda_stage_stream(const model_stage *stage);

/* Called by a cuda stage's backward, on the calling thread, each time the
 * gradients from float `ready_from` of the buffers to their end have all
 * been enqueued on the stage's stream: after the head, after each layer
 * (going down), after the embedding. The data-parallel reduction's
 * overlap (executor/parallel/grad_overlap.c) arms it for the last
 * micro-batch's backward, when those gradients are final. */
typedef void (*cuda_grad_hook)(void *data, size_t ready_from);
/* hook NULL: none (the default). */
void cuda_stage_set_grad_hook(model_stage *stage, cuda_grad_hook hook,
                              void *data);

/* Number of CUDA devices this process sees; 0 when there is no GPU or no
 * usable driver (never fails). executor/cuda/device.c, as the rest of
 * this header from here on. */
int cuda_device_count(void);

/* The current device, for run.json. */
typedef struct cuda_device_info {
    char name[256];   /* as cudaDeviceProp.name */
    int multiprocessors;
    double memory_bytes;
    char driver_cuda_version[16];   /* highest CUDA the driver supports */
    char runtime_cuda_version[16];  /* the CUDA runtime linked in */
} cuda_device_info;

/* Fills out for the current device; -1 when there is none. */
int cuda_device_describe(cuda_device_info *out);

/*
 * The device a rank's thread works on (executor/cuda/device.c): which GPU,
 * optionally only sm_limit of its SMs (a CUDA green context: the
 * stand-in for a slower GPU type) and at most memory_limit_bytes of its
 * memory (0: no cap). Thread-local: each rank's thread opens its own
 * before it creates its stage; a thread that opened none works on the
 * current device with every SM and no cap.
 */
int cuda_rank_device_open(int device, int sm_limit, double memory_limit_bytes,
                          pt_error *err);
/* The same for a rank that shares its GPU with other ranks that have an
 * sm_limit: sm_slices[0 .. slice_count) are the sm_limits (each > 0) of
 * every such rank on the device in rank order, this one at `index`.
 * Every rank splits the device the same way and takes its own part, so
 * the slices do not overlap: equal slices take one group each of a split
 * into groups of that size, others consecutive partitions of the
 * device's granularity (8 SMs on Hopper); docs/cuda-backend.md. */
int cuda_rank_device_open_slice(int device, const int *sm_slices,
                                int slice_count, int index,
                                double memory_limit_bytes, pt_error *err);
void cuda_rank_device_close(void);
/* A non-blocking stream on the thread's device, inside its green context
 * when it has one (cuBLAS and kernels launched on it then use only those
 * SMs). The cuda backend makes its stage stream here. */
int cuda_rank_stream_create(cudaStream_t *out, pt_error *err);
/* Counts `bytes` against the thread's memory cap before an allocation;
 * fails, naming the cap and what is already held, when they would pass
 * it. cuda_rank_memory_release gives bytes back. */
int cuda_rank_memory_reserve(size_t bytes, const char *what, pt_error *err);
void cuda_rank_memory_release(size_t bytes);
/* SMs the thread's kernels may use: the green context's, or the device's. */
int cuda_rank_sm_count(void);
/* Whether the thread's rank opened a slice of a GPU beside other ranks'
 * slices (cuda_rank_device_open_slice with more than one). */
bool cuda_rank_shares_device(void);

/* ------------------------------------------- the device exchange's kernels */

/* What executor/comm's device exchange runs on the GPU (exchange.cu): C
 * linkage, as the .cu file defines them. */
#ifdef __cplusplus
extern "C" {
#endif

/* The most members a collective of the device exchange joins (ranks that
 * share one GPU: its 16 partitions of 8 SMs on Hopper at most). */
#define CUDA_EXCHANGE_MAX_MEMBERS 16

/*
 * One step of a collective of the device exchange (executor/comm/
 * exchange.c), on the members' buffers of one GPU: for every element k of
 * [first, first + count), the reduction (sum or max) of inputs[0..
 * input_count)[k] in input order, accumulated in fp32 (bf16 inputs are
 * widened, the result rounded once), written to outputs[0..
 * output_count)[k]. One input and many outputs copy; many inputs and
 * every member's buffer as output is a chunk of an all-reduce.
 */
typedef struct cuda_exchange_step {
    const void *inputs[CUDA_EXCHANGE_MAX_MEMBERS];
    void *outputs[CUDA_EXCHANGE_MAX_MEMBERS];
    int input_count;
    int output_count;
    size_t first;
    size_t count;
    bool bf16;                   /* elements are bf16, else fp32 */
    bool max;                    /* maximum, else sum */
} cuda_exchange_step;

cudaError_t cuda_exchange_reduce(const cuda_exchange_step *step,
                                 cudaStream_t stream);
/* Pacing of an emulated link: cuda_exchange_stamp writes the GPU's
 * nanosecond clock (%globaltimer) into *stamp; cuda_exchange_pace, later
 * on the same stream, spins (one thread) until stamp + nanoseconds, so
 * the work between them takes at least that long. */
cudaError_t cuda_exchange_stamp(uint64_t *stamp, cudaStream_t stream);
cudaError_t cuda_exchange_pace(const uint64_t *stamp, uint64_t nanoseconds,
                               cudaStream_t stream);
/* The same from the later of two stamps (other_stamp may be another
 * stream's, written before this is enqueued; NULL: stamp alone). */
cudaError_t cuda_exchange_pace_after(const uint64_t *stamp,
                                     const uint64_t *other_stamp,
                                     uint64_t nanoseconds,
                                     cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
