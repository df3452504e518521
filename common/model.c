/* models/<name>.json: the shape of a decoder-only transformer (GPT-2's
 * layer, or Llama's and its kin: RMSNorm, SwiGLU, rotary positions,
 * grouped-query attention, no biases), read and written here (plans and
 * run records embed it), and its parameter counts. */
#include "common/common.h"

#include <stdio.h>
#include <string.h>

/* Bounds that keep every product the cost model forms far from overflow
 * while staying well above any real model. */
#define MODEL_MAX_LAYERS 100000
#define MODEL_MAX_WIDTH 1000000
#define MODEL_MAX_SEQ 10000000
#define MODEL_MAX_VOCAB 100000000

static const char *const model_keys[] = {
    "name", "layers", "hidden", "heads", "ffn_hidden", "seq", "vocab",
    "tied_embeddings", "kv_heads", "norm", "norm_eps", "mlp", "positions",
    "rope_base", "bias", "qkv_bias", NULL};

/* Indexed by the enums of common.h. */
static const char *const norm_names[] = {"layernorm", "rmsnorm", NULL};
static const char *const mlp_names[] = {"gelu", "swiglu", NULL};
static const char *const position_names[] = {"learned", "rope", NULL};

/* Rotary positions' base when the file gives none (Llama 2's). */
#define MODEL_DEFAULT_ROPE_BASE 10000.0
#define MODEL_MAX_ROPE_BASE 1e12
/* The norms' epsilon: LayerNorm's (fixed) and RMSNorm's when the file
 * gives none (Llama 2's and 3's, Mistral's; Qwen 2.5 states 1e-6). */
#define MODEL_DEFAULT_NORM_EPS 1e-5
#define MODEL_MAX_NORM_EPS 1.0

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

/* An optional string key that must be one of names; *out keeps its
 * value when the key is absent. */
static int get_choice(const json_t *obj, const json_place *place,
                      const char *key, const char *const *names, int *out,
                      pt_error *err)
{
    char text[32] = "";
    if (json_object_get(obj, key) == NULL)
        return 0;
    if (json_get_string(obj, place, key, false, text, sizeof text, err) != 0)
        return -1;
    for (int i = 0; names[i] != NULL; i++)
        if (strcmp(text, names[i]) == 0) {
            *out = i;
            return 0;
        }
    json_place where = json_place_key(place, key);
    return json_place_fail(&where, err, "must be \"%s\" or \"%s\", got "
                           "\"%s\"", names[0], names[1], text);
}

/* bias and qkv_bias: all linear layers, none, or (bias false, qkv_bias
 * true) the query, key and value projections alone. */
static int read_bias(const json_t *obj, const json_place *place,
                     model_shape *out, pt_error *err)
{
    bool bias = true, qkv_bias;
    if (json_get_bool(obj, place, "bias", false, &bias, err) != 0)
        return -1;
    qkv_bias = bias;
    if (json_get_bool(obj, place, "qkv_bias", false, &qkv_bias, err) != 0)
        return -1;
    if (bias && !qkv_bias) {
        json_place where = json_place_key(place, "qkv_bias");
        return json_place_fail(&where, err, "false needs \"bias\": false "
                               "(with biases, q, k and v have theirs)");
    }
    out->bias = bias ? MODEL_BIAS_ALL
                     : qkv_bias ? MODEL_BIAS_QKV : MODEL_BIAS_NONE;
    return 0;
}

/* norm_eps: RMSNorm's epsilon, for rmsnorm only (LayerNorm's is fixed
 * at 1e-5 in every backend). */
static int read_norm_eps(const json_t *obj, const json_place *place,
                         model_shape *out, pt_error *err)
{
    bool given = json_object_get(obj, "norm_eps") != NULL;
    if (given && out->norm != MODEL_NORM_RMSNORM) {
        json_place where = json_place_key(place, "norm_eps");
        return json_place_fail(&where, err, "needs \"norm\": \"rmsnorm\" "
                               "(LayerNorm's epsilon is 1e-5)");
    }
    out->norm_eps = MODEL_DEFAULT_NORM_EPS;
    if (json_get_positive_number(obj, place, "norm_eps", false,
                                 &out->norm_eps, err) != 0)
        return -1;
    if (out->norm_eps > MODEL_MAX_NORM_EPS) {
        json_place where = json_place_key(place, "norm_eps");
        return json_place_fail(&where, err, "must be at most 1, got %g",
                               out->norm_eps);
    }
    return 0;
}

