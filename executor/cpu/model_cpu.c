/*
 * The cpu backend: a model stage in plain fp32 C on host memory, built
 * from the reference ops of ops_cpu.c. It is the reference the cuda
 * backend is held to (tests/executor/gpu), so it favours plain data flow
 * over speed. Here: the stage's buffers, the embedding, the head and its
 * loss, the passes over the layers and the backend's table; the layer
 * itself is layer_cpu.c.
 *
 * Memory: params and grads (the stage's parameters; under ZeRO-2/3 the
 * grads, and under ZeRO-3 the params, of the optimizer's range only,
 * beside the unit buffers of units.c), adam_m and adam_v (the
 * optimizer's range: all of them, or a ZeRO-1 shard); per activation
 * slot, one arena holding everything the backward of a micro-batch needs
 * (with full recompute, only each layer's input); per stage, one arena of
 * backward scratch shared by all slots (one backward runs at a time), with
 * full recompute also the one layer's activations it recomputes into.
 */
#include "executor/cpu/stage_cpu.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every tensor of a stage inside one parameter-sized buffer; NULL for
 * the parts the stage does not hold. */
typedef struct stage_tensors {
    float *token_embedding, *position_embedding;
    layer_tensors *layers;          /* owned: one per local layer */
    float *final_norm_weight, *final_norm_bias;
    float *head_weight;             /* lm_head_weight or token_embedding */
} stage_tensors;

/* One micro-batch in flight. */
typedef struct activation_slot {
    float *arena;                    /* owned: all the floats below */
    uint32_t *inputs;                /* owned: B x T token ids */
    uint32_t *targets;               /* owned: B x T token ids */
    float *input;                    /* N x C: embedding output or received */
    layer_activations *layers;       /* owned: one per local layer */
    float *final_out, *final_mean, *final_rstd;
    float *probs;                    /* N x V (the shard's vocabulary):
                                        logits, then probabilities, then
                                        d logits during backward */
    float *losses;                   /* N */
    const float *output;             /* the last layer's output, or input */
    int mbs;                         /* sequences of the last forward */
    bool awaiting_backward;          /* forward ran, backward not yet */
} activation_slot;

/* backend_state of a cpu stage. */
typedef struct cpu_stage_state {
    stage_tensors params;
    stage_tensors grads;
    int layer_count;                 /* local layers */
    activation_slot *slots;          /* owned: slot_count */
    backward_scratch scratch;
    /* full recompute (spec.recompute_layers): the one layer's activations
     * every forward and recomputed forward writes, inside the scratch
     * arena; its `output` is pointed at the slot's kept layer output */
    layer_activations recomputed;
    size_t activation_bytes;         /* slots, their token ids, scratch */
    cpu_units units;                 /* with stage->grads_by_unit: where
                                        grads' tensor maps point */
    cpu_units param_units;           /* with params_by_unit: params' */
} cpu_stage_state;


/* ---------------------------------------------------------- tensor maps */

/* Where tensor `index` lies: in base at its offset, or, with units, in
 * its unit's buffer. */
static float *place(const model_stage *stage, float *base,
                    const cpu_units *units, int index)
{
    size_t offset = stage->tensors[index].offset;
    return units != NULL ? cpu_units_place(units, offset)
                         : base + offset;
}

/* A layer's tensors by the name stage_parameter_layout gives them after
 * "layers.L.". */
static float **layer_field(layer_tensors *layer, const char *name)
{
    static const struct {
        const char *name;
        size_t offset;
    } fields[] = {
        {"ln1_weight", offsetof(layer_tensors, ln1_weight)},
        {"ln1_bias", offsetof(layer_tensors, ln1_bias)},
        {"attn_qkv_weight", offsetof(layer_tensors, qkv_weight)},
        {"attn_qkv_bias", offsetof(layer_tensors, qkv_bias)},
        {"attn_proj_weight", offsetof(layer_tensors, attn_proj_weight)},
        {"attn_proj_bias", offsetof(layer_tensors, attn_proj_bias)},
        {"ln2_weight", offsetof(layer_tensors, ln2_weight)},
        {"ln2_bias", offsetof(layer_tensors, ln2_bias)},
        {"mlp_fc_weight", offsetof(layer_tensors, fc_weight)},
        {"mlp_fc_bias", offsetof(layer_tensors, fc_bias)},
        {"mlp_proj_weight", offsetof(layer_tensors, mlp_proj_weight)},
        {"mlp_proj_bias", offsetof(layer_tensors, mlp_proj_bias)},
    };
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
        if (strcmp(name, fields[f].name) == 0)
            return (float **)((char *)layer + fields[f].offset);
    return NULL;
}

