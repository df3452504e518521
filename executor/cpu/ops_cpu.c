/*
 * The CPU reference ops: forward and backward of each layer kind, and the
 * AdamW update, in plain fp32 C. Written to be read and checked (tests/executor/model/test_ops.c
 * holds each backward against finite differences); the matmul, where the
 * time goes, is blocked for the cache and written so the compiler can
 * vectorise it, but no more. Every backward adds into its gradient
 * outputs (see executor/cpu/cpu.h).
 */
#include "executor/cpu/cpu.h"
#include "executor/cpu/vec_cpu.h"

#include <math.h>
#include <string.h>

#define LAYERNORM_EPS 1e-5f

/* ------------------------------------------------------------ embedding */

void cpu_embedding_forward(float *out, const uint32_t *tokens,
                           const float *token_embedding,
                           const float *position_embedding, int B, int T,
                           int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)b * T + t;
            const float *token_row =
                token_embedding + (size_t)tokens[row] * C;
            float *out_row = out + row * C;
            if (position_embedding == NULL) {
                memcpy(out_row, token_row, (size_t)C * sizeof *out_row);
                continue;
            }
            const float *position_row = position_embedding + (size_t)t * C;
            for (int c = 0; c < C; c++)
                out_row[c] = token_row[c] + position_row[c];
        }
    }
}

void cpu_embedding_backward(float *d_token_embedding,
                            float *d_position_embedding, const float *d_out,
                            const uint32_t *tokens, int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)b * T + t;
            const float *d_out_row = d_out + row * C;
            if (d_token_embedding != NULL)
                cpu_add_scaled(d_token_embedding + (size_t)tokens[row] * C,
                               d_out_row, 1.0f, C);
            if (d_position_embedding != NULL)
                cpu_add_scaled(d_position_embedding + (size_t)t * C,
                               d_out_row, 1.0f, C);
        }
    }
}

/* ------------------------------------------------------------ layernorm */

void cpu_layernorm_forward(float *out, float *mean, float *rstd,
                           const float *inp, const float *weight,
                           const float *bias, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        float sum = 0.0f;
        for (int c = 0; c < C; c++)
            sum += x[c];
        float row_mean = sum / C;
        float square_sum = 0.0f;
        for (int c = 0; c < C; c++) {
            float centred = x[c] - row_mean;
            square_sum += centred * centred;
        }
        float row_rstd = 1.0f / sqrtf(square_sum / C + LAYERNORM_EPS);
        for (int c = 0; c < C; c++)
            y[c] = (x[c] - row_mean) * row_rstd * weight[c] + bias[c];
        mean[n] = row_mean;
        rstd[n] = row_rstd;
    }
}

/* With xhat = (x - mean) rstd and g = d_out * weight, the input gradient
 * is rstd (g - mean(g) - xhat mean(g xhat)): the two means are what the
 * normalisation's dependence on every element of the row contributes. */
void cpu_layernorm_backward(float *d_inp, float *d_weight, float *d_bias,
                            const float *d_out, const float *inp,
                            const float *weight, const float *mean,
                            const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = d_out + (size_t)n * C;
        float g_mean = 0.0f;
        float g_xhat_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - mean[n]) * rstd[n];
            float g = dy[c] * weight[c];
            g_mean += g;
            g_xhat_mean += g * xhat;
        }
        g_mean /= C;
        g_xhat_mean /= C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - mean[n]) * rstd[n];
            float g = dy[c] * weight[c];
            if (d_inp != NULL)
                d_inp[(size_t)n * C + c] +=
                    rstd[n] * (g - g_mean - xhat * g_xhat_mean);
            if (d_weight != NULL)
                d_weight[c] += dy[c] * xhat;
            if (d_bias != NULL)
                d_bias[c] += dy[c];
        }
    }
}

/* --------------------------------------------------------------- matmul */

/* Output channels handled together: their weight rows (32 x C floats)
 * stay in cache while every input row passes over them. */
#define MATMUL_BLOCK 32

void cpu_matmul_forward(float *out, const float *inp, const float *weight,
                        const float *bias, int N, int C, int OC)
{
    for (int block = 0; block < OC; block += MATMUL_BLOCK) {
        int block_end = block + MATMUL_BLOCK < OC ? block + MATMUL_BLOCK : OC;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            float *y = out + (size_t)n * OC;
            for (int o = block; o < block_end; o++) {
                float start = bias != NULL ? bias[o] : 0.0f;
                y[o] = start + cpu_dot_product(x, weight + (size_t)o * C, C);
            }
        }
    }
}

/* d_inp = d_out weight, d_weight = d_out^T inp, d_bias = column sums of
 * d_out; both matrix products run as row updates (y += a x), which
 * vectorise, over the same blocks of weight rows as the forward. */
void cpu_matmul_backward(float *d_inp, float *d_weight, float *d_bias,
                         const float *d_out, const float *inp,
                         const float *weight, int N, int C, int OC)
{
    for (int block = 0; block < OC; block += MATMUL_BLOCK) {
        int block_end = block + MATMUL_BLOCK < OC ? block + MATMUL_BLOCK : OC;
        for (int n = 0; n < N; n++) {
            const float *dy = d_out + (size_t)n * OC;
            const float *x = inp + (size_t)n * C;
            for (int o = block; o < block_end; o++) {
                if (d_inp != NULL)
                    cpu_add_scaled(d_inp + (size_t)n * C,
                                   weight + (size_t)o * C, dy[o], C);
                if (d_weight != NULL)
                    cpu_add_scaled(d_weight + (size_t)o * C, x, dy[o], C);
            }
        }
    }
    if (d_bias != NULL)
        for (int n = 0; n < N; n++)
            cpu_add_scaled(d_bias, d_out + (size_t)n * OC, 1.0f, OC);
}

