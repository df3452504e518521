/*
 * Private to the cuda backend: the pieces of a stage's passes
 * (pass_parts.c) that passes.c (the stage, the embedding, the head and
 * GPT-2's layer) and passes_llama.c (the Llama family's layer) share:
 * the linear layers' products with their tensor-parallel sums, the norms
 * with their sequence-parallel gathers, and where a parameter or its
 * gradient is read or written.
 */
#ifndef PARTITA_EXECUTOR_CUDA_PASS_PARTS_H
#define PARTITA_EXECUTOR_CUDA_PASS_PARTS_H

#include "executor/cuda/cuda_stage.h"

/* out (N x OC, row-major) = in (N x IC) W^T [+ bias] [+ residual]. */
typedef struct linear_forward {
    const pt_bf16 *weight;          /* OC x IC, bf16 mirror */
    const pt_bf16 *input;           /* N x IC */
    void *out;                      /* N x OC */
    bool out_fp32;
    const void *bias;               /* of out's type */
    const void *residual;           /* of out's type; NULL: none */
    int N, IC, OC;
    int ld_out;
} linear_forward;

/* Where the shard's rows start in an N x C buffer of every row (0
 * without sequence parallelism). */
static inline size_t shard_offset(const stage_dims *d)
{
    return (size_t)d->row0 * (size_t)d->C;
}

/* The product of a linear layer's forward; its input gradient
 * d_in (N x IC, bf16) = alpha d_out (N x OC) W; its weight gradient
 * d_W (OC x IC, the weight at `offset`) += alpha d_out^T in
 * (accumulated: beta = 1; written, beta = 0, in a step's first backward
 * that cuda_grad_written allows). */
gemm_call pass_forward_call(const linear_forward *f);
gemm_call pass_input_grad_call(pt_bf16 *d_in, const pt_bf16 *d_out,
                               int ld_d_out, const pt_bf16 *weight, int N,
                               int IC, int OC, float alpha);
gemm_call pass_weight_grad_call(const model_stage *stage, size_t offset,
                                const pt_bf16 *input, const pt_bf16 *d_out,
                                int ld_d_out, int N, int IC, int OC,
                                float alpha);
/* A weight gradient's product, and its bias's gradient (column sums of
 * call->b) where bias_offset is not CUDA_NO_TENSOR (a bias the model
 * lacks, or one whose gradient comes elsewhere). */
int pass_weight_grad(model_stage *stage, const gemm_call *call,
                     size_t bias_offset, const stage_dims *d, pt_error *err);
/* The weight gradient's product, then the bias gradient (column sums of
 * call->b). */
int pass_weight_and_bias_grad(cuda_stage_state *state, const gemm_call *call,
                              cuda_grad d_bias, const stage_dims *d,
                              pt_error *err);

/* Where parameter `offset` is read (fp32, and its bf16 copy) and where
 * its gradient goes; CUDA_NO_TENSOR (a tensor the model lacks): NULL. */
cuda_grad pass_grad_at(const model_stage *stage, size_t offset);
const float *pass_param_at(const model_stage *stage, size_t offset);
pt_bf16 *pass_mirror_at(const cuda_stage_state *state, size_t offset);

/* A row-parallel product into the bf16 stream: out = in W^T + bias +
 * residual, summed over the tp group (reduce-scattered under sequence
 * parallelism); `bias` the fp32 master of f.bias (both may be NULL). */
int pass_row_parallel_forward(model_stage *stage, linear_forward f,
                              const float *bias, const stage_dims *d,
                              pt_error *err);
/* The input gradient of a column-parallel product (call writes d_in, N x
 * C bf16), summed over the tp group (reduce-scattered under sequence
 * parallelism). */
int pass_column_parallel_input_grad(model_stage *stage, gemm_call call,
                                    const stage_dims *d, pt_error *err);

/* The model's norm over R rows: LayerNorm (mean, rstd and bias), or
 * RMSNorm (rstd only, its epsilon the model's), of inp, or where skip is
 * not NULL of sum = inp + skip (written to sum first, which may be inp:
 * cuda_norm_forward_after_add). */
cudaError_t pass_norm_rows_forward(const model_stage *stage, pt_bf16 *out,
                                   float *mean, float *rstd,
                                   const pt_bf16 *inp, const pt_bf16 *skip,
                                   pt_bf16 *sum, const float *weight,
                                   const float *bias, int R, int C,
                                   cudaStream_t stream);
/* The model's norm (LayerNorm, or RMSNorm: no mean, no bias) of the
 * shard's rows into `kept` (NULL: recomputed later), the column-parallel
 * product's input (every row) in *whole; again for a backward (kept, or
 * recomputed). */