/* The stage's (not a layer's) tensor of that name. */
static float **stage_field(stage_tensors *tensors, const char *name)
{
    if (strcmp(name, "token_embedding") == 0)
        return &tensors->token_embedding;
    if (strcmp(name, "position_embedding") == 0)
        return &tensors->position_embedding;
    if (strcmp(name, "final_norm_weight") == 0)
        return &tensors->final_norm_weight;
    if (strcmp(name, "final_norm_bias") == 0)
        return &tensors->final_norm_bias;
    if (strcmp(name, "lm_head_weight") == 0)
        return &tensors->head_weight;
    return NULL;
}

/* Points every field at its tensor of the stage's table (which holds
 * only the tensors the model has: the others stay NULL); a tied head on
 * the embedding's stage reads the token embedding. */
static void map_tensors(const model_stage *stage, float *base,
                        const cpu_units *units, stage_tensors *out)
{
    for (int index = 0; index < stage->tensor_count; index++) {
        const char *name = stage->tensors[index].name;
        int layer = 0, skipped = 0;
        float **field = NULL;
        if (sscanf(name, "layers.%d.%n", &layer, &skipped) == 1 &&
            skipped > 0)
            field = layer_field(&out->layers[layer - stage->spec.first_layer],
                                name + skipped);
        else
            field = stage_field(out, name);
        if (field != NULL)
            *field = place(stage, base, units, index);
    }
    if (stage->spec.has_head && out->head_weight == NULL)
        out->head_weight = out->token_embedding;
}

/* ---------------------------------------------------------- allocation */


stage_dims cpu_stage_dims(const model_shape *shape, const stage_spec *spec,
                          int mbs)
{
    stage_shard shard = stage_shard_of(shape, spec);
    stage_dims dims = {
        .B = (size_t)mbs,
        .T = (size_t)shape->seq,
        .C = (size_t)shape->hidden,
        .A = (size_t)shard.attention_channels,
        .F = (size_t)shard.ffn,
        .V = (size_t)shard.vocab_count,
        .NH = (size_t)shard.heads,
        .KVH = (size_t)(model_kv_heads(shape) / shard.tp),
        .hs = (size_t)(shape->hidden / shape->heads),
        .vocab_first = shard.vocab_first,
        .tp = shard.tp,
        .rmsnorm = shape->norm == MODEL_NORM_RMSNORM,
        .norm_eps = (float)model_norm_eps(shape),
        .swiglu = shape->mlp == MODEL_MLP_SWIGLU,
        .rope = shape->positions == MODEL_POSITIONS_ROPE,
        .rope_base = shape->rope_base,
        .grouped_qkv = !model_is_gpt(shape),
    };
    dims.QW = (dims.NH + 2 * dims.KVH) * dims.hs;
    dims.FW = dims.swiglu ? 2 * dims.F : dims.F;
    dims.N = dims.B * dims.T;
    stage_sequence_rows(spec, dims.N, &dims.row0, &dims.rows);
    dims.sp = dims.rows != dims.N;
    return dims;
}

static stage_dims dims_of(const model_stage *stage, int mbs)
{
    return cpu_stage_dims(&stage->shape, &stage->spec, mbs);
}

/* A micro-batch's activations: every layer's, or with full recompute
 * only every layer's output (the next one's input). */
static void carve_slot(activation_slot *slot, arena *a, const stage_dims *d,
                       int layer_count, bool has_head, bool recompute)
{
    slot->input = arena_take(a, d->N * d->C);
    for (int l = 0; l < layer_count; l++) {
        layer_activations *act = &slot->layers[l];
        if (!recompute)
            cpu_carve_layer(act, a, d);
        act->output = arena_take(a, d->N * d->C);
    }
    if (has_head) {
        slot->final_out = arena_take(a, d->N * d->C);
        slot->final_mean = arena_take(a, d->rmsnorm ? 0 : d->N);
        slot->final_rstd = arena_take(a, d->N);
        slot->probs = arena_take(a, d->N * d->V);
        slot->losses = arena_take(a, d->N);
    }
}

