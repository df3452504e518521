/*
 * The cpu backend's stage of a Llama-shaped model against the reference
 * Llama layer of layer_llama_cpu.c: a one-layer model's loss is the
 * composition of the token embedding, cpu_llama_layer_forward (its qkv
 * weight's rows taken from the stage's grouped order into the
 * reference's queries, keys, values order), the final RMSNorm, the
 * untied head and the cross-entropy; and exec's memory check predicts
 * the activation bytes a Llama stage allocates under tp, sequence
 * parallelism, recompute and pipeline splits.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"

#define MBS 2
#define SEQ 6

static model_shape llama_shape(int layers)
{
    model_shape shape = {.name = "llama", .layers = layers, .hidden = 16,
                         .heads = 4, .kv_heads = 2, .ffn_hidden = 24,
                         .seq = SEQ, .vocab = 13, .tied_embeddings = false,
                         .norm = MODEL_NORM_RMSNORM, .norm_eps = 1e-6,
                         .mlp = MODEL_MLP_SWIGLU,
                         .positions = MODEL_POSITIONS_ROPE,
                         .rope_base = 500.0, .bias = MODEL_BIAS_NONE};
    return shape;
}

static const float *tensor(const model_stage *stage, const char *name)
{
    const param_tensor *t = model_stage_find_tensor(stage, name);
    if (t == NULL)
        fail_msg("no tensor %s", name);
    return stage->params + t->offset;
}

/* The grouped rows (per key/value group: its query heads, its key head,
 * its value head) in the reference's order: all queries, keys, values. */
static void ungroup_rows(float *out, const float *grouped,
                         const model_shape *m)
{
    int hs = m->hidden / m->heads, kv = m->kv_heads, G = m->heads / kv;
    size_t row = (size_t)hs * m->hidden;
    for (int g = 0; g < kv; g++) {
        const float *from = grouped + (size_t)g * (G + 2) * row;
        memcpy(out + (size_t)g * G * row, from, G * row * sizeof *out);
        memcpy(out + (size_t)(m->heads + g) * row, from + G * row,
               row * sizeof *out);
        memcpy(out + (size_t)(m->heads + kv + g) * row, from + (G + 1) * row,
               row * sizeof *out);
    }
}

/* The loss by hand from the reference ops and the stage's weights. */
static float reference_loss(const model_stage *stage, const uint32_t *tokens)
{
    const model_shape *m = &stage->shape;
    int C = m->hidden, V = m->vocab, N = MBS * SEQ;
    int hs = C / m->heads;
    cpu_llama_dims d = {.B = MBS, .T = SEQ, .C = C, .heads = m->heads,
                        .kv_heads = m->kv_heads, .head_size = hs,
                        .F = m->ffn_hidden, .rope_base = m->rope_base,
                        .eps = (float)m->norm_eps};
    uint32_t inputs[MBS * SEQ], targets[MBS * SEQ];
    for (int b = 0; b < MBS; b++)
        for (int t = 0; t < SEQ; t++) {
            inputs[b * SEQ + t] = tokens[b * (SEQ + 1) + t];
            targets[b * SEQ + t] = tokens[b * (SEQ + 1) + t + 1];
        }
    size_t qkv_floats = (size_t)(m->heads + 2 * m->kv_heads) * hs * C;
    float *qkv = malloc(qkv_floats * sizeof *qkv);
    float *x = malloc((size_t)N * C * sizeof *x);
    float *acts = malloc(cpu_llama_activation_floats(&d) * sizeof *acts);
    float *normed = malloc((size_t)N * C * sizeof *normed);
    float *rstd = malloc((size_t)N * sizeof *rstd);
    float *logits = malloc((size_t)N * V * sizeof *logits);
    float *losses = malloc((size_t)N * sizeof *losses);
    assert_true(qkv && x && acts && normed && rstd && logits && losses);
    ungroup_rows(qkv, tensor(stage, "layers.0.attn_qkv_weight"), m);
    cpu_llama_weights w = {
        .attn_norm = tensor(stage, "layers.0.ln1_weight"), .qkv = qkv,
        .attn_out = tensor(stage, "layers.0.attn_proj_weight"),
        .mlp_norm = tensor(stage, "layers.0.ln2_weight"),
        .fc1 = tensor(stage, "layers.0.mlp_fc_weight"),
        .fc2 = tensor(stage, "layers.0.mlp_proj_weight")};
    cpu_llama_activations act;
    cpu_llama_activations_carve(&act, acts, &d);
    cpu_embedding_forward(x, inputs, tensor(stage, "token_embedding"), NULL,
                          MBS, SEQ, C);
    cpu_llama_layer_forward(&act, x, &w, &d);
    cpu_rmsnorm_forward(normed, rstd, act.out,
                        tensor(stage, "final_norm_weight"), d.eps, N, C);
    cpu_matmul_forward(logits, normed, tensor(stage, "lm_head_weight"), NULL,
                       N, C, V);
    float loss = cpu_softmax_crossentropy_forward(logits, losses, logits,
                                                  targets, N, V);
    free(qkv);
    free(x);
    free(acts);
    free(normed);
    free(rstd);
    free(logits);
    free(losses);
    return loss;
}

