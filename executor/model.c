/*
 * The backend-independent half of a model stage: which tensors it holds
 * and where they sit in its one parameter buffer, creation and release,
 * and the checked wrappers that dispatch to the backend.
 */
#ifdef PARTITA_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#endif
#include "executor/executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/backends.h"

float *model_stage_buffer(const model_stage *stage, stage_buffer which)
{
    switch (which) {
    case STAGE_PARAMS:
        return stage->params;
    case STAGE_GRADS:
        return stage->grads;
    case STAGE_ADAM_M:
        return stage->adam_m;
    case STAGE_ADAM_V:
        return stage->adam_v;
    }
    return NULL;
}

const char *backend_name(backend_kind kind)
{
    return kind == BACKEND_CUDA ? "cuda" : "cpu";
}

int backend_parse(const char *text, backend_kind *out, pt_error *err)
{
    if (strcmp(text, "cpu") == 0) {
        *out = BACKEND_CPU;
        return 0;
    }
    if (strcmp(text, "cuda") == 0) {
        *out = BACKEND_CUDA;
        return 0;
    }
    return pt_fail(err, "unknown backend \"%s\" (expected \"cpu\" or "
                        "\"cuda\")",
                   text);
}

const stage_backend *backend_find(backend_kind kind, pt_error *err)
{
    if (kind == BACKEND_CPU)
        return &cpu_stage_backend;
#ifdef PARTITA_HAVE_CUDA
    if (kind == BACKEND_CUDA)
        return cuda_stage_backend();
#endif
    pt_fail(err, "the %s backend is not built in this binary (meson "
                 "option cuda, needs nvcc)",
            backend_name(kind));
    return NULL;
}

/* ---------------------------------------------------------------- specs */

stage_spec stage_spec_whole_model(const model_shape *shape)
{
    stage_spec spec = {
        .first_layer = 0,
        .last_layer = shape->layers,
        .has_embedding = true,
        .has_head = true,
    };
    return spec;
}

int stage_spec_from_partition(const model_shape *shape,
                              const int *layers_per_stage, int stage_count,
                              int stage_index, stage_spec *out,
                              pt_error *err)
{
    if (stage_count < 1)
        return pt_fail(err, "partition: needs at least one stage, got %d",
                       stage_count);
    if (stage_index < 0 || stage_index >= stage_count)
        return pt_fail(err, "partition: stage %d does not exist (%d stages)",
                       stage_index, stage_count);
    long total = 0;
    long first = 0;
    for (int s = 0; s < stage_count; s++) {
        if (layers_per_stage[s] < 0)
            return pt_fail(err, "partition: stage %d has %d layers", s,
                           layers_per_stage[s]);
        if (s == stage_index)
            first = total;
        total += layers_per_stage[s];
    }
    if (total != shape->layers)
        return pt_fail(err, "partition: stages hold %ld layers, the model "
                            "has %d",
                       total, shape->layers);
    out->first_layer = (int)first;
    out->last_layer = (int)first + layers_per_stage[stage_index];
    out->has_embedding = stage_index == 0;
    out->has_head = stage_index == stage_count - 1;
    return 0;
}

/* --------------------------------------------------------------- layout */

static int check_shape_and_spec(const model_shape *shape,
                                const stage_spec *spec, pt_error *err)
{
    if (shape->layers < 0 || shape->hidden < 1 || shape->heads < 1 ||
        shape->ffn_hidden < 1 || shape->seq < 1 || shape->vocab < 1)
        return pt_fail(err, "model %s: layers must be >= 0 and hidden, "
                            "heads, ffn_hidden, seq, vocab >= 1",
                       shape->name);
    if (shape->hidden % shape->heads != 0)
        return pt_fail(err, "model %s: hidden %d is not divisible by %d "
                            "heads",
                       shape->name, shape->hidden, shape->heads);
    if (spec->first_layer < 0 || spec->last_layer < spec->first_layer ||
        spec->last_layer > shape->layers)
        return pt_fail(err, "model %s: stage layers [%d, %d) do not lie in "
                            "[0, %d]",
                       shape->name, spec->first_layer, spec->last_layer,
                       shape->layers);
    return 0;
}

/* Collects the tensor table; `out` may be NULL to count only. */
typedef struct layout_builder {
    param_tensor *out;
    int count;
    size_t floats;
} layout_builder;

static void add_tensor(layout_builder *builder, const char *name, int rows,
                       int cols, bool weight_decay, bool tied_copy)
{
    size_t count = (size_t)rows * (size_t)cols;
    if (builder->out != NULL) {
        param_tensor *tensor = &builder->out[builder->count];
        memset(tensor, 0, sizeof *tensor);
        pt_copy_string(tensor->name, sizeof tensor->name, name);
        tensor->offset = builder->floats;
        tensor->count = count;
        tensor->rows = rows;
        tensor->cols = cols;
        tensor->weight_decay = weight_decay;
        tensor->tied_copy = tied_copy;
    }
    builder->count++;
    builder->floats += count;
}

