/*
 * The forward and backward passes of a cuda stage: the order of the
 * kernels and matrix products of each layer, the embedding and the head,
 * with the tensor-parallel sums between them (their pieces in
 * pass_parts.c; the Llama family's layer in passes_llama.c). Precision,
 * the memory the passes read and write, and the products' layout are
 * described at the top of model_cuda.c.
 */
#include "executor/cuda/pass_parts.h"
#include "executor/cuda/passes_llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_check.h"

/* -------------------------------------------------------------- forward */

/* Where layer l of the slot's micro-batch has its activations: its own,
 * or with full recompute the stage's one set, writing its output into the
 * slot's kept one. */
static layer_activations *layer_kept(model_stage *stage,
                                     activation_slot *slot, int l)
{
    cuda_stage_state *state = state_of(stage);
    if (!stage->spec.recompute_layers)
        return &slot->layers[l];
    state->recomputed.output = slot->layers[l].output;
    return &state->recomputed;
}

/* One pre-norm transformer block:
 *   mid = x + proj(attention(qkv(ln1(x))));  out = mid + mlp(ln2(mid)).
 * Unsplit, the residual additions ride in the norm after them
 * (pass_skip_to_norm): mid's in ln2's pass; out's in the next layer's
 * ln1 (input_skip: that layer's input lacks it until then), the final
 * norm, or a pass after the stage's last layer (forward_passes); where
 * pass_skip_past_layer says no, in a pass of its own after mlp_proj.
 * With PARTITA_CUDA_RESIDUAL_IN_NORM=0 they ride in the projections'
 * epilogues (beta = 1). Split, they come after the tensor-parallel
 * sums, except in the forward's halves (layer_forward_halves), where
 * they ride in the norms as unsplit. Under sequence parallelism input,
 * mid and out are the shard's rows; the norms' outputs are gathered
 * before the column-parallel products. The block runs as two segments,
 * each ending in a row-parallel product and its sum. */

/* SMs a column-parallel product may take: all but the margin left to
 * the other half's sum in the forward's halves, else every SM. */
static int column_product_sms(const model_stage *stage, const stage_dims *d)
{
    return d->tp_halves ? cuda_tp_beside_sm_count(stage) : 0;
}

/* mid = x + proj(attention(qkv(ln1(x)))) */
static int attention_segment(model_stage *stage, layer_activations *act,
                             const layer_offsets *o, pt_bf16 *input,
                             const pt_bf16 *input_skip, const stage_dims *d,
                             pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    int N = d->N, C = d->C, A = d->A;
    const pt_bf16 *ln1_out = NULL;
    if (pass_norm_forward_after_add(
            stage, act->ln1_out, act->ln1_mean, act->ln1_rstd, input,
            input_skip, pass_param_at(stage, o->ln1_weight),
            pass_param_at(stage, o->ln1_bias), d, &ln1_out, err) != 0)
        return -1;
    linear_forward qkv = {
        .weight = pass_mirror_at(state, o->qkv_weight), .input = ln1_out,
        .out = act->qkv, .out_fp32 = false,
        .bias = pass_mirror_at(state, o->qkv_bias),
        .N = N, .IC = C, .OC = 3 * A, .ld_out = 3 * A,
    };
    gemm_call call = pass_forward_call(&qkv);
    call.sm_count = column_product_sms(stage, d);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0)
        return -1;
    if (attention_runner_forward(state->attention, act->att_out,
                                 act->att_lse, act->qkv, d->B, d->T, A,
                                 d->NH, state->stream, err) != 0)
        return -1;
    linear_forward proj = {
        .weight = pass_mirror_at(state, o->attn_proj_weight),
        .input = act->att_out, .out = act->residual_mid,
        .bias = pass_mirror_at(state, o->attn_proj_bias),
        .residual = pass_skip_to_norm(stage, d) ? NULL : input,
        .N = N, .IC = A, .OC = C, .ld_out = C,
    };
    return pass_row_parallel_forward(stage, proj,
                                     pass_param_at(stage, o->attn_proj_bias),
                                     d, err);
}

/* out = mid + mlp(ln2(mid)) (input: the block's, whose add to mid
 * ln2 makes where pass_skip_to_norm says) */
static int mlp_segment(model_stage *stage, layer_activations *act,
                       const layer_offsets *o, const pt_bf16 *input,
                       const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    cudaStream_t stream = state->stream;
    int N = d->N, C = d->C, F = d->F;
    const pt_bf16 *ln2_out = NULL;
    if (pass_norm_forward_after_add(
            stage, act->ln2_out, act->ln2_mean, act->ln2_rstd,
            act->residual_mid, pass_skip_to_norm(stage, d) ? input : NULL,
            pass_param_at(stage, o->ln2_weight),
            pass_param_at(stage, o->ln2_bias), d, &ln2_out, err) != 0)
        return -1;
    pt_bf16 *gelu_out = act->gelu_out != NULL ? act->gelu_out : s->d_fc;
    linear_forward fc = {
        .weight = pass_mirror_at(state, o->fc_weight), .input = ln2_out,
        .out = gelu_out, .out_fp32 = false,
        .bias = pass_mirror_at(state, o->fc_bias),
        .N = N, .IC = C, .OC = F, .ld_out = F,
    };
    gemm_call call = pass_forward_call(&fc);
    call.epilogue = GEMM_GELU_AUX_BIAS;
    call.aux = act->fc_pre;
    call.ld_aux = F;
    call.sm_count = column_product_sms(stage, d);
    if (state->fuse_epilogues && gemm_supported(state->gemm, &call)) {
        if (gemm_run(state->gemm, &call, stream, err) != 0)
            return -1;
    } else {
        /* bias in the product, GELU as its own pass */
        fc.out = act->fc_pre;
        call = pass_forward_call(&fc);
        call.sm_count = column_product_sms(stage, d);
        if (gemm_run(state->gemm, &call, stream, err) != 0)
            return -1;
        CUDA_TRY(cuda_gelu_forward(gelu_out, act->fc_pre, (size_t)N * F,
                                   stream));
    }
    linear_forward mlp_proj = {
        .weight = pass_mirror_at(state, o->mlp_proj_weight), .input = gelu_out,
        .out = act->output,
        .bias = pass_mirror_at(state, o->mlp_proj_bias),
        .residual = pass_skip_to_norm(stage, d) ? NULL : act->residual_mid,
        .N = N, .IC = F, .OC = C, .ld_out = C,
    };
    return pass_row_parallel_forward(stage, mlp_proj,
                                     pass_param_at(stage, o->mlp_proj_bias),
                                     d, err);
}