static void carve_scratch(backward_scratch *s, layer_activations *recomputed,
                          arena *a, const stage_dims *d, bool recompute)
{
    if (recompute)
        cpu_carve_layer(recomputed, a, d);
    s->d_stream[0] = arena_take(a, d->N * d->C);
    s->d_stream[1] = arena_take(a, d->N * d->C);
    s->d_mid = arena_take(a, d->N * d->C);
    s->d_norm = arena_take(a, d->N * d->C);
    s->d_att = arena_take(a, d->N * d->A);
    s->d_qkv = arena_take(a, d->N * d->QW);
    s->d_qkv_raw = arena_take(a, d->grouped_qkv ? d->N * d->QW : 0);
    s->d_fc = arena_take(a, d->N * d->FW);
    s->d_fc_act = arena_take(a, d->N * d->F);
    s->attention_row = arena_take(a, d->T);
    s->row_stats = arena_take(a, 3 * d->N);
    s->output_grad = arena_take(a, d->N * d->C);
}

/* Sizes an arena with a dry run, allocates it zeroed and carves it. */
static float *allocate_slot(activation_slot *slot, const stage_dims *d,
                            int layer_count, bool has_head, bool recompute,
                            size_t *floats)
{
    arena a = {.base = NULL, .used = 0};
    carve_slot(slot, &a, d, layer_count, has_head, recompute);
    *floats = a.used;
    a.base = calloc(a.used, sizeof(float));
    if (a.base == NULL)
        return NULL;
    a.used = 0;
    carve_slot(slot, &a, d, layer_count, has_head, recompute);
    return a.base;
}

static void cpu_release(model_stage *stage)
{
    free(stage->params);
    free(stage->grads);
    free(stage->adam_m);
    free(stage->adam_v);
    stage->params = stage->grads = stage->adam_m = stage->adam_v = NULL;
    cpu_stage_state *state = stage->backend_state;
    if (state == NULL)
        return;
    cpu_units_close(&state->units);
    cpu_units_close(&state->param_units);
    if (state->slots != NULL) {
        for (int s = 0; s < stage->slot_count; s++) {
            free(state->slots[s].arena);
            free(state->slots[s].inputs);
            free(state->slots[s].targets);
            free(state->slots[s].layers);
        }
    }
    free(state->slots);
    free(state->scratch.arena);
    free(state->scratch.norm_partial);
    free(state->params.layers);
    free(state->grads.layers);
    free(state);
    stage->backend_state = NULL;
}

static int allocate_slots(model_stage *stage, cpu_stage_state *state)
{
    stage_dims d = dims_of(stage, stage->mbs_capacity);
    bool recompute = stage->spec.recompute_layers && state->layer_count > 0;
    for (int s = 0; s < stage->slot_count; s++) {
        activation_slot *slot = &state->slots[s];
        /* one extra entry so a zero-layer stage's calloc is not NULL */
        slot->layers = calloc((size_t)state->layer_count + 1,
                              sizeof *slot->layers);
        slot->inputs = calloc(d.N, sizeof *slot->inputs);
        slot->targets = calloc(d.N, sizeof *slot->targets);
        if (slot->layers == NULL || slot->inputs == NULL ||
            slot->targets == NULL)
            return -1;
        size_t floats = 0;
        slot->arena = allocate_slot(slot, &d, state->layer_count,
                                    stage->spec.has_head, recompute, &floats);
        if (slot->arena == NULL)
            return -1;
        state->activation_bytes +=
            floats * sizeof(float) + 2 * d.N * sizeof(uint32_t);
    }
    arena a = {.base = NULL, .used = 0};
    carve_scratch(&state->scratch, &state->recomputed, &a, &d, recompute);
    a.base = calloc(a.used, sizeof(float));
    if (a.base == NULL)
        return -1;
    state->activation_bytes += a.used * sizeof(float);
    state->scratch.arena = a.base;
    a.used = 0;
    carve_scratch(&state->scratch, &state->recomputed, &a, &d, recompute);
    return 0;
}

