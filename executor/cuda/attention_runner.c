/*
 * The choice between cuDNN's fused attention and the own kernels, once
 * per shape (attention_runner.h). cuDNN is tried for head sizes that are
 * multiples of 8 up to 128 and sequences that are multiples of 128
 * (cuDNN up to 9.15 wants a padding mask for others, which the graphs of
 * attention_cudnn.c do not build), and never on cuDNN 9.10.0 or 9.10.1,
 * whose fused attention has known bugs (cudnn-frontend refuses them
 * too). In auto mode whatever cuDNN declines runs on the own kernels.
 * Grouped-query shapes (KVH < NH key/value heads) take the same choice;
 * their own path is attention_plain.cu's grouped kernels.
 */
#include "executor/cuda/attention_runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_check.h"
#ifdef PARTITA_HAVE_CUDNN
#include "executor/cuda/attention_cudnn.h"
#endif

#define RUNNER_MAX_SHAPES 8

/* A shape's path, and on the own kernels why not cuDNN. */
typedef struct shape_choice {
    int B, T, C, NH, KVH;
    bool cudnn;
    char why[sizeof(((pt_error *)0)->message)];
} shape_choice;

struct attention_runner {
    attention_mode mode;
    bool deterministic;         /* cuDNN's deterministic backward */
    size_t lendable;            /* bytes the backward's caller lends */
    shape_choice shapes[RUNNER_MAX_SHAPES];
    int shape_count;
    char description[sizeof(((pt_error *)0)->message) + 64];
#ifdef PARTITA_HAVE_CUDNN
    struct cudnn_attention *cudnn; /* made at the first shape it may run */
#endif
};

int attention_mode_from_env(attention_mode *out, pt_error *err)
{
    const char *value = getenv("PARTITA_CUDA_ATTENTION");
    *out = ATTENTION_AUTO;
    if (value == NULL || value[0] == '\0' || strcmp(value, "auto") == 0)
        return 0;
    if (strcmp(value, "own") == 0) {
        *out = ATTENTION_OWN;
        return 0;
    }
    if (strcmp(value, "cudnn") == 0) {
        *out = ATTENTION_CUDNN;
        return 0;
    }
    return pt_fail(err, "cuda backend: PARTITA_CUDA_ATTENTION=\"%s\": "
                        "expected auto, own or cudnn",
                   value);
}

bool attention_cudnn_built(void)
{
#ifdef PARTITA_HAVE_CUDNN
    return true;
#else
    return false;
#endif
}

int attention_runner_create(attention_runner **out, attention_mode mode,
                            bool deterministic, pt_error *err)
{
    *out = calloc(1, sizeof **out);
    if (*out == NULL)
        return pt_fail(err, "cuda backend: out of host memory");
    (*out)->mode = mode;
    (*out)->deterministic = deterministic;
    snprintf((*out)->description, sizeof (*out)->description,
             "no attention shape prepared yet");
    return 0;
}

void attention_runner_destroy(attention_runner *runner)
{
    if (runner == NULL)
        return;
#ifdef PARTITA_HAVE_CUDNN
    cudnn_attention_destroy(runner->cudnn);
#endif
    free(runner);
}

/* Why cuDNN is not tried for the shape (written to why), or false. */
static bool cudnn_unsuitable(const shape_choice *s, char *why, size_t size)
{
#ifdef PARTITA_HAVE_CUDNN
    int D = s->C / s->NH;
    size_t version = cudnn_attention_runtime_version();
    if (s->KVH <= 0 || s->NH % s->KVH != 0)
        snprintf(why, size, "%d query heads in groups over %d key/value "
                            "heads",
                 s->NH, s->KVH);
    else if (s->C % s->NH != 0 || D % 8 != 0 || D > 128)
        snprintf(why, size, "head size %d (cuDNN's attention is taken for "
                            "multiples of 8 up to 128)",
                 D);
    else if (s->T % 128 != 0)
        snprintf(why, size, "sequence length %d is not a multiple of 128",
                 s->T);
    else if (version == 91000 || version == 91001)
        snprintf(why, size, "cuDNN %zu.%zu.%zu has known fused-attention "
                            "bugs",
                 version / 10000, version % 10000 / 100, version % 100);
    else
        return false;
    return true;
#else
    (void)s;
    snprintf(why, size, "this build has no cuDNN (meson option cudnn)");
    return true;
#endif
}

