/*
 * executor: trains a GPT-2-family model under a plan. Public header of the
 * executor library; the data half (datasets, prep, sampling, checkpoints)
 * is declared in executor/data.h, which this header includes.
 *
 * This half holds the model and its training:
 *   - backends behind one interface (stage_backend): `cpu`, plain fp32 C,
 *     the reference; `cuda` is declared but not built yet;
 *   - a model *stage*: a range of transformer layers, optionally with the
 *     embedding (first pipeline stage) and the final norm, LM head and
 *     loss (last stage). The whole model is one stage holding everything;
 *   - all parameters of a stage in one contiguous fp32 buffer described by
 *     a table of named tensors (one all-reduce, one checkpoint write);
 *   - AdamW, gradient-norm clipping, the learning-rate schedule and a
 *     training-step helper for the single-stage case;
 *   - the CPU reference ops (forward and backward of each), public so that
 *     tests and, later, the CUDA backend can be checked against them.
 * docs/executor.md describes the layout, the ops and their tests.
 *
 * Like every library of Partita, nothing here prints or exits: functions
 * that can fail return -1 and fill a pt_error.
 */
#ifndef PARTITA_EXECUTOR_H
#define PARTITA_EXECUTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "executor/data/data.h"

/* ------------------------------------------------------------- backends */

/* The largest tensor-parallel degree a stage accepts. */
#define PT_MAX_TP 64

typedef enum backend_kind { BACKEND_CPU, BACKEND_CUDA } backend_kind;

/* "cpu" or "cuda". */
const char *backend_name(backend_kind kind);
/* Parses "cpu" / "cuda"; the message lists the accepted names. */
int backend_parse(const char *text, backend_kind *out, pt_error *err);

/* ---------------------------------------------------------- stage layout */

/* Which part of the model a stage holds: transformer layers
 * [first_layer, last_layer) (possibly none), and whether it holds the
 * embedding (token + position; the first pipeline stage) and the head
 * (final layer norm, LM head and loss; the last stage). */
typedef struct stage_spec {
    int first_layer;
    int last_layer;
    bool has_embedding;
    bool has_head;
    /* Tensor parallelism, Megatron style: the stage holds shard tp_rank of
     * tp (tp 0 is read as 1, the unsplit stage). Attention heads, the MLP's
     * inner features and the vocabulary are split: column-parallel QKV and
     * first MLP matrix, row-parallel projections, vocab-parallel embedding
     * and head. Norms, the position embedding and the row-parallel biases
     * are replicated on every shard. */
    int tp;
    int tp_rank;
    /* The distributed optimizer (ZeRO-1): the stage keeps AdamW state for
     * shard optimizer_shard of optimizer_shards (its data-parallel rank of
     * dp) and steps only those parameters; the runtime reduce-scatters the
     * gradients before and all-gathers the parameters after. 0 is read as
     * 1: the whole state. */
    int optimizer_shards;
    int optimizer_shard;
    /* Full activation recompute (a plan's "recompute": "full"): each
     * activation slot keeps only every layer's input (the residual stream
     * between layers); a layer's forward is run again right before its
     * backward, into one set of activations the stage shares. The same
     * arithmetic, so the same results, for about one more forward. */
    bool recompute_layers;
} stage_spec;

/* spec->tp, or 1 when it is 0. */
int stage_spec_tp(const stage_spec *spec);

/* Where each of `shards` optimizer shards of a buffer of param_count
 * floats starts: offsets[0..shards] (offsets[shards] = param_count), in
 * equal runs of a multiple of 64 floats (aligned vector loads) but the
 * last. A run may be empty when there are more shards than runs. */
void stage_optimizer_offsets(size_t param_count, int shards, size_t *offsets);
/* Shard `shard`'s part of those: [*first, *first + *count). */
void stage_optimizer_range(size_t param_count, int shards, int shard,
                           size_t *first, size_t *count);
/* The rows [*first, *first + *count) of the vocabulary shard tp_rank holds:
 * ceil(vocab / tp) rows each, the last shard taking what remains. */
void stage_vocab_shard(int vocab, int tp, int tp_rank, int *first,
                       int *count);

/* The sizes a stage's tensor-parallel shard computes with (the unsplit
 * model's when tp is 1): the residual stream's width is never split. */
typedef struct stage_shard {
    int tp;
    int attention_channels;  /* hidden / tp */
    int heads;               /* heads / tp */
    int ffn;                 /* ffn_hidden / tp */
    int vocab_first;         /* the shard's vocabulary rows */
    int vocab_count;
} stage_shard;

stage_shard stage_shard_of(const model_shape *shape, const stage_spec *spec);

/* The single stage of an unsplit model: all layers, embedding and head. */
stage_spec stage_spec_whole_model(const model_shape *shape);

/* The spec of stage `stage_index` of a pipeline whose stages hold
 * layers_per_stage[0..stage_count) layers (a plan's partition): the first
 * stage holds the embedding, the last the head. Fails when the partition
 * does not sum to the model's layers or the index is out of range. */
int stage_spec_from_partition(const model_shape *shape,
                              const int *layers_per_stage, int stage_count,
                              int stage_index, stage_spec *out,
                              pt_error *err);

/* One named tensor inside a stage's parameter buffer (and, at the same
 * offset, inside its gradient and optimizer-state buffers). Names use the
 * model's global layer index, "layers.5.attn_qkv_weight", so that a tensor
 * keeps its name whatever the split. Matrices are row-major rows x cols
 * with rows = output features (the convention out = in W^T + b);
 * vectors have rows = 1. */
typedef struct param_tensor {
    char name[PT_NAME_MAX];
    size_t offset;          /* in floats from the start of the buffer */
    size_t count;           /* rows x cols */
    int rows;
    int cols;
    bool weight_decay;      /* AdamW decays it: matrices, not biases/norms */
    bool tied_copy;         /* the last stage's copy of the token embedding
                               when embeddings are tied but the embedding
                               sits on another stage: its gradient must be
                               summed with the first stage's token-embedding
                               gradient before the optimizer step (the
                               "embedding all-reduce") */
    /* Where this shard sits in the whole tensor (full_rows x full_cols):
     * the full rows fall in row_parts equal parts (3 for the QKV matrix:
     * queries, keys, values; else 1) and the shard holds rows / row_parts
     * rows of each, from part_row_offset within the part; likewise for
     * columns (col_parts 3 for the QKV bias). The unsplit tensor has
     * parts 1, offsets 0 and full = its own shape. */
    int full_rows;
    int full_cols;
    int row_parts;
    int part_row_offset;
    int col_parts;
    int part_col_offset;
    bool replicated;        /* the same on every tensor-parallel shard
                               (counted once in the gradient norm) */
} param_tensor;

/* The tensors of a stage in buffer order: embedding (token, position),
 * then each layer (ln1 weight/bias, attn_qkv weight/bias, attn_proj
 * weight/bias, ln2 weight/bias, mlp_fc weight/bias, mlp_proj
 * weight/bias), then the head (final_norm weight/bias, and lm_head_weight
 * when it is untied or its embedding sits on another stage). Returns the
 * number of tensors; fills `out` when it is not NULL (it then needs room
 * for that many) and *total_floats when not NULL. Fails on an invalid
 * shape or spec. */
int stage_parameter_layout(const model_shape *shape, const stage_spec *spec,
                           param_tensor *out, size_t *total_floats,
                           pt_error *err);

/* --------------------------------------------------------------- stages */

struct stage_backend;

/*
 * One stage of the model on one device, with its parameters, gradients,
 * AdamW state and the activations of up to `slot_count` micro-batches in
 * flight (1F1B keeps several; a plain training step needs one). Owned by
 * the thread that created it; create with model_stage_create and release
 * with model_stage_destroy. The four float buffers live in the backend's
 * memory (host memory for cpu, device memory for cuda); use
 * model_stage_read / model_stage_write to move them to and from the host.
 */
