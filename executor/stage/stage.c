/*
 * The backend-independent half of a model stage: which tensors it holds
 * and where they sit in its one parameter buffer, creation and release,
 * and the checked wrappers that dispatch to the backend.
 */
#ifdef PARTITA_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#endif
#include "executor/comm/comm.h"
#include "executor/stage/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/cpu/cpu.h"

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

size_t model_stage_buffer_count(const model_stage *stage, stage_buffer which)
{
    return which == STAGE_ADAM_M || which == STAGE_ADAM_V
               ? stage->optimizer_count
               : stage->param_count;
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

stage_shard stage_shard_of(const model_shape *shape, const stage_spec *spec)
{
    int tp = stage_spec_tp(spec);
    stage_shard shard = {
        .tp = tp,
        .attention_channels = shape->hidden / tp,
        .heads = shape->heads / tp,
        .ffn = shape->ffn_hidden / tp,
    };
    stage_vocab_shard(shape->vocab, tp, spec->tp_rank, &shard.vocab_first,
                      &shard.vocab_count);
    return shard;
}

int stage_spec_tp(const stage_spec *spec)
{
    return spec->tp > 1 ? spec->tp : 1;
}

/* Runs of a multiple of 64 floats keep every shard's start 256-byte
 * aligned when the buffer's is, for the backends' vector loads. */
#define OPTIMIZER_SHARD_ALIGN 64

static size_t shard_start(size_t param_count, int shards, int shard)
{
    size_t runs = (param_count + OPTIMIZER_SHARD_ALIGN - 1) /
                  OPTIMIZER_SHARD_ALIGN;
    size_t per_shard =
        (runs + (size_t)shards - 1) / (size_t)shards * OPTIMIZER_SHARD_ALIGN;
    size_t start = per_shard * (size_t)shard;
    return start < param_count ? start : param_count;
}

void stage_optimizer_offsets(size_t param_count, int shards, size_t *offsets)
{
    if (shards < 1)
        shards = 1;
    for (int i = 0; i <= shards; i++)
        offsets[i] = shard_start(param_count, shards, i);
}

void stage_optimizer_range(size_t param_count, int shards, int shard,
                           size_t *first, size_t *count)
{
    if (shards < 1)
        shards = 1;
    *first = shard_start(param_count, shards, shard);
    *count = shard_start(param_count, shards, shard + 1) - *first;
}

void stage_vocab_shard(int vocab, int tp, int tp_rank, int *first, int *count)
{
    int per_shard = (vocab + tp - 1) / tp;
    int start = per_shard * tp_rank;
    if (start > vocab)
        start = vocab;
    int end = start + per_shard < vocab ? start + per_shard : vocab;
    *first = start;
    *count = end - start;
}

stage_spec stage_spec_whole_model(const model_shape *shape)
{
    stage_spec spec = {
        .first_layer = 0,
        .last_layer = shape->layers,
        .has_embedding = true,
        .has_head = true,
        .tp = 1,
        .tp_rank = 0,
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
    memset(out, 0, sizeof *out); /* the fields a caller adds stay off */
    out->first_layer = (int)first;
    out->last_layer = (int)first + layers_per_stage[stage_index];
    out->has_embedding = stage_index == 0;
    out->has_head = stage_index == stage_count - 1;
    out->tp = 1;
    out->tp_rank = 0;
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
    int tp = stage_spec_tp(spec);
    if (tp > PT_MAX_TP || spec->tp_rank < 0 || spec->tp_rank >= tp)
        return pt_fail(err, "model %s: tensor-parallel shard %d of %d does "
                            "not exist (tp at most %d)",
                       shape->name, spec->tp_rank, tp, PT_MAX_TP);
    int last_first = 0, last_count = 0;
    stage_vocab_shard(shape->vocab, tp, tp - 1, &last_first, &last_count);
    if (shape->heads % tp != 0 || shape->ffn_hidden % tp != 0 ||
        last_count < 1)
        return pt_fail(err, "model %s: tp %d must divide the %d heads and "
                            "ffn_hidden %d, and leave every shard some of "
                            "the vocabulary of %d",
                       shape->name, tp, shape->heads, shape->ffn_hidden,
                       shape->vocab);
    return 0;
}

/* Collects the tensor table; `out` may be NULL to count only. */
typedef struct layout_builder {
    param_tensor *out;
    int count;
    size_t floats;
    int tp;
    int tp_rank;
} layout_builder;

/* How a tensor is cut over the tp shards. */
typedef enum shard_kind {
    SHARD_NONE,      /* replicated: norms, position embedding, row biases */
    SHARD_ROWS,      /* output features: column-parallel weight, the
                        vocabulary rows of the embedding and head */
    SHARD_QKV_ROWS,  /* the query, key and value thirds, each by rows */
    SHARD_COLS,      /* input features of a row-parallel weight, or the
                        features of a column-parallel bias */
    SHARD_QKV_COLS   /* the QKV bias: each third by columns */
} shard_kind;

typedef struct tensor_desc {
    const char *name;
    int full_rows;
    int full_cols;
    shard_kind shard;
    bool weight_decay;
    bool tied_copy;
} tensor_desc;

/* Shard tp_rank of `full` elements cut in `parts` equal parts, each part
 * split evenly over tp (or, for one part, ceil-split: vocabularies). */
static void cut(int full, int parts, const layout_builder *b, int *offset,
                int *count)
{
    if (parts == 1) {
        stage_vocab_shard(full, b->tp, b->tp_rank, offset, count);
        return;
    }
    int per_shard = full / parts / b->tp;
    *offset = per_shard * b->tp_rank;
    *count = per_shard * parts;
}

static void shard_shape(const layout_builder *b, const tensor_desc *desc,
                        param_tensor *t)
{
    t->full_rows = t->rows = desc->full_rows;
    t->full_cols = t->cols = desc->full_cols;
    t->row_parts = t->col_parts = 1;
    t->replicated = b->tp > 1 && desc->shard == SHARD_NONE;
    switch (desc->shard) {
    case SHARD_NONE:
        break;
    case SHARD_ROWS:
    case SHARD_QKV_ROWS:
        t->row_parts = desc->shard == SHARD_QKV_ROWS ? 3 : 1;
        cut(desc->full_rows, t->row_parts, b, &t->part_row_offset, &t->rows);
        break;
    case SHARD_COLS:
    case SHARD_QKV_COLS:
        t->col_parts = desc->shard == SHARD_QKV_COLS ? 3 : 1;
        cut(desc->full_cols, t->col_parts, b, &t->part_col_offset, &t->cols);
        break;
    }
}

static void add_tensor(layout_builder *builder, const tensor_desc *desc)
{
    param_tensor tensor;
    memset(&tensor, 0, sizeof tensor);
    shard_shape(builder, desc, &tensor);
    pt_copy_string(tensor.name, sizeof tensor.name, desc->name);
    tensor.offset = builder->floats;
    tensor.count = (size_t)tensor.rows * (size_t)tensor.cols;
    tensor.weight_decay = desc->weight_decay;
    tensor.tied_copy = desc->tied_copy;
    if (builder->out != NULL)
        builder->out[builder->count] = tensor;
    builder->count++;
    builder->floats += tensor.count;
}

/* A matrix (decayed) and its bias (not decayed). A column-parallel layer
 * splits both by output features; a row-parallel one splits the matrix by
 * input features and keeps the whole bias, added once after the sum. */
static void add_linear(layout_builder *builder, int layer, const char *part,
                       int out_features, int in_features, shard_kind shard)
{
    char weight[PT_NAME_MAX], bias[PT_NAME_MAX];
    snprintf(weight, sizeof weight, "layers.%d.%s_weight", layer, part);
    snprintf(bias, sizeof bias, "layers.%d.%s_bias", layer, part);
    tensor_desc w = {weight, out_features, in_features, shard, true, false};
    tensor_desc b = {bias, 1, out_features, SHARD_NONE, false, false};
    /* a bias is one row: a column-parallel layer splits its columns */
    if (shard == SHARD_ROWS)
        b.shard = SHARD_COLS;
    else if (shard == SHARD_QKV_ROWS)
        b.shard = SHARD_QKV_COLS;
    add_tensor(builder, &w);
    add_tensor(builder, &b);
}

/* A layer norm's weight and bias (neither decayed, replicated):
 * "layers.L.PART_..." inside a layer, "PART_..." for the final norm
 * (layer < 0). */
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
    tensor_desc w = {weight, 1, hidden, SHARD_NONE, false, false};
    tensor_desc b = {bias, 1, hidden, SHARD_NONE, false, false};
    add_tensor(builder, &w);
    add_tensor(builder, &b);
}

int stage_parameter_layout(const model_shape *shape, const stage_spec *spec,
                           param_tensor *out, size_t *total_floats,
                           pt_error *err)
{
    if (check_shape_and_spec(shape, spec, err) != 0)
        return -1;
    int hidden = shape->hidden;
    layout_builder builder = {.out = out,
                              .tp = stage_spec_tp(spec),
                              .tp_rank = spec->tp_rank};
    if (spec->has_embedding) {
        tensor_desc token = {"token_embedding", shape->vocab, hidden,
                             SHARD_ROWS, true, false};
        tensor_desc position = {"position_embedding", shape->seq, hidden,
                                SHARD_NONE, true, false};
        add_tensor(&builder, &token);
        add_tensor(&builder, &position);
    }
    for (int layer = spec->first_layer; layer < spec->last_layer; layer++) {
        add_layernorm(&builder, layer, "ln1", hidden);
        add_linear(&builder, layer, "attn_qkv", 3 * hidden, hidden,
                   SHARD_QKV_ROWS);
        add_linear(&builder, layer, "attn_proj", hidden, hidden, SHARD_COLS);
        add_layernorm(&builder, layer, "ln2", hidden);
        add_linear(&builder, layer, "mlp_fc", shape->ffn_hidden, hidden,
                   SHARD_ROWS);
        add_linear(&builder, layer, "mlp_proj", hidden, shape->ffn_hidden,
                   SHARD_COLS);
    }
    if (spec->has_head) {
        add_layernorm(&builder, -1, "final_norm", hidden);
        /* A tied head reads the token embedding; when that sits on another
         * stage this stage keeps its own copy, kept equal by summing the
         * two gradients (Megatron's embedding all-reduce). */
        bool tied = shape->tied_embeddings;
        if (!tied || !spec->has_embedding) {
            tensor_desc head = {"lm_head_weight", shape->vocab, hidden,
                                SHARD_ROWS, true, tied};
            add_tensor(&builder, &head);
        }
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

/* The parameters this stage's optimizer steps: all, or its ZeRO-1
 * shard (stage_spec.optimizer_shards). */
static int set_optimizer_range(model_stage *stage, pt_error *err)
{
    int shards = stage->spec.optimizer_shards > 1
                     ? stage->spec.optimizer_shards
                     : 1;
    int shard = shards > 1 ? stage->spec.optimizer_shard : 0;
    if (shard < 0 || shard >= shards)
        return pt_fail(err, "model stage: optimizer shard %d of %d does not "
                            "exist",
                       stage->spec.optimizer_shard, shards);
    stage_optimizer_range(stage->param_count, shards, shard,
                          &stage->optimizer_first, &stage->optimizer_count);
    return 0;
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
    if (set_optimizer_range(out, err) != 0)
        return -1;
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

int model_stage_attach_tp(model_stage *stage, const struct comm *c,
                          const int *ranks, pt_error *err)
{
    int tp = stage_spec_tp(&stage->spec);
    stage->tp_comm = c;
    stage->tp_compute_only = c == NULL;
    if (c == NULL)
        return 0;
    for (int t = 0; t < tp; t++) {
        if (ranks[t] < 0 || ranks[t] >= c->size)
            return pt_fail(err, "tensor parallel: member %d of the group is "
                                "rank %d, not one of the %d",
                           t, ranks[t], c->size);
        stage->tp_group[t] = ranks[t];
    }
    if (stage->tp_group[stage->spec.tp_rank] != c->rank)
        return pt_fail(err, "tensor parallel: rank %d holds shard %d, but "
                            "the group names rank %d for it",
                       c->rank, stage->spec.tp_rank,
                       stage->tp_group[stage->spec.tp_rank]);
    return 0;
}

static int tp_all_reduce(const model_stage *stage, float *data, size_t count,
                         comm_reduce_op op, pt_error *err)
{
    int tp = stage_spec_tp(&stage->spec);
    if (tp == 1 || stage->tp_compute_only)
        return 0;
    if (stage->tp_comm == NULL)
        return pt_fail(err, "tensor parallel: shard %d of %d has no comm "
                            "(model_stage_attach_tp was not called)",
                       stage->spec.tp_rank, tp);
    if (op == COMM_MAX)
        return comm_all_reduce_max(stage->tp_comm, stage->tp_group, tp, data,
                                   count, err);
    return comm_all_reduce_sum(stage->tp_comm, stage->tp_group, tp, data,
                               count, err);
}

int stage_tp_all_reduce_sum(const model_stage *stage, float *data,
                            size_t count, pt_error *err)
{
    return tp_all_reduce(stage, data, count, COMM_SUM, err);
}

int stage_tp_all_reduce_max(const model_stage *stage, float *data,
                            size_t count, pt_error *err)
{
    return tp_all_reduce(stage, data, count, COMM_MAX, err);
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

float *stage_output_grad_buffer(model_stage *stage)
{
    if (stage->spec.has_head)
        return NULL;
    return stage->backend->output_grad_buffer(stage);
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

int stage_grad_norm_share(const model_stage *stage, double *out,
                          pt_error *err)
{
    bool excludes = false;
    for (int i = 0; i < stage->tensor_count; i++)
        excludes = excludes || stage->tensors[i].tied_copy ||
                   (stage->tensors[i].replicated && stage->spec.tp_rank > 0);
    if (!excludes)
        return stage_grad_square_sum(stage, out, err);
    if (stage->backend->grad_square_sums == NULL)
        return pt_fail(err, "the %s backend cannot sum gradients per tensor",
                       stage->backend->name);
    double *sums = calloc((size_t)stage->tensor_count, sizeof *sums);
    if (sums == NULL)
        return pt_fail(err, "out of memory for %d tensor norms",
                       stage->tensor_count);
    int status = stage->backend->grad_square_sums(stage, sums, err);
    double total = 0.0;
    for (int i = 0; i < stage->tensor_count && status == 0; i++) {
        const param_tensor *t = &stage->tensors[i];
        if (!t->tied_copy && !(t->replicated && stage->spec.tp_rank > 0))
            total += sums[i];
    }
    free(sums);
    *out = total;
    return status;
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

int stage_params_changed(model_stage *stage, pt_error *err)
{
    if (stage->backend->params_changed == NULL)
        return 0;
    return stage->backend->params_changed(stage, err);
}
