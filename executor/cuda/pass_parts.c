/*
 * The pieces of a cuda stage's passes that passes.c (the stage, the
 * embedding, the head, GPT-2's layer) and passes_llama.c (the Llama
 * family's layer) share (pass_parts.h): the linear layers' products with
 * their tensor-parallel sums, the norms with their sequence-parallel
 * gathers, and where a parameter or its gradient is read or written.
 */
#include "executor/cuda/pass_parts.h"

#include "executor/cuda/cuda_check.h"

gemm_call pass_forward_call(const linear_forward *f)
{
    gemm_call call = {
        .transpose_a = true,
        .transpose_b = false,
        .m = f->OC,
        .n = f->N,
        .k = f->IC,
        .a = f->weight,
        .lda = f->IC,
        .b = f->input,
        .ldb = f->IC,
        .d = f->out,
        .ldd = f->ld_out,
        .d_fp32 = f->out_fp32,
        .c = f->residual,
        .alpha = 1.0f,
        .beta = f->residual != NULL ? 1.0f : 0.0f,
        .epilogue = f->bias != NULL ? GEMM_BIAS : GEMM_PLAIN,
        .bias = (void *)f->bias,
    };
    return call;
}

/* d_in (N x IC, bf16) = alpha d_out (N x OC) W. */
gemm_call pass_input_grad_call(pt_bf16 *d_in, const pt_bf16 *d_out,
                               int ld_d_out, const pt_bf16 *weight, int N,
                               int IC, int OC, float alpha)
{
    gemm_call call = {
        .transpose_a = false,
        .transpose_b = false,
        .m = IC,
        .n = N,
        .k = OC,
        .a = weight,
        .lda = IC,
        .b = d_out,
        .ldb = ld_d_out,
        .d = d_in,
        .ldd = IC,
        .d_fp32 = false,
        .alpha = alpha,
        .beta = 0.0f,
        .epilogue = GEMM_PLAIN,
    };
    return call;
}

/* d_W (OC x IC, fp32 or bf16: cuda_grad; the weight at `offset`) +=
 * alpha d_out^T (OC x N) in (N x IC); a bf16 gradient is read, added in
 * fp32 and rounded once (beta = 1 over a bf16 C and D, as llm.c
 * accumulates); written (beta = 0) where the step left it unzeroed for
 * this product (cuda_grad_written). */
gemm_call pass_weight_grad_call(const model_stage *stage, size_t offset,
                                const pt_bf16 *input, const pt_bf16 *d_out,
                                int ld_d_out, int N, int IC, int OC,
                                float alpha)
{
    cuda_grad d_weight = pass_grad_at(stage, offset);
    gemm_call call = {
        .transpose_a = false,
        .transpose_b = true,
        .m = IC,
        .n = OC,
        .k = N,
        .a = input,
        .lda = IC,
        .b = d_out,
        .ldb = ld_d_out,
        .d = d_weight.data,
        .ldd = IC,
        .d_fp32 = !d_weight.bf16,
        .alpha = alpha,
        .beta = cuda_grad_written(stage, offset) ? 0.0f : 1.0f,
        .epilogue = GEMM_PLAIN,
    };
    return call;
}

/* The weight gradient of a linear layer, then its bias gradient (column
 * sums of d_out) by cuda_bias_grad. cuBLASLt's BGRADB epilogue is no
 * fusion on Hopper: it runs as a kernel of its own after the product, and
 * measured slower than ours (24 us against 9 us for 16384 x 768 on an
 * H100), so it is not used. */