int model_architecture_from_json(const json_t *obj, const json_place *place,
                                 model_shape *out, pt_error *err)
{
    long long kv = out->heads;
    int norm = 0, mlp = 0, positions = 0;
    if (json_get_int(obj, place, "kv_heads", false, 1, out->heads, &kv,
                     err) != 0 ||
        get_choice(obj, place, "norm", norm_names, &norm, err) != 0 ||
        get_choice(obj, place, "mlp", mlp_names, &mlp, err) != 0 ||
        get_choice(obj, place, "positions", position_names, &positions,
                   err) != 0)
        return -1;
    out->kv_heads = (int)kv;
    out->norm = (model_norm)norm;
    out->mlp = (model_mlp)mlp;
    out->positions = (model_positions)positions;
    if (out->heads % out->kv_heads != 0) {
        json_place where = json_place_key(place, "kv_heads");
        return json_place_fail(&where, err, "%d heads are not divisible by "
                               "%d key/value heads", out->heads,
                               out->kv_heads);
    }
    if (json_object_get(obj, "rope_base") != NULL &&
        out->positions != MODEL_POSITIONS_ROPE) {
        json_place where = json_place_key(place, "rope_base");
        return json_place_fail(&where, err, "needs \"positions\": "
                               "\"rope\"");
    }
    if (out->positions == MODEL_POSITIONS_ROPE) {
        out->rope_base = MODEL_DEFAULT_ROPE_BASE;
        if (json_get_number(obj, place, "rope_base", false, 1.0,
                            MODEL_MAX_ROPE_BASE, &out->rope_base, err) != 0)
            return -1;
    }
    if (read_norm_eps(obj, place, out, err) != 0)
        return -1;
    return read_bias(obj, place, out, err);
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
    return model_architecture_from_json(obj, place, out, err);
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

/* The architecture's keys only where they are not GPT-2's, so that a
 * GPT model's JSON (and a profile's GPT-2 shape) reads as it always has. */
void model_architecture_to_json(const model_shape *model, bool constants,
                                json_t *obj, int *failures)
{
    if (model_kv_heads(model) != model->heads)
        json_put(obj, "kv_heads", json_integer(model->kv_heads), failures);
    if (model->norm != MODEL_NORM_LAYERNORM) {
        json_put(obj, "norm", json_string(model_norm_name(model->norm)),
                 failures);
        if (constants)
            json_put(obj, "norm_eps", json_real(model_norm_eps(model)),
                     failures);
    }
    if (model->mlp != MODEL_MLP_GELU)
        json_put(obj, "mlp", json_string(model_mlp_name(model->mlp)),
                 failures);
    if (model->positions != MODEL_POSITIONS_LEARNED) {
        json_put(obj, "positions",
                 json_string(model_positions_name(model->positions)),
                 failures);
        if (constants)
            json_put(obj, "rope_base", json_real(model->rope_base),
                     failures);
    }
    if (model->bias != MODEL_BIAS_ALL)
        json_put(obj, "bias", json_false(), failures);
    if (model->bias == MODEL_BIAS_QKV)
        json_put(obj, "qkv_bias", json_true(), failures);
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
    model_architecture_to_json(model, true, obj, &failures);
    if (failures > 0) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

const char *model_norm_name(model_norm norm)
{
    return norm == MODEL_NORM_RMSNORM ? norm_names[1] : norm_names[0];
}

const char *model_mlp_name(model_mlp mlp)
{
    return mlp == MODEL_MLP_SWIGLU ? mlp_names[1] : mlp_names[0];
}

const char *model_positions_name(model_positions positions)
{
    return positions == MODEL_POSITIONS_ROPE ? position_names[1]
                                             : position_names[0];
}

int model_kv_heads(const model_shape *model)
{
    return model->kv_heads > 0 ? model->kv_heads : model->heads;
}

double model_norm_eps(const model_shape *model)
{
    if (model->norm != MODEL_NORM_RMSNORM || model->norm_eps <= 0.0)
        return MODEL_DEFAULT_NORM_EPS;
    return model->norm_eps;
}

const char *model_non_gpt_field(const model_shape *model)
{
    if (model_kv_heads(model) != model->heads)
        return "kv_heads";
    if (model->norm != MODEL_NORM_LAYERNORM)
        return "norm";
    if (model->mlp != MODEL_MLP_GELU)
        return "mlp";
    if (model->positions != MODEL_POSITIONS_LEARNED)
        return "positions";
    return model->bias != MODEL_BIAS_ALL ? "bias" : "";
}

bool model_is_gpt(const model_shape *model)
{
    return model_non_gpt_field(model)[0] == '\0';
}

void model_architecture_tag(const model_shape *model, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    const char *words[5] = {NULL, NULL, NULL, NULL, NULL};
    char kv[32] = "";
    if (model->norm != MODEL_NORM_LAYERNORM)
        words[0] = model_norm_name(model->norm);
    if (model->mlp != MODEL_MLP_GELU)
        words[1] = model_mlp_name(model->mlp);
    if (model->positions != MODEL_POSITIONS_LEARNED)
        words[2] = model_positions_name(model->positions);
    if (model_kv_heads(model) != model->heads) {
        snprintf(kv, sizeof kv, "kv %d/%d", model_kv_heads(model),
                 model->heads);
        words[3] = kv;
    }
    if (model->bias != MODEL_BIAS_ALL)
        words[4] = model->bias == MODEL_BIAS_QKV ? "qkv-bias" : "nobias";
    for (int i = 0; i < 5 && used < size; i++)
        if (words[i] != NULL)
            used += (size_t)snprintf(out + used, size - used, "%s%s",
                                     used > 0 ? " " : "", words[i]);
}

/* One norm's parameters: LayerNorm's weight and bias, RMSNorm's weight. */
static double norm_parameters(const model_shape *model)
{
    return (model->norm == MODEL_NORM_RMSNORM ? 1.0 : 2.0) * model->hidden;
}

/* Width of the key (or value) projection: kv_heads x head size. */
static double kv_width(const model_shape *model)
{
    int kv = model_kv_heads(model);
    if (kv == model->heads)
        return model->hidden;
    return (double)kv * (model->hidden / model->heads);
}

/* Megatron's layout: q, k and v one column-parallel product of h + 2 kv
 * d columns, the attention projection h x h, the MLP's first product f
 * columns (GELU) or 2f (SwiGLU's gate and up, fused), its second f x h;
 * biases on the linear layers as the model says; two norms. GPT-2:
 * 4h^2 + 2hf + 9h + f. */
double model_layer_parameter_count(const model_shape *model)
{
    double hidden = model->hidden;
    double ffn = model->ffn_hidden;
    double qkv_width = hidden + 2.0 * kv_width(model);
    bool bias = model->bias == MODEL_BIAS_ALL;
    bool qkv_bias = model->bias != MODEL_BIAS_NONE;
    double up_width = model->mlp == MODEL_MLP_SWIGLU ? 2.0 * ffn : ffn;
    double attention_qkv = hidden * qkv_width + (qkv_bias ? qkv_width : 0.0);
    double attention_projection = hidden * hidden + (bias ? hidden : 0.0);
    double mlp_up = hidden * up_width + (bias ? up_width : 0.0);
    double mlp_down = ffn * hidden + (bias ? hidden : 0.0);
    double layer_norms = 2.0 * norm_parameters(model);
    return attention_qkv + attention_projection + mlp_up + mlp_down +
           layer_norms;
}

double model_embedding_parameter_count(const model_shape *model)
{
    double hidden = model->hidden;
    double token_embedding = (double)model->vocab * hidden;
    double position_embedding =
        model->positions == MODEL_POSITIONS_LEARNED
            ? (double)model->seq * hidden
            : 0.0; /* rotary positions have no parameters */
    return token_embedding + position_embedding;
}

double model_final_norm_parameter_count(const model_shape *model)
{
    return norm_parameters(model);
}

double model_parameter_count(const model_shape *model)
{
    double token_embedding = (double)model->vocab * model->hidden;
    /* A tied head reuses the token embedding's matrix. */
    double head = model->tied_embeddings ? 0.0 : token_embedding;
    return model_embedding_parameter_count(model) +
           model->layers * model_layer_parameter_count(model) +
           model_final_norm_parameter_count(model) + head;
}

double model_kv_heads_per_rank(const model_shape *model, int tp)
{
    int kv = model_kv_heads(model);
    if (kv == model->heads || kv >= tp)
        return (double)kv / tp;
    return 1.0; /* fewer groups than ranks: each rank holds one, copied */
}

double model_layer_parameters_per_rank(const model_shape *model, int tp)
{
    double share = model_layer_parameter_count(model) / tp;
    int kv = model_kv_heads(model);
    if (kv == model->heads || kv >= tp)
        return share;
    /* the key and value heads a rank holds beyond its 1/tp of them */
    double head_size = model->hidden / model->heads;
    double per_head = 2.0 * head_size *
                      (model->hidden + (model->bias != MODEL_BIAS_NONE));
    return share + per_head * (1.0 - (double)kv / tp);
}

int model_check_tp(const model_shape *model, int tp, pt_error *err)
{
    int kv = model_kv_heads(model);
    if (model_is_gpt(model) || tp <= 1)
        return 0;
    if (model->heads % tp != 0)
        return pt_fail(err, "model %s: tp %d does not divide its %d "
                       "attention heads", model->name, tp, model->heads);
    if (kv % tp != 0 && tp % kv != 0)
        return pt_fail(err, "model %s: tp %d neither divides its %d "
                       "key/value heads nor is a multiple of them",
                       model->name, tp, kv);
    return 0;
}
