/*
 * The cpu backend's transformer layer: one pre-norm block, forward and
 * backward, from the reference ops, with the tensor-parallel sums and
 * the sequence-parallel gathers and scatters Megatron places around them
 * (column-parallel qkv and first MLP matrix, row-parallel projections).
 * The block is the model's: GPT-2's (LayerNorm, GELU, one key/value head
 * per head, biases) or Llama's and its kin (RMSNorm, SwiGLU, rotary
 * positions, grouped-query attention, the biases the model has), each
 * choice on its own. The model around it (embedding, head, loss,
 * buffers) is model_cpu.c.
 */
#include "executor/cpu/stage_cpu.h"

#include <string.h>

/* Everything one layer's backward reads but its output. */
void cpu_carve_layer(layer_activations *act, arena *a, const stage_dims *d)
{
    size_t means = d->rmsnorm ? 0 : d->N; /* RMSNorm keeps no mean */
    act->ln1_out = arena_take(a, d->N * d->C);
    act->ln1_mean = arena_take(a, means);
    act->ln1_rstd = arena_take(a, d->N);
    act->qkv = arena_take(a, d->N * d->QW);
    act->att_probs = arena_take(a, d->B * d->NH * d->T * d->T);
    act->att_out = arena_take(a, d->N * d->A);
    act->residual_mid = arena_take(a, d->N * d->C);
    act->ln2_out = arena_take(a, d->N * d->C);
    act->ln2_mean = arena_take(a, means);
    act->ln2_rstd = arena_take(a, d->N);
    act->fc_out = arena_take(a, d->N * d->FW);
    act->fc_act = arena_take(a, d->N * d->F);
}

/* out = inp W^T, then (row-parallel) summed over the tp group, then
 * + bias (when there is one): each shard holds some input features of
 * W, and the whole bias is added once after the sum. */
static int row_parallel_forward(const model_stage *stage, float *out,
                                const float *inp, const float *weight,
                                const float *bias, const stage_dims *d,
                                int in_features, pt_error *err)
{
    int N = (int)d->N, C = (int)d->C;
    cpu_matmul_forward(out, inp, weight, d->tp > 1 ? NULL : bias, N,
                       in_features, C);
    if (d->tp == 1)
        return 0;
    /* sequence parallelism: each shard keeps the sum of its rows */
    if (d->sp ? stage_tp_reduce_scatter_rows(stage, out, d->N, d->C, err)
              : stage_tp_all_reduce_sum(stage, out, d->N * d->C, err))
        return -1;
    if (bias == NULL)
        return 0;
    for (size_t n = d->row0; n < d->row0 + d->rows; n++)
        for (size_t c = 0; c < d->C; c++)
            out[n * d->C + c] += bias[c];
    return 0;
}

/* The rows the shard holds are normed, then gathered from every shard:
 * the next matmul is column-parallel and reads every row. */
int cpu_norm_forward(const model_stage *stage, float *out, float *mean,
                     float *rstd, const float *inp, const float *weight,
                     const float *bias, const stage_dims *d, pt_error *err)
{
    size_t off = d->row0 * d->C;
    if (d->rmsnorm)
        cpu_rmsnorm_forward(out + off, rstd + d->row0, inp + off, weight,
                            d->norm_eps, (int)d->rows, (int)d->C);
    else
        cpu_layernorm_forward(out + off, mean + d->row0, rstd + d->row0,
                              inp + off, weight, bias, (int)d->rows,
                              (int)d->C);
    return d->sp ? stage_tp_all_gather_rows(stage, out, d->N, d->C, err) : 0;
}

/* Under spec.bf16_residual, the shard's rows of a residual-stream buffer
 * rounded to bf16, as the cuda backend stores them (it adds in fp32 and
 * rounds once). */
void cpu_round_stream(const model_stage *stage, float *stream,
                      const stage_dims *d)
{
    if (stage->spec.bf16_residual)
        cpu_round_to_bf16(stream + d->row0 * d->C, d->rows * d->C);
}

/* The attention half: qkv(norm(x)), regrouped and rotated as the model
 * says, into act->qkv; attention; its projection into residual_mid,
 * summed over the group. s->d_qkv holds the grouped product meanwhile. */
