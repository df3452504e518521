/*
 * The Llama family's transformer layer on a cuda stage, forward and
 * backward: every model that is not GPT-2's (its norm RMSNorm or
 * LayerNorm, its MLP SwiGLU or GELU, rotary or learned positions,
 * grouped-query attention, the biases it has), as the cpu backend's
 * layer_cpu.c computes it. The products, the tensor-parallel sums and
 * sequence-parallel gathers and the norms are pass_parts.c's;
 * what differs from GPT-2's layer there:
 *   - the qkv product comes out in the weight's grouped order (per
 *     key/value group its query heads, its key head, its value head:
 *     Megatron-LM's, so tp cuts whole groups) into scratch.d_qkv, and
 *     one pass (cuda_qkv_to_heads) moves it into the heads' order the
 *     attention reads, turning queries and keys on the way (RoPE);
 *   - the attention is the runner's grouped-query call (cuDNN's fused
 *     attention with K/V of their own head count, else the own kernels);
 *   - the MLP's first product is [gate | up] (2F columns) and SwiGLU
 *     runs as a kernel of its own, no cuBLASLt epilogue fusing it;
 *   - a bias the model lacks is skipped (CUDA_NO_TENSOR).
 * The backward writes the gradients of the two places that are dead by
 * then over the activations themselves: SwiGLU's input gradient over
 * fc_pre (the kernel runs in place), the qkv product's grouped gradient
 * over qkv (after the attention's backward has read it), so the layer
 * needs no scratch beyond GPT-2's.
 */
#include "executor/cuda/passes_llama.h"

#include "executor/cuda/pass_parts.h"

#include "executor/cuda/cuda_check.h"

static bool turns(const model_stage *stage)
{
    return stage->shape.positions == MODEL_POSITIONS_ROPE;
}

/* The MLP's activation of fc_pre (N x FW) into out (N x F). */
static cudaError_t mlp_activation(const model_stage *stage, pt_bf16 *out,
                                  const pt_bf16 *fc_pre, const stage_dims *d,
                                  cudaStream_t stream)
{
    if (stage->shape.mlp == MODEL_MLP_SWIGLU)
        return cuda_swiglu_forward(out, fc_pre, d->N, d->F, stream);
    return cuda_gelu_forward(out, fc_pre, (size_t)d->N * d->F, stream);
}

/* norm1 (adding input_skip to input first, when not NULL), the qkv
 * product (grouped, in scratch.d_qkv), regrouped and turned into
 * act->qkv, the attention, and its row-parallel projection into
 * residual_mid (the skip added there, or by norm2: pass_skip_to_norm). */
static int attention_forward(model_stage *stage, layer_activations *act,
                             const layer_offsets *o, pt_bf16 *input,
                             const pt_bf16 *input_skip, const stage_dims *d,
                             pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    cudaStream_t stream = state->stream;
    const pt_bf16 *ln1_out = NULL;
    if (pass_norm_forward_after_add(
            stage, act->ln1_out, act->ln1_mean, act->ln1_rstd, input,
            input_skip, pass_param_at(stage, o->ln1_weight),
            pass_param_at(stage, o->ln1_bias), d, &ln1_out, err) != 0)
        return -1;
    linear_forward qkv = {
        .weight = pass_mirror_at(state, o->qkv_weight), .input = ln1_out,
        .out = s->d_qkv, .bias = pass_mirror_at(state, o->qkv_bias),
        .N = d->N, .IC = d->C, .OC = d->QW, .ld_out = d->QW,
    };
    gemm_call call = pass_forward_call(&qkv);
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_qkv_to_heads(act->qkv, s->d_qkv, stage->shape.rope_base,
                               turns(stage), d->B, d->T, d->NH, d->KVH,
                               d->hs, stream));
    if (attention_runner_forward_gqa(state->attention, act->att_out,
                                     act->att_lse, act->qkv, d->B, d->T,
                                     d->NH, d->KVH, d->hs, stream,
                                     err) != 0)
        return -1;
    linear_forward proj = {
        .weight = pass_mirror_at(state, o->attn_proj_weight),
        .input = act->att_out, .out = act->residual_mid,
        .bias = pass_mirror_at(state, o->attn_proj_bias),
        .residual = pass_skip_to_norm(stage, d) ? NULL : input,
        .N = d->N, .IC = d->A, .OC = d->C, .ld_out = d->C,
    };
    return pass_row_parallel_forward(
        stage, proj, pass_param_at(stage, o->attn_proj_bias), d, err);
}

/* One pre-norm block: mid = x + proj(attention(rope(qkv(norm1(x))))),
 * out = mid + fc2(swiglu(fc1(norm2(mid)))), the residual adds where
 * passes.c's GPT-2 layer does them (in the norms after them, unsplit).
 * Under sequence parallelism input, mid and out are the shard's rows. */