static int cpu_allocate(model_stage *stage, pt_error *err)
{
    /* offload keeps the moments in host memory of its own (offload.c) */
    size_t moments =
        (stage->spec.offload_optimizer ? 0 : stage->optimizer_count) + 1;
    /* ZeRO-2/3: the gradients, ZeRO-3 the parameters too, of the
     * optimizer's shard only (one float more: never calloc(0)) */
    stage->grads_by_unit = stage->spec.shard_gradients &&
                           stage->spec.optimizer_shards > 1;
    if (stage->grads_by_unit) {
        stage->grad_first = stage->optimizer_first;
        stage->grad_count = stage->optimizer_count;
    }
    stage->params_by_unit = stage->spec.shard_parameters &&
                            stage->spec.optimizer_shards > 1;
    if (stage->params_by_unit) {
        stage->params_first = stage->optimizer_first;
        stage->params_count = stage->optimizer_count;
    }
    stage->params = calloc(stage->params_count + 1, sizeof(float));
    stage->grads = calloc(stage->grad_count + 1, sizeof(float));
    stage->adam_m = calloc(moments, sizeof(float));
    stage->adam_v = calloc(moments, sizeof(float));
    cpu_stage_state *state = calloc(1, sizeof *state);
    stage->backend_state = state;
    if (stage->params == NULL || stage->grads == NULL ||
        stage->adam_m == NULL || stage->adam_v == NULL || state == NULL)
        goto out_of_memory;
    state->layer_count = stage->spec.last_layer - stage->spec.first_layer;
    size_t layers = (size_t)state->layer_count + 1;
    state->params.layers = calloc(layers, sizeof(layer_tensors));
    state->grads.layers = calloc(layers, sizeof(layer_tensors));
    state->slots = calloc((size_t)stage->slot_count, sizeof *state->slots);
    if (state->params.layers == NULL || state->grads.layers == NULL ||
        state->slots == NULL ||
        (stage->grads_by_unit &&
         cpu_units_open(stage, &state->units) != 0) ||
        (stage->params_by_unit &&
         cpu_units_open(stage, &state->param_units) != 0))
        goto out_of_memory;
    map_tensors(stage, stage->params,
                stage->params_by_unit ? &state->param_units : NULL,
                &state->params);
    map_tensors(stage, stage->grads,
                stage->grads_by_unit ? &state->units : NULL, &state->grads);
    state->scratch.norm_partial =
        calloc(2 * (size_t)stage->shape.hidden + 1, sizeof(float));
    if (state->scratch.norm_partial == NULL ||
        allocate_slots(stage, state) != 0)
        goto out_of_memory;
    return 0;
out_of_memory:
    cpu_release(stage);
    return pt_fail(err, "cpu backend: out of memory for a stage of %zu "
                        "parameters, micro-batch %d, %d activation slots",
                   stage->param_count, stage->mbs_capacity,
                   stage->slot_count);
}

/* -------------------------------------------------------------- forward */

/* Vocab-parallel embedding: each shard looks up the tokens of its rows
 * (zero for the others), the group sums, then the positions are added
 * (learned positions; rotary ones turn the queries and keys instead). */
static int embedding_forward(const model_stage *stage, activation_slot *slot,
                             const stage_tensors *p, const stage_dims *d,
                             pt_error *err)
{
    if (d->tp == 1) {
        cpu_embedding_forward(slot->input, slot->inputs, p->token_embedding,
                              p->position_embedding, (int)d->B, (int)d->T,
                              (int)d->C);
        return 0;
    }
    for (size_t n = 0; n < d->N; n++) {
        float *row = slot->input + n * d->C;
        long local = (long)slot->inputs[n] - d->vocab_first;
        if (local >= 0 && local < (long)d->V)
            memcpy(row, p->token_embedding + (size_t)local * d->C,
                   d->C * sizeof *row);
        else
            memset(row, 0, d->C * sizeof *row);
    }
    if (d->sp ? stage_tp_reduce_scatter_rows(stage, slot->input, d->N, d->C,
                                             err)
              : stage_tp_all_reduce_sum(stage, slot->input, d->N * d->C,
                                        err))
        return -1;
    for (size_t n = d->row0;
         p->position_embedding != NULL && n < d->row0 + d->rows; n++) {
        const float *position = p->position_embedding + (n % d->T) * d->C;
        for (size_t c = 0; c < d->C; c++)
            slot->input[n * d->C + c] += position[c];
    }
    return 0;
}

/* Vocab-parallel softmax cross-entropy over the shard's logits (N x V,
 * turned into probabilities in place): the row maxima reduced by max, the
 * exponential sums and target logits by sum, as Megatron does. */