typedef struct model_stage {
    model_shape shape;
    stage_spec spec;
    const struct stage_backend *backend;
    int mbs_capacity;            /* largest micro-batch it accepts */
    int slot_count;              /* micro-batches whose activations it keeps */
    int tensor_count;
    param_tensor *tensors;       /* owned, host memory, buffer order */
    size_t param_count;          /* floats in each of the buffers below */
    float *params;
    float *grads;
    float *adam_m;               /* AdamW first moment */
    float *adam_v;               /* AdamW second moment */
    /* The parameters the optimizer steps, [optimizer_first,
     * optimizer_first + optimizer_count): all of them, or the stage's
     * ZeRO-1 shard; adam_m and adam_v hold optimizer_count floats, for
     * these only. With a shard, the gradient norms cover it only (the
     * rest of grads is not this rank's after the reduce-scatter). */
    size_t optimizer_first;
    size_t optimizer_count;
    long optimizer_steps;        /* AdamW steps taken (bias correction, LR) */
    void *backend_state;         /* owned by the backend: activations */
    /* Tensor parallelism (spec.tp > 1): the comm and the ranks of this
     * stage's tp group, in tp_rank order, through which the backend sums
     * the partial results of row-parallel layers (model_stage_attach_tp).
     * tp_compute_only: no comm; the sums are skipped, so the results are
     * not the model's but the arithmetic is a shard's (the profiler). */
    const struct comm *tp_comm;
    int tp_group[PT_MAX_TP];
    bool tp_compute_only;
} model_stage;

/* What one micro-batch brings to a stage's forward or backward call.
 * tokens holds mbs windows of seq + 1 token ids: a window's first seq are
 * the inputs (read by a stage with the embedding) and its last seq the
 * targets (read by a stage with the head). Pointers are in the backend's
 * memory except tokens, which is always host memory. */
typedef struct stage_io {
    int mbs;                     /* sequences, 1..mbs_capacity */
    const uint32_t *tokens;      /* mbs x (seq + 1); NULL is allowed only
                                    for a stage with neither embedding nor
                                    head */
    const float *input;          /* forward without embedding: the previous
                                    stage's output, mbs x seq x hidden */
    const float *output_grad;    /* backward without head: d loss / d output,
                                    mbs x seq x hidden */
    float loss_scale;            /* backward with head: gradients are of
                                    loss_scale x (mean loss of this
                                    micro-batch); 1/micro-batches averages
                                    accumulated micro-batches */
} stage_io;

/* The buffers model_stage_read / model_stage_write move. */
typedef enum stage_buffer {
    STAGE_PARAMS,
    STAGE_GRADS,
    STAGE_ADAM_M,
    STAGE_ADAM_V
} stage_buffer;

/*
 * AdamW hyper-parameters. Defaults (adamw_defaults): beta1 0.9, beta2 0.95,
 * eps 1e-8, weight decay 0.1, the GPT-2 / GPT-3 recipe as Megatron runs it.
 * Decay applies to matrices only (param_tensor.weight_decay).
 */
typedef struct adamw_config {
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
} adamw_config;

adamw_config adamw_defaults(void);

/*
 * The backend interface: a table of functions every backend provides.
 * Callers use the model_stage_* / stage_* wrappers below, which check
 * arguments and then dispatch here, so a backend sees valid input only.
 */
typedef struct stage_backend {
    backend_kind kind;
    const char *name;
    /* Allocates params, grads, adam_m, adam_v (param_count floats each,
     * zeroed) and the activations; fills backend_state. */
    int (*allocate)(model_stage *stage, pt_error *err);
    /* Frees what allocate made; safe on a partly allocated stage. */
    void (*release)(model_stage *stage);
    /* mean_loss is never NULL here; a stage without the head writes 0. */
    int (*forward)(model_stage *stage, int slot, const stage_io *io,
                   float *mean_loss, pt_error *err);
    int (*backward)(model_stage *stage, int slot, const stage_io *io,
                    pt_error *err);
    int (*zero_grads)(model_stage *stage, pt_error *err);
    int (*grad_square_sum)(const model_stage *stage, double *out,
                           pt_error *err);
    /* The same, one sum per tensor (tensor_count doubles, table order). */
    int (*grad_square_sums)(const model_stage *stage, double *per_tensor,
                            pt_error *err);
    /* optimizer_steps is already incremented: it is the step t of the
     * bias correction. */
    int (*adamw_step)(model_stage *stage, const adamw_config *config,
                      float learning_rate, float grad_scale, pt_error *err);
    int (*copy_to_host)(const model_stage *stage, stage_buffer which,
                        float *host, pt_error *err);
    int (*copy_from_host)(model_stage *stage, stage_buffer which,
                          const float *host, pt_error *err);
    /* Called after params changed in backend memory outside adamw_step
     * (the distributed optimizer's all-gather); NULL when nothing
     * derives from them. */
    int (*params_changed)(model_stage *stage, pt_error *err);
    /* Activation buffers in backend memory, mbs_capacity x seq x hidden. */
    float *(*input_buffer)(model_stage *stage, int slot);
    const float *(*output)(const model_stage *stage, int slot);
    const float *(*input_grad)(const model_stage *stage);
    /* Where a stage without the head receives d loss / d output,
     * mbs_capacity x seq x hidden floats in backend memory. */
    float *(*output_grad_buffer)(model_stage *stage);
} stage_backend;

/* The backend of a kind; fails for a kind that is not built (cuda, for
 * now). */
const stage_backend *backend_find(backend_kind kind, pt_error *err);

/* Lays out and allocates a stage; parameters start at zero (call
 * model_stage_init_parameters). mbs_capacity >= 1, slot_count >= 1. On
 * failure nothing is left allocated. */
int model_stage_create(model_stage *out, const model_shape *shape,
                       const stage_spec *spec, backend_kind kind,
                       int mbs_capacity, int slot_count, pt_error *err);
void model_stage_destroy(model_stage *stage);

/* Connects a tensor-parallel stage to its group: ranks[0..spec.tp) of
 * comm c, in tp_rank order; or, with c NULL, marks it compute-only. */
int model_stage_attach_tp(model_stage *stage, const struct comm *c,
                          const int *ranks, pt_error *err);
/* Sums data (backend memory) over the stage's tp group; nothing when
 * tp is 1 or the stage is compute-only. Backends call these. */
int stage_tp_all_reduce_sum(const model_stage *stage, float *data,
                            size_t count, pt_error *err);
int stage_tp_all_reduce_max(const model_stage *stage, float *data,
                            size_t count, pt_error *err);

/* The tensor of that name, or NULL. */
const param_tensor *model_stage_find_tensor(const model_stage *stage,
                                            const char *name);

/*
 * Deterministic GPT-2 initialisation from a seed: matrices and embeddings
 * ~ N(0, 0.02^2), the two residual projections of each layer (attn_proj,
 * mlp_proj) ~ N(0, (0.02 / sqrt(2 x layers))^2), biases 0, norm weights
 * 1 and norm biases 0. Each tensor draws from its own stream, seeded by
 * the seed and the tensor's global name, so any split of the model gets
 * the same values as the whole model, and a tied copy of the embedding
 * equals the embedding. Also zeroes grads and AdamW state and resets
 * optimizer_steps.
 */
int model_stage_init_parameters(model_stage *stage, uint64_t seed,
                                pt_error *err);

/* The buffer `which` of a stage, in the backend's memory (for backends
 * and for code that stays in that memory). */
float *model_stage_buffer(const model_stage *stage, stage_buffer which);

/* Floats in buffer `which`: param_count, or optimizer_count for the
 * AdamW moments. */
size_t model_stage_buffer_count(const model_stage *stage,
                                stage_buffer which);

int model_stage_read(const model_stage *stage, stage_buffer which,
                     float *host, pt_error *err);
int model_stage_write(model_stage *stage, stage_buffer which,
                      const float *host, pt_error *err);

/*
 * Forward of one micro-batch into activation slot `slot` (kept until its
 * backward). A stage with the head writes the mean cross-entropy over the
 * micro-batch's mbs x seq positions (nats per token) to *mean_loss; others
 * write 0. mean_loss may be NULL.
 */