static int layer_forward(model_stage *stage, layer_activations *act,
                         const layer_offsets *o, pt_bf16 *input,
                         const pt_bf16 *input_skip, const stage_dims *d,
                         pt_error *err)
{
    if (attention_segment(stage, act, o, input, input_skip, d, err) != 0 ||
        mlp_segment(stage, act, o, input, d, err) != 0)
        return -1;
    return pass_layer_output_whole(stage, act->output, act->residual_mid, d,
                                   err);
}

/* Half h of a micro-batch in the forward's halves: its B / 2 sequences'
 * rows of the layer's activations, input and skip (rows are
 * sequence-major; the attention's log-sum-exp B x NH x T), and its
 * dims. */
typedef struct forward_half {
    layer_activations act;
    pt_bf16 *input;
    const pt_bf16 *skip;
    stage_dims d;
} forward_half;

static pt_bf16 *rows_from(const pt_bf16 *p, size_t row, int width)
{
    return p != NULL ? (pt_bf16 *)p + row * (size_t)width : NULL;
}

static float *values_from(float *p, size_t first)
{
    return p != NULL ? p + first : NULL;
}

static forward_half half_of(const layer_activations *a, pt_bf16 *input,
                            const pt_bf16 *skip, const stage_dims *d, int h)
{
    forward_half f = {.act = *a, .d = *d};
    f.d.B = d->B / 2;
    f.d.N = d->N / 2;
    f.d.R = d->R / 2;
    size_t r = (size_t)h * (size_t)f.d.N;
    layer_activations *v = &f.act;
    v->ln1_mean = values_from(a->ln1_mean, r);
    v->ln1_rstd = values_from(a->ln1_rstd, r);
    v->ln1_out = rows_from(a->ln1_out, r, d->C);
    v->qkv = rows_from(a->qkv, r, d->QW);
    v->att_out = rows_from(a->att_out, r, d->A);
    v->att_lse = values_from(a->att_lse, (size_t)h * (size_t)f.d.B *
                                             (size_t)d->NH * (size_t)d->T);
    v->residual_mid = rows_from(a->residual_mid, r, d->C);
    v->ln2_mean = values_from(a->ln2_mean, r);
    v->ln2_rstd = values_from(a->ln2_rstd, r);
    v->ln2_out = rows_from(a->ln2_out, r, d->C);
    v->fc_pre = rows_from(a->fc_pre, r, d->FW);
    v->gelu_out = rows_from(a->gelu_out, r, d->F);
    v->output = rows_from(a->output, r, d->C);
    f.input = rows_from(input, r, d->C);
    f.skip = rows_from(skip, r, d->C);
    return f;
}

/* The block over two halves of the micro-batch (cuda_tp_forward_halves):
 * each segment's sum of one half runs beside the next segment of the
 * other (A's attention, B's attention beside A's sum, A's MLP beside B's
 * sum, B's MLP beside A's, the next layer's A beside B's), so only the
 * last sum of a pass waits in line. */
static int layer_forward_halves(model_stage *stage, layer_activations *act,
                                const layer_offsets *o, pt_bf16 *input,
                                const pt_bf16 *input_skip,
                                const stage_dims *d, pt_error *err)
{
    cuda_tp_overlap *overlap = &state_of(stage)->tp_overlap;
    forward_half halves[2] = {half_of(act, input, input_skip, d, 0),
                              half_of(act, input, input_skip, d, 1)};
    int rc = 0;
    for (int h = 0; h < 2 && rc == 0; h++) {
        forward_half *f = &halves[h];
        overlap->active_half = h;
        if (cuda_tp_wait_half(stage, h, err) != 0 ||
            attention_segment(stage, &f->act, o, f->input, f->skip, &f->d,
                              err) != 0)
            rc = -1;
    }
    for (int h = 0; h < 2 && rc == 0; h++) {
        forward_half *f = &halves[h];
        overlap->active_half = h;
        if (cuda_tp_wait_half(stage, h, err) != 0 ||
            mlp_segment(stage, &f->act, o, f->input, &f->d, err) != 0)
            rc = -1;
    }
    overlap->active_half = -1;
    return rc;
}

/* The model's layer: GPT-2's above, or the Llama family's
 * (passes_llama.c: every model that is not GPT-2's). */
static int model_layer_forward(model_stage *stage, layer_activations *act,
                               const layer_offsets *o, pt_bf16 *input,
                               const pt_bf16 *input_skip,
                               const stage_dims *d, pt_error *err)
{
    if (d->tp_halves)
        return layer_forward_halves(stage, act, o, input, input_skip, d,
                                    err);
    if (state_of(stage)->llama_layer)
        return cuda_llama_layer_forward(stage, act, o, input, input_skip, d,
                                        err);
    return layer_forward(stage, act, o, input, input_skip, d, err);
}

/* The host's part of a micro-batch's upload: its tokens into the pinned
 * block, once the last upload has read it, and for the embedding the
 * plan of its gradient (cuda_prepare_tokens does it ahead). */