static int vocab_parallel_loss(const model_stage *stage, activation_slot *slot,
                               float *row_stats, const stage_dims *d,
                               float *mean_loss, pt_error *err)
{
    size_t N = d->N, V = d->V;
    float *row_max = row_stats, *sums = row_stats + N,
          *target_logit = row_stats + 2 * N;
    for (size_t n = 0; n < N; n++) {
        const float *z = slot->probs + n * V;
        float max = z[0];
        for (size_t i = 1; i < V; i++)
            max = z[i] > max ? z[i] : max;
        row_max[n] = max;
        long local = (long)slot->targets[n] - d->vocab_first;
        target_logit[n] = local >= 0 && local < (long)V ? z[local] : 0.0f;
    }
    if (stage_tp_all_reduce_max(stage, row_max, N, err) != 0)
        return -1;
    for (size_t n = 0; n < N; n++) {
        float *z = slot->probs + n * V;
        double sum = 0.0;
        for (size_t i = 0; i < V; i++) {
            z[i] = expf(z[i] - row_max[n]);
            sum += z[i];
        }
        sums[n] = (float)sum;
    }
    /* sums and target logits side by side: one all-reduce */
    if (stage_tp_all_reduce_sum(stage, sums, 2 * N, err) != 0)
        return -1;
    double loss_sum = 0.0;
    for (size_t n = 0; n < N; n++) {
        float inverse = 1.0f / sums[n];
        for (size_t i = 0; i < V; i++)
            slot->probs[n * V + i] *= inverse;
        slot->losses[n] = (float)(log((double)sums[n]) -
                                  (double)(target_logit[n] - row_max[n]));
        loss_sum += slot->losses[n];
    }
    *mean_loss = (float)(loss_sum / (double)N);
    return 0;
}

/* Splits the token windows into the inputs and the shifted targets. */
static void split_tokens(activation_slot *slot, const uint32_t *tokens,
                         const stage_dims *d)
{
    for (size_t b = 0; b < d->B; b++) {
        const uint32_t *window = tokens + b * (d->T + 1);
        memcpy(slot->inputs + b * d->T, window, d->T * sizeof *window);
        memcpy(slot->targets + b * d->T, window + 1, d->T * sizeof *window);
    }
}

/* Where layer l of the slot's micro-batch has its activations: its own,
 * or with full recompute the stage's one set, writing its output into the
 * slot's kept one. */
static layer_activations *layer_kept(model_stage *stage,
                                     activation_slot *slot, int l)
{
    cpu_stage_state *state = stage->backend_state;
    if (!stage->spec.recompute_layers)
        return &slot->layers[l];
    state->recomputed.output = slot->layers[l].output;
    return &state->recomputed;
}

/* ZeRO-3: a unit's weights gathered before its forward or backward. */
static int unit_fetch(model_stage *stage, cpu_unit_kind kind, int layer,
                      pt_error *err)
{
    cpu_stage_state *state = stage->backend_state;
    return stage->params_by_unit
               ? cpu_param_units_fetch(stage, &state->param_units, kind,
                                       layer, err)
               : 0;
}

static int cpu_forward(model_stage *stage, int slot_index, const stage_io *io,
                       float *mean_loss, pt_error *err)
{
    cpu_stage_state *state = stage->backend_state;
    activation_slot *slot = &state->slots[slot_index];
    const stage_tensors *p = &state->params;
    stage_dims d = dims_of(stage, io->mbs);
    if (io->tokens != NULL)
        split_tokens(slot, io->tokens, &d);
    if (stage->spec.has_embedding) {
        if (unit_fetch(stage, CPU_UNIT_EMBEDDING, 0, err) != 0 ||
            embedding_forward(stage, slot, p, &d, err) != 0)
            return -1;
    } else if (io->input != slot->input) {
        memcpy(slot->input, io->input, d.N * d.C * sizeof(float));
    }
    cpu_round_stream(stage, slot->input, &d);
    const float *stream = slot->input;
    for (int l = 0; l < state->layer_count; l++) {
        if (unit_fetch(stage, CPU_UNIT_LAYER, l, err) != 0 ||
            cpu_layer_forward(stage, layer_kept(stage, slot, l),
                              &p->layers[l], stream, &state->scratch, &d,
                              err) != 0)
            return -1;
        stream = slot->layers[l].output;
    }
    slot->output = stream;
    *mean_loss = 0.0f;
    if (stage->spec.has_head) {
        int N = (int)d.N, C = (int)d.C, V = (int)d.V;
        if (unit_fetch(stage, CPU_UNIT_HEAD, 0, err) != 0 ||
            cpu_norm_forward(stage, slot->final_out, slot->final_mean,
                         slot->final_rstd, stream, p->final_norm_weight,
                         p->final_norm_bias, &d, err) != 0)
            return -1;
        cpu_matmul_forward(slot->probs, slot->final_out, p->head_weight, NULL,
                           N, C, V);
        if (d.tp == 1)
            *mean_loss = cpu_softmax_crossentropy_forward(
                slot->probs, slot->losses, slot->probs, slot->targets, N, V);
        else if (vocab_parallel_loss(stage, slot, state->scratch.row_stats,
                                     &d, mean_loss, err) != 0)
            return -1;
    }
    slot->mbs = io->mbs;
    slot->awaiting_backward = true;
    return 0;
}

