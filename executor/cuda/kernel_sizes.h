/*
 * The sizes the cuda backend's kernels fix and its memory plan needs
 * (executor/cuda/buffers.c): scratch per launch, the optimizer's chunks,
 * the cuBLASLt and cuDNN attention workspaces. Plain C and C++ without the CUDA headers, so
 * the kernels (.cu), the backend and the builds without CUDA (the memory
 * plan's tests) read the same figures. The cost model, which does not
 * link the executor, restates them (costmodel/memory.c), and
 * tests/costmodel/test_memory.c holds its formulas to this plan.
 */
#ifndef PARTITA_EXECUTOR_CUDA_KERNEL_SIZES_H
#define PARTITA_EXECUTOR_CUDA_KERNEL_SIZES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows per block of the generic layer-norm backward's weight partials
 * (512 blocks for 16384 rows: full waves). */
#define CUDA_LAYERNORM_BACKWARD_ROWS 32
/* The team backward's rows a block, at least (one a warp of its 8), and
 * its blocks, at most (a wave of any GPU's: an H200 has 132 SMs): their
 * partial rows, which the scratch holds beside the generic kernel's
 * 32-row blocks'. */
#define CUDA_LAYERNORM_ROW_KERNEL_MIN_ROWS 8
#define CUDA_LAYERNORM_ROW_KERNEL_MAX_BLOCKS 256
/* Blocks of the fused layer-norm backward whose partial rows the last of
 * them to finish sums. */
#define CUDA_LAYERNORM_GROUP_BLOCKS 16
/* Floats the fused backward's completion counters are padded to, so the
 * partial rows after them start 256-byte aligned. */
#define CUDA_LAYERNORM_COUNTER_ALIGNMENT 64
/* Rows per chunk of a bias gradient's partial sums. */
#define CUDA_BIAS_GRAD_ROWS 256
/* Blocks of the first pass of a sum of squares. */
#define CUDA_SQUARE_SUM_BLOCKS 1024
/* cuBLAS asks for 32 MiB on Hopper to reach its best kernels. */
#define CUDA_GEMM_WORKSPACE_BYTES (32u * 1024u * 1024u)
/* Elements per param_chunk. */
#define PARAM_CHUNK_ELEMENTS 16384

/* A piece of one tensor for the optimizer's and the mirror's kernels (a
 * table of them on the device): `count` (<= PARAM_CHUNK_ELEMENTS) floats
 * at fp32 offset `offset` of the parameter buffers and at `mirror_offset`
 * of the bf16 weight mirror; `decay` when AdamW decays it. */
typedef struct param_chunk {
    uint64_t offset;
    uint64_t mirror_offset;
    uint64_t moment_offset;      /* in adam_m / adam_v: offset less the
                                    first parameter the optimizer steps */
    uint32_t count;
    uint32_t decay;
} param_chunk;

/* What a one-stage step keeps on the device (optimizer_step.c): the sum of
 * its micro-batches' mean losses (each rounded to float), the sum of
 * squares of the gradients, their square root, the clipping coefficient
 * AdamW reads and whether AdamW skipped the update (the loss sum or the
 * norm not finite). One block in the backward scratch; the host reads it
 * back once a step into pinned memory of the same layout. */
typedef struct cuda_step_values {
    double loss_sum;
    double square_sum;
    double grad_norm;
    float clip_scale;
    int32_t non_finite;
} cuda_step_values;

/* Floats of the layer-norm backward's completion counters (at the start
 * of its scratch, a fixed place whatever N). */
size_t cuda_layernorm_counter_floats(int N);
/* Floats of scratch the layer-norm backward needs for N rows of C:
 * counters, then the blocks' partial rows and the groups' sums. */
size_t cuda_layernorm_backward_scratch(int N, int C);
/* Floats of scratch a bias gradient of N rows and OC columns needs. */
size_t cuda_bias_grad_scratch(int N, int OC);
/* Floats of scratch the attention backward needs (one per row and head). */
size_t cuda_attention_backward_scratch(int B, int T, int NH);
/* Whether attention_runner.c takes cuDNN's fused attention for a
 * sequence of T and C channels in NH heads, in a build with cuDNN (whose
 * runtime is not a version it avoids): head sizes that are multiples of
 * 8 up to 128, T a multiple of 128. */
bool cuda_cudnn_attention_shape(int T, int C, int NH);
/* Bytes of the workspace cuDNN's fused attention backward runs in
 * (attention_cudnn.c): B x NH x T fp32 row sums, then, deterministic,
 * cuDNN's own B x NH x T x T bf16, otherwise dQ's fp32 accumulator, B x
 * NH x T x D floats; with grouped key/value heads (KVH < NH) B x NH x T
 * x D fp32 more; each rounded up to 256 bytes: what cuDNN 9.14's engine
 * asked on an H200 (deterministic, GPT-2's four sizes: the first two
 * terms alone; Llama-3.2-1B, 2 sequences: 544 MiB, Llama-3-8B's layer,
 * 2 sequences: 576 MiB; with the accumulator, GPT-2 350M: nothing of
 * cuDNN's own, Llama-3.2-1B at 4 sequences of 2,048: 64 MiB;
 * docs/cuda-backend.md, "The fused head"). A stage lends it its head's
 * idle logits, else allocates it. */
size_t cuda_cudnn_backward_workspace_bytes(int B, int T, int NH, int KVH,
                                           int D, bool deterministic);
/* The fewest pieces of whole sequences (a divisor of B) cuDNN's backward
 * of B sequences runs in so that one piece's workspace fits in
 * `lendable` bytes; 0 when not even one sequence's fits. Each sequence's
 * gradients do not depend on the others', so the pieces give the same
 * bits as one call. */
int cuda_cudnn_backward_split(int B, int T, int NH, int KVH, int D,
                              bool deterministic, size_t lendable);
/* Doubles of scratch a sum of squares needs. */
size_t cuda_square_sum_scratch(void);

#ifdef __cplusplus
}
#endif

#endif
