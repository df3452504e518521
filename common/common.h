/*
 * common: errors, units, JSON reading with validation, and the in-memory
 * form of the files users write (model, cluster, profile, plan).
 *
 * Every reader validates each field and, on failure, fills a pt_error whose
 * message names the file, the JSON path and the reason, for example
 *   clusters/bad.json: nodes[1].gpus: must be a positive integer, got 0
 * Libraries never print or exit; the command-line layer does.
 */
#ifndef PARTITA_COMMON_H
#define PARTITA_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define PARTITA_VERSION "0.1.0"
#define PT_NAME_MAX 64
#define PT_PATH_MAX 1024

/* ---------------------------------------------------------------- errors */

/* An error travels up as a message; the caller decides how to show it. */
typedef struct pt_error {
    char message[1024];
} pt_error;

/* Formats the message into err (when err is not NULL) and returns -1, so a
 * function can write `return pt_fail(err, "...", ...);`. */
int pt_fail(pt_error *err, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* Puts "prefix: " in front of an existing message (used to add the file). */
void pt_error_prefix(pt_error *err, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* ----------------------------------------------------------------- units */

#define PT_GIB (1024.0 * 1024.0 * 1024.0)
/* Human-readable time with its unit: "812 us", "14.2 ms", "3.41 s". */
void pt_format_seconds(double seconds, char *out, size_t out_size);
/* "1.50 GiB", "512 MiB", "4.0 KiB", "12 B". */
void pt_format_bytes(double bytes, char *out, size_t out_size);
/* x rounded to `digits` significant digits (0 and non-finite x as given):
 * fitted figures are written no finer than they are known. */
double pt_round_significant(double x, int digits);
/* *out = the count (of `what`: "SMs") from 0 to `most` in environment
 * variable `name`, or `fallback` if unset or empty; -1 and err if not. */
int pt_env_count(const char *name, const char *what, long most,
                 long fallback, long *out, pt_error *err);

/* ---------------------------------------------------------- memory terms */

/* The terms of one rank's device memory, named alike by the cuda backend's
 * tally (executor/cuda/buffers.c, what it allocates), run.json (measured,
 * per rank) and the cost model (estimated, per stage; docs/cost-model.md,
 * "Memory per GPU"). */
typedef enum pt_memory_term {
    PT_MEMORY_WEIGHTS,        /* fp32 master parameters */
    PT_MEMORY_WEIGHT_MIRROR,  /* the bf16 copy the matrix products read */
    PT_MEMORY_GRADIENTS,      /* fp32 gradients */
    PT_MEMORY_OPTIMIZER,      /* AdamW moments (ZeRO-1: the rank's shard)
                                 and the optimizer's chunk tables */
    PT_MEMORY_ACTIVATIONS,    /* what the micro-batches in flight keep for
                                 their backward, but the head's */
    PT_MEMORY_LOGITS,         /* the head's per micro-batch in flight: final
                                 norm, logits, losses */
    PT_MEMORY_SCRATCH,        /* one backward's working space (and the
                                 layer being recomputed) */
    PT_MEMORY_WORKSPACE,      /* the cuBLASLt workspace (and cuDNN's
                                 attention workspace where a stage without
                                 the head cannot lend it its logits) */
    PT_MEMORY_COMM,           /* the comm's device buffers (NCCL staging) */
    PT_MEMORY_ROUNDING,       /* alignment inside arenas, slack, and each
                                 allocation rounded up to 2 MiB */
    PT_MEMORY_CONTEXT,        /* the CUDA context and the libraries' own
                                 buffers: what the executor does not
                                 allocate itself */
    PT_MEMORY_TERM_COUNT
} pt_memory_term;

/* Bytes per term. */
typedef struct pt_memory_terms {
    double bytes[PT_MEMORY_TERM_COUNT];
} pt_memory_terms;

/* The term's key in run.json and the estimate ("weights", "weight_mirror",
 * ...); NULL past the last. */
const char *pt_memory_term_name(pt_memory_term term);
/* The term of that key, or -1. */
int pt_memory_term_from_name(const char *name);
/* Sum of the terms; without the context when with_context is false. */
double pt_memory_terms_total(const pt_memory_terms *terms, bool with_context);

/* --------------------------------------------------------------- strings */

/* Copies at most out_size-1 bytes and always terminates. */
void pt_copy_string(char *out, size_t out_size, const char *text);
/* Copies text with its control characters written as escapes (\n, \t,
 * \r, \x1b; the C1 controls U+0080..U+009F of UTF-8 as \u0080..), so
 * that bytes from an input file never steer the terminal they are shown
 * on; stops before an escape that does not fit, always terminates. */
void pt_escape_controls(const char *text, char *out, size_t out_size);
/* The directory part of path ("." when it has none). */
void pt_directory_of(const char *path, char *out, size_t out_size);
/* Resolves a relative path against base_dir; absolute paths pass as is. */
void pt_resolve_path(const char *base_dir, const char *path, char *out,
                     size_t out_size);

/* ------------------------------------------------------ JSON validation */

/* Where a value sits: the file and the JSON path that leads to it. Readers
 * pass it down so that every message can name both. */
typedef struct json_place {
    const char *file;   /* file name as the user gave it, or "<inline>" */
    char path[256];     /* JSON path such as "nodes[1].intra_node" */
} json_place;

/* Parses a whole file; on failure the message names file, line, column. */
json_t *pt_json_load_file(const char *path, pt_error *err);

/* A child place: place.key or place[index]. */
json_place json_place_key(const json_place *parent, const char *key);
json_place json_place_index(const json_place *parent, size_t index);

/* Fails when obj has a key that is not in allowed (a NULL-terminated
 * list); the key "notes" is always allowed. */
int json_check_keys(const json_t *obj, const json_place *place,
                    const char *const *allowed, pt_error *err);

/* Field getters. `required` false: an absent key leaves *out untouched
 * (the caller sets the default first) and returns 0. Type and range are
 * checked and reported with the field's full place. */
int json_get_int(const json_t *obj, const json_place *place, const char *key,
                 bool required, long long min, long long max, long long *out,
                 pt_error *err);
int json_get_number(const json_t *obj, const json_place *place,
                    const char *key, bool required, double min, double max,
                    double *out, pt_error *err);
int json_get_bool(const json_t *obj, const json_place *place, const char *key,
                  bool required, bool *out, pt_error *err);
int json_get_string(const json_t *obj, const json_place *place,
                    const char *key, bool required, char *out,
                    size_t out_size, pt_error *err);
/* Fails unless the value is an object (used for nested objects). */
int json_expect_object(const json_t *value, const json_place *place,
                       pt_error *err);

/* The place of a file's root value (path ""); file NULL means "<inline>". */
json_place json_place_root(const char *file);

/* Formats "file: path: reason" (or "file: reason" at the root) into err
 * and returns -1. */
int json_place_fail(const json_place *place, pt_error *err,
                    const char *format, ...)
    __attribute__((format(printf, 3, 4)));

/* A number > 0 (finite). Same conventions as json_get_number. */
int json_get_positive_number(const json_t *obj, const json_place *place,
                             const char *key, bool required, double *out,
                             pt_error *err);

/* A string that must be one of names (NULL-terminated); *out receives its
 * index. Absent and not required: *out untouched, returns 0. */
int json_get_choice(const json_t *obj, const json_place *place,
                    const char *key, bool required,
                    const char *const *names, int *out, pt_error *err);

/* ----------------------------------------------------------- JSON output */

/* The text of every JSON file Partita writes: objects indented by 2,
 * arrays of numbers and strings filled onto lines of up to 78 columns,
 * reals with 9 significant digits, keys in the order they were set; ends
 * with a newline. NULL when out of memory; the caller frees. */
char *json_format_text(const json_t *root);

/* json_format_text(root) through pt_write_file_atomic (the one atomic
 * writer, common/atomic_file.c). */
int json_write_file_atomic(const json_t *root, const char *path,
                           pt_error *err);
/* Sets obj[key] = value, taking value's reference; counts a failure
 * (value NULL from a failed allocation, or a failed set) in *failures, so
 * that a writer builds a whole object and checks once. */
void json_put(json_t *obj, const char *key, json_t *value, int *failures);
/* Appends value to array, as json_put does for an object. */
void json_push(json_t *array, json_t *value, int *failures);

/* ----------------------------------------------------------------- model */

/* The architecture's choices (docs/formats.md, "Model"). Each enum's 0
 * is GPT-2's, so a shape built field by field (tests, profiles' shapes)
 * is a GPT-2 layer unless it says otherwise. */
typedef enum model_norm { MODEL_NORM_LAYERNORM, MODEL_NORM_RMSNORM }
    model_norm;
typedef enum model_mlp { MODEL_MLP_GELU, MODEL_MLP_SWIGLU } model_mlp;
typedef enum model_positions {
    MODEL_POSITIONS_LEARNED,
    MODEL_POSITIONS_ROPE
} model_positions;
/* Which linear layers carry biases: all (GPT-2), none (Llama), or only
 * the query, key and value projections (Qwen 2). Norms keep theirs. */
typedef enum model_bias { MODEL_BIAS_ALL, MODEL_BIAS_NONE, MODEL_BIAS_QKV }
    model_bias;

/* The shape of a decoder-only transformer (models/<name>.json): GPT-2's
 * layer by default, Llama's with RMSNorm, SwiGLU, rotary positions,
 * grouped-query attention and no biases. */
typedef struct model_shape {
    char name[PT_NAME_MAX];
    int layers;
    int hidden;
    int heads;
    int ffn_hidden;      /* default 4 x hidden */
    int seq;
    int vocab;
    bool tied_embeddings; /* default true */
    int kv_heads;        /* key/value heads; 0 (or heads): one per head */
    model_norm norm;
    model_mlp mlp;
    model_positions positions;
    double rope_base;    /* rotary positions' base (rope only) */
    double norm_eps;     /* RMSNorm's epsilon (rmsnorm only; LayerNorm's
                            is 1e-5) */
    model_bias bias;
} model_shape;

int model_from_json(const json_t *obj, const json_place *place,
                    model_shape *out, pt_error *err);
/* A model file's architecture keys (kv_heads to qkv_bias) onto out, its
 * heads set; GPT-2's where absent. Profiles' shapes read theirs so. */
int model_architecture_from_json(const json_t *obj, const json_place *place,
                                 model_shape *out, pt_error *err);
/* Those not GPT-2's into obj; norm_eps and rope_base with constants. */
void model_architecture_to_json(const model_shape *model, bool constants,
                                json_t *obj, int *failures);
int model_load_file(const char *path, model_shape *out, pt_error *err);
/* The model as models/<name>.json holds it; NULL when out of memory. */
json_t *model_to_json(const model_shape *model);

/* Parameters of the whole model (embeddings, position embeddings, layers,
 * final norm; the head counts once when tied). */
double model_parameter_count(const model_shape *model);
/* Parameters of one transformer layer. */
double model_layer_parameter_count(const model_shape *model);
/* The token embedding and, with learned positions, the positions'. */
double model_embedding_parameter_count(const model_shape *model);
/* The final norm: weight and bias (LayerNorm) or weight (RMSNorm). */
double model_final_norm_parameter_count(const model_shape *model);
/* Key/value heads (heads when the file gives none). */
int model_kv_heads(const model_shape *model);
/* The norms' epsilon: norm_eps for RMSNorm (its default when a shape
 * built field by field leaves it 0), LayerNorm's fixed 1e-5. */
double model_norm_eps(const model_shape *model);
/* Whether the model is GPT-2's layer throughout (the shapes a profile's
 * measured tables hold, and the layer the executor runs). */
bool model_is_gpt(const model_shape *model);
/* The first field (in file order) that is not GPT-2's, "" when none:
 * what a message names when the layer is not one the caller runs. */
const char *model_non_gpt_field(const model_shape *model);
/* What is not GPT-2's in the layer, "rmsnorm swiglu rope kv 8/32 nobias"
 * ("" for GPT-2's): how profile output names a shape's architecture. */
void model_architecture_tag(const model_shape *model, char *out,
                            size_t size);
/* Key/value heads one of tp ranks holds, as Megatron splits them: kv / tp
 * when tp divides them, else (tp a multiple of them) one, replicated. */
double model_kv_heads_per_rank(const model_shape *model, int tp);
/* One layer's parameters on one of tp ranks: the layer's / tp, plus the
 * key/value projections a rank holds beyond its share when they are
 * replicated (kv_heads < tp). */
double model_layer_parameters_per_rank(const model_shape *model, int tp);
/* 0 when tp can split the model's attention; else -1 with err naming the
 * model and why. GPT-2 models are not checked (their tp splits columns);
 * the others need heads divisible by tp and kv_heads divisible by tp or
 * dividing it. */
int model_check_tp(const model_shape *model, int tp, pt_error *err);
/* The architecture's names, as the files spell them. */
const char *model_norm_name(model_norm norm);
const char *model_mlp_name(model_mlp mlp);
const char *model_positions_name(model_positions positions);

/* --------------------------------------------------------------- cluster */

typedef struct link_spec {
    double bandwidth_bytes_per_s;
    double latency_s;
} link_spec;

/* A node's local device; exec throttles it, the cost model reads caps. */
typedef struct device_spec {
    int index;
    int sm_limit;            /* 0: all SMs */
    double memory_limit_gib; /* 0: no cap */
} device_spec;

#define PT_MAX_DEVICES 16

/* One entry of "nodes": `count` identical nodes. */
typedef struct node_type {
    char name[PT_NAME_MAX];
    int count;
    char gpu[PT_NAME_MAX];  /* names a profile */
    /* "" or, for nodes that are slices of one GPU (devices with an
     * sm_limit), the profile of the same slices with the GPU's other
     * slices at rest; `gpu` then holds them with the others busy, and the
     * estimate prices each stage between the two by how busy its
     * neighbours are (docs/cost-model.md, section 12) */
    char gpu_at_rest[PT_NAME_MAX];
    int gpus;               /* GPUs per node */
    link_spec intra_node;
    /* Each GPU's share of the network: the node's NICs (`nics` of them,
     * each `nic` fast) shared by its GPUs, nics x nic / gpus, at most one
     * NIC a GPU; nics 0: one NIC a GPU, `inter_node` as the file gives
     * it (docs/formats.md, "Cluster") */
    link_spec inter_node;
    int nics;
    link_spec nic;
    double price_per_hour;  /* USD per node-hour, 0 when not given */
    int device_count;
    device_spec devices[PT_MAX_DEVICES];
} node_type;

/* The link between the nodes of two particular types (type_a may equal
 * type_b: two nodes of one type), where it is slower than their
 * inter_node figures give: the cluster file's "links". */
typedef struct type_link {
    int type_a, type_b;
    link_spec link;
} type_link;

#define CLUSTER_MAX_TYPE_LINKS 64

typedef struct cluster {
    char name[PT_NAME_MAX * 2];
    char source_dir[PT_PATH_MAX]; /* directory of the file, for profiles */
    int type_count;
    node_type *types;             /* owned */
    int node_count;               /* sum of counts */
    int link_count;
    type_link links[CLUSTER_MAX_TYPE_LINKS];
} cluster;

/* The link between a GPU of a node of type_a and one of another node of
 * type_b: the cluster's link for that pair of types when it names one,
 * else the slower of the two types' inter_node figures (the lower
 * bandwidth and the higher latency). */
link_spec cluster_type_link(const cluster *c, int type_a, int type_b);

int cluster_from_json(const json_t *obj, const json_place *place,
                      cluster *out, pt_error *err);
int cluster_load_file(const char *path, cluster *out, pt_error *err);
void cluster_free(cluster *c);
/* The cluster as clusters/<name>.json holds it (intra-node bandwidths in
 * GB/s, inter-node in Gbit/s); NULL when out of memory. */
json_t *cluster_to_json(const cluster *c);
/* Deep copy (dst must be unused or freed). */
int cluster_copy(cluster *dst, const cluster *src, pt_error *err);

/* Node instances are numbered 0..node_count-1 in file order: type 0's
 * nodes first. These map between an instance, its type and its name
 * ("a10[3]"). */
int cluster_node_type(const cluster *c, int node);
int cluster_node_ordinal(const cluster *c, int node);
void cluster_node_name(const cluster *c, int node, char *out, size_t size);
/* -1 when no node has that name. */
int cluster_find_node(const cluster *c, const char *name);
int cluster_gpu_count(const cluster *c);
/* GPUs of one node instance (0 when node is out of range). */
int cluster_node_gpus(const cluster *c, int node);
/* The link between two node instances: intra-node when a == b, else the
 * slower of the two nodes' inter-node figures. */
link_spec cluster_link(const cluster *c, int node_a, int node_b);

/* --------------------------------------------------------------- profile */

/* Forward and backward seconds of one part of the model, per micro-batch.
 * The spreads (interquartile range of the timed runs over their median)
 * come with measured profiles: kept for people and for output, never
 * priced; 0 where the profile gives none. */
typedef struct part_cost {
    double forward_s;
    double backward_s;
    double forward_spread;
    double backward_spread;
} part_cost;

/* Costs measured for one (tp, micro-batch) point. */
typedef struct profile_point {
    int tp;
    int mbs;
    part_cost embedding;
    part_cost layer;     /* one transformer layer */
    part_cost head;      /* final norm, LM head, loss */
    bool head_fused;     /* head timed fused: products in its forward */
} profile_point;

/* The costs of one layer shape, keyed by hidden, ffn_hidden, seq, vocab
 * and the layer's architecture (profile_shape_prices): a Llama layer
 * never prices a GPT-2 layer of its widths, nor the reverse. heads counts
 * only through kv_heads / heads. The architecture's 0s are GPT-2's, what
 * a file's shape without those keys (every profile before them) is. */
typedef struct profile_shape {
    int hidden, heads, ffn_hidden, seq, vocab;
    int kv_heads;           /* 0 (or heads): one per head */
    model_norm norm;
    model_mlp mlp;
    model_positions positions;
    model_bias bias;
    int point_count;
    profile_point *points;  /* owned */
} profile_shape;

/* A measured communication time for a message size over `gpus` GPUs;
 * spread as in part_cost; compute_lost: the share of time_s that bf16
 * products beside it on each GPU lost (a few sizes; 0: not measured). */
typedef struct comm_sample {
    int gpus;
    double bytes;
    double time_s;
    double spread;
    double compute_lost;
} comm_sample;

typedef struct comm_curve {
    int sample_count;
    comm_sample *samples;   /* owned, sorted by gpus then bytes */
} comm_curve;

typedef enum profile_source {
    PROFILE_MEASURED,
    PROFILE_PUBLISHED,
    PROFILE_DERIVED
} profile_source;

typedef enum microbatch_scaling {
    MBS_SCALING_MEASURED,  /* interpolate between measured micro-batches */
    MBS_SCALING_LINEAR     /* time = time at the measured mbs x mbs/that */
} microbatch_scaling;

/* The fitted parameters of the per-kernel roofline that prices any layer
 * shape (costmodel/roofline.c; docs/profiles.md states the model).
 * `present` is false when the profile's efficiency block has none. */
typedef struct roofline_params {
    bool present;
    double gemm_efficiency;        /* fraction of peak a large GEMM reaches */
    double gemm_half_work_flop;    /* GEMM FLOPs per SM at half of that */
    double attention_efficiency;   /* attention's fraction of peak on the
                                      full-square FLOP count, (0, 2] */
    double bandwidth_efficiency;   /* fraction of memory bandwidth that
                                      memory-bound kernels reach */
    double kernel_overhead_s;      /* launch and tail of every kernel */
    double bandwidth_saturation_sm_fraction; /* share of the SMs that
                                      reaches full memory bandwidth */
} roofline_params;

/* What a measured profile's workspace_gib adds to the CUDA context it
 * measured: cuBLAS workspaces and NCCL's own buffers, which a profile
 * cannot see before the plan (GiB). */
#define PROFILE_WORKSPACE_ALLOWANCE_GIB 0.5

/* One GPU type's costs: profiles/<gpu>.json in memory. Owned by
 * common/profile.c, which reads it (profile_from_json) and writes it
 * (profile_to_json) for every writer: `partita profile` fills one from
 * its measurements, `partita profile --derive` from a spec row and a fit. */
typedef struct profile {
    char gpu[PT_NAME_MAX];
    double memory_gib;         /* usable memory */
    profile_source source;
    json_t *provenance;        /* owned: kept as written, for output */
    /* assumptions */
    double backward_over_forward; /* > 0: backward = this x forward when a
                                     point gives no backward */
    microbatch_scaling mbs_scaling;
    bool layer_times_include_tp_comm;
    bool flash_attention;         /* the layers measured keep no attention
                                     scores (fused attention): memory
                                     drops Korthikanti's 5 a s / h term */
    /* CUDA context, cuBLAS, NCCL: a measured context + the allowance */
    double workspace_gib;
    double optimizer_s_per_param; /* AdamW step time per parameter */
    /* offload, measured (0: no): the host's AdamW; its link, 4 B each way */
    double host_adamw_s_per_param, host_copy_s_per_param;
    /* efficiency model: prices shapes the profile does not hold */
    double peak_tflops;           /* dense bf16/fp16 tensor peak */
    double fp32_tflops;           /* plain FP32 peak; 0: not given */
    double tf32_tflops;           /* dense TF32 tensor peak; 0: none */
    double flops_efficiency;      /* achieved fraction of peak, 0: fit */
    double memory_bandwidth_GBps;
    int sms;                      /* SMs of the whole GPU; 0: not given */
    int sm_limit;                 /* SMs the times were taken on; 0: all */
    roofline_params roofline;     /* prices any shape when present */
    int shape_count;
    profile_shape *shapes;        /* owned */
    comm_curve allreduce, sendrecv; /* optional, sample_count 0 if absent */
    comm_curve reduce_scatter, all_gather; /* bytes: the whole tensor */
    json_t *notes;                /* owned: the file's top-level notes, kept
                                     as written for output; NULL: none */
} profile;

int profile_from_json(const json_t *obj, const json_place *place,
                      profile *out, pt_error *err);
int profile_load_file(const char *path, profile *out, pt_error *err);
/* The file's JSON of p in its canonical key order, checked by the reader
 * (so that what a writer writes loads); NULL with err set when the reader
 * refuses it, naming `label` as the file. p is not changed. */
json_t *profile_to_json(const profile *p, const char *label, pt_error *err);
/* A deep copy of src into dst, which then owns what it frees. */
int profile_copy(profile *dst, const profile *src, pt_error *err);
/* Adds to `into` every point of `from` it lacks (a shape it lacks, with
 * all its points): points stay sorted by tp, then mbs; *added counts
 * them. On failure (out of memory) into keeps what it held. */
int profile_add_points(profile *into, const profile *from, int *added,
                       pt_error *err);
void profile_free(profile *p);
const char *profile_source_name(profile_source source);

/* The shape of p that prices this model's layers (below); -1: none. */
int profile_find_shape(const profile *p, const model_shape *model);
/* The same norm, MLP, positions and biases, and kv_heads / heads. */
bool profile_shape_same_architecture(const profile_shape *shape,
                                     const model_shape *model);
/* That, and the same hidden, ffn_hidden (0: 4 x hidden), seq, vocab. */
bool profile_shape_prices(const profile_shape *shape,
                          const model_shape *model);
/* The one-layer model the shape measured, and a model's shape key. */
model_shape profile_shape_model(const profile_shape *shape);
profile_shape profile_shape_of_model(const model_shape *model);
/* The point (tp, mbs) of a shape; -1 when it was not measured. Points are
 * sorted by tp, then mbs. */
int profile_find_point(const profile_shape *shape, int tp, int mbs);

/* Finds profiles/<gpu>.json: in extra_dir (may be NULL), then in
 * $PARTITA_PROFILES, then next to the cluster file (../profiles), then in
 * the installed profile directory. extra_dir and $PARTITA_PROFILES, when
 * given, must be folders that can be read: a missing one is an error,
 * not a silent fall back. */
int profile_find(const char *gpu, const char *extra_dir,
                 const char *cluster_dir, char *out_path, size_t out_size,
                 pt_error *err);
/* profile_load_file of a file profile_find found for gpu, refused when
 * the file's "gpu" is another name (naming both). */
int profile_load_for_gpu(const char *path, const char *gpu, profile *out,
                         pt_error *err);

/* ------------------------------------------------------------------ plan */

typedef enum schedule_kind { SCHEDULE_1F1B, SCHEDULE_GPIPE } schedule_kind;
typedef enum precision_kind {
    PRECISION_BF16,
    PRECISION_FP16,
    PRECISION_FP32
} precision_kind;

/* How the main gradients are kept, accumulated over micro-batches and
 * reduced over dp (issue 34): fp32, Megatron-LM's bf16 recipe
 * (--accumulate-allreduce-grads-in-fp32) and the default; or bf16, as
 * llm.c keeps them (only with precision bf16). FP32 is 0 so that a
 * config built field by field keeps the default. */
typedef enum grad_precision_kind {
    GRAD_PRECISION_FP32,
    GRAD_PRECISION_BF16
} grad_precision_kind;

/* The program that will run the plan (docs/cost-model.md, "The
 * runtime"): memory and time follow its allocations and options; only
 * Partita's executor always overlaps the dp reduction with the backward
 * (parallel_residual_bytes and parallel_gradient_bytes say the rest). */
typedef enum runtime_kind {
    RUNTIME_PARTITA,
    RUNTIME_MEGATRON,
    RUNTIME_DEEPSPEED
} runtime_kind;
/* How a layer's attention is computed: fused flash kernels (no s x s
 * scores kept), or the unfused path of Megatron-LM before flash
 * attention and of Megatron-DeepSpeed (Q K^T and P V as batched GEMMs,
 * the scores written, masked softmax and dropout over them).
 * ATTENTION_DEFAULT: the runtime's (flash for Partita and Megatron-LM,
 * unfused for DeepSpeed). */
typedef enum attention_kind {
    ATTENTION_DEFAULT,
    ATTENTION_FLASH,
    ATTENTION_UNFUSED
} attention_kind;

const char *schedule_name(schedule_kind kind);
const char *precision_name(precision_kind kind);
const char *runtime_name(runtime_kind kind);
const char *attention_name(attention_kind kind);
const char *grad_precision_name(grad_precision_kind kind);
/* "fp32" or "bf16" into *out; fails naming the value otherwise. */
int grad_precision_parse(const char *name, grad_precision_kind *out,
                         pt_error *err);
/* Bytes of one activation / weight element in this precision. */
int precision_bytes(precision_kind kind);

/* The parallel degrees and memory levers of a plan. */
typedef struct parallel_config {
    int gbs, mbs, tp, dp, pp;
    schedule_kind schedule;
    precision_kind precision;
    bool recompute;             /* full activation recompute */
    /* Megatron-LM's selective recompute (recompute "selective"; never
     * with recompute): the attention core (Q K^T, softmax, dropout,
     * P V) recomputed in the backward, its s x s activations not kept */
    bool selective_recompute;
    bool distributed_optimizer; /* ZeRO-1 over the dp group */
    /* DeepSpeed's ZeRO stage (docs/cost-model.md, section 11): 2 shards
     * the gradients over dp as well, 3 the parameters too; 0 or 1 leave
     * distributed_optimizer to say ZeRO-1. A stage of 1 or more always
     * comes with distributed_optimizer set (parallel_set_zero_stage);
     * read it through parallel_zero_stage. */
    int zero_stage;
    /* ZeRO-Offload: the fp32 master weights and AdamW's moments in host
     * memory, the step on the CPU (docs/cost-model.md, section 11). */
    bool offload_optimizer;
    /* Megatron's interleaved 1F1B: model chunks per rank (0 and 1: the
     * plain schedule; docs/cost-model.md, "Interleaved 1F1B"). */
    int virtual_stages;
    /* Megatron's sequence parallelism with tp: the layer norms and the
     * residual stream sharded over the sequence, reduce-scatter and
     * all-gather in place of each all-reduce. */
    bool sequence_parallel;
    /* The program that runs the plan and its attention (above); read
     * through parallel_attention. */
    runtime_kind runtime;
    attention_kind attention;
    /* Megatron-LM's --overlap-grad-reduce (DeepSpeed's overlap_comm):
     * the dp reduction runs bucket by bucket during the last backward.
     * Partita's executor always overlaps; the others only when set. */
    bool overlap_grad_reduce;
    /* Megatron-LM's --overlap-param-gather: with the distributed
     * optimizer, the updated parameters' all-gather runs during the next
     * step's first forward instead of after the optimizer. Megatron-LM and
     * DeepSpeed plans only (Partita's executor gathers after the step). */
    bool overlap_param_gather;
    /* With precision fp32: the matmuls on TF32 tensor cores (PyTorch's
     * allow_tf32), priced at the GPU's TF32 rate, not its FP32 one. */
    bool tf32;
    /* The main gradients' type (above); bf16 only with precision bf16
     * (parallel_check_grad_precision). */
    grad_precision_kind grad_precision;
    bool deterministic; /* Megatron-LM's --deterministic-mode (formats.md) */
} parallel_config;

/* Fails when the config's grad_precision cannot go with its precision:
 * bf16 gradients need precision bf16 (an fp32 run keeps fp32 ones, and
 * fp16 needs the loss scaling bf16 gradients do not have). */
int parallel_check_grad_precision(const parallel_config *config,
                                  pt_error *err);

/* The attention a config computes: its own, or its runtime's default. */
attention_kind parallel_attention(const parallel_config *config);
/* Bytes of one element of the residual stream: the plan's precision in
 * every runtime (Partita's cuda backend keeps a bf16 stream, issue 34;
 * its pipeline messages stay fp32, costmodel/memory.c counts them). */
int parallel_residual_bytes(const parallel_config *config);
/* Bytes of one main-gradient element, as the runtime keeps and reduces
 * them: 2 under grad_precision bf16 (llm.c's recipe, whatever the
 * runtime), else fp32 in Partita's executor and in Megatron-LM's bf16
 * recipe (--accumulate-allreduce-grads-in-fp32), the plan's precision
 * for fp16 under Megatron-LM and DeepSpeed. */
int parallel_gradient_bytes(const parallel_config *config);
/* Whether dp sums overlap the last backward (Partita: not interleaved). */
bool parallel_overlaps_grad_reduce(const parallel_config *config);

/* The most virtual_stages a plan may ask for. */
#define PLAN_MAX_VIRTUAL_STAGES 64
/* Model chunks per rank: virtual_stages, 1 when 0 (a config built before
 * the field existed). */
int parallel_virtual_stages(const parallel_config *config);
/* Megatron's interleaved 1F1B order, shared by the cost model and the
 * executor (docs/cost-model.md 6.1): the chunk forwards rank `stage` runs
 * before its first chunk backward, 2 (pp - stage - 1) + (v - 1) pp (the
 * plain 1F1B's pp - stage - 1 when v is 1), at most v x micro-batches;
 * and the chunk and micro-batch of a rank's k-th chunk forward (or
 * backward): micro-batches in groups of pp through chunk 0, then the same
 * group through chunk 1, ..., backwards through the chunks in reverse. */
int parallel_chunk_warmup(int pp, int v, int stage, int microbatches);
void parallel_chunk_unit(int pp, int v, int k, bool forward, int *chunk,
                         int *microbatch);
/* For each chunk c of rank `stage` (v > 1), the most of its
 * micro-batches in flight at once under that order, into slots[c]: the
 * activation slots the executor gives the chunk and the cost model
 * counts (a chunk's micro-batches in flight are consecutive, so that
 * many slots, used modulo, never collide). slots holds v entries, v at
 * most PLAN_MAX_VIRTUAL_STAGES. */
void parallel_chunk_slots(int pp, int v, int stage, int microbatches,
                          int *slots);

/* Why config's interleaving or sequence parallelism cannot run, as one
 * reason naming the field ("virtual_stages: 2 needs micro-batches (6) a
 * multiple of pp (4)"); 0 when both are valid. seq: the model's
 * sequence length. */
int parallel_check_schedule_levers(const parallel_config *config, int seq,
                                   pt_error *err);

/* Micro-batches per iteration: gbs / (dp x mbs). */
int parallel_microbatches(const parallel_config *config);
/* The ZeRO stage asked, 0..3: zero_stage, or 1 for distributed_optimizer. */
int parallel_zero_stage(const parallel_config *config);
/* Sets ZeRO stage 0..3, distributed_optimizer (stage >= 1) with it. */
void parallel_set_zero_stage(parallel_config *config, int stage);

#define PT_MAX_STAGES 512
#define PT_MAX_NODES 4096

/* A stage's own tensor- and data-parallel degrees (issue 36: "stages" in
 * plan.json); 0 in a field: the plan-wide degree (config.tp, config.dp).
 * Every stage runs the same micro-batches, gbs / (dp x mbs) of them with
 * the plan-wide dp and mbs: a pipeline micro-batch is dp x mbs samples,
 * which a stage of its own dp splits over its replicas, mbs x dp / dp_s
 * each (docs/formats.md, "Stages of their own degrees"). */
typedef struct stage_degrees {
    int tp, dp;
} stage_degrees;

/* The config stage `stage` runs: config with its tp, dp and its
 * replicas' micro-batch, dp x mbs / its dp (integer division: the plan
 * reader refuses a dp that does not divide it). stages may be NULL (a
 * symmetric plan): config itself. */
parallel_config parallel_stage_config(const parallel_config *config,
                                      const stage_degrees *stages,
                                      int stage);
/* Whether a stage's resolved degrees differ from the plan-wide ones
 * anywhere; stages may be NULL. The first such stage, or -1. */
int stage_degrees_first_own(const parallel_config *config,
                            const stage_degrees *stages);
/* The ranks of stage `stage` (its tp x dp) and its first rank: stages
 * take consecutive ranks in pipeline order, each laid out as
 * first + t + tp_s x d. */
int stage_degrees_ranks(const parallel_config *config,
                        const stage_degrees *stages, int stage);
int stage_degrees_first_rank(const parallel_config *config,
                             const stage_degrees *stages, int stage);

/* A plan: what plan.json holds (docs/formats.md, "Plan"). Owned by
 * common/plan.c, which reads and writes the file. */
typedef struct plan {
    model_shape model;
    cluster cluster;                 /* owned */
    /* Paths as an older plan wrote them ("model": "../models/x.json");
     * "" when inline, as every plan Partita writes now has them. */
    char model_ref[PT_PATH_MAX];
    char cluster_ref[PT_PATH_MAX];
    /* For people: where the model and cluster were read from when the
     * plan was made ("origin" in the file, or the resolved path of a
     * model_ref); "" when unknown. Never opened. */
    char model_origin[PT_PATH_MAX];
    char cluster_origin[PT_PATH_MAX];
    char source_dir[PT_PATH_MAX];    /* directory of the plan file */
    parallel_config config;
    int partition[PT_MAX_STAGES];    /* layers per stage */
    /* Each stage's own degrees ("stages"); zeros: the plan-wide ones, as
     * every plan without the key (and every plan built field by field)
     * has. Read through parallel_stage_config. */
    stage_degrees stages[PT_MAX_STAGES];
    int node_order_count;
    int *node_order;                 /* owned: node instances, pipeline order */
} plan;

/* Parses "0-11-8-8" (or a JSON array handled by the plan reader) into
 * stages; fails on empty parts, signs, junk or more than max_stages. */
int partition_parse(const char *text, int *out, int max_stages,
                    int *out_count, pt_error *err);
/* Writes "0-11-8-8". */
void partition_format(const int *layers, int count, char *out, size_t size);
/* The default partition: layers split evenly over stages, the earlier
 * stages taking one extra layer each while the remainder lasts. */
void partition_even(int layers, int stages, int *out);

/* Readers zero *out first; on failure they free what they built, so
 * *out is empty and safe to free again. file may be NULL ("<inline>"):
 * relative paths then resolve against the current directory. */
int plan_from_json(const json_t *obj, const char *file, plan *out,
                   pt_error *err);
int plan_load_file(const char *path, plan *out, pt_error *err);
void plan_free(plan *p);
/* The GPUs a plan's node order provides, and the node of a rank. */
int plan_gpu_count(const plan *p);
int plan_rank_node(const plan *p, int rank);
/* The first stage of p whose tp or dp is its own (not the plan-wide
 * one), or -1: a plan the symmetric tools (exec, export) can take. */
int plan_first_asymmetric_stage(const plan *p);
/* Fails where a stage's tp splits not whole heads, MLP columns and k/v
 * heads (and some vocabulary each), as exec needs; priced anyway. */
int plan_check_tp_split(const plan *p, pt_error *err);
/* The ranks of a plan (tp x dp x pp, or its stages' tp x dp summed), of
 * stage `stage`, the first of them and the stage holding a rank. */
int plan_rank_count(const plan *p);
int plan_stage_ranks(const plan *p, int stage);
int plan_stage_first_rank(const plan *p, int stage);
int plan_stage_of_rank(const plan *p, int rank);
/* The "stages" entry of a plan (parsed and checked against the degrees,
 * the model, the batch and held_gpus, those of node_order): the plan
 * reader's last step (common/plan_stages.c). */
int plan_stages_part(const json_t *obj, const json_place *place,
                     long long held_gpus, plan *out, pt_error *err);
/* "stages" as plan.json (and its alternatives) write it, one {"tp",
 * "dp"} a stage; NULL when no stage has its own degrees (the key is then
 * left out). *failed set when out of memory. */
json_t *stage_degrees_to_json(const parallel_config *config,
                              const stage_degrees *stages, bool *failed);
/* Ranks of a stage: rank = t + tp x (d + dp x s), so stage s holds the
 * tp x dp consecutive ranks from s x tp x dp. */
int parallel_ranks_per_stage(const parallel_config *config);
int parallel_stage_first_rank(const parallel_config *config, int stage);

/* What plan.json carries beside the plan proper, each built by the layer
 * that owns its content and attached under its key by plan_to_json
 * (borrowed: the writer takes its own reference). NULL leaves the key
 * out. The reader accepts and ignores all three. */
typedef struct plan_json_sections {
    json_t *estimate;      /* costmodel's estimate_to_json */
    json_t *alternatives;  /* runner-up plans (partita plan) */
    json_t *pareto;        /* the front of partita plan --pareto */
} plan_json_sections;

/* The JSON of a plan: model and cluster always inline (a plan stands
 * alone wherever it is moved), "origin" when known, then the sections.
 * sections may be NULL. NULL with err set when out of memory. */
json_t *plan_to_json(const plan *p, const plan_json_sections *sections,
                     pt_error *err);
/* plan_to_json written with json_write_file_atomic. */
int plan_write_file(const plan *p, const plan_json_sections *sections,
                    const char *path, pt_error *err);

/* ------------------------------------------------------------ runs table */

/* How the rows of a runs table (common/runs_table.c, docs/formats.md,
 * "Runs table") become plans: what a column the table lacks means, and
 * the cluster every run ran on (one node type; each run gets as many of
 * its nodes as tp x dp x pp GPUs fill). NULL levers: the plan's
 * defaults. where_column (may be NULL) keeps the rows whose cell in that
 * column is where_value. */
typedef struct runs_table_options {
    const char *precision, *recompute, *runtime, *attention;
    long vocab;
    const json_t *cluster;
    const char *cluster_file;      /* for messages */
    const char *where_column, *where_value;
} runs_table_options;

/* One measured run: its id, the plan it ran and its step time. */
typedef struct measured_run {
    char id[64];
    plan plan;                     /* owned */
    double measured_s;
} measured_run;

/* Reads a runs table; every message names the file and the line. *out
 * is owned by the caller (runs_table_free). */
int runs_table_load(const char *path, const runs_table_options *options,
                    measured_run **out, int *count, pt_error *err);
void runs_table_free(measured_run *runs, int count);

/* ----------------------------------------------------------------- clock */

/* Seconds on the monotonic clock (CLOCK_MONOTONIC), from an arbitrary
 * start: for durations, deadlines and timelines within one process; the
 * one clock every timing in Partita reads (common/clock.c). */
double pt_monotonic_seconds(void);

/* --------------------------------------------------------- atomic files */

/* Files that appear whole or not at all (common/atomic_file.c): written
 * under a temporary name beside the target, fsynced, then renamed over
 * it, so a crash or an error leaves the old file (or none) and never a
 * partial one. pt_write_file_atomic does it in one call; the steps are
 * public for writers that stream (datasets) or must be interruptible
 * between steps (checkpoints).
 */

/* Writes size bytes of data to path. A regular file (or none yet) is
 * replaced through a temporary file, fsync and rename, keeping its
 * permissions; no file is left under either name on failure. Symbolic
 * links are followed (the link stays, its target is replaced). "-" is
 * standard output, and a device, FIFO or socket is written through, as
 * cp and tee do: there is nothing to rename over. A directory is
 * refused. */
int pt_write_file_atomic(const char *path, const void *data, size_t size,
                         pt_error *err);

/* Before any work: 0 when pt_write_file_atomic could write path ("-", a
 * device or FIFO that may be written, or a file whose folder exists and
 * takes a new file, tried by creating and removing one). -1 otherwise,
 * e.g. "out/plan.json: cannot write there: folder out: No such file or
 * directory". */
int pt_check_output_file(const char *path, pt_error *err);
/* The same for a folder that will be made if missing (mkdir -p): it is a
 * folder, or its nearest existing ancestor is one, and takes a new
 * file. */
int pt_check_output_folder(const char *dir, pt_error *err);

/* Where a file written in steps under path must be renamed to: the
 * file at the end of its symbolic links (the links stay), in resolved;
 * -1 for a directory, a device, a FIFO or "-", which cannot be replaced
 * by a rename. */
int pt_output_target(const char *path, char *resolved, size_t size,
                     pt_error *err);
/* Before any work: -1 when output names (through links or another path)
 * the same regular file as input, which writing it would replace, e.g.
 * "p.json: the output is the plan it reads: ..."; input_role ("plan",
 * "model", "dataset") says what the input is. 0 when either is missing
 * or NULL, or output is "-". */
int pt_check_output_not_input(const char *output, const char *input,
                              const char *input_role, pt_error *err);

/* Writes all of data, retrying short writes and EINTR; 0 or -1 (errno). */
int pt_write_fully(int fd, const void *data, size_t size);
/* Creates an empty temporary file beside target ("target.tmp.<pid>.<n>",
 * mode 0666 less umask), names it in temp_path and returns its
 * descriptor, or -1 with err. */
int pt_temp_file_beside(const char *target, char *temp_path,
                        size_t temp_size, pt_error *err);
/* fsyncs and closes fd (before a rename: otherwise a crash can leave the
 * new name on an empty or partial file). On failure the temporary file is
 * removed. fd is closed either way. */
int pt_finish_temp_file(int fd, const char *temp_path, pt_error *err);
/* Renames a finished temporary file to target; removes it on failure. */
int pt_rename_into_place(const char *temp_path, const char *target,
                         pt_error *err);
/* pt_finish_temp_file, then pt_rename_into_place. */
int pt_publish_temp_file(int fd, const char *temp_path, const char *target,
                         pt_error *err);
/* fsyncs a directory so that renames and creations inside it last. */
int pt_sync_directory(const char *dir, pt_error *err);

/* ---------------------------------------------------------- input files */

/* Input files read through read(2) (common/file_reader.c): a failed read
 * is an error naming the file and the reason, never taken for the end of
 * the file, and nothing is read past a bound, so an endless input
 * (/dev/zero, a FIFO, one line of 400 MB) is refused in one line rather
 * than exhausting memory. A directory is refused as one.
 */

/* A file read line by line. */
typedef struct pt_line_reader {
    const char *path;          /* as the user gave it, for messages */
    int fd;                    /* -1 when closed */
    size_t max_line;           /* bytes a line may hold, newline excluded */
    char *buffer;              /* owned: bytes read, not yet returned */
    size_t capacity, start, end;
    bool at_end;               /* read(2) said end of file */
    bool ended_by_newline;     /* of the last line returned */
    uint64_t line_number;      /* of the last line returned, from 1 */
    uint64_t bytes_read;
} pt_line_reader;

int pt_line_reader_open(pt_line_reader *r, const char *path,
                        size_t max_line, pt_error *err);
/* 1 with the next line in *line (without its newline, NUL-terminated,
 * valid until the next call; it may hold NUL bytes, *length counts
 * them), 0 at the end of the file, -1 with err on a read error or a line
 * longer than max_line ("in.txt:3: the line is longer than ..."). */
int pt_line_reader_next(pt_line_reader *r, char **line, size_t *length,
                        pt_error *err);
void pt_line_reader_close(pt_line_reader *r);

/* The whole file, NUL-terminated, in *data (the caller frees), its size
 * in *size; -1 with err on a read error or past max_bytes. */
int pt_read_file(const char *path, size_t max_bytes, char **data,
                 size_t *size, pt_error *err);

/* The most a JSON input file (model, cluster, profile, plan, run.json,
 * manifest) may hold: far above any real one. */
#define PT_JSON_MAX_BYTES ((size_t)256 << 20)

/* Little-endian loads and stores of 1 to 8 bytes at any alignment (the
 * byte order of datasets and checkpoints). */
static inline uint64_t pt_load_le(const unsigned char *bytes, size_t width)
{
    uint64_t value = 0;
    for (size_t i = width; i > 0; i--)
        value = (value << 8) | bytes[i - 1];
    return value;
}

static inline void pt_store_le(unsigned char *bytes, uint64_t value,
                               size_t width)
{
    for (size_t i = 0; i < width; i++) {
        bytes[i] = (unsigned char)(value & 0xff);
        value >>= 8;
    }
}

/* ------------------------------------------------------------- run.json */

/* run.json (formats.md, "Run"), the record of a training run. One owner,
 * common/run_json.c: `partita exec` fills a run_json (executor/run) and
 * builds the file's object with run_json_build; `partita report` reads it
 * back with run_json_read (report/run_record.c). A run_json is plain data:
 * the writer borrows what it points to; the reader allocates iterations,
 * events, peak_memory_gib and memory_terms, freed by run_json_free.
 */
#define RUN_JSON_FORMAT "partita-run/1"
/* The most ranks a run has: what exec runs, and so what a record holds. */
#define RUN_JSON_MAX_RANKS (PT_MAX_STAGES * 64)

/* One iteration. */
typedef struct run_json_iteration {
    long iteration;              /* 1-based, counting those before a resume */
    double step_time_s;
    double loss;                 /* nats per token; NAN when a file has none */
    double grad_norm;            /* written only */
    double learning_rate;        /* written only */
} run_json_iteration;

/* One timed phase of the chosen iteration (formats.md, "Events"). */
typedef struct run_json_event {
    int rank;
    int stage;
    int microbatch;              /* -1 for the once-per-step phases */
    char kind[PT_NAME_MAX];      /* the cost model's event kind names */
    int kind_index;              /* read: what the reader's kind_index
                                    gave for kind */
    double start_s;              /* from the start of the iteration */
    double end_s;
} run_json_event;

/* The device of a rank (written only). */
typedef struct run_json_device {
    int rank;
    const char *name;
    int sms_used;                /* 0: not a GPU, or not reported (null) */
    double memory_cap_bytes;     /* 0: none (null) */
    const char *driver_version;  /* "": unknown (null) */
    const char *cuda_version;
} run_json_device;

/* The record. "read" fields are those the reader fills; the others are
 * written only. */
typedef struct run_json {
    char file[PT_PATH_MAX];      /* read: as the user named it */
    json_t *plan;                /* written: the plan, model and cluster
                                    inline (a reference is taken) */
    int tp, dp, pp, gbs, mbs;    /* read (from plan); gbs, mbs written */
    int plan_ranks;              /* read: tp x dp x pp, or the plan's
                                    stages' tp x dp summed */
    char backend[PT_NAME_MAX];   /* training.backend; read: "" if absent */
    int rank_count;              /* read: entries of peak_memory_gib;
                                    written: ranks of max_rss_gib */
    int device_count;
    const run_json_device *devices;
    char data_prefix[PT_PATH_MAX];
    uint64_t dataset_tokens;
    uint64_t dataset_documents;
    uint32_t largest_token;
    uint64_t seed;
    int micro_batches;
    long tokens_per_iteration;
    double max_lr, min_lr;
    long warmup_iterations, decay_iterations;
    double max_grad_norm;
    long first_iteration, last_iteration;
    char resumed_from[PT_PATH_MAX];  /* "": not resumed (null) */
    bool stopped_early;
    char stop_reason[512];           /* why it stopped early; "": it ran
                                        to the end (null) */
    long interrupted_iteration;      /* abandoned by a stop; 0: none
                                        (null) */
    long last_checkpoint_iteration;  /* 0: none (null) */
    char started_utc[32];
    long iteration_count;        /* read */
    run_json_iteration *iterations;  /* read */
    long events_iteration;       /* read */
    int event_count;             /* read */
    run_json_event *events;      /* read */
    int peak_memory_count;       /* read: rank_count */
    double *peak_memory_gib;     /* read */
    const char *peak_memory_basis;
    /* Each rank's device memory by term, peak_memory_count entries: NAN
     * bytes where not known (written null: a rank with none known, or
     * one term such as an unmeasured context). Written when not NULL;
     * read: NULL when the file has none (an older file). */
    pt_memory_terms *memory_terms;
    double max_rss_gib;          /* the process's peak resident set */
    double step_time_s;          /* read */
    double tokens_per_s;         /* read */
    double tflops_per_gpu;       /* read */
    int note_count;
    const char *const *notes;
} run_json;

/* The run.json object of r; NULL (err filled) when out of memory. */
json_t *run_json_build(const run_json *r, pt_error *err);

/* The index of an event kind name, or -1 when the caller knows no such
 * kind (report: the cost model's event_kind_from_name). */
typedef int (*run_json_kind_index)(const char *kind);
/* Reads the fields a report uses, each validated; *out is zeroed first
 * and emptied on failure. Messages name file (NULL: "<inline>"), the JSON
 * path and the reason. */
int run_json_read(const json_t *root, const char *file,
                  run_json_kind_index kind_index, run_json *out,
                  pt_error *err);
void run_json_free(run_json *run);

#endif