int pass_weight_and_bias_grad(cuda_stage_state *state, const gemm_call *call,
                              cuda_grad d_bias, const stage_dims *d,
                              pt_error *err)
{
    if (gemm_run(state->gemm, call, state->stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_bias_grad(d_bias, call->b, state->scratch.bias_partials,
                            d->N, call->n, state->stream));
    return 0;
}

/* The weight gradient, and its bias's where the model has the bias here
 * (pass_parts.h). */
int pass_weight_grad(model_stage *stage, const gemm_call *call,
                     size_t bias_offset, const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (bias_offset == CUDA_NO_TENSOR)
        return gemm_run(state->gemm, call, state->stream, err);
    return pass_weight_and_bias_grad(state, call,
                                     pass_grad_at(stage, bias_offset), d,
                                     err);
}

/* Where parameter `offset`'s gradient goes (its unit's buffer under
 * ZeRO-2/3: grad_units.c), of the stage's gradient precision. */
cuda_grad pass_grad_at(const model_stage *stage, size_t offset)
{
    if (offset == CUDA_NO_TENSOR)
        return cuda_grad_fp32(NULL);
    return cuda_grad_at(stage, offset);
}

/* Where parameter `offset` is read, fp32 and bf16 (its unit's buffers
 * under ZeRO-3: param_units.c). */
const float *pass_param_at(const model_stage *stage, size_t offset)
{
    return offset == CUDA_NO_TENSOR ? NULL : cuda_param_at(stage, offset);
}

pt_bf16 *pass_mirror_at(const cuda_stage_state *state, size_t offset)
{
    return offset == CUDA_NO_TENSOR ? NULL : cuda_mirror_at(state, offset);
}

cudaError_t pass_norm_rows_forward(const model_stage *stage, pt_bf16 *out,
                                   float *mean, float *rstd,
                                   const pt_bf16 *inp, const pt_bf16 *skip,
                                   pt_bf16 *sum, const float *weight,
                                   const float *bias, int R, int C,
                                   cudaStream_t stream)
{
    return cuda_norm_forward_after_add(
        out, mean, rstd, sum, inp, skip, weight, bias,
        stage->shape.norm == MODEL_NORM_RMSNORM,
        (float)model_norm_eps(&stage->shape), R, C, stream);
}

/* A row-parallel product's partial (call: plain, into bf16) in two
 * parts of rows (cuda_tp_split_rows), the first part's sum beside the
 * second part's product (cuda_tp_overlap), the second's after it. */
static int row_parallel_halves(model_stage *stage, gemm_call call,
                               pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    int first = cuda_tp_split_rows(stage, call.n);
    gemm_call second = call;
    call.n = first;
    second.n -= first;
    second.b += (size_t)first * (size_t)call.ldb;
    second.d = (pt_bf16 *)call.d + (size_t)first * (size_t)call.ldd;
    second.sm_count = cuda_tp_beside_sm_count(stage);
    return gemm_run(state->gemm, &call, state->stream, err) != 0 ||
                   cuda_tp_sum_bf16_beside(stage, call.d,
                                           (size_t)first * call.ldd,
                                           err) != 0 ||
                   gemm_run(state->gemm, &second, state->stream, err) !=
                       0 ||
                   cuda_tp_join_beside(stage, err) != 0 ||
                   cuda_tp_sum_bf16(stage, second.d,
                                    (size_t)second.n * second.ldd, err) != 0
               ? -1
               : 0;
}

/* A row-parallel product of one half of the forward's micro-batch
 * (cuda_tp_forward_halves), summed in place in the bf16 stream beside
 * the stage's stream: shard 0's product carries the bias in its
 * epilogue, the others' none, so the sum holds it once; the residual
 * rides in the norm after it (pass_skip_to_norm). The product leaves
 * SMs to the other half's sum. */
static int row_parallel_half(model_stage *stage, linear_forward f,
                             const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (stage->spec.tp_rank != 0)
        f.bias = NULL;
    f.residual = NULL;
    gemm_call call = pass_forward_call(&f);
    call.sm_count = cuda_tp_beside_sm_count(stage);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0)
        return -1;
    return cuda_tp_sum_half(stage, f.out, (size_t)d->N * (size_t)f.OC,
                            state->tp_overlap.active_half, err);
}