/* ------------------------------------------------------------ attention */

/* Multi-head attention is grouped-query attention with a key/value head
 * per query head (ops_llama_cpu.c): the same layout (queries, keys,
 * values side by side, C = NH head_size) and the same sums, so one
 * reference serves both layers. */
void cpu_attention_forward(float *out, float *probs, const float *qkv,
                           int B, int T, int C, int NH)
{
    cpu_gqa_attention_forward(out, probs, qkv, B, T, NH, NH, C / NH);
}

void cpu_attention_backward(float *d_qkv, const float *d_out,
                            const float *qkv, const float *probs,
                            float *scratch, int B, int T, int C, int NH)
{
    cpu_gqa_attention_backward(d_qkv, d_out, qkv, probs, scratch, B, T, NH,
                               NH, C / NH);
}

/* ----------------------------------------------------------------- gelu */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

void cpu_gelu_forward(float *out, const float *inp, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float x = inp[i];
        float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(inner));
    }
}

void cpu_gelu_backward(float *d_inp, const float *d_out, const float *inp,
                       size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float x = inp[i];
        float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        float tanh_inner = tanhf(inner);
        float d_inner = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
        float sech_squared = 1.0f - tanh_inner * tanh_inner;
        float derivative =
            0.5f * (1.0f + tanh_inner) + 0.5f * x * sech_squared * d_inner;
        d_inp[i] += derivative * d_out[i];
    }
}

/* ------------------------------------------------------------- residual */

void cpu_residual_forward(float *out, const float *a, const float *b,
                          size_t count)
{
    for (size_t i = 0; i < count; i++)
        out[i] = a[i] + b[i];
}

void cpu_residual_backward(float *d_a, float *d_b, const float *d_out,
                           size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (d_a != NULL)
            d_a[i] += d_out[i];
        if (d_b != NULL)
            d_b[i] += d_out[i];
    }
}

/* ------------------------------------------------------------- bfloat16 */

void cpu_round_to_bf16(float *values, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &values[i], sizeof bits);
        if ((bits & 0x7f800000u) == 0x7f800000u)
            continue; /* NaN, infinity: rounding could carry into them */
        bits += 0x7fffu + ((bits >> 16) & 1u);
        bits &= 0xffff0000u;
        memcpy(&values[i], &bits, sizeof bits);
    }
}

/* ------------------------------------------- softmax + cross-entropy */

/* The loss is taken as log(sum exp(z - max)) - (z_target - max) rather
 * than -log(prob), so that a tiny probability cannot round to 0 and give
 * an infinite loss. */
float cpu_softmax_crossentropy_forward(float *probs, float *losses,
                                       const float *logits,
                                       const uint32_t *targets, int N, int V)
{
    double loss_sum = 0.0;
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float max_logit = z[0];
        for (int i = 1; i < V; i++)
            if (z[i] > max_logit)
                max_logit = z[i];
        float target_logit = z[targets[n]];
        double sum = 0.0;
        for (int i = 0; i < V; i++) {
            p[i] = expf(z[i] - max_logit); /* may overwrite z when p == z */
            sum += p[i];
        }
        float inverse = (float)(1.0 / sum);
        for (int i = 0; i < V; i++)
            p[i] *= inverse;
        losses[n] = (float)(log(sum) - (double)(target_logit - max_logit));
        loss_sum += losses[n];
    }
    return (float)(loss_sum / N);
}

void cpu_softmax_crossentropy_backward(float *d_logits, const float *probs,
                                       const uint32_t *targets, float d_loss,
                                       int N, int V)
{
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = d_logits + (size_t)n * V;
        for (int i = 0; i < V; i++) {
            float indicator = (uint32_t)i == targets[n] ? 1.0f : 0.0f;
            d[i] = (p[i] - indicator) * d_loss;
        }
    }
}

/* Decoupled weight decay (Loshchilov and Hutter): the decay shrinks the
 * parameter directly, scaled by the learning rate, instead of entering the
 * gradient and being rescaled by the second moment. */
void cpu_adamw_update(float *params, const float *grads, float *m, float *v,
                      size_t count, const adamw_config *config,
                      float learning_rate, float grad_scale, long step,
                      bool decay)
{
    float first_correction = (float)(1.0 - pow(config->beta1, (double)step));
    float second_correction = (float)(1.0 - pow(config->beta2, (double)step));
    float weight_decay = decay ? config->weight_decay : 0.0f;
    for (size_t i = 0; i < count; i++) {
        float g = grads[i] * grad_scale;
        m[i] = config->beta1 * m[i] + (1.0f - config->beta1) * g;
        v[i] = config->beta2 * v[i] + (1.0f - config->beta2) * g * g;
        float m_hat = m[i] / first_correction;
        float v_hat = v[i] / second_correction;
        params[i] -= learning_rate *
                     (m_hat / (sqrtf(v_hat) + config->eps) +
                      weight_decay * params[i]);
    }
}