/* Builds cuDNN's plans of the shape (setting cuDNN up first). */
static int cudnn_plan(attention_runner *runner, const shape_choice *s,
                      pt_error *err)
{
#ifdef PARTITA_HAVE_CUDNN
    if (runner->cudnn == NULL &&
        cudnn_attention_create(&runner->cudnn, runner->deterministic,
                               err) != 0)
        return -1;
    return cudnn_attention_prepare(runner->cudnn, s->B, s->T, s->NH, s->KVH,
                                   s->C / s->NH, runner->lendable, err);
#else
    (void)runner, (void)s;
    return pt_fail(err, "this build has no cuDNN");
#endif
}

static void describe(attention_runner *runner, const shape_choice *s)
{
    size_t size = sizeof runner->description;
    if (!s->cudnn) {
        snprintf(runner->description, size, "own kernels (%s); not cuDNN: %s",
                 s->KVH == s->NH ? "attention.cu"
                                 : "attention_plain.cu, grouped",
                 s->why);
        return;
    }
#ifdef PARTITA_HAVE_CUDNN
    snprintf(runner->description, size, "%s",
             cudnn_attention_describe(runner->cudnn, s->B, s->T, s->NH,
                                      s->KVH, s->C / s->NH));
#endif
}

/* Settles the shape's path: cuDNN when the mode allows, the shape suits
 * and cuDNN plans it; else the own kernels, or in cudnn mode an error. */
static int choose(attention_runner *runner, shape_choice *s, pt_error *err)
{
    if (runner->mode == ATTENTION_OWN) {
        snprintf(s->why, sizeof s->why, "PARTITA_CUDA_ATTENTION=own");
        return 0;
    }
    pt_error cudnn_err;
    if (!cudnn_unsuitable(s, s->why, sizeof s->why)) {
        if (cudnn_plan(runner, s, &cudnn_err) == 0) {
            s->cudnn = true;
            return 0;
        }
        snprintf(s->why, sizeof s->why, "%s", cudnn_err.message);
    }
    if (runner->mode == ATTENTION_AUTO)
        return 0;
    return pt_fail(err, "cuda backend: PARTITA_CUDA_ATTENTION=cudnn, but "
                        "the attention of %d x %d positions, %d heads of "
                        "%d: %s",
                   s->B, s->T, s->NH, s->C / s->NH, s->why);
}

static int decide(attention_runner *runner, int B, int T, int C, int NH,
                  int KVH, const shape_choice **out, pt_error *err)
{
    for (int i = 0; i < runner->shape_count; i++) {
        const shape_choice *s = &runner->shapes[i];
        if (s->B == B && s->T == T && s->C == C && s->NH == NH &&
            s->KVH == KVH) {
            *out = s;
            return 0;
        }
    }
    if (runner->shape_count == RUNNER_MAX_SHAPES)
        return pt_fail(err, "cuda backend: more than %d attention shapes",
                       RUNNER_MAX_SHAPES);
    shape_choice *s = &runner->shapes[runner->shape_count];
    memset(s, 0, sizeof *s);
    s->B = B, s->T = T, s->C = C, s->NH = NH, s->KVH = KVH;
    if (choose(runner, s, err) != 0)
        return -1;
    runner->shape_count++;
    describe(runner, s);
    *out = s;
    return 0;
}

int attention_runner_prepare(attention_runner *runner, int B, int T, int C,
                             int NH, size_t lendable, pt_error *err)
{
    const shape_choice *s = NULL;
    runner->lendable = lendable;
    return decide(runner, B, T, C, NH, NH, &s, err);
}

int attention_runner_uses_cudnn(attention_runner *runner, int B, int T,
                                int C, int NH, bool *out, pt_error *err)
{
    const shape_choice *s = NULL;
    if (decide(runner, B, T, C, NH, NH, &s, err) != 0)
        return -1;
    *out = s->cudnn;
    return 0;
}