static int tokens_to_host_block(model_stage *stage, const uint32_t *tokens,
                                const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    token_block *host = &state->host_tokens;
    int T = d->T;
    /* the profiler's back-to-back calls (defer_sync) pass the same
     * tokens and are not held back (stage.h) */
    if (!stage->defer_sync && cuda_tokens_writable(state, err) != 0)
        return -1;
    for (int b = 0; b < d->B; b++) {
        const uint32_t *window = tokens + (size_t)b * (T + 1);
        memcpy(host->inputs + (size_t)b * T, window, T * sizeof *window);
        memcpy(host->targets + (size_t)b * T, window + 1,
               T * sizeof *window);
    }
    state->host_unique_tokens = 0;
    if (stage->spec.has_embedding) {
        embedding_plan plan = {
            .starts = host->plan_starts,
            .rows = host->plan_rows,
            .tokens = host->plan_tokens,
        };
        embedding_plan_build_range(&plan, host->inputs, d->N,
                                   d->vocab_first, d->V,
                                   state->token_counts);
        state->host_unique_tokens = plan.unique_tokens;
    }
    return 0;
}

int cuda_prepare_tokens(model_stage *stage, const stage_io *io,
                        pt_error *err)
{
    CUDA_TRY(cudaSetDevice(state_of(stage)->device));
    stage_dims d = dims_of(stage, io->mbs);
    return tokens_to_host_block(stage, io->tokens, &d, err);
}

/* Copies the micro-batch's tokens (and, for the embedding, the plan of
 * its gradient) to the slot with one transfer, from the pinned block
 * (filled now unless stage_prepare_tokens filled it with these tokens:
 * stage.h's prepared_tokens, which every forward clears). */
static int upload_tokens(model_stage *stage, activation_slot *slot,
                         const uint32_t *tokens, const stage_dims *d,
                         pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    token_block *host = &state->host_tokens;
    bool prepared = stage->prepared_tokens == tokens &&
                    stage->prepared_mbs == d->B;
    if (!prepared && tokens_to_host_block(stage, tokens, d, err) != 0)
        return -1;
    slot->unique_tokens = state->host_unique_tokens;
    /* host and device blocks share one layout: copy up to the plan's
     * end (the capacity's layout, so offsets match) */
    size_t bytes = (size_t)((char *)(host->plan_tokens + d->N) -
                            (char *)host->inputs);
    CUDA_TRY(cudaMemcpyAsync(slot->tokens.inputs, host->inputs, bytes,
                             cudaMemcpyHostToDevice, state->stream));
    return cuda_tokens_sent(state, err);
}

/* The vocab-parallel classifier over the shard's logits (cuda_ops.h): the
 * shard's row maxima and exponential sums, the group's maxima, the sums
 * rescaled to them, then sums and target logits summed side by side in
 * one reduction. The logits become softmax - onehot as on one GPU. */
static int vocab_parallel_loss(model_stage *stage, activation_slot *slot,
                               const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cudaStream_t stream = state->stream;
    size_t N = (size_t)d->N;
    float *shard_max = state->scratch.row_stats;
    float *group_max = shard_max + N, *sums = shard_max + 2 * N,
          *target_logit = shard_max + 3 * N;
    CUDA_TRY(cuda_vocab_parallel_partials(
        slot->logits, shard_max, sums, target_logit, slot->tokens.targets,
        d->vocab_first, d->N, d->V, state->ld_logits, stream));
    CUDA_TRY(cudaMemcpyAsync(group_max, shard_max, N * sizeof(float),
                             cudaMemcpyDeviceToDevice, stream));
    if (cuda_tp_reduce(stage, group_max, N, COMM_MAX, err) != 0)
        return -1;
    CUDA_TRY(cuda_vocab_parallel_rescale(sums, shard_max, group_max, d->N,
                                         stream));
    if (cuda_tp_reduce(stage, sums, 2 * N, COMM_SUM, err) != 0)
        return -1;
    CUDA_TRY(cuda_vocab_parallel_finish(
        slot->logits, slot->losses, slot->tokens.targets, group_max, sums,
        target_logit, d->vocab_first, d->N, d->V, state->ld_logits, stream));
    return 0;
}

/* The fused head (buffer_layout.head_rows): the logits of head_rows
 * rows at a time in scratch.head_logits, each chunk's losses and
 * softmax - onehot, then at once the chunk's share of the head's
 * backward: the weight gradient from its rows of final_out, then their
 * input gradient written over them (alpha = loss_scale / N, as
 * head_backward's). One chunk of logits is alive, not the slot's N rows;
 * from here final_out holds d loss / d final_out for head_backward. */
static int fused_head_chunks(model_stage *stage, activation_slot *slot,
                             float loss_scale, const stage_dims *d,
                             pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    const stage_offsets *o = &state->offsets;
    int N = d->N, C = d->C, Vp = state->ld_logits;
    int chunk_rows = state->layout.head_rows;
    float alpha = loss_scale / (float)N;
    pt_bf16 *logits = state->scratch.head_logits;
    const pt_bf16 *weight = pass_mirror_at(state, o->head_weight);
    for (int first = 0; first < N; first += chunk_rows) {
        int rows = N - first < chunk_rows ? N - first : chunk_rows;
        pt_bf16 *rows_out = slot->final_out + (size_t)first * C;
        linear_forward head = {
            .weight = weight, .input = rows_out, .out = logits,
            .out_fp32 = false, .N = rows, .IC = C, .OC = Vp, .ld_out = Vp,
        };
        gemm_call call = pass_forward_call(&head);
        if (gemm_run(state->gemm, &call, state->stream, err) != 0)
            return -1;
        CUDA_TRY(cuda_classifier_forward(logits, slot->losses + first,
                                         slot->tokens.targets + first, rows,
                                         d->V, Vp, state->stream));
        call = pass_weight_grad_call(stage, o->head_weight, rows_out,
                                     logits, Vp, rows, C, Vp, alpha);
        /* the step's first forward's first chunk may write, no other */
        if (first > 0 || !state->side_zero.first_forward)
            call.beta = 1.0f;
        if (gemm_run(state->gemm, &call, state->stream, err) != 0)
            return -1;
        call = pass_input_grad_call(rows_out, logits, Vp, weight, rows, C,
                                    Vp, alpha);
        if (gemm_run(state->gemm, &call, state->stream, err) != 0)
            return -1;
    }
    return 0;
}

