/*
 * The CPU reference ops of the Llama-family layer, beside the GPT-2 ones
 * of ops_cpu.c: RMSNorm, SwiGLU, rotary positions and grouped-query
 * attention, forward and backward, and the qkv product's regrouping
 * between Megatron-LM's grouped order and the attention's, in plain fp32
 * C. Written to be read
 * and checked (tests/executor/model/test_llama_ops.c holds each backward
 * against finite differences); the cuda kernels of these layers are to
 * be held to them. Every backward adds into its gradient outputs (see
 * executor/cpu/cpu.h).
 */
#include "executor/cpu/cpu.h"
#include "executor/cpu/vec_cpu.h"

#include <math.h>
#include <string.h>

/* -------------------------------------------------------------- rmsnorm */

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp,
                         const float *weight, float eps, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        float square_sum = 0.0f;
        for (int c = 0; c < C; c++)
            square_sum += x[c] * x[c];
        float row_rstd = 1.0f / sqrtf(square_sum / C + eps);
        for (int c = 0; c < C; c++)
            y[c] = x[c] * row_rstd * weight[c];
        rstd[n] = row_rstd;
    }
}

/* With xhat = x rstd and g = d_out * weight, the input gradient is
 * rstd (g - xhat mean(g xhat)): layer norm's without the mean term, since
 * nothing is subtracted from the row. */
void cpu_rmsnorm_backward(float *d_inp, float *d_weight, const float *d_out,
                          const float *inp, const float *weight,
                          const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = d_out + (size_t)n * C;
        float g_xhat_mean = 0.0f;
        for (int c = 0; c < C; c++)
            g_xhat_mean += dy[c] * weight[c] * x[c] * rstd[n];
        g_xhat_mean /= C;
        for (int c = 0; c < C; c++) {
            float xhat = x[c] * rstd[n];
            float g = dy[c] * weight[c];
            if (d_inp != NULL)
                d_inp[(size_t)n * C + c] += rstd[n] * (g - xhat * g_xhat_mean);
            if (d_weight != NULL)
                d_weight[c] += dy[c] * xhat;
        }
    }
}

/* --------------------------------------------------------------- swiglu */

static float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

void cpu_swiglu_forward(float *out, const float *inp, int N, int F)
{
    for (int n = 0; n < N; n++) {
        const float *gate = inp + (size_t)n * 2 * F;
        const float *up = gate + F;
        float *y = out + (size_t)n * F;
        for (int f = 0; f < F; f++)
            y[f] = gate[f] * sigmoid(gate[f]) * up[f];
    }
}

/* silu(x) = x s(x) with s the sigmoid, whose derivative s (1 - s) makes
 * silu'(x) = s(x) (1 + x (1 - s(x))). */
void cpu_swiglu_backward(float *d_inp, const float *d_out, const float *inp,
                         int N, int F)
{
    for (int n = 0; n < N; n++) {
        const float *gate = inp + (size_t)n * 2 * F;
        const float *up = gate + F;
        const float *dy = d_out + (size_t)n * F;
        float *d_gate = d_inp + (size_t)n * 2 * F;
        float *d_up = d_gate + F;
        for (int f = 0; f < F; f++) {
            float s = sigmoid(gate[f]);
            float silu = gate[f] * s;
            d_gate[f] += dy[f] * up[f] * s * (1.0f + gate[f] * (1.0f - s));
            d_up[f] += dy[f] * silu;
        }
    }
}

/* ----------------------------------------------------------------- rope */

/* The rotation of pair i (channels i and i + head_size / 2 of a head) at
 * position t: angle t base^(-2i / head_size), taken in double so that
 * the angles of late positions (t ~ 1e4 radians) keep their fp32
 * digits. */
static void rope_angle(double base, int t, int i, int head_size,
                       float *cos_out, float *sin_out)
{
    double frequency = pow(base, -2.0 * i / head_size);
    double angle = (double)t * frequency;
    *cos_out = (float)cos(angle);
    *sin_out = (float)sin(angle);
}

/* Rotates each head of one row by the angles of position t into out:
 * sign +1 is the rotation, -1 its inverse (the transpose, which is also
 * its backward); `add` adds the result to out instead of writing it.
 * Reads both channels of a pair before writing either, so out may be x. */
static void rope_row(float *out, const float *x, double base, int t,
                     int heads, int head_size, float sign, bool add)
{
    int half = head_size / 2;
    for (int i = 0; i < half; i++) {
        float c, s;
        rope_angle(base, t, i, head_size, &c, &s);
        s *= sign;
        for (int h = 0; h < heads; h++) {
            size_t first = (size_t)h * head_size + i;
            float x1 = x[first], x2 = x[first + half];
            float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
            out[first] = add ? out[first] + y1 : y1;
            out[first + half] = add ? out[first + half] + y2 : y2;
        }
    }
}

void cpu_rope_forward(float *out, const float *inp, double base, int B,
                      int T, int width, int heads, int head_size)
{
    size_t rotated = (size_t)heads * head_size;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t row = ((size_t)b * T + t) * width;
            rope_row(out + row, inp + row, base, t, heads, head_size, 1.0f,
                     false);
            if (out != inp)
                memcpy(out + row + rotated, inp + row + rotated,
                       (width - rotated) * sizeof *out);
        }
    }
}

/* The rotation is orthogonal, so d_inp = R^T d_out: the inverse
 * rotation of d_out, added; the channels passed through pass their
 * gradient through. */