/* A row-parallel product into the bf16 stream: out = in W^T + bias +
 * residual (out and residual bf16; f.bias the bias's bf16 mirror, `bias`
 * its fp32 master). Unsplit, bias and residual ride in the epilogue (the
 * bf16 bias, as the epilogue takes out's type; beta = 1 over a bf16 C:
 * added in fp32, rounded once). Split, each shard holds some input
 * features of W, so its product is partial: it runs plain, the group
 * sums it, and bias and residual are added once after the sum, in fp32,
 * rounded once into the stream. Under sequence parallelism the sum is a
 * reduce-scatter: out and residual are the shard's R rows, packed. */
int pass_row_parallel_forward(model_stage *stage, linear_forward f,
                              const float *bias, const stage_dims *d,
                              pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (d->tp == 1) {
        gemm_call call = pass_forward_call(&f);
        return gemm_run(state->gemm, &call, state->stream, err);
    }
    if (d->tp_halves)
        return row_parallel_half(stage, f, d, err);
    const pt_bf16 *residual = f.residual;
    pt_bf16 *out = f.out;
    f.bias = NULL;
    f.residual = NULL;
    size_t count = (size_t)f.N * (size_t)f.OC;
    if (cuda_tp_on_stream(stage) || stage->tp_compute_only) {
        /* the partial in bf16 (scratch.d_partial is free during a
         * forward), summed, then the bias and the residual added in one
         * pass */
        pt_bf16 *partial = (pt_bf16 *)state->scratch.d_partial;
        f.out = partial;
        gemm_call call = pass_forward_call(&f);
        if (cuda_tp_split_product(stage, d, f.IC, f.OC)) {
            if (row_parallel_halves(stage, call, err) != 0)
                return -1;
        } else if (gemm_run(state->gemm, &call, state->stream, err) != 0 ||
                   (d->sp ? cuda_tp_scatter_rows(stage, partial,
                                                 COMM_BFLOAT16, d, err)
                          : cuda_tp_sum_bf16(stage, partial, count, err)) !=
                       0) {
            return -1;
        }
        CUDA_TRY(cuda_stream_from_bf16(out, partial + shard_offset(d), bias,
                                       residual, d->R, f.OC, state->stream));
        return 0;
    }
    /* fp32 sums through the blocking comm: the whole product in fp32
     * (scratch.d_partial), summed there, then into the bf16 stream */
    float *whole = state->scratch.d_partial;
    f.out = whole;
    f.out_fp32 = true;
    gemm_call call = pass_forward_call(&f);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0 ||
        (d->sp ? cuda_tp_scatter_rows(stage, whole, COMM_FLOAT32, d, err)
               : cuda_tp_reduce(stage, whole, count, COMM_SUM, err)) != 0)
        return -1;
    CUDA_TRY(cuda_stream_from_float(out, whole + shard_offset(d), bias, 1,
                                    residual, d->R, f.OC, state->stream));
    return 0;
}

/* A layer norm of the shard's R rows (all N without sequence
 * parallelism) into `kept` (NULL: not kept, recomputed for the
 * backward), and in *whole the input of the column-parallel product
 * after it, every row: `kept` itself, or scratch.norm_out, where the
 * shards' rows are gathered under sequence parallelism. mean and rstd
 * may be NULL (a recomputation). */
