/*
 * One Llama-family transformer layer on the CPU, forward and backward,
 * composed from the reference ops (ops_cpu.c, ops_llama_cpu.c):
 *
 *   h   = x + Wo GQA(RoPE(Wqkv RMSNorm(x)))
 *   out = h + W2 SwiGLU(W1 RMSNorm(h))
 *
 * with no biases. The whole layer is what the cpu backend's model is to
 * run for a Llama shape and what the cuda layer is to be held to; it is
 * checked against finite differences as one function
 * (tests/executor/model/test_llama_layer.c).
 */
#include "executor/cpu/cpu.h"

#include <string.h>

/* Query, key and value heads side by side: the fused projection's
 * width. */
static int qkv_width(const cpu_llama_dims *d)
{
    return (d->heads + 2 * d->kv_heads) * d->head_size;
}

size_t cpu_llama_activation_floats(const cpu_llama_dims *d)
{
    size_t N = (size_t)d->B * d->T;
    size_t attention = (size_t)d->heads * d->head_size;
    return N * (4 * (size_t)d->C + 2 + (size_t)qkv_width(d) + attention +
                3 * (size_t)d->F) +
           (size_t)d->B * d->heads * d->T * d->T;
}

void cpu_llama_activations_carve(cpu_llama_activations *act, float *floats,
                                 const cpu_llama_dims *d)
{
    size_t N = (size_t)d->B * d->T, C = (size_t)d->C;
    act->attn_norm = floats;
    act->attn_rstd = act->attn_norm + N * C;
    act->qkv = act->attn_rstd + N;
    act->attention = act->qkv + N * qkv_width(d);
    act->probs = act->attention + N * d->heads * d->head_size;
    act->residual = act->probs + (size_t)d->B * d->heads * d->T * d->T;
    act->mlp_norm = act->residual + N * C;
    act->mlp_rstd = act->mlp_norm + N * C;
    act->fc1 = act->mlp_rstd + N;
    act->swiglu = act->fc1 + N * 2 * d->F;
    act->out = act->swiglu + N * d->F;
}

void cpu_llama_layer_forward(cpu_llama_activations *act, const float *inp,
                             const cpu_llama_weights *w,
                             const cpu_llama_dims *d)
{
    int N = d->B * d->T, C = d->C, W = qkv_width(d);
    int attention = d->heads * d->head_size;
    cpu_rmsnorm_forward(act->attn_norm, act->attn_rstd, inp, w->attn_norm,
                        d->eps, N, C);
    cpu_matmul_forward(act->qkv, act->attn_norm, w->qkv, NULL, N, C, W);
    /* queries and keys turned in place; the values pass */
    cpu_rope_forward(act->qkv, act->qkv, d->rope_base, d->B, d->T, W,
                     d->heads + d->kv_heads, d->head_size);
    cpu_gqa_attention_forward(act->attention, act->probs, act->qkv, d->B,
                              d->T, d->heads, d->kv_heads, d->head_size);
    /* the projection back lands in out, free until the MLP's turn */
    cpu_matmul_forward(act->out, act->attention, w->attn_out, NULL, N,
                       attention, C);
    cpu_residual_forward(act->residual, inp, act->out, (size_t)N * C);
    cpu_rmsnorm_forward(act->mlp_norm, act->mlp_rstd, act->residual,
                        w->mlp_norm, d->eps, N, C);
    cpu_matmul_forward(act->fc1, act->mlp_norm, w->fc1, NULL, N, C,
                       2 * d->F);
    cpu_swiglu_forward(act->swiglu, act->fc1, N, d->F);
    cpu_matmul_forward(act->out, act->swiglu, w->fc2, NULL, N, d->F, C);
    cpu_residual_forward(act->out, act->residual, act->out, (size_t)N * C);
}

size_t cpu_llama_scratch_floats(const cpu_llama_dims *d)
{
    size_t N = (size_t)d->B * d->T;
    return N * (2 * (size_t)d->C + 3 * (size_t)d->F +
                (size_t)d->heads * d->head_size + 2 * (size_t)qkv_width(d)) +
           (size_t)d->T;
}

/* The scratch's parts; each backward below zeroes what it adds into. */
typedef struct llama_scratch {
    float *d_residual, *d_norm, *d_swiglu, *d_fc1, *d_attention;
    float *d_qkv, *d_qkv_raw, *attention_rows;
} llama_scratch;