int pass_norm_forward(model_stage *stage, pt_bf16 *kept, float *mean,
                      float *rstd, const pt_bf16 *inp, const float *weight,
                      const float *bias, const stage_dims *d,
                      const pt_bf16 **whole, pt_error *err);
/* pass_norm_forward of a residual sum: *sum += skip first (in place,
 * rounded once into the bf16 stream), in the norm's own pass. */
int pass_norm_forward_after_add(model_stage *stage, pt_bf16 *kept,
                                float *mean, float *rstd, pt_bf16 *sum,
                                const pt_bf16 *skip, const float *weight,
                                const float *bias, const stage_dims *d,
                                const pt_bf16 **whole, pt_error *err);
/* Whether a row-parallel product leaves its residual add to the norm
 * that reads its output (pass_norm_forward_after_add): unsplit (tp 1),
 * where cuBLASLt's epilogue with beta = 1 costs more than the norm's
 * extra read (docs/cuda-backend.md), unless
 * PARTITA_CUDA_RESIDUAL_IN_NORM=0; split, the add rides on the sum's
 * pass already. */
bool pass_skip_to_norm(const model_stage *stage, const stage_dims *d);
/* Whether a layer's second add is left to the next layer's first norm
 * (or the final norm, or one pass after the stage's last layer): as
 * pass_skip_to_norm, but not where whole layers are recomputed (the
 * recomputation writes the layer's output again, which must be whole). */
bool pass_skip_past_layer(const model_stage *stage, const stage_dims *d);
/* After a layer's last product: output += mid where pass_skip_to_norm
 * left the add out of the product but pass_skip_past_layer does not
 * defer it (one pass, rounded as the norms round it, so every mode's
 * stream holds the same values). */
int pass_layer_output_whole(model_stage *stage, pt_bf16 *output,
                            const pt_bf16 *mid, const stage_dims *d,
                            pt_error *err);
int pass_norm_output_again(model_stage *stage, const pt_bf16 *kept,
                           const pt_bf16 *inp, const float *weight,
                           const float *bias, const stage_dims *d,
                           const pt_bf16 **whole, pt_error *err);
/* The norm's backward from scratch.d_norm into scratch.d_stream_bf16 in
 * place (plus the stream gradient there with add_residual); its weight
 * (and bias) gradient where pass_norm_grad says: the gradients, or under
 * sequence parallelism run `run` of scratch.norm_grads, summed over the
 * group by pass_add_norm_grads (targets of NULL data: none). */
int pass_norm_backward(model_stage *stage, bool add_residual,
                       cuda_grad d_weight, cuda_grad d_bias,
                       const pt_bf16 *inp, const float *weight,
                       const float *mean, const float *rstd,
                       const stage_dims *d, pt_error *err);
/* A norm and the column-parallel product it feeds (qkv, fc), backwards:
 * what pass_norm_product_backward reads. */
typedef struct norm_product {
    const pt_bf16 *kept; /* the norm's output kept by the forward, or NULL */
    const pt_bf16 *inp;  /* the norm's input (the shard's rows) */
    size_t norm_weight, norm_bias; /* offsets (CUDA_NO_TENSOR: none) */
    const float *mean, *rstd;      /* the forward's statistics */
    int run;                       /* pass_norm_grad's run of the weight
                                      (the bias's: run + 1) */
    size_t weight, bias;           /* the product's (bias CUDA_NO_TENSOR:
                                      none, or added elsewhere) */
    const pt_bf16 *d_product;      /* the product's output gradient */
    int width;                     /* its columns */
} norm_product;
/* The product's weight (and bias) gradient from the norm's output, its
 * input gradient into scratch.d_norm (summed over the group), then the
 * norm's backward into scratch.d_stream_bf16 with the stream gradient
 * there added. Where the forward kept no output and every row is the
 * rank's (tp 1), the norm's backward comes before the weight gradient
 * and writes the output again into scratch.norm_out as it goes
 * (cuda_norm_backward_and_output); else the output is the kept one or
 * one made again first (pass_norm_output_again). */
int pass_norm_product_backward(model_stage *stage, const norm_product *p,
                               const stage_dims *d, pt_error *err);
/* The same from the gradient of the norm's output at d_out (the shard's
 * rows) instead of scratch.d_norm. */
int pass_norm_backward_from(model_stage *stage, bool add_residual,
                            cuda_grad d_weight, cuda_grad d_bias,
                            const pt_bf16 *d_out, const pt_bf16 *inp,
                            const float *weight, const float *mean,
                            const float *rstd, const stage_dims *d,
                            pt_error *err);
cuda_grad pass_norm_grad(model_stage *stage, const stage_dims *d, int run,
                         size_t offset);
int pass_add_norm_grads(model_stage *stage, const cuda_grad *targets,
                        int count, const stage_dims *d, pt_error *err);

#endif