static int norm_forward(model_stage *stage, pt_bf16 *kept, float *mean,
                        float *rstd, const pt_bf16 *inp, const pt_bf16 *skip,
                        pt_bf16 *sum, const float *weight, const float *bias,
                        const stage_dims *d, const pt_bf16 **whole,
                        pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    pt_bf16 *norm_out = state->scratch.norm_out;
    pt_bf16 *mine = norm_out + shard_offset(d);
    pt_bf16 *out = kept != NULL ? kept : mine;
    CUDA_TRY(pass_norm_rows_forward(stage, out, mean, rstd, inp, skip, sum,
                                    weight, bias, d->R, d->C,
                                    state->stream));
    *whole = out;
    if (!d->sp)
        return 0;
    if (kept != NULL)
        CUDA_TRY(cudaMemcpyAsync(mine, kept,
                                 (size_t)d->R * d->C * sizeof(pt_bf16),
                                 cudaMemcpyDeviceToDevice, state->stream));
    *whole = norm_out;
    return cuda_tp_gather_rows(stage, norm_out, COMM_BFLOAT16, d, err);
}

int pass_norm_forward(model_stage *stage, pt_bf16 *kept, float *mean,
                      float *rstd, const pt_bf16 *inp, const float *weight,
                      const float *bias, const stage_dims *d,
                      const pt_bf16 **whole, pt_error *err)
{
    return norm_forward(stage, kept, mean, rstd, inp, NULL, NULL, weight,
                        bias, d, whole, err);
}

int pass_norm_forward_after_add(model_stage *stage, pt_bf16 *kept,
                                float *mean, float *rstd, pt_bf16 *sum,
                                const pt_bf16 *skip, const float *weight,
                                const float *bias, const stage_dims *d,
                                const pt_bf16 **whole, pt_error *err)
{
    return norm_forward(stage, kept, mean, rstd, sum, skip, sum, weight,
                        bias, d, whole, err);
}

bool pass_skip_to_norm(const model_stage *stage, const stage_dims *d)
{
    /* split, only the forward's halves sum the product whole into the
     * stream before the norm (pass_row_parallel_forward) */
    return (d->tp == 1 || d->tp_halves) && state_of(stage)->residual_in_norm;
}

bool pass_skip_past_layer(const model_stage *stage, const stage_dims *d)
{
    return pass_skip_to_norm(stage, d) && !stage->spec.recompute_layers;
}

int pass_layer_output_whole(model_stage *stage, pt_bf16 *output,
                            const pt_bf16 *mid, const stage_dims *d,
                            pt_error *err)
{
    if (!pass_skip_to_norm(stage, d) || pass_skip_past_layer(stage, d))
        return 0;
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cuda_stream_from_bf16(output, output, NULL, mid, d->R, d->C,
                                   state->stream));
    return 0;
}

/* The same norm output for a backward's weight gradient: the kept one
 * (its rows gathered again under sequence parallelism, as Megatron
 * does) or recomputed from the norm's input. */
int pass_norm_output_again(model_stage *stage, const pt_bf16 *kept,
                           const pt_bf16 *inp, const float *weight,
                           const float *bias, const stage_dims *d,
                           const pt_bf16 **whole, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (kept == NULL)
        return pass_norm_forward(stage, NULL, NULL, NULL, inp, weight, bias, d,
                            whole, err);
    *whole = kept;
    if (!d->sp)
        return 0;
    pt_bf16 *norm_out = state->scratch.norm_out;
    CUDA_TRY(cudaMemcpyAsync(norm_out + shard_offset(d), kept,
                             (size_t)d->R * d->C * sizeof(pt_bf16),
                             cudaMemcpyDeviceToDevice, state->stream));
    *whole = norm_out;
    return cuda_tp_gather_rows(stage, norm_out, COMM_BFLOAT16, d, err);
}

/* The product's weight gradient from the norm's output `norm_out`, and
 * its bias's where it has one here, on sm_count SMs (0: all). */
static int product_weight_grad(model_stage *stage, const norm_product *p,
                               const pt_bf16 *norm_out, const stage_dims *d,
                               int sm_count, pt_error *err)
{
    gemm_call call = pass_weight_grad_call(stage, p->weight, norm_out,
                                           p->d_product, p->width, d->N,
                                           d->C, p->width, 1.0f);
    call.sm_count = sm_count;
    return pass_weight_grad(stage, &call, p->bias, d, err);
}