static llama_scratch carve_scratch(float *floats, const cpu_llama_dims *d)
{
    size_t N = (size_t)d->B * d->T, C = (size_t)d->C;
    llama_scratch s;
    s.d_residual = floats;
    s.d_norm = s.d_residual + N * C;
    s.d_swiglu = s.d_norm + N * C;
    s.d_fc1 = s.d_swiglu + N * d->F;
    s.d_attention = s.d_fc1 + N * 2 * d->F;
    s.d_qkv = s.d_attention + N * d->heads * d->head_size;
    s.d_qkv_raw = s.d_qkv + N * qkv_width(d);
    s.attention_rows = s.d_qkv_raw + N * qkv_width(d);
    return s;
}

/* The MLP half: from d_out (the layer's output gradient) into
 * s->d_residual, which also takes d_out through the skip. */
static void mlp_backward(llama_scratch *s, cpu_llama_grads *g,
                         const float *d_out, const cpu_llama_activations *act,
                         const cpu_llama_weights *w, const cpu_llama_dims *d)
{
    int N = d->B * d->T, C = d->C, F = d->F;
    memset(s->d_residual, 0, (size_t)N * C * sizeof(float));
    memset(s->d_norm, 0, (size_t)N * C * sizeof(float));
    memset(s->d_swiglu, 0, (size_t)N * F * sizeof(float));
    memset(s->d_fc1, 0, (size_t)N * 2 * F * sizeof(float));
    cpu_residual_backward(s->d_residual, NULL, d_out, (size_t)N * C);
    cpu_matmul_backward(s->d_swiglu, g->fc2, NULL, d_out,
                        act->swiglu, w->fc2, N, F, C);
    cpu_swiglu_backward(s->d_fc1, s->d_swiglu, act->fc1, N, F);
    cpu_matmul_backward(s->d_norm, g->fc1, NULL, s->d_fc1,
                        act->mlp_norm, w->fc1, N, C, 2 * F);
    cpu_rmsnorm_backward(s->d_residual, g->mlp_norm, s->d_norm,
                         act->residual, w->mlp_norm, act->mlp_rstd, N, C);
}

/* The attention half: from s->d_residual into d_inp (skip and norm). */
static void attention_backward(llama_scratch *s, float *d_inp,
                               cpu_llama_grads *g, const float *inp,
                               const cpu_llama_activations *act,
                               const cpu_llama_weights *w,
                               const cpu_llama_dims *d)
{
    int N = d->B * d->T, C = d->C, W = qkv_width(d);
    int attention = d->heads * d->head_size;
    memset(s->d_norm, 0, (size_t)N * C * sizeof(float));
    memset(s->d_attention, 0, (size_t)N * attention * sizeof(float));
    memset(s->d_qkv, 0, (size_t)N * W * sizeof(float));
    memset(s->d_qkv_raw, 0, (size_t)N * W * sizeof(float));
    cpu_residual_backward(d_inp, NULL, s->d_residual, (size_t)N * C);
    cpu_matmul_backward(s->d_attention, g->attn_out, NULL,
                        s->d_residual, act->attention, w->attn_out, N,
                        attention, C);
    cpu_gqa_attention_backward(s->d_qkv, s->d_attention, act->qkv,
                               act->probs, s->attention_rows, d->B, d->T,
                               d->heads, d->kv_heads, d->head_size);
    cpu_rope_backward(s->d_qkv_raw, s->d_qkv, d->rope_base, d->B, d->T, W,
                      d->heads + d->kv_heads, d->head_size);
    cpu_matmul_backward(s->d_norm, g->qkv, NULL, s->d_qkv_raw,
                        act->attn_norm, w->qkv, N, C, W);
    cpu_rmsnorm_backward(d_inp, g->attn_norm, s->d_norm, inp,
                         w->attn_norm, act->attn_rstd, N, C);
}

void cpu_llama_layer_backward(float *d_inp, cpu_llama_grads *grads,
                              const float *d_out, const float *inp,
                              const cpu_llama_activations *act,
                              const cpu_llama_weights *weights,
                              float *scratch, const cpu_llama_dims *d)
{
    llama_scratch s = carve_scratch(scratch, d);
    mlp_backward(&s, grads, d_out, act, weights, d);
    attention_backward(&s, d_inp, grads, inp, act, weights, d);
}