int stage_forward(model_stage *stage, int slot, const stage_io *io,
                  float *mean_loss, pt_error *err);
/* Backward of the micro-batch in `slot` (its forward must be the last one
 * run in that slot): ADDS its parameter gradients to grads, so successive
 * micro-batches accumulate, and, when the stage has no embedding, leaves
 * d loss / d input in stage_input_grad. */
int stage_backward(model_stage *stage, int slot, const stage_io *io,
                   pt_error *err);

/* Where a stage without the embedding can receive its input directly
 * (then pass the same pointer as io.input, and no copy is made). */
float *stage_input_buffer(model_stage *stage, int slot);
/* The activation a stage without the head hands to the next stage:
 * io.mbs x seq x hidden floats, valid from the forward into that slot
 * until the next forward into it. */
const float *stage_output(const model_stage *stage, int slot);
/* d loss / d input of the last backward of a stage without the
 * embedding: io.mbs x seq x hidden floats, valid until the stage's next
 * backward (send it, or copy it, before that). NULL for a stage with the
 * embedding, whose input is tokens. */
const float *stage_input_grad(const model_stage *stage);
/* A buffer in backend memory for the output gradient a stage without the
 * head receives (pass it as io.output_grad); NULL for a stage with it. */
float *stage_output_grad_buffer(model_stage *stage);

int stage_zero_grads(model_stage *stage, pt_error *err);
/* Sum of squares of all gradients (double). The global norm of a split
 * model is the square root of the sum over stages (counting a tied copy
 * once, after its gradient has been summed in). */
int stage_grad_square_sum(const model_stage *stage, double *out,
                          pt_error *err);
/* This stage's share of the squared global gradient norm of a parallel
 * model: the sum of squares of its gradients less the tensors counted
 * elsewhere: a tied copy of the embedding (counted on the first stage) and,
 * on tensor-parallel shards other than 0, the replicated tensors. */
int stage_grad_norm_share(const model_stage *stage, double *out,
                          pt_error *err);
/* One AdamW step on every parameter with gradient g x grad_scale (the
 * clipping coefficient); increments optimizer_steps first and uses it for
 * bias correction. */
int stage_adamw_step(model_stage *stage, const adamw_config *config,
                     float learning_rate, float grad_scale, pt_error *err);
/* After params were written in backend memory by other means than the
 * optimizer (an all-gather): lets the backend refresh what it derives. */
int stage_params_changed(model_stage *stage, pt_error *err);

/* ------------------------------------------------------------ optimizer */

/* The factor that scales gradients of global norm grad_norm down to
 * max_norm: min(1, max_norm / (grad_norm + 1e-6)); 1 when max_norm <= 0
 * (clipping off). */
float clip_coefficient(double grad_norm, float max_norm);

/*
 * Learning rate by step: linear warm-up from max_lr / warmup_steps to
 * max_lr over the first warmup_steps steps, then cosine decay from max_lr
 * down to min_lr at step decay_steps, then min_lr. Steps count from 0.
 * Defaults (lr_schedule_defaults), those of GPT-2 small trained from
 * scratch: max 6e-4, min 6e-5, warm-up 2000 steps, decay over 600000.
 */
typedef struct lr_schedule {
    double max_lr;
    double min_lr;
    long warmup_steps;   /* 0: start at max_lr */
    long decay_steps;    /* step at which min_lr is reached; counts the
                            warm-up; must be >= warmup_steps */
} lr_schedule;

lr_schedule lr_schedule_defaults(void);
/* Fails on negative or inconsistent values (min_lr > max_lr, ...). */
int lr_schedule_check(const lr_schedule *schedule, pt_error *err);
double lr_schedule_at(const lr_schedule *schedule, long step);

/* ------------------------------------------------------------- training */

/* Everything a training step needs besides the model and the data. */
typedef struct train_config {
    adamw_config adamw;
    lr_schedule schedule;
    float max_grad_norm;      /* global-norm clipping; <= 0: off. Default 1 */
} train_config;

train_config train_config_defaults(void);

/* What one step did. */
typedef struct step_result {
    float loss;               /* mean over all micro-batches, nats/token */
    float grad_norm;          /* global gradient norm before clipping */
    float learning_rate;      /* the rate the step used */
} step_result;

/*
 * One training step of a whole-model stage (stage_spec_whole_model):
 * zero the gradients; for each of micro_batches micro-batches of mbs
 * windows (tokens: micro_batches x mbs x (seq + 1) ids, micro-batch after
 * micro-batch), forward and backward in slot 0 with loss_scale
 * 1/micro_batches, so the gradients end up averaged; clip by global norm;
 * one AdamW step at the schedule's rate for stage->optimizer_steps.
 */
int train_step(model_stage *stage, const train_config *config,
               const uint32_t *tokens, int micro_batches, int mbs,
               step_result *out, pt_error *err);

/* -------------------------------------------------- random numbers */

/*
 * The generator behind initialisation, also handy for tests: splitmix64
 * (a 64-bit counter stepped by the golden-ratio constant and passed
 * through a mixing function), uniform floats from its top bits and normal
 * ones by Box-Muller. Not cryptographic; the same sequence on every
 * machine. The struct is the whole state; no global state anywhere.
 */
typedef struct model_rng {
    uint64_t state;
    bool has_spare;          /* Box-Muller makes two normals at a time */
    double spare;
} model_rng;

void model_rng_seed(model_rng *rng, uint64_t seed);
uint64_t model_rng_next(model_rng *rng);
/* Uniform in [0, 1), 53 random bits. */
double model_rng_uniform(model_rng *rng);
/* Standard normal. */
double model_rng_normal(model_rng *rng);

/* ---------------------------------------------------- cpu reference ops */

/*
 * The layers of the model as plain fp32 C on host memory, forward and
 * backward of each as separate functions, each checked against finite
 * differences (tests/executor/model/test_ops.c).
 *
 * Shapes: B sequences, T positions, C channels, N = B x T rows, OC output
 * channels, NH heads, V vocabulary. Row-major throughout.
 *
 * Gradient convention: every backward ADDS into its gradient outputs,
 * parameters and inputs alike (callers zero them first), so a buffer can
 * gather the contributions of several consumers; the one exception is
 * cpu_softmax_crossentropy_backward, the start of the chain, which writes.
 * A NULL gradient output is skipped.
 */

/* out[b,t,:] = token_embedding[tokens[b,t],:] + position_embedding[t,:].
 * tokens: B x T ids below the embedding's rows (the caller checks). */
void cpu_embedding_forward(float *out, const uint32_t *tokens,
                           const float *token_embedding,
                           const float *position_embedding, int B, int T,
                           int C);
void cpu_embedding_backward(float *d_token_embedding,
                            float *d_position_embedding, const float *d_out,
                            const uint32_t *tokens, int B, int T, int C);

/* Layer norm over the last axis with eps 1e-5: out = (x - mean) * rstd *
 * weight + bias; keeps mean and rstd (N each) for the backward. */
void cpu_layernorm_forward(float *out, float *mean, float *rstd,
                           const float *inp, const float *weight,
                           const float *bias, int N, int C);
void cpu_layernorm_backward(float *d_inp, float *d_weight, float *d_bias,
                            const float *d_out, const float *inp,
                            const float *weight, const float *mean,
                            const float *rstd, int N, int C);

/* out (N x OC) = inp (N x C) weight^T + bias, weight OC x C (one row per
 * output channel); bias may be NULL (the LM head has none). */
void cpu_matmul_forward(float *out, const float *inp, const float *weight,
                        const float *bias, int N, int C, int OC);
void cpu_matmul_backward(float *d_inp, float *d_weight, float *d_bias,
                         const float *d_out, const float *inp,
                         const float *weight, int N, int C, int OC);