int pass_norm_product_backward(model_stage *stage, const norm_product *p,
                               const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    const float *weight = pass_param_at(stage, p->norm_weight);
    const float *bias = pass_param_at(stage, p->norm_bias);
    bool rms = stage->shape.norm == MODEL_NORM_RMSNORM;
    cuda_grad d_weight = pass_norm_grad(stage, d, p->run, p->norm_weight);
    cuda_grad d_bias = pass_norm_grad(stage, d, p->run + 1, p->norm_bias);
    gemm_call input_grad = pass_input_grad_call(
        s->d_norm, p->d_product, p->width, pass_mirror_at(state, p->weight),
        d->N, d->C, p->width, 1.0f);
    if (p->kept == NULL && d->tp == 1 && (rms || bias != NULL)) {
        pt_bf16 *rows = s->d_stream_bf16;
        if (pass_column_parallel_input_grad(stage, input_grad, d, err) != 0)
            return -1;
        CUDA_TRY(cuda_norm_backward_and_output(
            s->norm_out, rows, d_weight, d_bias, rows, s->d_norm, p->inp,
            weight, bias, p->mean, p->rstd, rms, s->norm_partials, d->R,
            d->C, state->stream));
        return product_weight_grad(stage, p, s->norm_out, d, 0, err);
    }
    /* with the sum beside the weight gradient (cuda_tp_overlap): the
     * input gradient and its sum first, the weight gradient on the SMs
     * the sum leaves, then the norm's backward once the sum is in */
    bool beside = cuda_tp_overlapped(stage, d);
    const pt_bf16 *norm_out = NULL;
    if ((beside &&
         (gemm_run(state->gemm, &input_grad, state->stream, err) != 0 ||
          cuda_tp_sum_bf16_beside(stage, input_grad.d,
                                  (size_t)d->N * (size_t)d->C, err) != 0)) ||
        pass_norm_output_again(stage, p->kept, p->inp, weight, bias, d,
                               &norm_out, err) != 0 ||
        product_weight_grad(stage, p, norm_out, d,
                            beside ? cuda_tp_beside_sm_count(stage) : 0,
                            err) != 0 ||
        (beside ? cuda_tp_join_beside(stage, err)
                : pass_column_parallel_input_grad(stage, input_grad, d,
                                                  err)) != 0)
        return -1;
    return pass_norm_backward(stage, true, d_weight, d_bias, p->inp, weight,
                              p->mean, p->rstd, d, err);
}

/* The input gradient of a column-parallel layer (QKV, fc, LM head):
 * call writes d_in (bf16, N x C). Split, each shard saw some output
 * features, so its result is partial and the group sums it: on the
 * stream in bf16 in place, else the product writes fp32 into
 * scratch.d_partial, the group sums it there and one pass rounds it to
 * bf16 for the layer-norm backward, so the sum itself loses nothing.
 * Under sequence parallelism the sum is a reduce-scatter: the shard's
 * rows of d_in (at their place) hold it. */
int pass_column_parallel_input_grad(model_stage *stage, gemm_call call,
                                    const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (d->tp == 1)
        return gemm_run(state->gemm, &call, state->stream, err);
    size_t count = (size_t)d->N * (size_t)d->C;
    if (cuda_tp_on_stream(stage) || stage->tp_compute_only)
        return gemm_run(state->gemm, &call, state->stream, err) != 0 ||
                       (d->sp ? cuda_tp_scatter_rows(stage, call.d,
                                                     COMM_BFLOAT16, d, err)
                              : cuda_tp_sum_bf16(stage, call.d, count,
                                                 err)) != 0
                   ? -1
                   : 0;
    pt_bf16 *d_in = call.d;
    float *partial = state->scratch.d_partial;
    call.d = partial;
    call.d_fp32 = true;
    if (gemm_run(state->gemm, &call, state->stream, err) != 0 ||
        (d->sp ? cuda_tp_scatter_rows(stage, partial, COMM_FLOAT32, d, err)
               : cuda_tp_reduce(stage, partial, count, COMM_SUM, err)) != 0)
        return -1;
    size_t off = shard_offset(d);
    CUDA_TRY(cuda_convert_to_bf16(d_in + off, partial + off,
                                  (size_t)d->R * d->C, state->stream));
    return 0;
}