/* The head's logits: every row into the slot's, or the fused head's
 * chunks. */
static int head_logits(model_stage *stage, activation_slot *slot,
                       float loss_scale, const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (state->layout.head_rows > 0)
        return fused_head_chunks(stage, slot, loss_scale, d, err);
    linear_forward head = {
        .weight = pass_mirror_at(state, state->offsets.head_weight),
        .input = slot->final_out, .out = slot->logits, .out_fp32 = false,
        .N = d->N, .IC = d->C, .OC = state->ld_logits,
        .ld_out = state->ld_logits,
    };
    gemm_call call = pass_forward_call(&head);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0)
        return -1;
    if (d->tp == 1)
        CUDA_TRY(cuda_classifier_forward(slot->logits, slot->losses,
                                         slot->tokens.targets, d->N, d->V,
                                         state->ld_logits, state->stream));
    else if (vocab_parallel_loss(stage, slot, d, err) != 0)
        return -1;
    return 0;
}

/* The micro-batch's mean loss, which the head's forward left in
 * scratch.reduced, read back once the stage's stream has drained (under
 * the comm's deadline when sums are on it: a copy into pageable memory
 * would wait for it with no deadline). */
static int read_mean_loss(model_stage *stage, float *mean_loss,
                          pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (cuda_sync_stage_stream(stage, err) != 0)
        return -1;
    double loss = 0.0;
    CUDA_TRY(cudaMemcpyAsync(&loss, state->scratch.reduced, sizeof loss,
                             cudaMemcpyDeviceToHost, state->stream));
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    *mean_loss = (float)loss;
    return 0;
}

/* The final norm, the head and the loss; stream_in += stream_skip first
 * where the last layer left its second residual add (NULL: none). */
static int head_forward(model_stage *stage, activation_slot *slot,
                        pt_bf16 *stream_in, const pt_bf16 *stream_skip,
                        const stage_dims *d, float loss_scale,
                        float *mean_loss, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    const stage_offsets *o = &state->offsets;
    int N = d->N, C = d->C;
    /* the final norm of the shard's rows; the head reads every row */
    pt_bf16 *final_out = slot->final_out + shard_offset(d);
    const float *weight = pass_param_at(stage, o->final_norm_weight);
    const float *bias = pass_param_at(stage, o->final_norm_bias);
    CUDA_TRY(pass_norm_rows_forward(stage, final_out, slot->final_mean,
                                    slot->final_rstd, stream_in, stream_skip,
                                    stream_in, weight, bias, d->R, C,
                                    state->stream));
    if (d->sp && cuda_tp_gather_rows(stage, slot->final_out, COMM_BFLOAT16,
                                     d, err) != 0)
        return -1;
    if (head_logits(stage, slot, loss_scale, d, err) != 0)
        return -1;
    if (stage->defer_sync) {
        *mean_loss = 0.0f; /* the profiler's timing reads no loss */
        return 0;
    }
    if (stage->step.on_device) {
        *mean_loss = 0.0f; /* summed on the device, read once a step */
        return cuda_step_loss_add(stage, slot->losses, N, err);
    }
    CUDA_TRY(cuda_mean(state->scratch.reduced, slot->losses, N,
                       state->stream));
    *mean_loss = 0.0f;
    /* a slot graph's body: the caller reads it after the pass */
    return state->graphs.in_slot_pass ? 0
                                      : read_mean_loss(stage, mean_loss, err);
}

/* Token + position embedding into the slot's input (the bf16 stream).
 * Vocab-parallel: each shard looks up the tokens of its rows (zero for
 * the others) in fp32 (scratch.d_partial, free during a forward), the
 * group sums, then the positions are added as the sum is rounded into
 * the stream. Under sequence parallelism the sum is a reduce-scatter of
 * the lookup with the positions added before it by shard 0 alone, and
 * the shard's rows are its input. */
static int embedding_forward(model_stage *stage, activation_slot *slot,
                             const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    const stage_offsets *o = &state->offsets;
    const float *token = pass_param_at(stage, o->token_embedding);
    const float *position = pass_param_at(stage, o->position_embedding);
    if (d->tp == 1) {
        CUDA_TRY(cuda_embedding_forward(slot->input, slot->tokens.inputs,
                                        token, position, d->B, d->T, d->C,
                                        state->stream));
        return 0;
    }
    float *whole = state->scratch.d_partial;
    CUDA_TRY(cuda_embedding_shard_forward(whole, slot->tokens.inputs, token,
                                          d->vocab_first, d->V, d->N, d->C,
                                          state->stream));
    if (d->sp) {
        if (stage->spec.tp_rank == 0 && position != NULL) /* learned */
            CUDA_TRY(cuda_add_broadcast_rows(whole, position, d->T, NULL,
                                             d->N, d->C, state->stream));
        if (cuda_tp_scatter_rows(stage, whole, COMM_FLOAT32, d, err) != 0)
            return -1;
        position = NULL;
    } else if (cuda_tp_reduce(stage, whole, (size_t)d->N * d->C, COMM_SUM,
                              err) != 0) {
        return -1;
    }
    CUDA_TRY(cuda_stream_from_float(slot->input, whole + shard_offset(d),
                                    position, d->T, NULL, d->R, d->C,
                                    state->stream));
    return 0;
}

/* What the stage sends the next one (stage.h's fp32 interface): its last
 * stream widened (exact), or, through a stage of no layers, the received
 * message itself. */
static int widen_output(model_stage *stage, activation_slot *slot,
                        const stage_io *io, const stage_dims *d,
                        pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    size_t RC = (size_t)d->R * d->C;
    if (state->layer_count == 0 && !stage->spec.has_embedding) {
        CUDA_TRY(cudaMemcpyAsync(slot->output, io->input, RC * sizeof(float),
                                 cudaMemcpyDeviceToDevice, state->stream));
        return 0;
    }
    CUDA_TRY(cuda_convert_to_float(slot->output, slot->stream_out, RC,
                                   state->stream));
    return 0;
}