/* Causal multi-head self-attention. qkv: B x T x 3C, the query, key and
 * value of a position side by side, head h at channels [h C/NH, (h+1)
 * C/NH) of each. out: B x T x C, heads side by side. probs: B x NH x T x T
 * softmax weights (zero above the diagonal), kept for the backward. */
void cpu_attention_forward(float *out, float *probs, const float *qkv,
                           int B, int T, int C, int NH);
/* scratch: T floats of working space. */
void cpu_attention_backward(float *d_qkv, const float *d_out,
                            const float *qkv, const float *probs,
                            float *scratch, int B, int T, int C, int NH);

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))), as GPT-2. */
void cpu_gelu_forward(float *out, const float *inp, size_t count);
void cpu_gelu_backward(float *d_inp, const float *d_out, const float *inp,
                       size_t count);

/* out = a + b (the skip connection around each sub-block). */
void cpu_residual_forward(float *out, const float *a, const float *b,
                          size_t count);
void cpu_residual_backward(float *d_a, float *d_b, const float *d_out,
                           size_t count);

/* Softmax over each row of logits (N x V) into probs (may be the same
 * buffer) and the cross-entropy of each row against its target into
 * losses (N). Returns the mean loss (accumulated in double). */
float cpu_softmax_crossentropy_forward(float *probs, float *losses,
                                       const float *logits,
                                       const uint32_t *targets, int N, int V);
/* WRITES d_logits = (probs - onehot(target)) x d_loss for every row, where
 * d_loss is d (objective) / d (each row's loss); d_logits may be probs. */
void cpu_softmax_crossentropy_backward(float *d_logits, const float *probs,
                                       const uint32_t *targets, float d_loss,
                                       int N, int V);

/* One AdamW update of `count` parameters, step >= 1 (bias correction):
 * g = grads x grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr (m_hat / (sqrt(v_hat) + eps) + decay p), decay = weight_decay
 * when `decay` else 0 (decoupled weight decay). */
void cpu_adamw_update(float *params, const float *grads, float *m, float *v,
                      size_t count, const adamw_config *config,
                      float learning_rate, float grad_scale, long step,
                      bool decay);

/* ---------------------------------------------------- single-stage runs */

/*
 * `partita exec` for plans of one stage on one device (tp = dp = pp = 1),
 * and for parallel plans (pp, dp or tp > 1), whose ranks run as threads
 * through the parallel runtime: on the cpu backend over the threads comm
 * (pipeline_threads), on the cuda backend one GPU per rank over NCCL or
 * ranks sharing GPUs over the host-staged comm (pipeline_gpu,
 * executor/pipeline_gpu.h), after the plan was checked
 * against this machine's GPUs (device_check_plan); on the same data, seed
 * and record:
 * samples from a dataset (gpt_sampler), gbs / mbs accumulated
 * micro-batches per iteration, AdamW with clipping and the schedule,
 * per-phase timing, checkpoints that resume bit for bit, and a record of
 * it all for run.json. Only the backend interface is used, so any backend
 * that backend_find hands out runs here. docs/executor.md ("partita exec")
 * and docs/formats.md ("Run") describe it.
 */

#include <signal.h>

struct run_result;

/* Called after every iteration (and after an interval's checkpoint, if
 * one was due); so_far->iterations[so_far->iteration_count - 1] is the
 * iteration just finished. For printing progress: it must not keep the
 * pointer. */
typedef void (*run_observer)(const struct run_result *so_far, void *data);

/* The comm of a parallel plan's ranks on GPUs (executor/pipeline_gpu.h):
 * NCCL, one GPU per rank; or host-staged, slow, but ranks may share a GPU
 * (each in its own slice of SMs) and no NCCL is needed. */
typedef enum run_gpu_comm {
    RUN_GPU_COMM_AUTO,
    RUN_GPU_COMM_NCCL,
    RUN_GPU_COMM_HOST,
} run_gpu_comm;

/* What a run is asked to do. run_options_defaults fills every field. */
typedef struct run_options {
    const char *data_prefix;     /* PREFIX of PREFIX.bin / PREFIX.idx */
    backend_kind backend;
    long iterations;             /* the run ends after this iteration,
                                    counted from the start of training: a
                                    resumed run continues up to it */
    uint64_t seed;               /* initialisation and data order */
    bool seed_given;             /* false: a resumed run takes the
                                    checkpoint's seed; true: it must match */
    train_config train;          /* AdamW, clipping, learning-rate schedule */
    const char *save_dir;        /* NULL: no checkpoints */
    long save_interval;          /* iterations between checkpoints; 0: only
                                    at the end (a stopped run saves too) */
    const char *load_dir;        /* NULL: start from initialisation */
    double memory_available_bytes; /* cpu backend: 0 means the machine's
                                      physical memory */
    double comm_timeout_s;       /* parallel runs: how long a rank waits
                                    for a peer before the run fails; 0:
                                    the default (3600 s on cpu, 300 s on
                                    cuda) */
    run_gpu_comm gpu_comm;       /* cuda backend, ranks as threads: how
                                    they communicate (RUN_GPU_COMM_AUTO:
                                    NCCL when built and every rank has a
                                    GPU of its own, else host-staged) */
    struct comm_mpi *processes;  /* NULL: the ranks of a parallel plan
                                    are threads of this process. Else one
                                    process per rank (mpirun, srun): this
                                    process runs only its rank of this
                                    world, whose size must be the plan's
                                    ranks; rank 0's result holds every
                                    rank's events, devices and memory, and
                                    checkpoints hold every rank's blobs */
    volatile sig_atomic_t *stop; /* non-zero (say, set by a signal handler):
                                    finish the current iteration, save if
                                    save_dir is set, and return normally.
                                    NULL: never */
    run_observer observer;       /* NULL: none */
    void *observer_data;
} run_options;

/* Defaults for a run of `iterations` iterations: cpu backend, seed 1234,
 * AdamW defaults, clipping at 1, learning rate 6e-4 warming up over the
 * first 10% of the iterations, then cosine decay to 6e-5 (10%) at the
 * last one; no checkpoints, no stop flag, no observer. */
run_options run_options_defaults(long iterations);

/* How long a rank of the run waits for a peer: options->comm_timeout_s,
 * or the backend's default. */
double run_comm_timeout(const run_options *options);

/* One iteration as recorded. */
typedef struct run_iteration {
    long iteration;              /* 1-based, counting those before a resume */
    double step_time_s;          /* wall time: batch assembly, forwards,
                                    backwards, norm, optimizer */
    float loss;                  /* mean over the micro-batches, nats/token */
    float grad_norm;             /* global norm before clipping */
    float learning_rate;
} run_iteration;

/* One timed phase of an iteration, in the estimate's event schema
 * (formats.md, "Events"). */
typedef struct run_event {
    int rank;
    int stage;
    int microbatch;              /* -1 for the optimizer */
    const char *kind;            /* "fwd", "bwd" or "optimizer": the names
                                    of costmodel's event kinds */
    double start_s;              /* from the start of the iteration */
    double end_s;
} run_event;

/* The device a rank ran on. */
typedef struct run_device {
    int rank;
    char name[PT_NAME_MAX * 2];  /* "cpu (16 cores)", or the GPU's name */
    int sms_used;                /* streaming multiprocessors; 0: not a GPU
                                    or not reported */
    double memory_cap_bytes;     /* cpu: physical memory; GPU: the plan's
                                    memory_limit_gib, 0 when none */
    char driver_version[32];     /* "" when not applicable or unknown */
    char cuda_version[32];
} run_device;

#define RUN_MAX_NOTES 8