/* ------------------------------------------------------------- backward */

/* d logits = (probs - onehot(target)) x d_loss over the shard's
 * vocabulary; a target outside the shard has no one-hot entry here. */
static void vocab_parallel_loss_backward(activation_slot *slot, float d_loss,
                                         const stage_dims *d)
{
    for (size_t n = 0; n < d->N; n++) {
        long local = (long)slot->targets[n] - d->vocab_first;
        float *row = slot->probs + n * d->V;
        for (size_t i = 0; i < d->V; i++)
            row[i] = (row[i] - ((long)i == local ? 1.0f : 0.0f)) * d_loss;
    }
}

/* Loss -> logits -> final norm: leaves d loss / d (last stream) in
 * d_stream. The loss is loss_scale x the mean over N positions, so each
 * position's loss has weight loss_scale / N. */
static int head_backward(model_stage *stage, activation_slot *slot,
                         float loss_scale, float *d_stream,
                         const stage_dims *d, pt_error *err)
{
    cpu_stage_state *state = stage->backend_state;
    const stage_tensors *p = &state->params;
    stage_tensors *g = &state->grads;
    backward_scratch *s = &state->scratch;
    int N = (int)d->N, C = (int)d->C, V = (int)d->V;
    float *d_logits = slot->probs; /* overwrites the probabilities */
    if (d->tp == 1)
        cpu_softmax_crossentropy_backward(d_logits, slot->probs,
                                          slot->targets,
                                          loss_scale / (float)N, N, V);
    else
        vocab_parallel_loss_backward(slot, loss_scale / (float)N, d);
    cpu_zero(s->d_norm, d->N * d->C);
    cpu_matmul_backward(s->d_norm, g->head_weight, NULL, d_logits,
                        slot->final_out, p->head_weight, N, C, V);
    if (cpu_sum_partial_input_grad(stage, s->d_norm, d, err) != 0)
        return -1;
    cpu_zero(d_stream, d->N * d->C);
    return cpu_norm_backward(stage, d_stream, g->final_norm_weight,
                         g->final_norm_bias, s->d_norm, slot->output,
                         p->final_norm_weight, slot->final_mean,
                         slot->final_rstd, s, d, err);
}

/* The vocab-parallel embedding's backward: the shard's rows only. */
static void embedding_backward(cpu_stage_state *state, const float *d_out,
                               const activation_slot *slot,
                               const stage_dims *d)
{
    if (d->tp == 1) {
        cpu_embedding_backward(state->grads.token_embedding,
                               state->grads.position_embedding, d_out,
                               slot->inputs, (int)d->B, (int)d->T, (int)d->C);
        return;
    }
    float *positions = state->grads.position_embedding; /* NULL: rope */
    for (size_t n = 0; n < d->N; n++) {
        const float *row = d_out + n * d->C;
        float *position =
            positions != NULL ? positions + (n % d->T) * d->C : NULL;
        long local = (long)slot->inputs[n] - d->vocab_first;
        float *token = local >= 0 && local < (long)d->V
                           ? state->grads.token_embedding +
                                 (size_t)local * d->C
                           : NULL;
        for (size_t c = 0; c < d->C; c++) {
            if (position != NULL)
                position[c] += row[c];
            if (token != NULL)
                token[c] += row[c];
        }
    }
}

/* ZeRO-2/3: a unit's gradients of this micro-batch are complete. */
static int unit_done(model_stage *stage, cpu_unit_kind kind, int layer,
                     pt_error *err)
{
    cpu_stage_state *state = stage->backend_state;
    return stage->grads_by_unit
               ? cpu_grad_units_done(stage, &state->units, kind, layer, err)
               : 0;
}