/* What a forward leaves on the slot's host side for its backward (set
 * here, not by the passes, which a replayed graph skips). */
static void forward_done(const cuda_stage_state *state, activation_slot *slot,
                         int mbs)
{
    slot->stream_out = state->layer_count > 0
                           ? slot->layers[state->layer_count - 1].output
                           : slot->input;
    slot->mbs = mbs;
    slot->awaiting_backward = true;
}

/* The forward's passes after the tokens' upload, into the slot; the
 * mean loss read back into *mean_loss only off the device step. */
static int forward_passes(model_stage *stage, int slot_index,
                          const stage_io *io, float *mean_loss,
                          pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    activation_slot *slot = &state->slots[slot_index];
    stage_dims d = dims_of(stage, io->mbs);
    /* ZeRO-3: each unit gathered before it, the next one's gather behind
     * it (param_units.c) */
    if (cuda_param_pass_begin(stage, false, err) != 0 ||
        cuda_side_zero_fork(stage, err) != 0)
        return -1;
    if (stage->spec.has_embedding) {
        if (cuda_param_unit_use(stage, STAGE_UNIT_EMBEDDING, 0, false,
                                err) != 0 ||
            embedding_forward(stage, slot, &d, err) != 0)
            return -1;
    } else if (!stage->boundary_free) {
        /* the pipeline's fp32 message rounded into the bf16 stream */
        CUDA_TRY(cuda_stream_from_float(slot->input, io->input, NULL, 1,
                                        NULL, d.R, d.C, state->stream));
    }
    /* a layer's output may lack its second residual add (`pending`, its
     * mid) until the norm that reads it next adds it (layer_forward) */
    pt_bf16 *stream_in = slot->input;
    const pt_bf16 *pending = NULL;
    stage_dims layer_dims = d;
    layer_dims.tp_halves = cuda_tp_forward_halves(stage, &d);
    for (int l = 0; l < state->layer_count; l++) {
        layer_activations *act = layer_kept(stage, slot, l);
        if (cuda_param_unit_use(stage, STAGE_UNIT_LAYER, l, false, err) !=
                0 ||
            model_layer_forward(stage, act, &state->offsets.layers[l],
                                stream_in, pending, &layer_dims, err) != 0)
            return -1;
        stream_in = slot->layers[l].output;
        pending = pass_skip_past_layer(stage, &layer_dims) ? act->residual_mid
                                                           : NULL;
    }
    /* the halves' last sums, in line */
    if (layer_dims.tp_halves && (cuda_tp_wait_half(stage, 0, err) != 0 ||
                                 cuda_tp_wait_half(stage, 1, err) != 0))
        return -1;
    if (pending != NULL &&
        (!stage->spec.has_head || slot->output != NULL)) {
        /* the stage's output leaves it whole */
        CUDA_TRY(cuda_stream_from_bf16(stream_in, stream_in, NULL, pending,
                                       d.R, d.C, state->stream));
        pending = NULL;
    }
    slot->stream_out = stream_in;
    if (slot->output != NULL && !stage->boundary_free &&
        widen_output(stage, slot, io, &d, err) != 0)
        return -1;
    *mean_loss = 0.0f;
    /* the fused head writes its weight's gradient in the forward */
    if (cuda_side_zero_join(stage, err) != 0)
        return -1;
    if (stage->spec.has_head) {
        if (cuda_param_unit_use(stage, STAGE_UNIT_HEAD, 0, false, err) !=
                0 ||
            head_forward(stage, slot, stream_in, pending, &d,
                         io->loss_scale, mean_loss, err) != 0)
            return -1;
    } else if (!stage->defer_sync && !stage->step.on_device &&
               !state->graphs.in_slot_pass &&
               cuda_sync_stage_stream(stage, err) != 0) {
        return -1;
    }
    return 0;
}

/* forward_passes as a graph's body: a step kept on the device reads no
 * loss back (it sums them on the device), a slot graph's caller reads it
 * after the pass (cuda_stage_forward). */
static int forward_body(model_stage *stage, int slot_index,
                        const stage_io *io, pt_error *err)
{
    float unread = 0.0f;
    return forward_passes(stage, slot_index, io, &unread, err);
}

int cuda_stage_forward(model_stage *stage, int slot_index,
                       const stage_io *io, float *mean_loss, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    activation_slot *slot = &state->slots[slot_index];
    stage_dims d = dims_of(stage, io->mbs);
    slot->awaiting_backward = false;
    if (io->tokens != NULL &&
        upload_tokens(stage, slot, io->tokens, &d, err) != 0)
        return -1;
    *mean_loss = 0.0f;
    if (stage->step.on_device) {
        /* a step's first forward zeroes the gradients beside it: a graph
         * of its own */
        int first = state->side_zero.pending ? 1 : 0;
        state->side_zero.first_forward = first == 1;
        int status = cuda_pass_run(stage, &state->graphs.forward[first],
                                   slot_index, io, forward_body, err);
        state->side_zero.first_forward = false;
        if (status != 0)
            return -1;
        state->side_zero.pending = false; /* forked, or replayed */
    } else if (cuda_slot_graphable(stage, false)) {
        /* a pipeline stage: its slot's graph, then the loss or the wait
         * the body left out */
        if (cuda_slot_pass_run(stage, false, slot_index, io, forward_body,
                               err) != 0 ||
            (stage->spec.has_head ? read_mean_loss(stage, mean_loss, err)
                                  : cuda_sync_stage_stream(stage, err)) != 0)
            return -1;
    } else if (forward_passes(stage, slot_index, io, mean_loss, err) != 0) {
        return -1;
    }
    forward_done(state, slot, io->mbs);
    return 0;
}

/* ------------------------------------------------------------- backward */