/* What a run did: filled by run_training, freed by run_result_free. */
typedef struct run_result {
    backend_kind backend;
    run_device device;           /* of rank 0 (the only rank of a one-stage
                                    run) */
    int rank_count;              /* pp x dp x tp: 1 for a one-stage run */
    int pp, dp, tp;
    run_device *devices;         /* owned, rank_count, by rank */
    double *rank_peak_memory_bytes; /* owned, rank_count: each rank's
                                       figure on peak_memory_basis */
    char data_prefix[PT_PATH_MAX];
    uint64_t dataset_tokens;
    uint64_t dataset_documents;
    uint32_t largest_token;
    uint64_t seed;
    int gbs, mbs, micro_batches;
    long tokens_per_iteration;   /* gbs x seq */
    lr_schedule schedule;
    float max_grad_norm;
    char resumed_from[PT_PATH_MAX]; /* the --load directory, "" if none */
    char started_utc[32];        /* when training began, ISO 8601 UTC */
    long first_iteration;        /* 1, or one past the checkpoint's */
    long last_iteration;         /* options.iterations */
    long iteration_count;        /* iterations run by this call */
    run_iteration *iterations;   /* owned, iteration_count of them */
    long events_iteration;       /* the iteration events come from */
    int event_count;
    run_event *events;           /* owned: one-stage, 2 x micro_batches + 1;
                                    parallel, every rank's events of that
                                    iteration, rank after rank, with the
                                    runtime's kinds */
    double step_time_s;          /* median over the timed iterations (all
                                    but the first, when there are two or
                                    more) */
    double tokens_per_s;         /* tokens_per_iteration / step_time_s */
    double peak_memory_bytes;    /* the largest rank's, see
                                    peak_memory_basis */
    const char *peak_memory_basis;
    double max_rss_bytes;        /* the process's peak resident set */
    bool stopped;                /* the stop flag ended the run early */
    long last_checkpoint_iteration; /* 0: none saved by this call */
    int note_count;
    char notes[RUN_MAX_NOTES][256]; /* things the user should know, such
                                       as a precision the backend ignores */
} run_result;

/* Fails for plans exec cannot run on any backend: tp x dp x pp different
 * from the GPUs of the plan's node order, gbs not a multiple of dp x mbs.
 * On the cuda backend run_training also checks a parallel plan against
 * this machine's GPUs (device_check_plan) before allocating anything. */
int run_check_plan(const plan *p, pt_error *err);

/* Host bytes a cpu-backend stage of the whole model needs at micro-batch
 * mbs: 16 per parameter (parameters, gradients, AdamW m and v, fp32) and
 * the activations and backward scratch of one micro-batch as the cpu
 * backend lays them out (with full recompute or without). *activation_bytes
 * gets the second part when not NULL. */
double run_cpu_stage_bytes(const model_shape *shape, int mbs, bool recompute,
                           double *activation_bytes);
/* The same for one pipeline stage (spec) keeping slot_count micro-batches'
 * activations, as a rank of a parallel run allocates it: 8 bytes per
 * parameter of the stage and 8 per parameter of its optimizer's range
 * (all, or its ZeRO-1 shard), slot_count activation slots of the stage's
 * layers (and embedding input / head), one backward scratch. */
double run_cpu_partial_stage_bytes(const model_shape *shape,
                                   const stage_spec *spec, int mbs,
                                   int slot_count, double *activation_bytes);
/* Host bytes a cpu-backend stage allocated for activations: its slots'
 * arenas and token ids and its backward scratch (what *activation_bytes
 * above predicts); 0 for a stage of another backend. */
size_t cpu_stage_activation_bytes(const model_stage *stage);

/*
 * Trains the plan's model on the dataset: loads and checks everything
 * first (plan, options, checkpoint to resume, dataset, vocabulary against
 * the largest token, memory), then runs iterations up to
 * options->iterations, saving checkpoints as asked. Returns 0; -1 when
 * refused before training started (nothing was written; a bad plan,
 * option, dataset, checkpoint, or too little memory); -2 when training
 * failed part-way (a non-finite gradient norm, an I/O error saving a
 * checkpoint: checkpoints committed earlier stay). out is filled in every
 * case and must be freed with run_result_free.
 */
int run_training(const plan *p, const run_options *options, run_result *out,
                 pt_error *err);
void run_result_free(run_result *r);

/*
 * The run.json object of formats.md ("Run"): plan_json (the plan with
 * model and cluster inline; a reference is taken, it is not stolen), the
 * device, software, every iteration, the chosen iteration's events and
 * the measured figures. flops_per_iteration (Megatron's model FLOPs of one
 * iteration, from the caller) gives tflops_per_gpu. NULL on failure.
 */
json_t *run_to_json(const run_result *r, json_t *plan_json,
                    double flops_per_iteration, pt_error *err);

/* The "format" of a run checkpoint's meta.json (docs/executor.md). */
#define RUN_CHECKPOINT_FORMAT "partita-run-checkpoint/1"

/*
 * A plan against the GPUs of this machine, checked before any allocation
 * (executor/device_check.c). All ranks of the plan run here (one process,
 * a thread per GPU). The caller queries the devices; the check only
 * compares, and names the rank, the cluster's GPU type, the device and
 * the numbers when they disagree.
 */

/* A GPU this machine has, as the CUDA runtime reports it. */
typedef struct local_device {
    int index;                  /* CUDA device ordinal */
    char name[256];             /* cudaDeviceProp.name: "NVIDIA H200" */
    double total_memory_bytes;
    double free_memory_bytes;   /* cudaMemGetInfo, before allocating */
    int multiprocessors;        /* SMs */
} local_device;

/* The device a rank runs on, with its throttles: a node that lists
 * `devices` (formats.md) gives its i-th GPU devices[i]; a node without
 * them gives rank r device r, unthrottled. -1 when no node holds rank. */
int plan_rank_device(const plan *p, int rank, device_spec *out);

/* Whether a cluster file's GPU type names the hardware of a device,
 * case-insensitively: the type's model, its words up to the first with a
 * digit, less a "-NNSM" suffix ("H200" of "H200-40SM", "A100" of
 * "A100-40GB" or "A100-FASOP", "RTX3090" of "RTX-3090"), must equal a
 * word of the device's name ("NVIDIA A100-SXM4-40GB") or adjacent words
 * joined ("GeForce RTX 3090"). "A10" does not match an A100. */
bool gpu_name_matches(const char *cluster_gpu, const char *device_name);

/* 0 when the machine can run every rank of the plan: as many devices as
 * the plan needs (tp x dp x pp) and its node order provides; each rank's
 * device present and of its node's GPU type; sm_limit and
 * memory_limit_gib within the device's SMs and memory (together, for
 * ranks that share a device); needed_bytes[rank] (what the rank will
 * allocate; NULL: not checked) within its memory_limit_gib and, summed
 * over the ranks of a device, within the device's free memory. -1 with
 * the first disagreement otherwise, e.g. "rank 1 (stage 1, H200-40SM on
 * node h200x2[0] device 1) needs 61.2 GiB, device 1 NVIDIA H200 has 58.0
 * GiB free". */
int device_check_plan(const plan *p, const local_device *devices,
                      int device_count, const double *needed_bytes,
                      pt_error *err);

/* ------------------------------------------------------ parallel runtime */

/*
 * Communication between the ranks of a parallel run, behind one interface
 * (a table of functions and the implementation's shared state) so the
 * pipeline and data-parallel runtime below is written once: the threads
 * implementation (comm_threads_*, N ranks as N threads of one process,
 * host memory) is the CPU reference; the NCCL one (executor/comm_nccl.h,
 * one GPU per rank) runs the cuda backend, and so does the host-staged one
 * (executor/pipeline_gpu.h: the threads comm on pinned host copies, ranks
 * may share a GPU). Buffers are in the backend's
 * memory of the rank (host memory for threads, device memory for NCCL);
 * whatever wrote them must have finished when the call is made (the cuda
 * backend synchronises its stream), and a call returns with its result in
 * place.
 *
 * Every blocking wait ends: when a rank calls comm_abort (the runtime
 * does on any error), every other rank's pending and later operations
 * return -1 with a message naming the failed rank and what it was doing;
 * when a peer does not answer within the timeout, the waiting rank's
 * operation returns -1 naming the peer and the operation, and aborts the
 * others too.
 */
typedef struct comm comm;

typedef enum comm_reduce_op { COMM_SUM, COMM_MAX } comm_reduce_op;