static int attention_forward(const model_stage *stage, layer_activations *act,
                             const layer_tensors *p, const float *input,
                             backward_scratch *s, const stage_dims *d,
                             pt_error *err)
{
    int N = (int)d->N, C = (int)d->C, QW = (int)d->QW;
    if (cpu_norm_forward(stage, act->ln1_out, act->ln1_mean, act->ln1_rstd,
                         input, p->ln1_weight, p->ln1_bias, d, err) != 0)
        return -1;
    float *product = d->grouped_qkv ? s->d_qkv : act->qkv;
    cpu_matmul_forward(product, act->ln1_out, p->qkv_weight, p->qkv_bias, N,
                       C, QW);
    if (d->grouped_qkv)
        cpu_qkv_regroup(act->qkv, product, d->N, (int)d->NH, (int)d->KVH,
                        (int)d->hs, true);
    /* queries and keys turned in place; the values pass */
    if (d->rope)
        cpu_rope_forward(act->qkv, act->qkv, d->rope_base, (int)d->B,
                         (int)d->T, QW, (int)(d->NH + d->KVH), (int)d->hs);
    cpu_gqa_attention_forward(act->att_out, act->att_probs, act->qkv,
                              (int)d->B, (int)d->T, (int)d->NH, (int)d->KVH,
                              (int)d->hs);
    return row_parallel_forward(stage, act->residual_mid, act->att_out,
                                p->attn_proj_weight, p->attn_proj_bias, d,
                                (int)d->A, err);
}

/* One pre-norm transformer block:
 *   mid = x + proj(attention(qkv(norm1(x))));  out = mid + mlp(norm2(mid))
 * with mlp = proj(gelu(fc)) or proj(swiglu(fc)). With tensor parallelism
 * the shard computes its heads and MLP features; the two projections sum
 * over the group. */
int cpu_layer_forward(const model_stage *stage, layer_activations *act,
                      const layer_tensors *p, const float *input,
                      backward_scratch *s, const stage_dims *d,
                      pt_error *err)
{
    int N = (int)d->N, C = (int)d->C, F = (int)d->F;
    size_t off = d->row0 * d->C, rows_c = d->rows * d->C;
    /* the branch goes to residual_mid first, then the skip is added */
    if (attention_forward(stage, act, p, input, s, d, err) != 0)
        return -1;
    cpu_residual_forward(act->residual_mid + off, input + off,
                         act->residual_mid + off, rows_c);
    cpu_round_stream(stage, act->residual_mid, d);
    if (cpu_norm_forward(stage, act->ln2_out, act->ln2_mean, act->ln2_rstd,
                         act->residual_mid, p->ln2_weight, p->ln2_bias, d,
                         err) != 0)
        return -1;
    cpu_matmul_forward(act->fc_out, act->ln2_out, p->fc_weight, p->fc_bias, N,
                       C, (int)d->FW);
    if (d->swiglu)
        cpu_swiglu_forward(act->fc_act, act->fc_out, N, F);
    else
        cpu_gelu_forward(act->fc_act, act->fc_out, d->N * d->F);
    if (row_parallel_forward(stage, act->output, act->fc_act,
                             p->mlp_proj_weight, p->mlp_proj_bias, d, F,
                             err) != 0)
        return -1;
    cpu_residual_forward(act->output + off, act->residual_mid + off,
                         act->output + off, rows_c);
    cpu_round_stream(stage, act->output, d);
    return 0;
}

void cpu_zero(float *buffer, size_t count)
{
    memset(buffer, 0, count * sizeof *buffer);
}

/* The gradient of a column-parallel layer's input is partial on each
 * shard (it saw some output features): sum it over the group. */
int cpu_sum_partial_input_grad(const model_stage *stage, float *d_input,
                               const stage_dims *d, pt_error *err)
{
    /* sequence parallelism: each shard keeps the sum of its rows */
    if (d->sp)
        return stage_tp_reduce_scatter_rows(stage, d_input, d->N, d->C, err);
    return stage_tp_all_reduce_sum(stage, d_input, d->N * d->C, err);
}

/* The norm's op over `rows` rows from row `row0`; d_bias NULL for
 * RMSNorm. */
