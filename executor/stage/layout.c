/*
 * Which part of the model a stage holds and how its parameters are laid
 * out: stage specs (layers, embedding, head, tensor-parallel shard,
 * ZeRO-1 optimizer shard) and the table of named tensors in the stage's
 * one contiguous buffer, the same for every backend.
 */
#include "executor/stage/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (model_kv_heads(shape) % tp != 0)
        return pt_fail(err, "model %s: tp %d does not divide its %d "
                            "key/value heads (the executor does not "
                            "replicate them, as Megatron-LM does for "
                            "kv_heads < tp)",
                       shape->name, tp, model_kv_heads(shape));
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
    SHARD_COLS       /* input features of a row-parallel weight, or the
                        features of a column-parallel bias */
} shard_kind;

/* parts (0 read as 1): the rows (SHARD_ROWS) or columns (SHARD_COLS)
 * fall in that many equal parts, each cut over the shards: GPT-2's
 * query, key and value thirds, SwiGLU's gate and up halves. */
typedef struct tensor_desc {
    const char *name;
    int full_rows;
    int full_cols;
    shard_kind shard;
    bool weight_decay;
    bool tied_copy;
    int parts;
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
    int parts = desc->parts > 1 ? desc->parts : 1;
    switch (desc->shard) {
    case SHARD_NONE:
        break;
    case SHARD_ROWS:
        t->row_parts = parts;
        cut(desc->full_rows, t->row_parts, b, &t->part_row_offset, &t->rows);
        break;
    case SHARD_COLS:
        t->col_parts = parts;
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

/* A matrix (decayed) and, with `with_bias`, its bias (not decayed). A
 * column-parallel layer (SHARD_ROWS) splits both by output features, in
 * `parts` parts; a row-parallel one (SHARD_COLS) splits the matrix by
 * input features and keeps the whole bias, added once after the sum. */
static void add_linear(layout_builder *builder, int layer, const char *part,
                       int out_features, int in_features, shard_kind shard,
                       int parts, bool with_bias)
{
    char weight[PT_NAME_MAX], bias[PT_NAME_MAX];
    snprintf(weight, sizeof weight, "layers.%d.%s_weight", layer, part);
    snprintf(bias, sizeof bias, "layers.%d.%s_bias", layer, part);
    tensor_desc w = {weight, out_features, in_features, shard, true, false,
                     parts};
    tensor_desc b = {bias, 1, out_features, SHARD_NONE, false, false, 1};
    /* a bias is one row: a column-parallel layer splits its columns */
    if (shard == SHARD_ROWS) {
        b.shard = SHARD_COLS;
        b.parts = parts;
    }
    add_tensor(builder, &w);
    if (with_bias)
        add_tensor(builder, &b);
}

/* A norm's weight and, for LayerNorm, bias (neither decayed,
 * replicated): "layers.L.PART_..." inside a layer, "PART_..." for the
 * final norm (layer < 0). RMSNorm has no bias. */
static void add_norm(layout_builder *builder, const model_shape *shape,
                     int layer, const char *part)
{
    int hidden = shape->hidden;
    char weight[PT_NAME_MAX], bias[PT_NAME_MAX];
    if (layer >= 0) {
        snprintf(weight, sizeof weight, "layers.%d.%s_weight", layer, part);
        snprintf(bias, sizeof bias, "layers.%d.%s_bias", layer, part);
    } else {
        snprintf(weight, sizeof weight, "%s_weight", part);
        snprintf(bias, sizeof bias, "%s_bias", part);
    }
    tensor_desc w = {weight, 1, hidden, SHARD_NONE, false, false, 1};
    tensor_desc b = {bias, 1, hidden, SHARD_NONE, false, false, 1};
    add_tensor(builder, &w);
    if (shape->norm == MODEL_NORM_LAYERNORM)
        add_tensor(builder, &b);
}

/* One transformer layer's tensors. GPT-2's fused qkv holds the queries,
 * keys and values of all heads as three parts (each cut over tp); any
 * other model's is Megatron-LM's grouped order, each key/value group's
 * query heads, then its key head, then its value head, so that tp cuts
 * whole groups (kv_heads divisible by tp). SwiGLU's first matrix is its
 * gate rows, then its up rows: two parts. */
static void add_layer(layout_builder *builder, const model_shape *shape,
                      int layer)
{
    int hidden = shape->hidden, ffn = shape->ffn_hidden;
    int head_size = hidden / shape->heads;
    bool gpt = model_is_gpt(shape);
    bool bias = shape->bias == MODEL_BIAS_ALL;
    bool qkv_bias = shape->bias != MODEL_BIAS_NONE;
    int qkv_rows = (shape->heads + 2 * model_kv_heads(shape)) * head_size;
    bool swiglu = shape->mlp == MODEL_MLP_SWIGLU;
    add_norm(builder, shape, layer, "ln1");
    add_linear(builder, layer, "attn_qkv", qkv_rows, hidden, SHARD_ROWS,
               gpt ? 3 : 1, qkv_bias);
    add_linear(builder, layer, "attn_proj", hidden, hidden, SHARD_COLS, 1,
               bias);
    add_norm(builder, shape, layer, "ln2");
    add_linear(builder, layer, "mlp_fc", swiglu ? 2 * ffn : ffn, hidden,
               SHARD_ROWS, swiglu ? 2 : 1, bias);
    add_linear(builder, layer, "mlp_proj", hidden, ffn, SHARD_COLS, 1,
               bias);
}

int stage_parameter_layout(const model_shape *shape, const stage_spec *spec,
                           param_tensor *out, size_t *total_floats,
                           pt_error *err)
{
    if (check_shape_and_spec(shape, spec, err) != 0)
        return -1;
    layout_builder builder = {.out = out,
                              .tp = stage_spec_tp(spec),
                              .tp_rank = spec->tp_rank};
    if (spec->has_embedding) {
        tensor_desc token = {"token_embedding", shape->vocab, shape->hidden,
                             SHARD_ROWS, true, false, 1};
        tensor_desc position = {"position_embedding", shape->seq,
                                shape->hidden, SHARD_NONE, true, false, 1};
        add_tensor(&builder, &token);
        /* rotary positions have no parameters */
        if (shape->positions == MODEL_POSITIONS_LEARNED)
            add_tensor(&builder, &position);
    }
    for (int layer = spec->first_layer; layer < spec->last_layer; layer++)
        add_layer(&builder, shape, layer);
    if (spec->has_head) {
        add_norm(&builder, shape, -1, "final_norm");
        /* A tied head reads the token embedding; when that sits on another
         * stage this stage keeps its own copy, kept equal by summing the
         * two gradients (Megatron's embedding all-reduce). */
        bool tied = shape->tied_embeddings;
        if (!tied || !spec->has_embedding) {
            tensor_desc head = {"lm_head_weight", shape->vocab,
                                shape->hidden, SHARD_ROWS, true, tied, 1};
            add_tensor(&builder, &head);
        }
    }
    if (total_floats != NULL)
        *total_floats = builder.floats;
    return builder.count;
}

/* The first tensor from `from` on whose name is (inside) or is not
 * (outside) a layer's, or tensor_count. */
static int first_tensor(const param_tensor *table, int tensor_count,
                        int from, bool inside)
{
    int i = from;
    while (i < tensor_count &&
           (strncmp(table[i].name, "layers.", 7) == 0) != inside)
        i++;
    return i;
}

void stage_units_of(const stage_spec *spec, const param_tensor *table,
                    int tensor_count, size_t param_count, stage_units *out)
{
    memset(out, 0, sizeof *out);
    int layers = spec->last_layer - spec->first_layer;
    /* the embedding's tensors come first, the layers' next, the head's
     * last; how many of each depends on the model */
    int embedding = spec->has_embedding
                        ? first_tensor(table, tensor_count, 0, true)
                        : 0;
    int head = first_tensor(table, tensor_count, embedding, false);
    size_t head_first =
        head < tensor_count ? table[head].offset : param_count;
    size_t layers_first =
        embedding < tensor_count ? table[embedding].offset : param_count;
    out->first[STAGE_UNIT_EMBEDDING] = 0;
    out->count[STAGE_UNIT_EMBEDDING] = embedding > 0 ? layers_first : 0;
    out->first[STAGE_UNIT_LAYER] = layers_first;
    out->count[STAGE_UNIT_LAYER] =
        layers > 0 ? (head_first - layers_first) / (size_t)layers : 0;
    out->first[STAGE_UNIT_HEAD] = head_first;
    out->count[STAGE_UNIT_HEAD] =
        spec->has_head ? param_count - head_first : 0;
}

stage_unit_kind stage_unit_at(const stage_units *units, size_t offset,
                              int *layer)
{
    *layer = 0;
    if (offset < units->first[STAGE_UNIT_LAYER])
        return STAGE_UNIT_EMBEDDING;
    if (offset >= units->first[STAGE_UNIT_HEAD])
        return STAGE_UNIT_HEAD;
    *layer = (int)((offset - units->first[STAGE_UNIT_LAYER]) /
                   units->count[STAGE_UNIT_LAYER]);
    return STAGE_UNIT_LAYER;
}