/* The MLP's projection back to its GELU's input: the projection's weight
 * and bias gradients, then d (fc output) through the GELU into s->d_fc,
 * fused into the product's epilogue when cuBLASLt offers it (with the fc
 * bias gradient too, left in s->bias_grads: *fc_bias_pending). */
static int mlp_projection_backward(model_stage *stage,
                                   const layer_offsets *o,
                                   const layer_activations *act,
                                   const stage_dims *d,
                                   bool *fc_bias_pending, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    cudaStream_t stream = state->stream;
    int N = d->N, C = d->C, F = d->F;
    const pt_bf16 *gelu_out = act->gelu_out;
    if (gelu_out == NULL) {
        CUDA_TRY(cuda_gelu_forward(s->d_fc, act->fc_pre, (size_t)N * F,
                                   stream));
        gelu_out = s->d_fc;
    }
    gemm_call call =
        pass_weight_grad_call(stage, o->mlp_proj_weight, gelu_out,
                              s->d_stream_bf16, C, N, F, C, 1.0f);
    if (pass_weight_and_bias_grad(state, &call,
                             pass_grad_at(stage, o->mlp_proj_bias), d, err) != 0)
        return -1;
    call = pass_input_grad_call(s->d_fc, s->d_stream_bf16, C,
                           pass_mirror_at(state, o->mlp_proj_weight), N, F, C,
                           1.0f);
    call.epilogue = GEMM_DGELU_BGRAD;
    call.aux = act->fc_pre;
    call.ld_aux = F;
    call.bias = s->bias_grads;
    if (state->fuse_epilogues && gemm_supported(state->gemm, &call)) {
        *fc_bias_pending = true;
        return gemm_run(state->gemm, &call, stream, err);
    }
    if (state->fuse_epilogues) {
        /* the GELU gradient alone in the epilogue, the bias by a kernel */
        call.epilogue = GEMM_DGELU;
        call.bias = NULL;
        if (gemm_supported(state->gemm, &call)) {
            if (gemm_run(state->gemm, &call, stream, err) != 0)
                return -1;
            CUDA_TRY(cuda_bias_grad(pass_grad_at(stage, o->fc_bias), s->d_fc,
                                    s->bias_partials, N, F, stream));
            return 0;
        }
    }
    call.epilogue = GEMM_PLAIN;
    call.aux = NULL;
    call.bias = NULL;
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_gelu_backward(s->d_fc, s->d_fc, act->fc_pre, (size_t)N * F,
                                stream));
    CUDA_TRY(cuda_bias_grad(pass_grad_at(stage, o->fc_bias), s->d_fc,
                            s->bias_partials, N, F, stream));
    return 0;
}

/* The MLP's first product and the second layer norm: fc's weight
 * gradient, d (ln2 output), and d_mid = d_out + ln2's term in
 * scratch.d_stream_bf16 (which held d_out). */
static int mlp_input_backward(model_stage *stage, const layer_offsets *o,
                              const layer_activations *act,
                              const stage_dims *d, pt_error *err)
{
    /* the fc bias's gradient: the product's epilogue's, added later */
    norm_product p = {
        .kept = act->ln2_out, .inp = act->residual_mid,
        .norm_weight = o->ln2_weight, .norm_bias = o->ln2_bias,
        .mean = act->ln2_mean, .rstd = act->ln2_rstd, .run = 2,
        .weight = o->fc_weight, .bias = CUDA_NO_TENSOR,
        .d_product = state_of(stage)->scratch.d_fc, .width = d->F,
    };
    return pass_norm_product_backward(stage, &p, d, err);
}

/* mid = input + attn_proj(attention(qkv(ln1(input)))), backwards: from
 * d_mid in scratch.d_stream_bf16 to the gradient of the layer's input,
 * in the same place. Under sequence parallelism the shards' rows of
 * d_mid are gathered first. */
static int attention_block_backward(model_stage *stage,
                                    const layer_offsets *o,
                                    const layer_activations *act,
                                    const pt_bf16 *input,
                                    const stage_dims *d,
                                    pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    cudaStream_t stream = state->stream;
    int N = d->N, C = d->C, A = d->A;
    if (d->sp && cuda_tp_gather_rows(stage, s->d_stream_bf16, COMM_BFLOAT16,
                                     d, err) != 0)
        return -1;
    gemm_call call = pass_weight_grad_call(stage, o->attn_proj_weight,
                                           act->att_out, s->d_stream_bf16, C,
                                           N, A, C, 1.0f);
    if (pass_weight_and_bias_grad(state, &call, pass_grad_at(stage, o->attn_proj_bias), d, err) !=
        0)
        return -1;
    call = pass_input_grad_call(s->d_att, s->d_stream_bf16, C,
                           pass_mirror_at(state, o->attn_proj_weight), N, A, C,
                           1.0f);
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    if (attention_runner_backward(state->attention, s->d_qkv, s->d_att,
                                  act->qkv, act->att_out, act->att_lse,
                                  s->attention, d->B, d->T, A, d->NH,
                                  state->attention_lent, state->logits_bytes,
                                  stream, err) != 0)
        return -1;
    norm_product p = {
        .kept = act->ln1_out, .inp = input, .norm_weight = o->ln1_weight,
        .norm_bias = o->ln1_bias, .mean = act->ln1_mean,
        .rstd = act->ln1_rstd, .run = 0, .weight = o->qkv_weight,
        .bias = o->qkv_bias, .d_product = s->d_qkv, .width = 3 * A,
    };
    return pass_norm_product_backward(stage, &p, d, err);
}

/* The block's backward in reverse order of its forward
 * (out = mid + mlp_proj(gelu(fc(ln2(mid)))), mid = input +
 * attn_proj(attention(qkv(ln1(input))))). scratch.d_stream_bf16 holds
 * the gradient of the block's output and receives the gradient of its
 * input. An fc bias gradient made by the product's epilogue is added
 * last. Under sequence parallelism the stream gradient's rows are the
 * shard's (at their place, gathered before the row-parallel products'
 * backward), input is the shard's rows, and the norms' gradients are
 * summed at the end. */