/* A matrix (decayed) and its bias (not decayed). */
static void add_linear(layout_builder *builder, int layer, const char *part,
                       int out_features, int in_features)
{
    char name[PT_NAME_MAX];
    snprintf(name, sizeof name, "layers.%d.%s_weight", layer, part);
    add_tensor(builder, name, out_features, in_features, true, false);
    snprintf(name, sizeof name, "layers.%d.%s_bias", layer, part);
    add_tensor(builder, name, 1, out_features, false, false);
}

/* A layer norm's weight and bias (neither decayed): "layers.L.PART_..."
 * inside a layer, "PART_..." for the final norm (layer < 0). */
static void add_layernorm(layout_builder *builder, int layer,
                          const char *part, int hidden)
{
    char weight[PT_NAME_MAX], bias[PT_NAME_MAX];
    if (layer >= 0) {
        snprintf(weight, sizeof weight, "layers.%d.%s_weight", layer, part);
        snprintf(bias, sizeof bias, "layers.%d.%s_bias", layer, part);
    } else {
        snprintf(weight, sizeof weight, "%s_weight", part);
        snprintf(bias, sizeof bias, "%s_bias", part);
    }
    add_tensor(builder, weight, 1, hidden, false, false);
    add_tensor(builder, bias, 1, hidden, false, false);
}

int stage_parameter_layout(const model_shape *shape, const stage_spec *spec,
                           param_tensor *out, size_t *total_floats,
                           pt_error *err)
{
    if (check_shape_and_spec(shape, spec, err) != 0)
        return -1;
    int hidden = shape->hidden;
    layout_builder builder = {.out = out, .count = 0, .floats = 0};
    if (spec->has_embedding) {
        add_tensor(&builder, "token_embedding", shape->vocab, hidden, true,
                   false);
        add_tensor(&builder, "position_embedding", shape->seq, hidden, true,
                   false);
    }
    for (int layer = spec->first_layer; layer < spec->last_layer; layer++) {
        add_layernorm(&builder, layer, "ln1", hidden);
        add_linear(&builder, layer, "attn_qkv", 3 * hidden, hidden);
        add_linear(&builder, layer, "attn_proj", hidden, hidden);
        add_layernorm(&builder, layer, "ln2", hidden);
        add_linear(&builder, layer, "mlp_fc", shape->ffn_hidden, hidden);
        add_linear(&builder, layer, "mlp_proj", hidden, shape->ffn_hidden);
    }
    if (spec->has_head) {
        add_layernorm(&builder, -1, "final_norm", hidden);
        /* A tied head reads the token embedding; when that sits on another
         * stage this stage keeps its own copy, kept equal by summing the
         * two gradients (Megatron's embedding all-reduce). */
        bool tied = shape->tied_embeddings;
        if (!tied || !spec->has_embedding)
            add_tensor(&builder, "lm_head_weight", shape->vocab, hidden, true,
                       tied);
    }
    if (total_floats != NULL)
        *total_floats = builder.floats;
    return builder.count;
}

/* --------------------------------------------------------------- stages */

void model_stage_destroy(model_stage *stage)
{
    if (stage->backend != NULL)
        stage->backend->release(stage);
    free(stage->tensors);
    memset(stage, 0, sizeof *stage);
}

int model_stage_create(model_stage *out, const model_shape *shape,
                       const stage_spec *spec, backend_kind kind,
                       int mbs_capacity, int slot_count, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (mbs_capacity < 1 || slot_count < 1)
        return pt_fail(err, "model stage: micro-batch capacity (%d) and "
                            "activation slots (%d) must be >= 1",
                       mbs_capacity, slot_count);
    const stage_backend *backend = backend_find(kind, err);
    if (backend == NULL)
        return -1;
    size_t floats = 0;
    int count = stage_parameter_layout(shape, spec, NULL, &floats, err);
    if (count < 0)
        return -1;
    out->shape = *shape;
    out->spec = *spec;
    out->mbs_capacity = mbs_capacity;
    out->slot_count = slot_count;
    out->tensor_count = count;
    out->param_count = floats;
    /* calloc(0) may return NULL: keep one entry so NULL means failure. */
    out->tensors = calloc((size_t)count + 1, sizeof *out->tensors);
    if (out->tensors == NULL)
        return pt_fail(err, "model stage: out of memory for %d tensors",
                       count);
    stage_parameter_layout(shape, spec, out->tensors, NULL, err);
    out->backend = backend;
    if (backend->allocate(out, err) != 0) {
        model_stage_destroy(out);
        return -1;
    }
    return 0;
}