int cuda_llama_layer_forward(model_stage *stage, layer_activations *act,
                             const layer_offsets *o, pt_bf16 *input,
                             const pt_bf16 *input_skip, const stage_dims *d,
                             pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cudaStream_t stream = state->stream;
    if (attention_forward(stage, act, o, input, input_skip, d, err) != 0)
        return -1;
    const pt_bf16 *ln2_out = NULL;
    if (pass_norm_forward_after_add(
            stage, act->ln2_out, act->ln2_mean, act->ln2_rstd,
            act->residual_mid, pass_skip_to_norm(stage, d) ? input : NULL,
            pass_param_at(stage, o->ln2_weight),
            pass_param_at(stage, o->ln2_bias), d, &ln2_out, err) != 0)
        return -1;
    linear_forward fc = {
        .weight = pass_mirror_at(state, o->fc_weight), .input = ln2_out,
        .out = act->fc_pre, .bias = pass_mirror_at(state, o->fc_bias),
        .N = d->N, .IC = d->C, .OC = d->FW, .ld_out = d->FW,
    };
    gemm_call call = pass_forward_call(&fc);
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    /* the activation's output kept, or recomputed in the backward */
    pt_bf16 *mlp_act =
        act->gelu_out != NULL ? act->gelu_out : state->scratch.d_fc;
    CUDA_TRY(mlp_activation(stage, mlp_act, act->fc_pre, d, stream));
    linear_forward fc2 = {
        .weight = pass_mirror_at(state, o->mlp_proj_weight),
        .input = mlp_act, .out = act->output,
        .bias = pass_mirror_at(state, o->mlp_proj_bias),
        .residual = pass_skip_to_norm(stage, d) ? NULL : act->residual_mid,
        .N = d->N, .IC = d->F, .OC = d->C, .ld_out = d->C,
    };
    if (pass_row_parallel_forward(
            stage, fc2, pass_param_at(stage, o->mlp_proj_bias), d, err) != 0)
        return -1;
    return pass_layer_output_whole(stage, act->output, act->residual_mid, d,
                                   err);
}

/* ------------------------------------------------------------- backward */

/* A recomputed SwiGLU's share of the MLP backward in one pass: fc2's
 * input gradient into scratch.d_fc, then cuda_swiglu_backward_and_forward
 * turns it into SwiGLU's output there (for fc2's weight gradient, after)
 * while writing fc_pre's gradient over fc_pre. The forward then the
 * backward read the gate and up twice (a quarter more bytes). */
static int swiglu_recomputed_backward(model_stage *stage,
                                      const layer_offsets *o,
                                      const layer_activations *act,
                                      const stage_dims *d, pt_bf16 **d_fc,
                                      pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    int N = d->N, C = d->C, F = d->F;
    gemm_call call = pass_input_grad_call(
        s->d_fc, s->d_stream_bf16, C,
        pass_mirror_at(state, o->mlp_proj_weight), N, F, C, 1.0f);
    if (gemm_run(state->gemm, &call, state->stream, err) != 0)
        return -1;
    CUDA_TRY(cuda_swiglu_backward_and_forward(act->fc_pre, s->d_fc,
                                              act->fc_pre, N, F,
                                              state->stream));
    call = pass_weight_grad_call(stage, o->mlp_proj_weight,
                                 s->d_fc, s->d_stream_bf16, C, N, F, C,
                                 1.0f);
    if (pass_weight_grad(stage, &call, o->mlp_proj_bias, d, err) != 0)
        return -1;
    *d_fc = act->fc_pre;
    return 0;
}

/* fc2 and the activation backwards: fc2's gradients, then the gradient
 * of fc_pre, in *d_fc: SwiGLU's over fc_pre itself (in place), GELU's in
 * scratch.d_fc. */
static int mlp_output_backward(model_stage *stage, const layer_offsets *o,
                               const layer_activations *act,
                               const stage_dims *d, pt_bf16 **d_fc,
                               pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    cudaStream_t stream = state->stream;
    int N = d->N, C = d->C, F = d->F;
    const pt_bf16 *mlp_act = act->gelu_out;
    if (mlp_act == NULL && stage->shape.mlp == MODEL_MLP_SWIGLU)
        return swiglu_recomputed_backward(stage, o, act, d, d_fc, err);
    if (mlp_act == NULL) {
        CUDA_TRY(mlp_activation(stage, s->d_fc, act->fc_pre, d, stream));
        mlp_act = s->d_fc;
    }
    gemm_call call = pass_weight_grad_call(stage, o->mlp_proj_weight, mlp_act,
                                           s->d_stream_bf16, C, N, F, C, 1.0f);
    if (pass_weight_grad(stage, &call, o->mlp_proj_bias, d, err) != 0)
        return -1;
    call = pass_input_grad_call(s->d_fc, s->d_stream_bf16, C,
                                pass_mirror_at(state, o->mlp_proj_weight), N,
                                F, C, 1.0f);
    if (gemm_run(state->gemm, &call, stream, err) != 0)
        return -1;
    if (stage->shape.mlp == MODEL_MLP_SWIGLU) {
        CUDA_TRY(cuda_swiglu_backward(act->fc_pre, s->d_fc, act->fc_pre, N,
                                      F, stream));
        *d_fc = act->fc_pre;
        return 0;
    }
    CUDA_TRY(cuda_gelu_backward(s->d_fc, s->d_fc, act->fc_pre, (size_t)N * F,
                                stream));
    *d_fc = s->d_fc;
    return 0;
}

