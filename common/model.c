/* models/<name>.json: the shape of a GPT-style transformer, read and
 * written here (plans and run records embed it). */
#include "common/common.h"

#include <string.h>

/* Bounds that keep every product the cost model forms far from overflow
 * while staying well above any real model. */
#define MODEL_MAX_LAYERS 100000
#define MODEL_MAX_WIDTH 1000000
#define MODEL_MAX_SEQ 10000000
#define MODEL_MAX_VOCAB 100000000

static const char *const model_keys[] = {
    "name", "layers", "hidden", "heads", "ffn_hidden", "seq", "vocab",
    "tied_embeddings", NULL};

static int get_bounded_int(const json_t *obj, const json_place *place,
                           const char *key, bool required, long long max,
                           int *out, pt_error *err)
{
    long long value = *out;
    if (json_get_int(obj, place, key, required, 1, max, &value, err) != 0)
        return -1;
    *out = (int)value;
    return 0;
}

int model_from_json(const json_t *obj, const json_place *place,
                    model_shape *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (json_check_keys(obj, place, model_keys, err) != 0)
        return -1;
    if (json_get_string(obj, place, "name", true, out->name,
                        sizeof out->name, err) != 0)
        return -1;
    if (out->name[0] == '\0') {
        json_place where = json_place_key(place, "name");
        return json_place_fail(&where, err, "must not be empty");
    }
    if (get_bounded_int(obj, place, "layers", true, MODEL_MAX_LAYERS,
                        &out->layers, err) != 0 ||
        get_bounded_int(obj, place, "hidden", true, MODEL_MAX_WIDTH,
                        &out->hidden, err) != 0 ||
        get_bounded_int(obj, place, "heads", true, MODEL_MAX_WIDTH,
                        &out->heads, err) != 0)
        return -1;
    out->ffn_hidden = 4 * out->hidden;
    out->tied_embeddings = true;
    if (get_bounded_int(obj, place, "ffn_hidden", false, 4 * MODEL_MAX_WIDTH,
                        &out->ffn_hidden, err) != 0 ||
        get_bounded_int(obj, place, "seq", true, MODEL_MAX_SEQ, &out->seq,
                        err) != 0 ||
        get_bounded_int(obj, place, "vocab", true, MODEL_MAX_VOCAB,
                        &out->vocab, err) != 0 ||
        json_get_bool(obj, place, "tied_embeddings", false,
                      &out->tied_embeddings, err) != 0)
        return -1;
    if (out->hidden % out->heads != 0) {
        json_place where = json_place_key(place, "heads");
        return json_place_fail(&where, err,
                               "hidden %d is not divisible by %d heads",
                               out->hidden, out->heads);
    }
    return 0;
}

int model_load_file(const char *path, model_shape *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL)
        return -1;
    json_place place = json_place_root(path);
    int status = model_from_json(root, &place, out, err);
    json_decref(root);
    return status;
}

json_t *model_to_json(const model_shape *model)
{
    json_t *obj = json_object();
    if (obj == NULL)
        return NULL;
    int failures = 0;
    json_put(obj, "name", json_string(model->name), &failures);
    json_put(obj, "layers", json_integer(model->layers), &failures);
    json_put(obj, "hidden", json_integer(model->hidden), &failures);
    json_put(obj, "heads", json_integer(model->heads), &failures);
    json_put(obj, "ffn_hidden", json_integer(model->ffn_hidden), &failures);
    json_put(obj, "seq", json_integer(model->seq), &failures);
    json_put(obj, "vocab", json_integer(model->vocab), &failures);
    json_put(obj, "tied_embeddings", json_boolean(model->tied_embeddings),
             &failures);
    if (failures > 0) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

double model_layer_parameter_count(const model_shape *model)
{
    double hidden = model->hidden;
    double ffn = model->ffn_hidden;
    double attention_qkv = 3.0 * hidden * hidden + 3.0 * hidden;
    double attention_projection = hidden * hidden + hidden;
    double mlp_up = hidden * ffn + ffn;
    double mlp_down = ffn * hidden + hidden;
    double layer_norms = 2.0 * 2.0 * hidden; /* weight and bias, twice */
    return attention_qkv + attention_projection + mlp_up + mlp_down +
           layer_norms;
}

double model_parameter_count(const model_shape *model)
{
    double hidden = model->hidden;
    double token_embedding = (double)model->vocab * hidden;
    double position_embedding = (double)model->seq * hidden;
    double final_norm = 2.0 * hidden;
    /* A tied head reuses the token embedding's matrix. */
    double head = model->tied_embeddings ? 0.0 : token_embedding;
    return token_embedding + position_embedding +
           model->layers * model_layer_parameter_count(model) + final_norm +
           head;
}