int attention_runner_forward(attention_runner *runner, pt_bf16 *out,
                             float *lse, const pt_bf16 *qkv, int B, int T,
                             int C, int NH, cudaStream_t stream,
                             pt_error *err)
{
    const shape_choice *s = NULL;
    if (decide(runner, B, T, C, NH, NH, &s, err) != 0)
        return -1;
#ifdef PARTITA_HAVE_CUDNN
    if (s->cudnn)
        return cudnn_attention_forward(runner->cudnn, out, lse, qkv, B, T,
                                       NH, NH, C / NH, stream, err);
#endif
    CUDA_TRY(cuda_attention_forward(out, lse, qkv, B, T, C, NH, stream));
    return 0;
}

int attention_runner_backward(attention_runner *runner, pt_bf16 *d_qkv,
                              const pt_bf16 *d_out, const pt_bf16 *qkv,
                              const pt_bf16 *out, const float *lse,
                              float *scratch, int B, int T, int C, int NH,
                              void *lent, size_t lent_bytes,
                              cudaStream_t stream, pt_error *err)
{
    const shape_choice *s = NULL;
    if (decide(runner, B, T, C, NH, NH, &s, err) != 0)
        return -1;
#ifdef PARTITA_HAVE_CUDNN
    if (s->cudnn)
        return cudnn_attention_backward(runner->cudnn, d_qkv, d_out, qkv,
                                        out, lse, B, T, NH, NH, C / NH, lent,
                                        lent_bytes, stream, err);
#else
    (void)lent, (void)lent_bytes;
#endif
    CUDA_TRY(cuda_attention_backward(d_qkv, d_out, qkv, out, lse, scratch, B,
                                     T, C, NH, stream));
    return 0;
}

int attention_runner_prepare_gqa(attention_runner *runner, int B, int T,
                                 int NH, int KVH, int D, size_t lendable,
                                 pt_error *err)
{
    const shape_choice *s = NULL;
    runner->lendable = lendable;
    return decide(runner, B, T, NH * D, NH, KVH, &s, err);
}

int attention_runner_forward_gqa(attention_runner *runner, pt_bf16 *out,
                                 float *lse, const pt_bf16 *qkv, int B, int T,
                                 int NH, int KVH, int D, cudaStream_t stream,
                                 pt_error *err)
{
    const shape_choice *s = NULL;
    if (decide(runner, B, T, NH * D, NH, KVH, &s, err) != 0)
        return -1;
#ifdef PARTITA_HAVE_CUDNN
    if (s->cudnn)
        return cudnn_attention_forward(runner->cudnn, out, lse, qkv, B, T,
                                       NH, KVH, D, stream, err);
#endif
    CUDA_TRY(cuda_gqa_attention_forward(out, lse, qkv, B, T, NH, KVH, D,
                                        stream));
    return 0;
}

int attention_runner_backward_gqa(attention_runner *runner, pt_bf16 *d_qkv,
                                  const pt_bf16 *d_out, const pt_bf16 *qkv,
                                  const pt_bf16 *out, const float *lse,
                                  float *scratch, int B, int T, int NH,
                                  int KVH, int D, void *lent,
                                  size_t lent_bytes, cudaStream_t stream,
                                  pt_error *err)
{
    const shape_choice *s = NULL;
    if (decide(runner, B, T, NH * D, NH, KVH, &s, err) != 0)
        return -1;
#ifdef PARTITA_HAVE_CUDNN
    if (s->cudnn)
        return cudnn_attention_backward(runner->cudnn, d_qkv, d_out, qkv,
                                        out, lse, B, T, NH, KVH, D, lent,
                                        lent_bytes, stream, err);
#else
    (void)lent, (void)lent_bytes;
#endif
    CUDA_TRY(cuda_gqa_attention_backward(d_qkv, d_out, qkv, out, lse,
                                         scratch, B, T, NH, KVH, D, stream));
    return 0;
}

const char *attention_runner_describe(const attention_runner *runner)
{
    return runner != NULL ? runner->description : "no attention";
}

size_t attention_runner_device_bytes(const attention_runner *runner)
{
#ifdef PARTITA_HAVE_CUDNN
    return runner != NULL ? cudnn_attention_device_bytes(runner->cudnn) : 0;
#else
    (void)runner;
    return 0;
#endif
}