const param_tensor *model_stage_find_tensor(const model_stage *stage,
                                            const char *name)
{
    for (int i = 0; i < stage->tensor_count; i++)
        if (strcmp(stage->tensors[i].name, name) == 0)
            return &stage->tensors[i];
    return NULL;
}

int model_stage_read(const model_stage *stage, stage_buffer which,
                     float *host, pt_error *err)
{
    return stage->backend->copy_to_host(stage, which, host, err);
}

int model_stage_write(model_stage *stage, stage_buffer which,
                      const float *host, pt_error *err)
{
    return stage->backend->copy_from_host(stage, which, host, err);
}

/* ------------------------------------------------- forward and backward */

static int check_io(const model_stage *stage, int slot, const stage_io *io,
                    bool forward, pt_error *err)
{
    if (slot < 0 || slot >= stage->slot_count)
        return pt_fail(err, "stage: activation slot %d does not exist (%d "
                            "slots)",
                       slot, stage->slot_count);
    if (io->mbs < 1 || io->mbs > stage->mbs_capacity)
        return pt_fail(err, "stage: micro-batch of %d sequences, capacity "
                            "is %d",
                       io->mbs, stage->mbs_capacity);
    bool needs_tokens = stage->spec.has_embedding || stage->spec.has_head;
    if (needs_tokens && io->tokens == NULL)
        return pt_fail(err, "stage: tokens are required by a stage with the "
                            "embedding or the head");
    if (forward && !stage->spec.has_embedding && io->input == NULL)
        return pt_fail(err, "stage: forward of a stage without the "
                            "embedding needs an input activation");
    if (!forward && !stage->spec.has_head && io->output_grad == NULL)
        return pt_fail(err, "stage: backward of a stage without the head "
                            "needs the output gradient");
    if (!needs_tokens)
        return 0;
    /* Only the rows a stage reads need be valid: inputs for the
     * embedding, targets for the head; check those that will be read. */
    size_t window = (size_t)stage->shape.seq + 1;
    for (int b = 0; b < io->mbs; b++) {
        for (size_t t = 0; t < window; t++) {
            bool read = (t < window - 1 && stage->spec.has_embedding) ||
                        (t > 0 && stage->spec.has_head);
            uint32_t token = io->tokens[b * window + t];
            if (read && token >= (uint32_t)stage->shape.vocab)
                return pt_fail(err, "stage: token %u at sequence %d, "
                                    "position %zu is outside the "
                                    "vocabulary of %d",
                               token, b, t, stage->shape.vocab);
        }
    }
    return 0;
}

int stage_forward(model_stage *stage, int slot, const stage_io *io,
                  float *mean_loss, pt_error *err)
{
    if (check_io(stage, slot, io, true, err) != 0)
        return -1;
    float loss = 0.0f;
    if (stage->backend->forward(stage, slot, io, &loss, err) != 0)
        return -1;
    if (mean_loss != NULL)
        *mean_loss = loss;
    return 0;
}

int stage_backward(model_stage *stage, int slot, const stage_io *io,
                   pt_error *err)
{
    if (check_io(stage, slot, io, false, err) != 0)
        return -1;
    return stage->backend->backward(stage, slot, io, err);
}

float *stage_input_buffer(model_stage *stage, int slot)
{
    if (slot < 0 || slot >= stage->slot_count)
        return NULL;
    return stage->backend->input_buffer(stage, slot);
}

const float *stage_output(const model_stage *stage, int slot)
{
    if (slot < 0 || slot >= stage->slot_count)
        return NULL;
    return stage->backend->output(stage, slot);
}

const float *stage_input_grad(const model_stage *stage)
{
    return stage->backend->input_grad(stage);
}

int stage_zero_grads(model_stage *stage, pt_error *err)
{
    return stage->backend->zero_grads(stage, err);
}

int stage_grad_square_sum(const model_stage *stage, double *out,
                          pt_error *err)
{
    return stage->backend->grad_square_sum(stage, out, err);
}

int stage_adamw_step(model_stage *stage, const adamw_config *config,
                     float learning_rate, float grad_scale, pt_error *err)
{
    if (!(config->beta1 >= 0.0f && config->beta1 < 1.0f) ||
        !(config->beta2 >= 0.0f && config->beta2 < 1.0f) ||
        !(config->eps > 0.0f) || !(config->weight_decay >= 0.0f))
        return pt_fail(err, "adamw: need 0 <= beta1, beta2 < 1, eps > 0 and "
                            "weight_decay >= 0 (got %g, %g, %g, %g)",
                       config->beta1, config->beta2, config->eps,
                       config->weight_decay);
    stage->optimizer_steps++;
    if (stage->backend->adamw_step(stage, config, learning_rate, grad_scale,
                                   err) != 0) {
        stage->optimizer_steps--;
        return -1;
    }
    return 0;
}