static void stage_equals_reference_layer(void **state)
{
    (void)state;
    model_shape shape = llama_shape(1);
    stage_spec whole = stage_spec_whole_model(&shape);
    model_stage stage;
    pt_error err = {{0}};
    assert_int_equal(model_stage_create(&stage, &shape, &whole, BACKEND_CPU,
                                        MBS, 1, &err), 0);
    /* spread 0.3 so that every path carries weight; norms around 1 */
    model_rng rng;
    model_rng_seed(&rng, 7);
    for (size_t i = 0; i < stage.param_count; i++)
        stage.params[i] = (float)(0.3 * model_rng_normal(&rng));
    for (int i = 0; i < stage.tensor_count; i++)
        if (strstr(stage.tensors[i].name, "norm_weight") != NULL ||
            strstr(stage.tensors[i].name, "ln") != NULL)
            for (size_t k = 0; k < stage.tensors[i].count; k++)
                stage.params[stage.tensors[i].offset + k] += 1.0f;
    uint32_t tokens[MBS * (SEQ + 1)];
    for (size_t i = 0; i < sizeof tokens / sizeof *tokens; i++)
        tokens[i] = (uint32_t)((i * 7 + 3) % (size_t)shape.vocab);
    stage_io io = {.mbs = MBS, .tokens = tokens, .loss_scale = 1.0f};
    float loss = 0.0f;
    assert_int_equal(stage_forward(&stage, 0, &io, &loss, &err), 0);
    float want = reference_loss(&stage, tokens);
    if (!(fabsf(loss - want) <= 1e-6f * want))
        fail_msg("stage loss %.9g, reference layer %.9g", loss, want);
    model_stage_destroy(&stage);
}

/* Allocation against prediction for one spec. */
static void expect_predicted(const model_shape *shape, stage_spec spec,
                             int slots)
{
    model_stage stage;
    pt_error err = {{0}};
    if (model_stage_create(&stage, shape, &spec, BACKEND_CPU, MBS, slots,
                           &err) != 0)
        fail_msg("%s", err.message);
    size_t predicted =
        cpu_stage_activation_bytes_of(shape, &spec, MBS, slots);
    assert_true(predicted > 0);
    if (cpu_stage_activation_bytes(&stage) != predicted)
        fail_msg("allocated %zu activation bytes, predicted %zu",
                 cpu_stage_activation_bytes(&stage), predicted);
    model_stage_destroy(&stage);
}

static void memory_prediction_matches(void **state)
{
    (void)state;
    model_shape shape = llama_shape(3);
    static const int partition[] = {2, 1};
    stage_spec spec = stage_spec_whole_model(&shape);
    expect_predicted(&shape, spec, 1);
    spec.recompute_layers = true;
    expect_predicted(&shape, spec, 2);
    pt_error err = {{0}};
    for (int index = 0; index < 2; index++) {
        assert_int_equal(stage_spec_from_partition(&shape, partition, 2,
                                                   index, &spec, &err), 0);
        spec.tp = 2;
        spec.tp_rank = index;
        spec.sequence_parallel = index == 1;
        expect_predicted(&shape, spec, 3);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stage_equals_reference_layer),
        cmocka_unit_test(memory_prediction_matches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