static int layer_backward(model_stage *stage, const layer_offsets *o,
                          const layer_activations *act,
                          const pt_bf16 *input,
                          const stage_dims *d, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    bool fc_bias_pending = false;
    if (d->sp) {
        CUDA_TRY(cudaMemsetAsync(s->norm_grads, 0,
                                 4 * (size_t)d->C * sizeof(float),
                                 state->stream));
        if (cuda_tp_gather_rows(stage, s->d_stream_bf16, COMM_BFLOAT16, d,
                                err) != 0)
            return -1;
    }
    if (mlp_projection_backward(stage, o, act, d, &fc_bias_pending, err) !=
            0 ||
        mlp_input_backward(stage, o, act, d, err) != 0 ||
        attention_block_backward(stage, o, act, input, d, err) != 0)
        return -1;
    if (fc_bias_pending)
        CUDA_TRY(cuda_add_into_grad(pass_grad_at(stage, o->fc_bias),
                                    s->bias_grads, (size_t)d->F,
                                    state->stream));
    const cuda_grad norms[4] = {
        pass_grad_at(stage, o->ln1_weight), pass_grad_at(stage, o->ln1_bias),
        pass_grad_at(stage, o->ln2_weight), pass_grad_at(stage, o->ln2_bias)};
    return d->sp ? pass_add_norm_grads(stage, norms, 4, d, err) : 0;
}

/* The backward of the model's layer (as model_layer_forward). */
static int model_layer_backward(model_stage *stage, const layer_offsets *o,
                                const layer_activations *act,
                                const pt_bf16 *input, const stage_dims *d,
                                pt_error *err)
{
    if (state_of(stage)->llama_layer)
        return cuda_llama_layer_backward(stage, o, act, input, d, err);
    return layer_backward(stage, o, act, input, d, err);
}

/* Loss -> logits -> final norm: leaves d loss / d (last stream) in
 * scratch.d_stream_bf16 (the shard's rows at their place). The loss is
 * loss_scale x the mean over N positions; the logits' buffer holds
 * softmax - onehot, so the products take alpha = loss_scale / N. */
static int head_backward(model_stage *stage, activation_slot *slot,
                         float loss_scale, const stage_dims *d,
                         pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    const stage_offsets *o = &state->offsets;
    int N = d->N, C = d->C, Vp = state->ld_logits;
    float alpha = loss_scale / (float)N;
    if (d->sp)
        CUDA_TRY(cudaMemsetAsync(s->norm_grads, 0,
                                 2 * (size_t)C * sizeof(float),
                                 state->stream));
    /* the fused head's forward made both products (fused_head_chunks)
     * and left the final norm's output gradient in final_out */
    const pt_bf16 *d_final = slot->final_out;
    if (state->layout.head_rows == 0) {
        gemm_call call = pass_input_grad_call(
            s->d_norm, slot->logits, state->ld_logits,
            pass_mirror_at(state, o->head_weight), N, C, Vp, alpha);
        if (pass_column_parallel_input_grad(stage, call, d, err) != 0)
            return -1;
        call = pass_weight_grad_call(stage, o->head_weight, slot->final_out,
                                     slot->logits, state->ld_logits, N, C,
                                     Vp, alpha);
        if (gemm_run(state->gemm, &call, state->stream, err) != 0)
            return -1;
        d_final = s->d_norm;
    }
    /* the final norm over the shard's rows (its statistics packed) */
    if (pass_norm_backward_from(
            stage, false, pass_norm_grad(stage, d, 0, o->final_norm_weight),
            pass_norm_grad(stage, d, 1, o->final_norm_bias),
            d_final + shard_offset(d), slot->stream_out,
            pass_param_at(stage, o->final_norm_weight), slot->final_mean,
            slot->final_rstd, d, err) != 0)
        return -1;
    const cuda_grad norms[2] = {pass_grad_at(stage, o->final_norm_weight),
                                pass_grad_at(stage, o->final_norm_bias)};
    return d->sp ? pass_add_norm_grads(stage, norms, 2, d, err) : 0;
}

/* The embedding's gradients from d_out, the gradient of its output (the
 * shard's rows under sequence parallelism: the vocab-parallel lookup's
 * rows are every row, so they are gathered into scratch.d_partial, free
 * after the layers). */
static int embedding_backward(model_stage *stage, const activation_slot *slot,
                              const float *d_out, const stage_dims *d,
                              pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    const stage_offsets *o = &state->offsets;
    const token_block *t = &slot->tokens;
    if (d->sp) {
        float *whole = state->scratch.d_partial;
        CUDA_TRY(cudaMemcpyAsync(whole + shard_offset(d), d_out,
                                 (size_t)d->R * d->C * sizeof(float),
                                 cudaMemcpyDeviceToDevice, state->stream));
        if (cuda_tp_gather_rows(stage, whole, COMM_FLOAT32, d, err) != 0)
            return -1;
        d_out = whole;
    }
    CUDA_TRY(cuda_embedding_backward(
        pass_grad_at(stage, o->token_embedding),
        pass_grad_at(stage, o->position_embedding), d_out, t->plan_starts,
        t->plan_rows, t->plan_tokens, slot->unique_tokens, d->B, d->T, d->C,
        state->stream));
    return 0;
}

/* Tells the armed hook (cuda_backend.h) that every gradient from float
 * ready_from on is enqueued. */
static void gradients_enqueued(const cuda_stage_state *state,
                               size_t ready_from)
{
    if (state->grad_hook != NULL)
        state->grad_hook(state->grad_hook_data, ready_from);
}

/* The gradient of the stage's input in fp32 (the shard's rows, packed)
 * for the embedding or the previous stage: converted from the bf16
 * stream into scratch.d_stream_fp32 (backward_passes), or the output
 * gradient itself when nothing came between. */