void cpu_rope_backward(float *d_inp, const float *d_out, double base, int B,
                       int T, int width, int heads, int head_size)
{
    size_t rotated = (size_t)heads * head_size;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t row = ((size_t)b * T + t) * width;
            rope_row(d_inp + row, d_out + row, base, t, heads, head_size,
                     -1.0f, true);
            for (size_t c = rotated; c < (size_t)width; c++)
                d_inp[row + c] += d_out[row + c];
        }
    }
}

/* --------------------------------------------------------- regrouping */

void cpu_qkv_regroup(float *out, const float *inp, size_t N, int NH,
                     int KVH, int head_size, bool to_heads)
{
    size_t G = (size_t)(NH / KVH), hs = (size_t)head_size;
    size_t width = ((size_t)NH + 2 * (size_t)KVH) * hs;
    for (size_t n = 0; n < N; n++) {
        const float *from = inp + n * width;
        float *to = out + n * width;
        for (size_t g = 0; g < (size_t)KVH; g++) {
            size_t grouped = g * (G + 2) * hs;
            /* where the group's query heads, key and value go */
            size_t places[3] = {g * G * hs, ((size_t)NH + g) * hs,
                                ((size_t)NH + (size_t)KVH + g) * hs};
            size_t widths[3] = {G * hs, hs, hs};
            for (int part = 0; part < 3; part++) {
                if (to_heads)
                    memcpy(to + places[part], from + grouped,
                           widths[part] * sizeof *to);
                else
                    memcpy(to + grouped, from + places[part],
                           widths[part] * sizeof *to);
                grouped += widths[part];
            }
        }
    }
}

/* ---------------------------------------------- grouped-query attention */

/* Row width of the fused projection: NH query heads, KVH key heads, KVH
 * value heads. */
static int gqa_width(int NH, int KVH, int head_size)
{
    return (NH + 2 * KVH) * head_size;
}

/* Where head `slot` of row (b, t) starts in qkv: slots 0 .. NH-1 are the
 * queries, NH .. NH+KVH-1 the keys, NH+KVH .. the values. */
static size_t gqa_index(int b, int t, int slot, int T, int width,
                        int head_size)
{
    return ((size_t)b * T + t) * width + (size_t)slot * head_size;
}

/* The same sums in the same order as cpu_attention_forward, so that
 * with KVH == NH the two agree to the bit. */
void cpu_gqa_attention_forward(float *out, float *probs, const float *qkv,
                               int B, int T, int NH, int KVH, int head_size)
{
    int width = gqa_width(NH, KVH, head_size);
    int group = NH / KVH;
    float scale = 1.0f / sqrtf((float)head_size);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int key = NH + h / group, value = NH + KVH + h / group;
            for (int t = 0; t < T; t++) {
                const float *q = qkv + gqa_index(b, t, h, T, width, head_size);
                float *row = probs + (((size_t)b * NH + h) * T + t) * T;
                float max_score = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k =
                        qkv + gqa_index(b, t2, key, T, width, head_size);
                    row[t2] = cpu_dot_product(q, k, head_size) * scale;
                    if (row[t2] > max_score)
                        max_score = row[t2];
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    row[t2] = expf(row[t2] - max_score);
                    sum += row[t2];
                }
                for (int t2 = 0; t2 <= t; t2++)
                    row[t2] /= sum;
                for (int t2 = t + 1; t2 < T; t2++)
                    row[t2] = 0.0f; /* the causal mask */
                float *o = out + ((size_t)b * T + t) * NH * head_size +
                           (size_t)h * head_size;
                memset(o, 0, (size_t)head_size * sizeof *o);
                for (int t2 = 0; t2 <= t; t2++)
                    cpu_add_scaled(
                        o, qkv + gqa_index(b, t2, value, T, width, head_size),
                        row[t2], head_size);
            }
        }
    }
}

/* As cpu_attention_backward, per query head; the key and value
 * gradients of a group's heads land on the one head they share, so
 * they sum there. */
void cpu_gqa_attention_backward(float *d_qkv, const float *d_out,
                                const float *qkv, const float *probs,
                                float *scratch, int B, int T, int NH, int KVH,
                                int head_size)
{
    int width = gqa_width(NH, KVH, head_size);
    int group = NH / KVH;
    float scale = 1.0f / sqrtf((float)head_size);
    float *d_probs = scratch;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int key = NH + h / group, value = NH + KVH + h / group;
            for (int t = 0; t < T; t++) {
                const float *row = probs + (((size_t)b * NH + h) * T + t) * T;
                const float *dy = d_out +
                                  ((size_t)b * T + t) * NH * head_size +
                                  (size_t)h * head_size;
                float weighted_sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t v = gqa_index(b, t2, value, T, width, head_size);
                    d_probs[t2] = cpu_dot_product(dy, qkv + v, head_size);
                    weighted_sum += row[t2] * d_probs[t2];
                    cpu_add_scaled(d_qkv + v, dy, row[t2], head_size);
                }
                size_t q = gqa_index(b, t, h, T, width, head_size);
                for (int t2 = 0; t2 <= t; t2++) {
                    float d_score =
                        row[t2] * (d_probs[t2] - weighted_sum) * scale;
                    size_t k = gqa_index(b, t2, key, T, width, head_size);
                    cpu_add_scaled(d_qkv + q, qkv + k, d_score, head_size);
                    cpu_add_scaled(d_qkv + k, qkv + q, d_score, head_size);
                }
            }
        }
    }
}