static void norm_rows_backward(float *d_inp, float *d_weight, float *d_bias,
                               const float *d_out, const float *inp,
                               const float *weight, const float *mean,
                               const float *rstd, size_t row0, size_t rows,
                               const stage_dims *d)
{
    size_t off = row0 * d->C;
    if (d->rmsnorm)
        cpu_rmsnorm_backward(d_inp + off, d_weight, d_out + off, inp + off,
                             weight, rstd + row0, (int)rows, (int)d->C);
    else
        cpu_layernorm_backward(d_inp + off, d_weight, d_bias, d_out + off,
                               inp + off, weight, mean + row0, rstd + row0,
                               (int)rows, (int)d->C);
}

/* A norm's backward over the rows the shard holds. Under sequence
 * parallelism its weight (and bias) gradients come from those rows only:
 * they are summed over the shards (for this micro-batch alone) before
 * they join the accumulated ones, so every shard holds the whole. */
int cpu_norm_backward(const model_stage *stage, float *d_inp,
                      float *d_weight, float *d_bias, const float *d_out,
                      const float *inp, const float *weight,
                      const float *mean, const float *rstd,
                      backward_scratch *s, const stage_dims *d,
                      pt_error *err)
{
    size_t C = d->C;
    if (!d->sp) {
        norm_rows_backward(d_inp, d_weight, d_bias, d_out, inp, weight, mean,
                           rstd, 0, d->N, d);
        return 0;
    }
    float *partial = s->norm_partial;
    cpu_zero(partial, 2 * C);
    norm_rows_backward(d_inp, partial, partial + C, d_out, inp, weight, mean,
                       rstd, d->row0, d->rows, d);
    if (stage_tp_all_reduce_sum(stage, partial, 2 * C, err) != 0)
        return -1;
    for (size_t c = 0; c < C; c++) {
        d_weight[c] += partial[c];
        if (d_bias != NULL)
            d_bias[c] += partial[C + c];
    }
    return 0;
}

/* Under sequence parallelism, the whole of a gradient whose shard rows
 * are in `rows` (at their offset), gathered into `whole` (N x C); else
 * `rows` itself. */
const float *cpu_gathered_rows(const model_stage *stage, const float *rows,
                               float *whole, const stage_dims *d,
                               pt_error *err)
{
    if (!d->sp)
        return rows;
    size_t off = d->row0 * d->C;
    memcpy(whole + off, rows + off, d->rows * d->C * sizeof *whole);
    return stage_tp_all_gather_rows(stage, whole, d->N, d->C, err) == 0
               ? whole
               : NULL;
}

/* The MLP half's backward: from d_out (the block's output gradient; the
 * shard's rows under sequence parallelism) into s->d_mid, the gradient
 * of mid, through the skip and through the MLP. */
static int mlp_backward(const model_stage *stage, const float *d_out,
                        layer_tensors *g, const layer_tensors *p,
                        const layer_activations *act, backward_scratch *s,
                        const stage_dims *d, pt_error *err)
{
    int N = (int)d->N, C = (int)d->C, F = (int)d->F;
    size_t off = d->row0 * d->C, rows_c = d->rows * d->C;
    cpu_zero(s->d_mid, d->N * d->C);
    cpu_residual_backward(s->d_mid + off, NULL, d_out + off, rows_c);
    /* the row-parallel matmul's backward reads every row */
    const float *d_whole_out =
        cpu_gathered_rows(stage, d_out, s->d_norm, d, err);
    if (d_whole_out == NULL)
        return -1;
    cpu_zero(s->d_fc_act, d->N * d->F);
    cpu_matmul_backward(s->d_fc_act, g->mlp_proj_weight, g->mlp_proj_bias,
                        d_whole_out, act->fc_act, p->mlp_proj_weight, N, F,
                        C);
    cpu_zero(s->d_fc, d->N * d->FW);
    if (d->swiglu)
        cpu_swiglu_backward(s->d_fc, s->d_fc_act, act->fc_out, N, F);
    else
        cpu_gelu_backward(s->d_fc, s->d_fc_act, act->fc_out, d->N * d->F);
    cpu_zero(s->d_norm, d->N * d->C);
    cpu_matmul_backward(s->d_norm, g->fc_weight, g->fc_bias, s->d_fc,
                        act->ln2_out, p->fc_weight, N, C, (int)d->FW);
    if (cpu_sum_partial_input_grad(stage, s->d_norm, d, err) != 0)
        return -1;
    return cpu_norm_backward(stage, s->d_mid, g->ln2_weight, g->ln2_bias,
                             s->d_norm, act->residual_mid, p->ln2_weight,
                             act->ln2_mean, act->ln2_rstd, s, d, err);
}