static int cpu_backward(model_stage *stage, int slot_index,
                        const stage_io *io, pt_error *err)
{
    cpu_stage_state *state = stage->backend_state;
    activation_slot *slot = &state->slots[slot_index];
    if (!slot->awaiting_backward || slot->mbs != io->mbs)
        return pt_fail(err, "cpu backend: backward of slot %d without a "
                            "forward of %d sequences before it",
                       slot_index, io->mbs);
    backward_scratch *s = &state->scratch;
    stage_dims d = dims_of(stage, io->mbs);
    const float *d_out = io->output_grad;
    int free_stream = 0;
    if (stage->spec.has_head) {
        if (unit_fetch(stage, CPU_UNIT_HEAD, 0, err) != 0 ||
            head_backward(stage, slot, io->loss_scale, s->d_stream[0], &d,
                          err) != 0 ||
            unit_done(stage, CPU_UNIT_HEAD, 0, err) != 0)
            return -1;
        d_out = s->d_stream[0];
        free_stream = 1;
    }
    for (int l = state->layer_count - 1; l >= 0; l--) {
        const float *layer_input =
            l > 0 ? slot->layers[l - 1].output : slot->input;
        float *d_input = s->d_stream[free_stream];
        layer_activations *act = layer_kept(stage, slot, l);
        if (unit_fetch(stage, CPU_UNIT_LAYER, l, err) != 0)
            return -1;
        /* full recompute: the layer's forward again, from its kept input
         * (its output is rewritten with the same values) */
        if (stage->spec.recompute_layers &&
            cpu_layer_forward(stage, act, &state->params.layers[l],
                              layer_input, s, &d, err) != 0)
            return -1;
        if (cpu_layer_backward(stage, d_input, d_out,
                               &state->grads.layers[l],
                               &state->params.layers[l], act, layer_input, s,
                               &d, err) != 0 ||
            unit_done(stage, CPU_UNIT_LAYER, l, err) != 0)
            return -1;
        d_out = d_input;
        free_stream = 1 - free_stream;
    }
    if (stage->spec.has_embedding) {
        /* the vocab-parallel lookup's rows are every row */
        d_out = cpu_gathered_rows(stage, d_out, s->d_norm, &d, err);
        if (d_out == NULL)
            return -1;
        embedding_backward(state, d_out, slot, &d);
        if (unit_done(stage, CPU_UNIT_EMBEDDING, 0, err) != 0)
            return -1;
        s->input_grad = NULL;
    } else {
        /* a stage with no layers and no head passes the gradient through;
         * copy it so the result does not point into the caller's memory */
        if (d_out != s->d_stream[0] && d_out != s->d_stream[1]) {
            memcpy(s->d_stream[0], d_out, d.N * d.C * sizeof(float));
            d_out = s->d_stream[0];
        }
        s->input_grad = d_out;
    }
    /* llm.c's recipe: what the micro-batches have accumulated is held in
     * bf16, so the next one adds to the rounded sum */
    if (stage->spec.bf16_grads)
        cpu_round_to_bf16(model_stage_buffer(stage, STAGE_GRADS),
                          model_stage_buffer_count(stage, STAGE_GRADS));
    slot->awaiting_backward = false;
    return 0;
}

/* ----------------------------------------------- buffers and optimizer */

static int cpu_copy_to_host(const model_stage *stage, stage_buffer which,
                            float *host, pt_error *err)
{
    const float *buffer = model_stage_buffer(stage, which);
    if (buffer == NULL)
        return pt_fail(err, "cpu backend: unknown buffer %d", (int)which);
    memcpy(host, buffer,
           model_stage_buffer_count(stage, which) * sizeof(float));
    return 0;
}

static int cpu_copy_from_host(model_stage *stage, stage_buffer which,
                              const float *host, pt_error *err)
{
    float *buffer = model_stage_buffer(stage, which);
    if (buffer == NULL)
        return pt_fail(err, "cpu backend: unknown buffer %d", (int)which);
    memcpy(buffer, host,
           model_stage_buffer_count(stage, which) * sizeof(float));
    return 0;
}