/* What an implementation provides; the comm_* wrappers check arguments
 * and dispatch here. */
typedef struct comm_ops {
    const char *name;
    /* Hands `count` floats to `peer` under `tag`; may return before the
     * peer received them (the threads implementation copies). */
    int (*send)(const comm *c, int peer, int tag, const float *data,
                size_t count, pt_error *err);
    /* Waits for the message of `peer` under `tag` (messages of one peer
     * and tag arrive in the order they were sent) and copies its `count`
     * floats into data; a different count is an error. */
    int (*recv)(const comm *c, int peer, int tag, float *data, size_t count,
                pt_error *err);
    /* Reduces data element-wise (sum or max) over the ranks
     * group[0..group_size), which all call it with the same group, count
     * and op; every member gets the same result, summed in group order.
     * Members of two groups must call their collectives in the same
     * order. */
    int (*all_reduce)(const comm *c, const int *group, int group_size,
                      float *data, size_t count, comm_reduce_op op,
                      pt_error *err);
    /* The same sum for a few doubles in host memory (norms, losses),
     * whatever memory the other operations use. */
    int (*all_reduce_host)(const comm *c, const int *group, int group_size,
                           double *data, size_t count, pt_error *err);
    /* Sums data over the group and leaves, on member i, chunk i of the sum,
     * data[chunk_offsets[i] .. chunk_offsets[i + 1]), in place; the rest of
     * data is undefined afterwards. chunk_offsets: group_size + 1
     * non-decreasing offsets from 0 to the buffer's count. */
    int (*reduce_scatter)(const comm *c, const int *group, int group_size,
                          float *data, const size_t *chunk_offsets,
                          pt_error *err);
    /* Member i's chunk i to every member: afterwards data holds every
     * member's chunk, in place. */
    int (*all_gather)(const comm *c, const int *group, int group_size,
                      float *data, const size_t *chunk_offsets,
                      pt_error *err);
    /* Returns once every rank has called it. */
    int (*barrier)(const comm *c, pt_error *err);
    /* Records that this rank failed (the first failure wins) and wakes
     * every waiting rank. */
    void (*abort)(const comm *c, const char *reason);
    /* The rank that failed first (called abort, timed out, or hit an
     * error of the transport) and its reason, or -1 when none has. */
    int (*failed_rank)(const comm *c, char *reason, size_t reason_size);
} comm_ops;

/* One rank's handle: plain value, valid while its world lives. */
struct comm {
    const comm_ops *ops;
    void *shared;        /* the implementation's state, shared by ranks */
    int rank;
    int size;            /* ranks in the world */
};

/* Operation tags at or above 0 are the caller's; collectives use their
 * own. */
int comm_send(const comm *c, int peer, int tag, const float *data,
              size_t count, pt_error *err);
int comm_recv(const comm *c, int peer, int tag, float *data, size_t count,
              pt_error *err);
int comm_all_reduce_sum(const comm *c, const int *group, int group_size,
                        float *data, size_t count, pt_error *err);
int comm_all_reduce_max(const comm *c, const int *group, int group_size,
                        float *data, size_t count, pt_error *err);
int comm_all_reduce_host(const comm *c, const int *group, int group_size,
                         double *data, size_t count, pt_error *err);
/* ZeRO-1's two halves of an all-reduce (see comm_ops): the sum's chunk i
 * to member i, and every member's chunk to every member. */
int comm_reduce_scatter_sum(const comm *c, const int *group, int group_size,
                            float *data, const size_t *chunk_offsets,
                            pt_error *err);
int comm_all_gather(const comm *c, const int *group, int group_size,
                    float *data, const size_t *chunk_offsets, pt_error *err);
int comm_barrier(const comm *c, pt_error *err);
void comm_abort(const comm *c, const char *reason);
/* The rank of c's world that failed first, or -1; reason may be NULL. */
int comm_failed_rank(const comm *c, char *reason, size_t reason_size);

/* Groups of ranks that run collectives together, as flat lists: group g
 * is members[offsets[g] .. offsets[g + 1]). A comm that must set up each
 * group in advance (NCCL) is given these. */
typedef struct comm_groups {
    int count;
    int *offsets;        /* count + 1, owned */
    int *members;        /* offsets[count], owned */
} comm_groups;

void comm_groups_free(comm_groups *groups);

/* How long a rank waits for a peer unless told otherwise. */
#define COMM_DEFAULT_TIMEOUT_S 60.0

/* The threads implementation: a world of `size` ranks sharing memory,
 * with one mailbox per rank under a mutex and condition variable. */
typedef struct comm_threads comm_threads;

int comm_threads_create(int size, double timeout_s, comm_threads **out,
                        pt_error *err);
/* Frees the world and any message never received. No rank may be inside
 * an operation. */
void comm_threads_destroy(comm_threads *world);
/* The handle of one rank, 0 <= rank < size. */
comm comm_threads_rank(comm_threads *world, int rank);
/* The rank that failed first (called comm_abort or timed out) and its
 * reason, or -1 when none has; reason may be NULL. */
int comm_threads_failed_rank(comm_threads *world, char *reason,
                             size_t reason_size);

/*
 * The MPI implementation (executor/comm_mpi.c, built when meson finds MPI:
 * option `mpi`): one process per rank, started by mpirun or srun, host
 * memory. send copies the floats and returns (MPI_Isend, completed
 * lazily), so crossing sends cannot wait on each other; every wait polls
 * its request, the abort messages of the other ranks and a deadline (the
 * timeout), so a dead or silent peer is an error naming it, not a hang.
 * Collectives run over MPI communicators made once for the world and for
 * each group the runtime gives (comm_mpi_set_groups). Without MPI in the
 * build every function below fails, saying so.
 */
typedef struct comm_mpi comm_mpi;

/* Whether this binary was built with MPI. */
bool comm_mpi_built(void);
/* Joins the MPI job this process was started in (MPI_Init_thread) and
 * makes its world: every process of the job is a rank. */
int comm_mpi_create(double timeout_s, comm_mpi **out, pt_error *err);
/* This process's handle. */
comm comm_mpi_handle(comm_mpi *world);
/* Rank among the processes of this host (the GPU a process drives) and
 * how many processes this host runs. */
int comm_mpi_local_rank(const comm_mpi *world);
int comm_mpi_local_size(const comm_mpi *world);
/* Makes a communicator for each group; every process calls it with the
 * same groups (collective over the world). A collective over a group
 * never set up, other than the whole world in rank order, fails. */
int comm_mpi_set_groups(comm_mpi *world, const comm_groups *groups,
                        pt_error *err);
/* Every rank's `bytes` bytes of data, in rank order, into gathered on
 * rank 0 (which must hold size x bytes; NULL elsewhere). */
int comm_mpi_gather(const comm *c, const void *data, size_t bytes,
                    void *gathered, pt_error *err);
/* Rank 0's `bytes` bytes of data to every rank, in place. */
int comm_mpi_broadcast(const comm *c, void *data, size_t bytes,
                       pt_error *err);
/* Ends this process's part: after a failure of any rank (comm_failed_rank
 * >= 0) the whole job is ended (MPI_Abort with exit_status, after a
 * moment that lets the rank that failed first print its message); else
 * the pending sends complete and MPI is finalized. Frees the world. */
void comm_mpi_finish(comm_mpi *world, int exit_status);

/*
 * A parallel plan's layout: pp pipeline stages, each replicated dp times,
 * each replica split over tp tensor-parallel shards. Rank layout as the
 * planner's (formats.md), pipeline outermost, then data, then tensor:
 * rank = t + tp x (d + dp x s) for shard t of replica d of stage s.
 * Each step takes a global batch of gbs token windows of seq + 1 ids;
 * replica d trains on windows [d gbs/dp, (d + 1) gbs/dp) as
 * micro_batches micro-batches of mbs windows (every shard of a replica
 * reads the same windows).
 */
