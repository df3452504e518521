/* A profile's shapes as keys: which shape prices a model's layers (its
 * widths and its layer's architecture, so that a Llama layer is never
 * priced by a GPT-2 layer's times nor the reverse), and the one-layer
 * model a shape measured. docs/formats.md ("Profile", shapes) states the
 * key. */
#include "common/common.h"

#include <stdio.h>

bool profile_shape_same_architecture(const profile_shape *shape,
                                     const model_shape *model)
{
    /* the key/value heads as a share of the heads: the same key/value
       width at the same hidden, whatever the head count (a key built
       without heads is multi-head) */
    bool shape_mha = shape->kv_heads <= 0 || shape->kv_heads == shape->heads;
    bool model_mha = model->heads <= 0 ||
                     model_kv_heads(model) == model->heads;
    bool same_share = shape_mha || model_mha
                          ? shape_mha == model_mha
                          : (long long)shape->kv_heads * model->heads ==
                                (long long)model_kv_heads(model) *
                                    shape->heads;
    return shape->norm == model->norm && shape->mlp == model->mlp &&
           shape->positions == model->positions &&
           shape->bias == model->bias && same_share;
}

bool profile_shape_prices(const profile_shape *shape,
                          const model_shape *model)
{
    int ffn = shape->ffn_hidden > 0 ? shape->ffn_hidden : 4 * shape->hidden;
    return shape->hidden == model->hidden && ffn == model->ffn_hidden &&
           shape->seq == model->seq && shape->vocab == model->vocab &&
           profile_shape_same_architecture(shape, model);
}

model_shape profile_shape_model(const profile_shape *shape)
{
    model_shape m = {
        .layers = 1, .hidden = shape->hidden, .heads = shape->heads,
        .ffn_hidden = shape->ffn_hidden > 0 ? shape->ffn_hidden
                                            : 4 * shape->hidden,
        .seq = shape->seq, .vocab = shape->vocab, .tied_embeddings = true,
        .kv_heads = shape->kv_heads, .norm = shape->norm, .mlp = shape->mlp,
        .positions = shape->positions, .bias = shape->bias};
    if (m.positions == MODEL_POSITIONS_ROPE)
        m.rope_base = 10000.0; /* the constant changes no cost */
    snprintf(m.name, sizeof m.name, "h%d-s%d", shape->hidden, shape->seq);
    return m;
}

profile_shape profile_shape_of_model(const model_shape *model)
{
    return (profile_shape){
        .hidden = model->hidden, .heads = model->heads,
        .ffn_hidden = model->ffn_hidden, .seq = model->seq,
        .vocab = model->vocab,
        .kv_heads = model_kv_heads(model) != model->heads ? model->kv_heads
                                                          : 0,
        .norm = model->norm, .mlp = model->mlp,
        .positions = model->positions, .bias = model->bias};
}

int profile_find_shape(const profile *p, const model_shape *model)
{
    for (int i = 0; i < p->shape_count; i++)
        if (profile_shape_prices(&p->shapes[i], model))
            return i;
    return -1;
}