static bool input_grad_converted(const model_stage *stage)
{
    const cuda_stage_state *state = state_of(stage);
    return (stage->spec.has_head || state->layer_count > 0) &&
           (!stage->boundary_free || stage->spec.has_embedding);
}

/* The backward's passes into the slot's gradients: the head's, the
 * layers' and the input gradient's conversion (input_grad_converted),
 * all but the embedding's, whose grid follows the micro-batch's
 * distinct tokens (so that a graph can replay them). */
static int backward_passes(model_stage *stage, int slot_index,
                           const stage_io *io, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    activation_slot *slot = &state->slots[slot_index];
    backward_scratch *s = &state->scratch;
    stage_dims d = dims_of(stage, io->mbs);
    /* the gradient of the stage's output: the shard's rows under
     * sequence parallelism (packed in io->output_grad; in bf16 at their
     * place in scratch.d_stream_bf16, where the head and the layers keep
     * the stream gradient) */
    size_t RC = (size_t)d.R * d.C;
    pt_bf16 *stream_grad = s->d_stream_bf16 + shard_offset(&d);
    /* ZeRO-2/3's units (grad_units.c): the embeddings' buffer is open for
     * the whole backward (a tied head writes into it first) */
    if (cuda_side_zero_settle(stage, err) != 0 ||
        cuda_grad_unit_begin(stage, STAGE_UNIT_EMBEDDING, 0, err) != 0 ||
        cuda_param_pass_begin(stage, true, err) != 0)
        return -1;
    if (stage->spec.has_head) {
        if (cuda_param_unit_use(stage, STAGE_UNIT_HEAD, 0, true, err) != 0 ||
            cuda_grad_unit_begin(stage, STAGE_UNIT_HEAD, 0, err) != 0 ||
            head_backward(stage, slot, io->loss_scale, &d, err) != 0 ||
            cuda_grad_unit_done(stage, STAGE_UNIT_HEAD, 0, err) != 0)
            return -1;
        gradients_enqueued(state, state->offsets.final_norm_weight);
        /* the fused head's chunk buffer, or the slot's logits: dead
         * until the next forward */
        state->attention_lent = state->layout.head_rows > 0
                                    ? (void *)s->head_logits
                                    : (void *)slot->logits;
    } else if (state->layer_count > 0 && !stage->boundary_free) {
        CUDA_TRY(cuda_convert_to_bf16(stream_grad, io->output_grad, RC,
                                      state->stream));
    }
    for (int l = state->layer_count - 1; l >= 0; l--) {
        pt_bf16 *layer_input =
            l > 0 ? slot->layers[l - 1].output : slot->input;
        layer_activations *act = layer_kept(stage, slot, l);
        if (cuda_param_unit_use(stage, STAGE_UNIT_LAYER, l, true, err) != 0)
            return -1;
        /* full recompute: the layer's forward again from its kept input
         * (rewriting its output with the same values) */
        if (stage->spec.recompute_layers &&
            model_layer_forward(stage, act, &state->offsets.layers[l],
                                layer_input, NULL, &d, err) != 0)
            return -1;
        if (cuda_grad_unit_begin(stage, STAGE_UNIT_LAYER, l, err) != 0 ||
            model_layer_backward(stage, &state->offsets.layers[l], act,
                                 layer_input, &d, err) != 0 ||
            cuda_grad_unit_done(stage, STAGE_UNIT_LAYER, l, err) != 0)
            return -1;
        gradients_enqueued(state, state->offsets.layers[l].ln1_weight);
    }
    if (input_grad_converted(stage))
        CUDA_TRY(cuda_convert_to_float(s->d_stream_fp32, stream_grad, RC,
                                       state->stream));
    return 0;
}

int cuda_stage_backward(model_stage *stage, int slot_index,
                        const stage_io *io, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaSetDevice(state->device));
    activation_slot *slot = &state->slots[slot_index];
    if (!slot->awaiting_backward || slot->mbs != io->mbs)
        return pt_fail(err, "cuda backend: backward of slot %d without a "
                            "forward of %d sequences before it",
                       slot_index, io->mbs);
    backward_scratch *s = &state->scratch;
    stage_dims d = dims_of(stage, io->mbs);
    size_t RC = (size_t)d.R * d.C;
    /* a step's first backward may write its products' gradients: a graph
     * of its own */
    bool writes = state->side_zero.products_write;
    if ((stage->step.on_device
             ? cuda_pass_run(stage, &state->graphs.backward[writes ? 1 : 0],
                             slot_index, io, backward_passes, err)
             : cuda_slot_pass_run(stage, true, slot_index, io,
                                  backward_passes, err)) != 0)
        return -1;
    state->side_zero.products_write = false; /* the rest add */
    const float *d_in =
        input_grad_converted(stage) ? s->d_stream_fp32 : io->output_grad;
    if (stage->spec.has_embedding) {
        if (cuda_param_unit_use(stage, STAGE_UNIT_EMBEDDING, 0, true, err) !=
                0 ||
            embedding_backward(stage, slot, d_in, &d, err) != 0 ||
            cuda_grad_unit_done(stage, STAGE_UNIT_EMBEDDING, 0, err) != 0)
            return -1;
        gradients_enqueued(state, 0);
        s->input_grad = NULL;
    } else if (stage->boundary_free) {
        s->input_grad = s->d_stream_fp32; /* not written: the profiler's */
    } else {
        /* the result must not point into the caller's memory */
        if (d_in != s->d_stream_fp32)
            CUDA_TRY(cudaMemcpyAsync(s->d_stream_fp32, d_in,
                                     RC * sizeof(float),
                                     cudaMemcpyDeviceToDevice,
                                     state->stream));
        s->input_grad = s->d_stream_fp32;
    }
    state->attention_lent = NULL;
    /* a step kept on the device waits once, at its end (optimizer_step.c) */
    if (!stage->defer_sync && !stage->step.on_device &&
        cuda_sync_stage_stream(stage, err) != 0)
        return -1;
    slot->awaiting_backward = false;
    return 0;
}