typedef struct pipeline_layout {
    model_shape shape;
    parallel_config config;
    int stage_count;                 /* config.pp */
    int partition[PT_MAX_STAGES];    /* layers per stage */
    int micro_batches;               /* gbs / (dp x mbs) */
    int rank_count;                  /* pp x dp x tp */
} pipeline_layout;

/* Checks the config (gbs a multiple of dp x mbs, the partition summing to
 * the layers, tp dividing the heads and ffn_hidden) and fills out. */
int pipeline_layout_init(pipeline_layout *out, const model_shape *shape,
                         const parallel_config *config, const int *partition,
                         int partition_count, pt_error *err);
int pipeline_rank_stage(const pipeline_layout *layout, int rank);
int pipeline_rank_replica(const pipeline_layout *layout, int rank);
int pipeline_rank_tp(const pipeline_layout *layout, int rank);
/* The rank of shard tp_rank of replica `replica` of stage `stage`. */
int pipeline_rank_of(const pipeline_layout *layout, int stage, int replica,
                     int tp_rank);
/* The stage spec of a rank: its stage's layers, its tp shard and, with
 * the distributed optimizer and dp > 1, its optimizer shard (its
 * replica). */
int pipeline_rank_spec(const pipeline_layout *layout, int rank,
                       stage_spec *out, pt_error *err);
/* Micro-batches whose activations stage s keeps at once: min(pp - s, m)
 * for 1F1B, m for GPipe. */
int pipeline_slot_count(const pipeline_layout *layout, int stage);
/* Creates and initialises (seed: the same values as the whole model) the
 * stage of a rank with its slots. */
int pipeline_stage_create(model_stage *out, const pipeline_layout *layout,
                          int rank, backend_kind backend, uint64_t seed,
                          pt_error *err);
/* Connects a rank's stage to its tensor-parallel group on comm c (which
 * must outlive the stage's use); nothing when tp is 1. */
int pipeline_stage_attach(const pipeline_layout *layout, model_stage *stage,
                          const comm *c, pt_error *err);

/* The timed events of one rank's step, in the estimate's event schema;
 * kinds are costmodel's names: "fwd", "bwd", "send_fwd", "recv_fwd",
 * "send_bwd", "recv_bwd", "dp_allreduce", "embedding_allreduce",
 * "optimizer" (microbatch -1 for the last three; with ZeRO-1 the
 * reduce-scatter and the all-gather are two "dp_allreduce" events, as in
 * the estimate). */
typedef struct pipeline_events {
    int count;
    int capacity;
    run_event *events;   /* owned */
} pipeline_events;

/* Room for every event of a step of that layout: 6 per micro-batch and
 * 4 more. */
int pipeline_events_reserve(pipeline_events *events,
                            const pipeline_layout *layout, pt_error *err);
void pipeline_events_free(pipeline_events *events);

/*
 * One training step of one rank, whatever launches the ranks (threads
 * here; one process per GPU later): zero the gradients; the schedule's
 * forwards and backwards (1F1B: min(pp - s - 1, m) warm-up forwards, then
 * one forward one backward, then the remaining backwards; GPipe: every
 * forward, then every backward), activations received from rank
 * d + dp (s - 1) and sent to d + dp (s + 1), gradients the other way,
 * loss_scale 1 / (m dp) so gradients average over the global batch; the
 * gradient all-reduce over the stage's dp group; with tied embeddings and
 * pp > 1, the all-reduce of the first stage's token-embedding gradient
 * with the last stage's tied copy; the global gradient norm (sum over the
 * stages of a replica, the tied copy once); clipping and AdamW. Every
 * rank gets the same step_result (loss: mean over the m dp
 * micro-batches). tokens: the global batch, gbs x (seq + 1) ids, host
 * memory. step_start_s: CLOCK_MONOTONIC seconds the event times count
 * from. events may be NULL; it is emptied first. inject_failure: fail
 * after the first forward (tests of the failure path). On failure the
 * rank aborts the comm so that the others return too.
 */
int pipeline_rank_step(const pipeline_layout *layout, model_stage *stage,
                       const comm *c, const train_config *config,
                       const uint32_t *tokens, double step_start_s,
                       bool inject_failure, step_result *out,
                       pipeline_events *events, pt_error *err);

/* The groups the ranks of a layout run collectives over, besides the
 * world: each stage's dp groups (one per tp shard; dp > 1), each
 * replica's tp groups (tp > 1), and each first/last-stage embedding pair
 * (tied embeddings, pp > 1), as pipeline_rank_step and
 * pipeline_stage_attach form them; a group equal to an earlier one or to
 * the world is left out. Free with comm_groups_free. */
int pipeline_layout_groups(const pipeline_layout *layout, comm_groups *out,
                           pt_error *err);

/* What a launcher's rank thread does around its stage, for backends whose
 * state is per thread (the cuda backend: the rank's GPU, green context and
 * memory cap; the NCCL comm's streams). Each hook runs on the rank's own
 * thread; NULL hooks do nothing. */
typedef struct pipeline_rank_hooks {
    /* Before the rank's stage is made. */
    int (*open)(void *data, int rank, pt_error *err);
    /* After its stage is destroyed; also after a failed open. */
    void (*close)(void *data, int rank);
    void *data;
} pipeline_rank_hooks;

/* How pipeline_threads_start runs the ranks. */
typedef struct pipeline_launch {
    backend_kind backend;
    uint64_t seed;                   /* initialisation */
    double timeout_s;                /* the threads comm's (comms NULL) */
    /* NULL: the launcher makes and owns a threads comm world. Else
     * comms[rank] is each rank's handle of a world the caller made and
     * keeps until pipeline_threads_destroy has returned (NCCL). */
    const comm *comms;
    /* One process per rank (comm_mpi): only the rank of comms[0], the one
     * handle given, runs here; the layout's other ranks are other
     * processes. false: every rank of the layout runs here. */
    bool this_rank_only;
    pipeline_rank_hooks hooks;
} pipeline_launch;

struct pipeline_workers;

/*
 * Every rank of a layout in one process, each on a thread of its own that
 * lives as long as the launcher: the thread runs the open hook, makes and
 * initialises its rank's stage (so a cuda stage lands on the rank's
 * device), attaches it to its comm, then runs the steps (and tasks) it is
 * given, and at the end destroys the stage and runs the close hook.
 */
typedef struct pipeline_threads {
    pipeline_layout layout;
    model_stage *stages;             /* rank_count, each owned by its
                                        rank's thread */
    comm_threads *world;             /* owned; NULL with the caller's
                                        comms */
    pipeline_events *events;         /* rank_count: the last step's */
    pt_error *rank_errors;           /* rank_count: the last step's */
    int *rank_status;                /* rank_count: 0 or -1 */
    comm *comms;                     /* rank_count: each rank's handle */
    int inject_failure_rank;         /* -1: none (tests set it) */
    struct pipeline_workers *workers; /* owned: the rank threads */
    /* The ranks that run in this process, [first_local_rank,
     * first_local_rank + local_rank_count): all of them, or the one rank
     * of this_rank_only; only their entries above are filled. */
    int first_local_rank;
    int local_rank_count;
} pipeline_threads;

/* Starts the rank threads and waits until every rank has its stage.
 * Fails, with nothing left running, when any rank's hook or stage fails
 * (the message of the lowest such rank, prefixed "rank R"). */
int pipeline_threads_start(pipeline_threads *out,
                           const pipeline_layout *layout,
                           const pipeline_launch *launch, pt_error *err);
/* pipeline_threads_start with a threads comm of that timeout and no
 * hooks: the CPU reference. */
int pipeline_threads_create(pipeline_threads *out,
                            const pipeline_layout *layout,
                            backend_kind backend, uint64_t seed,
                            double timeout_s, pt_error *err);
/* Runs one step on every rank. Fails when any rank failed, with the
 * message of the rank that failed first (each rank's own message stays
 * in rank_errors); the world is then unusable. */
int pipeline_threads_step(pipeline_threads *p, const train_config *config,
                          const uint32_t *tokens, step_result *out,
                          pt_error *err);