/* The gradient of the qkv product from attention's: through the
 * rotation's inverse and the regrouping as the forward went. Returns
 * where it lies (s->d_qkv or s->d_qkv_raw). */
static const float *qkv_product_grad(backward_scratch *s,
                                     const stage_dims *d)
{
    if (!d->grouped_qkv)
        return s->d_qkv; /* GPT-2: neither */
    const float *heads = s->d_qkv;
    if (d->rope) {
        cpu_zero(s->d_qkv_raw, d->N * d->QW);
        cpu_rope_backward(s->d_qkv_raw, s->d_qkv, d->rope_base, (int)d->B,
                          (int)d->T, (int)d->QW, (int)(d->NH + d->KVH),
                          (int)d->hs);
        heads = s->d_qkv_raw;
    }
    float *grouped = heads == s->d_qkv ? s->d_qkv_raw : s->d_qkv;
    cpu_qkv_regroup(grouped, heads, d->N, (int)d->NH, (int)d->KVH,
                    (int)d->hs, false);
    return grouped;
}

/* The attention half's backward: from s->d_mid (every row) into d_input
 * (overwritten), through the skip and through the attention. */
static int attention_backward(const model_stage *stage, float *d_input,
                              layer_tensors *g, const layer_tensors *p,
                              const layer_activations *act,
                              const float *input, backward_scratch *s,
                              const stage_dims *d, pt_error *err)
{
    int N = (int)d->N, C = (int)d->C, A = (int)d->A;
    cpu_zero(s->d_att, d->N * d->A);
    cpu_matmul_backward(s->d_att, g->attn_proj_weight, g->attn_proj_bias,
                        s->d_mid, act->att_out, p->attn_proj_weight, N, A, C);
    cpu_zero(s->d_qkv, d->N * d->QW);
    cpu_gqa_attention_backward(s->d_qkv, s->d_att, act->qkv, act->att_probs,
                               s->attention_row, (int)d->B, (int)d->T,
                               (int)d->NH, (int)d->KVH, (int)d->hs);
    const float *d_product = qkv_product_grad(s, d);
    cpu_zero(s->d_norm, d->N * d->C);
    cpu_matmul_backward(s->d_norm, g->qkv_weight, g->qkv_bias, d_product,
                        act->ln1_out, p->qkv_weight, N, C, (int)d->QW);
    if (cpu_sum_partial_input_grad(stage, s->d_norm, d, err) != 0)
        return -1;
    return cpu_norm_backward(stage, d_input, g->ln1_weight, g->ln1_bias,
                             s->d_norm, input, p->ln1_weight, act->ln1_mean,
                             act->ln1_rstd, s, d, err);
}

/* The block's backward in reverse order of its forward. d_out is the
 * gradient of the block's output; d_input receives (is overwritten with)
 * the gradient of its input. A residual's backward hands its output
 * gradient to both inputs, so the branch's matmul reads the same buffer
 * the skip path starts from. */
int cpu_layer_backward(const model_stage *stage, float *d_input,
                       const float *d_out, layer_tensors *g,
                       const layer_tensors *p, const layer_activations *act,
                       const float *input, backward_scratch *s,
                       const stage_dims *d, pt_error *err)
{
    size_t off = d->row0 * d->C, rows_c = d->rows * d->C;
    if (mlp_backward(stage, d_out, g, p, act, s, d, err) != 0)
        return -1;
    /* mid = input + proj(attention(qkv(norm1(input)))) */
    cpu_zero(d_input, d->N * d->C);
    cpu_residual_backward(d_input + off, NULL, s->d_mid + off, rows_c);
    if (d->sp && stage_tp_all_gather_rows(stage, s->d_mid, d->N, d->C, err))
        return -1;
    return attention_backward(stage, d_input, g, p, act, input, s, d, err);
}