/* A part of params or grads (the wrappers check the range). */
static int cpu_copy_range(model_stage *stage, stage_buffer which,
                          size_t first, size_t count, float *host,
                          bool to_host, pt_error *err)
{
    (void)err;
    /* the gradients and parameters may be a shard (ZeRO-2/3) */
    size_t at = first - (which == STAGE_GRADS ? stage->grad_first
                                              : stage->params_first);
    float *part = model_stage_buffer(stage, which) + at;
    memcpy(to_host ? host : part, to_host ? part : host,
           count * sizeof(float));
    return 0;
}

static int cpu_zero_range(model_stage *stage, stage_buffer which,
                          size_t first, size_t count, pt_error *err)
{
    (void)err;
    size_t at = first - (which == STAGE_GRADS ? stage->grad_first
                                              : stage->params_first);
    cpu_zero(model_stage_buffer(stage, which) + at, count);
    return 0;
}

static int cpu_zero_grads(model_stage *stage, pt_error *err)
{
    (void)err;
    cpu_zero(stage->grads, stage->grad_count);
    if (stage->grads_by_unit) {
        cpu_stage_state *state = stage->backend_state;
        cpu_units_zero(&state->units);
    }
    return 0;
}

static float *cpu_input_buffer(model_stage *stage, int slot)
{
    cpu_stage_state *state = stage->backend_state;
    return state->slots[slot].input;
}

static const float *cpu_output(const model_stage *stage, int slot)
{
    const cpu_stage_state *state = stage->backend_state;
    return state->slots[slot].output;
}

static const float *cpu_input_grad(const model_stage *stage)
{
    const cpu_stage_state *state = stage->backend_state;
    return state->scratch.input_grad;
}

static float *cpu_output_grad_buffer(model_stage *stage)
{
    cpu_stage_state *state = stage->backend_state;
    return state->scratch.output_grad;
}

size_t cpu_stage_activation_bytes_of(const model_shape *shape,
                                     const stage_spec *spec, int mbs,
                                     int slot_count)
{
    stage_dims d = cpu_stage_dims(shape, spec, mbs);
    int layers = spec->last_layer - spec->first_layer;
    bool recompute = spec->recompute_layers && layers > 0;
    /* the dry runs of allocate_slots' carving */
    activation_slot slot = {
        .layers = calloc((size_t)layers + 1, sizeof *slot.layers)};
    if (slot.layers == NULL)
        return 0;
    arena slot_floats = {.base = NULL, .used = 0};
    carve_slot(&slot, &slot_floats, &d, layers, spec->has_head, recompute);
    free(slot.layers);
    backward_scratch scratch;
    layer_activations recomputed;
    arena scratch_floats = {.base = NULL, .used = 0};
    carve_scratch(&scratch, &recomputed, &scratch_floats, &d, recompute);
    size_t per_slot =
        slot_floats.used * sizeof(float) + 2 * d.N * sizeof(uint32_t);
    return (size_t)slot_count * per_slot +
           scratch_floats.used * sizeof(float);
}

size_t cpu_stage_activation_bytes(const model_stage *stage)
{
    if (stage->backend == NULL || stage->backend->kind != BACKEND_CPU ||
        stage->backend_state == NULL)
        return 0;
    const cpu_stage_state *state = stage->backend_state;
    return state->activation_bytes;
}

size_t cpu_stage_unit_bytes(const model_stage *stage, stage_buffer which)
{
    if (stage->backend == NULL || stage->backend->kind != BACKEND_CPU ||
        stage->backend_state == NULL)
        return 0;
    const cpu_stage_state *state = stage->backend_state;
    if (which == STAGE_GRADS && stage->grads_by_unit)
        return cpu_units_bytes(&state->units);
    if (which == STAGE_PARAMS && stage->params_by_unit)
        return cpu_units_bytes(&state->param_units);
    return 0;
}

const stage_backend cpu_stage_backend = {
    .kind = BACKEND_CPU,
    .name = "cpu",
    .allocate = cpu_allocate,
    .release = cpu_release,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .zero_grads = cpu_zero_grads,
    .grad_square_sum = cpu_backend_grad_square_sum,
    .grad_square_sums = cpu_backend_grad_square_sums,
    .adamw_step = cpu_backend_adamw_step,
    .copy_to_host = cpu_copy_to_host,
    .copy_from_host = cpu_copy_from_host,
    .input_buffer = cpu_input_buffer,
    .output = cpu_output,
    .input_grad = cpu_input_grad,
    .output_grad_buffer = cpu_output_grad_buffer,
    .copy_range = cpu_copy_range,
    .zero_range = cpu_zero_range,
};