/* Runs task(data, rank, stage) on that rank's own thread and waits for
 * it: what must run where the rank's device is current (checkpoint
 * copies, device queries). Returns the task's status. */
typedef int (*pipeline_rank_task)(void *data, int rank, model_stage *stage,
                                  pt_error *err);
int pipeline_threads_on_rank(pipeline_threads *p, int rank,
                             pipeline_rank_task task, void *data,
                             pt_error *err);
/* Ends the rank threads (each destroys its stage) and frees the rest.
 * Safe on a launcher that failed to start or was zeroed. */
void pipeline_threads_destroy(pipeline_threads *p);

/* ------------------------------------------------------------- profiler */

/*
 * `partita profile` (executor/profiler.c, docs/profiles.md "Measuring"):
 * what the parts of a model cost on the device at hand. For every tp of
 * a list, shard 0 of the embedding, of one transformer layer and of the
 * head, each a stage of its own, tensor-parallel shards compute-only (the
 * tp all-reduces are priced separately, from the all-reduce curve), at
 * every micro-batch of a list that fits in memory. Each part is run
 * forward then backward, warm-up runs first, then timed runs, host clock
 * around each synchronous call; a part's time is the median of its runs,
 * its spread the interquartile range over the median. Plus the AdamW step
 * per parameter and, built with NCCL and given two GPUs, all-reduce and
 * send/recv curves. Backend-agnostic except the device handling: on the
 * cpu backend it runs (slowly) on a tiny model, which is how CI tests it.
 */

/* The most entries of a tp or micro-batch list; of notes; of message
 * sizes of a communication curve. */
#define PROFILER_MAX_VALUES 16
#define PROFILER_MAX_NOTES 24
#define PROFILER_MAX_COMM_SIZES 32

/* A timed quantity: the median of its timed runs and their spread,
 * (third quartile - first quartile) / median (quartiles by linear
 * interpolation between the sorted runs). */
typedef struct timing_summary {
    double median_s;
    double spread;
    int runs;
} timing_summary;

/* Summarises runs[0..count) (count >= 1; the array is left as is). */
timing_summary timing_summarize(const double *runs, int count);

typedef struct profiled_part {
    timing_summary forward;
    timing_summary backward;
} profiled_part;

/* One measured (tp, micro-batch) point: seconds per micro-batch on one
 * GPU of the tp group. */
typedef struct profiled_point {
    int tp;
    int mbs;
    profiled_part embedding;
    profiled_part layer;
    profiled_part head;      /* final norm, LM head and loss */
} profiled_point;

/* Reported after each step of a measurement: done of total steps; point
 * is the point just measured, or NULL for another step (label says
 * which: "optimizer", "skipped: ...", "all-reduce 4.0 KiB"). */
typedef void (*profiler_progress_fn)(int done, int total, const char *label,
                                     const profiled_point *point,
                                     void *data);

typedef struct profiler_options {
    backend_kind backend;
    int device;                  /* cuda device ordinal (0) */
    int sm_limit;                /* cuda: only this many SMs, through a
                                    green context; 0: all */
    double memory_limit_bytes;   /* cuda: cap on the stages; 0: none */
    int tp_count;
    int tp_values[PROFILER_MAX_VALUES];   /* ascending */
    int mbs_count;
    int mbs_values[PROFILER_MAX_VALUES];  /* ascending */
    int warmup_runs;             /* untimed runs before each point */
    int timed_runs;              /* timed runs of a point, at most */
    int min_timed_runs;          /* at least, however slow the point */
    double point_budget_s;       /* timed seconds a point should take:
                                    slow points get fewer runs */
    double device_warmup_s;      /* work before the first timing, so that
                                    clocks have ramped up */
    uint64_t seed;               /* parameters and tokens */
    profiler_progress_fn progress;   /* NULL: none */
    void *progress_data;
} profiler_options;

/* The full measurement: tp 1, 2, 4, 8, micro-batches 1, 2, 4, 8, 16,
 * 5 warm-up and up to 50 timed runs per point (at least 7; as many as
 * fit in about 1.5 s), 2 s of device warm-up. */
profiler_options profiler_options_defaults(backend_kind backend);
/* Fewer runs, no device warm-up: for tests and a first look. */
void profiler_options_quick(profiler_options *options);
/* Checks lists (ascending powers of two for tp, ascending for mbs, each
 * 1..1024), run counts and the cuda-only options. */
int profiler_options_check(const profiler_options *options, pt_error *err);

/* The device the profile was taken on. */
typedef struct profiled_device {
    char name[256];              /* "NVIDIA H200", "cpu (16 cores)" */
    int sms;                     /* SMs of the GPU; 0 for the cpu */
    int sms_used;                /* the green context's, or sms */
    double memory_bytes;         /* the GPU's (host's for the cpu) */
    double context_bytes;        /* device memory in use before the first
                                    stage: CUDA context and libraries */
    char driver_version[64];     /* "580.95.05"; "" when unknown */
    char driver_cuda_version[16];    /* highest CUDA the driver runs */
    char runtime_cuda_version[16];   /* the CUDA runtime linked in */
} profiled_device;

typedef struct profiler_result {
    profiled_device device;
    int point_count;             /* sorted by tp, then mbs */
    profiled_point points[PROFILER_MAX_VALUES * PROFILER_MAX_VALUES];
    /* AdamW steps of the tp 1 (or smallest tp measured) layer and
     * embedding stages, and the parameters each holds. */
    timing_summary optimizer_layer;
    timing_summary optimizer_embedding;
    double layer_parameters;
    double embedding_parameters;
    /* optimizer_layer per parameter: a real stage is mostly layers. */
    double optimizer_s_per_param;
    int runs_warmup;             /* as run (options, after checks) */
    int runs_timed_max;
    int runs_timed_min;
    double elapsed_s;            /* wall time of the measurement */
    int note_count;              /* what was skipped and why */
    char notes[PROFILER_MAX_NOTES][320];
} profiler_result;

/* Measures the model's parts under the options into out (zeroed first).
 * Points that fail to be made or run are skipped with a note (a tp the
 * shape does not divide; a tp the backend cannot run; a micro-batch that
 * does not fit: larger ones are not tried). -1 when nothing at all could
 * be measured, or on a device failure. */
int profiler_measure(const model_shape *shape,
                     const profiler_options *options, profiler_result *out,
                     pt_error *err);

/* Communication curves between two GPUs of this machine (devices 0 and
 * 1) through NCCL. */
typedef struct profiled_comm_sample {
    double bytes;
    timing_summary time;         /* one operation */
} profiled_comm_sample;

typedef struct profiler_comm_result {
    int gpus;                    /* 2 */
    int sample_count;            /* sizes, in each curve */
    profiled_comm_sample allreduce[PROFILER_MAX_COMM_SIZES];
    profiled_comm_sample sendrecv[PROFILER_MAX_COMM_SIZES];  /* 0 -> 1 */
    int operations_per_run[PROFILER_MAX_COMM_SIZES]; /* back to back,
                                    timed together: small messages */
    char nccl_version[16];
    double elapsed_s;
} profiler_comm_result;

/* Whether this build has NCCL and this machine shows two GPUs; if not,
 * why, in reason (which may be NULL). */
bool profiler_comm_available(char *reason, size_t reason_size);

/* All-reduce (fp32 sum, in place) over GPUs 0 and 1, and send/recv from
 * GPU 0 to GPU 1, for every power of two from min_bytes to max_bytes
 * (both powers of two): warm-up runs, then timed runs (the options'
 * counts), each of a few operations back to back when messages are small
 * (so that launch jitter averages out), host clock from the first GPU's
 * start to the last GPU's end; one thread per GPU, each in
 * options->sm_limit SMs when set. progress reports each size (point
 * NULL). */
int profiler_measure_comm(const profiler_options *options, double min_bytes,
                          double max_bytes, profiler_comm_result *out,
                          pt_error *err);

#endif