/* Sequence parallelism: a layer's (or the head's) norm weight and bias
 * gradients of this micro-batch come from the shard's rows into
 * scratch.norm_grads (zeroed first); the group sums them, for this
 * micro-batch alone as the cpu reference does, and they join the
 * gradients, so every shard holds the whole. `targets` lists where each
 * run of C floats goes. */
int pass_add_norm_grads(model_stage *stage, const cuda_grad *targets,
                        int count, const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    float *partials = state->scratch.norm_grads;
    size_t C = (size_t)d->C;
    if (cuda_tp_reduce(stage, partials, (size_t)count * C, COMM_SUM, err) !=
        0)
        return -1;
    for (int i = 0; i < count; i++)
        if (targets[i].data != NULL) /* RMSNorm has no bias */
            CUDA_TRY(cuda_add_into_grad(targets[i], partials + (size_t)i * C,
                                        C, state->stream));
    return 0;
}

/* Where a norm's weight (or bias) gradient goes: the stage's gradients
 * at `offset`, or under sequence parallelism run `run` of
 * scratch.norm_grads, summed over the group later (pass_add_norm_grads). */
cuda_grad pass_norm_grad(model_stage *stage, const stage_dims *d, int run,
                         size_t offset)
{
    return d->sp ? cuda_grad_fp32(state_of(stage)->scratch.norm_grads +
                                  (size_t)run * d->C)
                 : pass_grad_at(stage, offset);
}

/* A layer norm's backward over the shard's rows: the norm's term from
 * scratch.d_norm's rows, plus (add_residual) the stream gradient already
 * there, into the rows' place in scratch.d_stream_bf16, in place; the
 * weight and bias gradients added to d_weight and d_bias. The stream
 * gradient is bf16 from the head down to the embedding, as Megatron-LM's
 * bf16 recipe and llm.c keep it: the layer norm's backward moves 8 bytes
 * a value, not the 16 of an fp32 stream with a bf16 copy. */
int pass_norm_backward(model_stage *stage, bool add_residual,
                       cuda_grad d_weight, cuda_grad d_bias,
                       const pt_bf16 *inp, const float *weight,
                       const float *mean, const float *rstd,
                       const stage_dims *d, pt_error *err)
{
    const backward_scratch *s = &state_of(stage)->scratch;
    return pass_norm_backward_from(stage, add_residual, d_weight, d_bias,
                                   s->d_norm + shard_offset(d), inp, weight,
                                   mean, rstd, d, err);
}

int pass_norm_backward_from(model_stage *stage, bool add_residual,
                            cuda_grad d_weight, cuda_grad d_bias,
                            const pt_bf16 *d_out, const pt_bf16 *inp,
                            const float *weight, const float *mean,
                            const float *rstd, const stage_dims *d,
                            pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    pt_bf16 *rows = s->d_stream_bf16 + shard_offset(d);
    if (stage->shape.norm == MODEL_NORM_RMSNORM) {
        CUDA_TRY(cuda_rmsnorm_backward(
            NULL, rows, d_weight, NULL, add_residual ? rows : NULL, d_out,
            inp, weight, rstd, s->norm_partials, d->R, d->C, state->stream));
        return 0;
    }
    CUDA_TRY(cuda_layernorm_backward(
        NULL, rows, d_weight, d_bias, NULL, add_residual ? rows : NULL, d_out,
        inp, weight, mean, rstd, s->norm_partials, d->R, d->C,
        state->stream));
    return 0;
}