/* The MLP half backwards: from d_out in scratch.d_stream_bf16 (every row
 * under sequence parallelism) to d_mid there (the shard's rows). */
static int mlp_backward(model_stage *stage, const layer_offsets *o,
                        const layer_activations *act, const stage_dims *d,
                        pt_error *err)
{
    pt_bf16 *d_fc = NULL;
    if (mlp_output_backward(stage, o, act, d, &d_fc, err) != 0)
        return -1;
    norm_product p = {
        .kept = act->ln2_out, .inp = act->residual_mid,
        .norm_weight = o->ln2_weight, .norm_bias = o->ln2_bias,
        .mean = act->ln2_mean, .rstd = act->ln2_rstd, .run = 2,
        .weight = o->fc_weight, .bias = o->fc_bias, .d_product = d_fc,
        .width = d->FW,
    };
    return pass_norm_product_backward(stage, &p, d, err);
}

/* The attention half backwards: from d_mid in scratch.d_stream_bf16 to
 * the gradient of the layer's input in the same place. The attention's
 * gradient (heads' order, scratch.d_qkv) is turned back and regrouped
 * over act->qkv, dead once the attention's backward has read it. */
static int attention_backward(model_stage *stage, const layer_offsets *o,
                              const layer_activations *act,
                              const pt_bf16 *input, const stage_dims *d,
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
    if (pass_weight_grad(stage, &call, o->attn_proj_bias, d, err) != 0)
        return -1;
    call = pass_input_grad_call(s->d_att, s->d_stream_bf16, C,
                                pass_mirror_at(state, o->attn_proj_weight), N,
                                A, C, 1.0f);
    if (gemm_run(state->gemm, &call, stream, err) != 0 ||
        attention_runner_backward_gqa(
            state->attention, s->d_qkv, s->d_att, act->qkv, act->att_out,
            act->att_lse, s->attention, d->B, d->T, d->NH, d->KVH, d->hs,
            state->attention_lent, state->logits_bytes, stream, err) != 0)
        return -1;
    pt_bf16 *d_product = act->qkv;
    CUDA_TRY(cuda_qkv_to_grouped(d_product, s->d_qkv, stage->shape.rope_base,
                                 turns(stage), d->B, d->T, d->NH, d->KVH,
                                 d->hs, stream));
    norm_product p = {
        .kept = act->ln1_out, .inp = input, .norm_weight = o->ln1_weight,
        .norm_bias = o->ln1_bias, .mean = act->ln1_mean,
        .rstd = act->ln1_rstd, .run = 0, .weight = o->qkv_weight,
        .bias = o->qkv_bias, .d_product = d_product, .width = d->QW,
    };
    return pass_norm_product_backward(stage, &p, d, err);
}

/* The block's backward in reverse order of its forward. Under sequence
 * parallelism the stream gradient's rows are the shard's (gathered
 * before each row-parallel product's backward) and the norms' weight
 * gradients are summed over the group at the end. */
int cuda_llama_layer_backward(model_stage *stage, const layer_offsets *o,
                              const layer_activations *act,
                              const pt_bf16 *input, const stage_dims *d,
                              pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    backward_scratch *s = &state->scratch;
    if (d->sp) {
        CUDA_TRY(cudaMemsetAsync(s->norm_grads, 0,
                                 4 * (size_t)d->C * sizeof(float),
                                 state->stream));
        if (cuda_tp_gather_rows(stage, s->d_stream_bf16, COMM_BFLOAT16, d,
                                err) != 0)
            return -1;
    }
    if (mlp_backward(stage, o, act, d, err) != 0 ||
        attention_backward(stage, o, act, input, d, err) != 0)
        return -1;
    const cuda_grad norms[4] = {
        pass_grad_at(stage, o->ln1_weight), pass_grad_at(stage, o->ln1_bias),
        pass_grad_at(stage, o->ln2_weight), pass_grad_at(stage, o->ln2_bias)};
    return d->sp ? pass_add_norm_grads(stage, norms, 4, d, err) : 0;
}
