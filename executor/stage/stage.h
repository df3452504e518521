/*
 * executor/stage: the model stage, whatever the backend. A stage is a
 * range of transformer layers, optionally with the embedding (first
 * pipeline stage) and the final norm, LM head and loss (last stage); the
 * whole model is one stage holding everything. All its parameters sit in
 * one contiguous fp32 buffer described by a table of named tensors (one
 * all-reduce, one checkpoint write). Declared here: the layout of that
 * buffer, the backend interface (stage_backend) and the checked wrappers
 * that dispatch to it, deterministic initialisation, AdamW, clipping, the
 * learning-rate schedule and the one-stage training step. The backends
 * are executor/cpu (the fp32 reference) and executor/cuda.
 * docs/executor.md describes the layout, the ops and their tests.
 *
 * Like every library of Partita, nothing here prints or exits: functions
 * that can fail return -1 and fill a pt_error.
 */
#ifndef PARTITA_EXECUTOR_STAGE_H
#define PARTITA_EXECUTOR_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

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
    /* ZeRO-Offload (a plan's "offload_optimizer"): the fp32 master
     * weights and AdamW's moments of the optimizer's range live in host
     * memory (pinned on the cuda backend) and the step runs on the CPU
     * (stage/offload.c); the backend's params are refreshed from the
     * master after each step. */
    bool offload_optimizer;
    /* Megatron's sequence parallelism (tp > 1): outside
     * the tensor-parallel matmuls each shard holds its part of the rows
     * (stage_sequence_rows): the layer norms and residual adds run on
     * them, reduce-scatters and all-gathers replace the all-reduces, and
     * the stage's input, output and their gradients are those rows. */
    bool sequence_parallel;
    /* ZeRO-2/3 (optimizer_shards > 1; honoured by the backend that sets
     * model_stage.grads_by_unit: the cpu one, the cuda one but on the
     * tied embedding's pair of a pipeline): grads holds the optimizer's
     * range only, and a backward fills a unit buffer per unit (the
     * embeddings, a layer, the head), handed to the stage's grad_sink as
     * each unit completes, then added into that range. */
    bool shard_gradients;
    /* ZeRO-3 (likewise; model_stage.params_by_unit): params holds the
     * optimizer's range only, and each unit's weights are gathered into
     * a buffer of that unit's size, one per unit kind (the cuda backend:
     * two for the layers, gathered one unit ahead), through the stage's
     * param_source before the unit's forward and backward. */
    bool shard_parameters;
    /* llm.c's recipe (a plan's "grad_precision": "bf16"): the gradients
     * are kept in bf16. The cpu backend emulates it, rounding its fp32
     * gradients to bf16 after each micro-batch's backward; the cuda
     * backend keeps its gradient buffer in bf16 (model_stage.grads_bf16;
     * it refuses the recipe with ZeRO-2/3's gradient units and with the
     * optimizer offload, issue 34). */
    bool bf16_grads;
    /* The residual stream in bf16 (Megatron-LM's bf16 recipe without
     * --fp32-residual-connection). The cuda backend always keeps it so;
     * the cpu backend, when this is set, rounds its fp32 stream to bf16
     * where the cuda one stores it (the embedding's output, a received
     * input, each residual add), so tests can hold the two together. */
    bool bf16_residual;
    /* Megatron-LM's --deterministic-mode (a plan's "deterministic"): the
     * same bits on every run. The cuda backend then runs cuDNN's
     * deterministic attention backward instead of the one that sums dQ
     * with atomics; the cpu backend always is. */
    bool deterministic;
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
     * the full rows fall in row_parts equal parts (3 for GPT-2's QKV
     * matrix: queries, keys, values; 2 for SwiGLU's first MLP matrix:
     * gate, up; else 1) and the shard holds rows / row_parts
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
 * when it is untied or its embedding sits on another stage); of those,
 * the ones the model has (no position embedding with rotary positions,
 * no norm bias with RMSNorm, the linear biases the model says), a
 * model other than GPT-2's with its qkv rows in Megatron-LM's grouped
 * order (docs/executor.md, "The parameter buffer"). Returns the
 * number of tensors; fills `out` when it is not NULL (it then needs room
 * for that many) and *total_floats when not NULL. Fails on an invalid
 * shape or spec. */
int stage_parameter_layout(const model_shape *shape, const stage_spec *spec,
                           param_tensor *out, size_t *total_floats,
                           pt_error *err);

/* ZeRO-2/3's units (docs/executor.md, "ZeRO-2 and ZeRO-3"): the parts
 * of a stage's parameter buffer gathered and reduced whole, the
 * embeddings, each layer, the head (final norm and, when the stage holds
 * one, its LM head matrix; a tied head on the embedding's stage uses the
 * embedding's unit). */
typedef enum stage_unit_kind {
    STAGE_UNIT_EMBEDDING,
    STAGE_UNIT_LAYER,
    STAGE_UNIT_HEAD,
    STAGE_UNIT_KINDS
} stage_unit_kind;

/* Where each kind's unit starts in the parameter buffer and its floats
 * (the layer's: layer 0's start and one layer's floats, every layer the
 * same size); count 0 for a kind the stage lacks. */
typedef struct stage_units {
    size_t first[STAGE_UNIT_KINDS];
    size_t count[STAGE_UNIT_KINDS];
} stage_units;

/* The units of a stage of that spec whose tensor table (buffer order,
 * stage_parameter_layout's) holds param_count floats. */
void stage_units_of(const stage_spec *spec, const param_tensor *table,
                    int tensor_count, size_t param_count, stage_units *out);
/* The unit of parameter `offset`: its kind and, for a layer, its local
 * index (0 otherwise). */
stage_unit_kind stage_unit_at(const stage_units *units, size_t offset,
                              int *layer);

/* --------------------------------------------------------------- stages */

struct stage_backend;
struct model_stage;

/* What a one-stage step reports once its update is queued: the sum of
 * its micro-batches' mean losses (each rounded to float, as a forward
 * returns it; nats per token), the global gradient norm before
 * clipping, and whether the AdamW update was applied (not when the
 * loss sum or the norm is not finite). */
typedef struct stage_step_totals {
    double loss_sum;
    double grad_norm;
    bool applied;
} stage_step_totals;

/* A one-stage step in progress (train.c). on_device: the backend keeps
 * the loss sum, the norm and the clipping in its own memory
 * (stage_backend.step_apply): its forward with the head adds its
 * mean loss to the sum instead of returning it (it writes 0), and its
 * forward and backward return once their work is queued, so the host
 * waits once a step, in stage_step_end. Else the wrappers keep `host`
 * from the losses forward returns and the norm the backend reads back. */
typedef struct stage_step_state {
    bool on_device;
    stage_step_totals host;
    /* on_device with a backend that marks the device's progress
     * (stage_backend.step_mark): stage_step_mark_seconds reads it,
     * until the next stage_step_begin */
    bool marked;
    int micro_batches;            /* forwards of the step so far */
} stage_step_state;

/* What a backend calls per unit (floats [first, first + count) of the
 * parameter buffer, in `unit`, backend memory) under ZeRO-2/3: with
 * spec.shard_gradients as each unit's gradients of one micro-batch are
 * complete (the grad_sink may change them: the reduce-scatter over dp
 * sums them in place; the backend then adds the part in the grads
 * range); with spec.shard_parameters before a unit's forward or backward
 * (the param_source fills the unit around the rank's part, which the
 * backend has copied in: the all-gather over dp). stream NULL: the
 * collective is done when the hook returns; else (the stage's
 * units_on_stream) it is enqueued on that CUDA stream, behind the
 * unit's producers, and the backend orders its readers after it. */
typedef int (*stage_unit_hook)(struct model_stage *stage, size_t first,
                               size_t count, float *unit, void *stream,
                               void *context, pt_error *err);

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
    /* grads holds floats [grad_first, grad_first + grad_count) of the
     * parameter buffer: all of them, or, when the backend honours
     * spec.shard_gradients (grads_by_unit), the optimizer's range; the
     * sink (may be NULL: the unit is added as it is) and its context. */
    size_t grad_first;
    size_t grad_count;
    bool grads_by_unit;
    /* grads holds bf16 values (grad_count of them, 2 bytes each; set by a
     * backend that keeps spec.bf16_grads so: cuda), which the parallel
     * step reduces as bf16; else fp32 (the cpu backend's rounded
     * values included). Reads and writes through model_stage_read and
     * the ranges convert to and from fp32. */
    bool grads_bf16;
    /* The head runs fused (set by a backend that fuses it: cuda, where
     * buffer_head_fused holds): the forward also computes the head
     * matrix's weight and input gradient products, the backward only the
     * final norm's; false on the cpu backend. The profiler records it
     * with the head's times (docs/profiles.md). */
    bool head_fused;
    stage_unit_hook grad_sink;
    void *grad_sink_context;
    /* params likewise: floats [params_first, params_first +
     * params_count), the optimizer's range when the backend honours
     * spec.shard_parameters (params_by_unit); the source may be NULL
     * (a unit then holds the rank's part only, zeros elsewhere). */
    size_t params_first;
    size_t params_count;
    bool params_by_unit;
    stage_unit_hook param_source;
    void *param_source_context;
    /* The backend's stream for the units' collectives (the cuda
     * backend's, with grads_by_unit; NULL: none), and whether the hooks
     * enqueue on it (set by the step while its comm has stream-ordered
     * collectives; false: the backend drains its work and the hooks
     * block). */
    void *unit_stream;
    bool units_on_stream;
    /* The backend's own stream (the cuda backend's cudaStream_t; NULL on
     * the cpu one), idle between calls: where a blocking reduction of
     * bf16 gradients is enqueued and waited for (parallel/grad_sync.c),
     * the blocking collectives carrying fp32 only. */
    void *stream;
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
    /* The profiler's stages time their parts alone: the cuda backend
     * skips the stage's boundary, the rounding of a received fp32 message
     * into the bf16 stream, the widening of its last stream for the next
     * stage, and the same two for the gradients, which a pipeline stage
     * pays once per micro-batch however many layers it holds (the cost
     * model prices them per stage, docs/cost-model.md). The skipped
     * buffers keep what they held, so results are not the model's. */
    bool boundary_free;
    /* The profiler's back-to-back timing: forward, backward and the AdamW
     * step return once their work is queued (a backend that runs on the host finishes it
     * all the same), and a forward with the head reads no loss back (its
     * mean_loss is 0); stage_synchronize waits for the work. Calls that
     * may overlap must be given the same tokens (the host staging of the
     * next is written while the last may still read it). Off for
     * training. */
    bool defer_sync;
    /* The host side of spec.offload_optimizer (stage/offload.c); NULL
     * without offload. Owned. */
    struct stage_offload *offload;
    /* The one-stage step in progress (stage_step_begin to
     * stage_step_end, train.c). */
    stage_step_state step;
    /* The tokens stage_prepare_tokens took (checked, and the backend's
     * host work on them done) for the next forward of `prepared_mbs`
     * sequences; cleared by every forward. NULL: none. */
    const uint32_t *prepared_tokens;
    int prepared_mbs;
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
                                    stage's output, mbs x seq x hidden
                                    (sequence parallelism: the shard's
                                    rows, stage_backend.packs_sequence_
                                    rows says where) */
    const float *output_grad;    /* backward without head: d loss / d output,
                                    mbs x seq x hidden (likewise) */
    float loss_scale;            /* with head: gradients are of
                                    loss_scale x (mean loss of this
                                    micro-batch); 1/micro-batches averages
                                    accumulated micro-batches. Give the
                                    forward the backward's: the cuda
                                    backend's fused head adds the head's
                                    gradients in the forward */
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
/* Fails on hyper-parameters AdamW cannot use (betas outside [0, 1), eps
 * not above 0, a negative decay). */
int stage_adamw_check(const adamw_config *config, pt_error *err);

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
    /* Waits for the work queued under defer_sync;
     * NULL when they never leave any (the cpu backend). */
    int (*synchronize)(model_stage *stage, pt_error *err);
    /* Activation buffers in backend memory, mbs_capacity x seq x hidden. */
    float *(*input_buffer)(model_stage *stage, int slot);
    const float *(*output)(const model_stage *stage, int slot);
    const float *(*input_grad)(const model_stage *stage);
    /* Where a stage without the head receives d loss / d output,
     * mbs_capacity x seq x hidden floats in backend memory. */
    float *(*output_grad_buffer)(model_stage *stage);
    /* Floats [first, first + count) of buffer `which` (params or grads)
     * to (to_host) or from host memory, or set to 0; params written
     * refresh what the backend derives from them. For ZeRO-2/3's shards
     * and the optimizer offload; the wrappers check the range. */
    int (*copy_range)(model_stage *stage, stage_buffer which, size_t first,
                      size_t count, float *host, bool to_host,
                      pt_error *err);
    int (*zero_range)(model_stage *stage, stage_buffer which, size_t first,
                      size_t count, pt_error *err);
    /* The one-stage step kept on the backend (stage_step_state's
     * on_device; NULL for a backend without it: cpu). step_apply queues
     * the global norm of the gradients, the clipping coefficient for
     * max_grad_norm (clip_coefficient's arithmetic) and AdamW, which
     * reads the coefficient in backend memory and leaves every buffer
     * as it was when the loss sum or the norm is not finite;
     * step_totals waits for it and reads back the totals. */
    int (*step_apply)(model_stage *stage, const adamw_config *config,
                      float learning_rate, float max_grad_norm,
                      pt_error *err);
    int (*step_totals)(model_stage *stage, stage_step_totals *out,
                       pt_error *err);
    /* Marks where the device's queue has reached (mark 0, 1, ... in
     * order within a step), and, once step_totals returned, the seconds
     * from mark 0 to `mark` on the device's clock. NULL: no marks. */
    int (*step_mark)(model_stage *stage, int mark, pt_error *err);
    int (*step_mark_seconds)(const model_stage *stage, int mark,
                             double *seconds, pt_error *err);
    /* Host memory the backend copies fastest from and to (pinned, on
     * cuda); NULL: malloc and free. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *memory);
    /* The host's work on a micro-batch's tokens done ahead of its forward
     * (stage_prepare_tokens); NULL: none to do ahead (cpu). */
    int (*prepare_tokens)(model_stage *stage, const stage_io *io,
                          pt_error *err);
    /* Under sequence parallelism, where the shard's rows of the stage's
     * input, output and their gradients (the pipeline's messages) lie:
     * packed from the buffers' start (true: cuda, whose buffers hold
     * those rows only), or at their place in buffers of every row
     * (false: the cpu reference). */
    bool packs_sequence_rows;
} stage_backend;

/* The backend of a kind; fails for a kind this binary was built without
 * (cuda, when meson found no nvcc). */
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
/* Sequence parallelism: the rows [*first, *first + *count) of `rows`
 * (mbs x seq) that shard tp_rank holds, an equal part each (all of them
 * without it); and the two halves of an all-reduce over rows x cols
 * floats (backend memory): the sum of each shard's rows to that shard,
 * and every shard's rows to every shard. */
void stage_sequence_rows(const stage_spec *spec, size_t rows, size_t *first,
                         size_t *count);
int stage_tp_reduce_scatter_rows(const model_stage *stage, float *data,
                                 size_t rows, size_t cols, pt_error *err);
int stage_tp_all_gather_rows(const model_stage *stage, float *data,
                             size_t rows, size_t cols, pt_error *err);

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
 * AdamW moments; grad_count and params_count for the gradients and
 * parameters (the optimizer's range when the backend holds ZeRO-2/3's
 * shards). model_stage_read and model_stage_write move that many. */
size_t model_stage_buffer_count(const model_stage *stage,
                                stage_buffer which);

int model_stage_read(const model_stage *stage, stage_buffer which,
                     float *host, pt_error *err);
int model_stage_write(model_stage *stage, stage_buffer which,
                      const float *host, pt_error *err);
/* Floats [first, first + count) of params or grads to or from the host,
 * or zeroed (the backend's copy_range and zero_range, range checked). */
int model_stage_read_range(model_stage *stage, stage_buffer which,
                           size_t first, size_t count, float *host,
                           pt_error *err);
int model_stage_write_range(model_stage *stage, stage_buffer which,
                            size_t first, size_t count, const float *host,
                            pt_error *err);
int model_stage_zero_range(model_stage *stage, stage_buffer which,
                           size_t first, size_t count, pt_error *err);

/* ZeRO-Offload (stage/offload.c): the host buffers of a stage whose
 * spec asks for them, made by model_stage_create and freed by
 * model_stage_destroy; the step stage_adamw_step runs there. */
int stage_offload_open(model_stage *stage, pt_error *err);
void stage_offload_close(model_stage *stage);
int stage_offload_step(model_stage *stage, const adamw_config *config,
                       float learning_rate, float grad_scale, pt_error *err);
/* The host moments (STAGE_ADAM_M / V) read or written in place of the
 * backend's, and the master weights marked stale after params are
 * written from outside the step (initialisation, a checkpoint). */
int stage_offload_copy(const model_stage *stage, stage_buffer which,
                       float *host, bool to_host, pt_error *err);
void stage_offload_params_written(model_stage *stage);
/* The host's AdamW rate as stage_offload_step runs it (the same threads,
 * the cpu reference's update): `passes` passes (at most 15) over `count`
 * parameters in host memory, the median's seconds per parameter into
 * *s_per_param
 * (the profiler's `host_adamw_s_per_param`: the rate the cost model
 * prices an offloaded optimizer at). */
int stage_offload_host_rate(size_t count, int passes, double *s_per_param,
                            pt_error *err);
/* The host link's rate as stage_offload_step uses it: `passes` passes
 * (at most 15) of the stage's weights down to host memory of the
 * backend's kind (pinned on cuda) and back up unchanged, the median's
 * seconds per parameter into *s_per_param (the profiler's
 * `host_copy_s_per_param`: 4 bytes each way, what an offloaded step
 * moves per parameter). */
int stage_offload_copy_rate(model_stage *stage, int passes,
                            double *s_per_param, pt_error *err);

/*
 * Forward of one micro-batch into activation slot `slot` (kept until its
 * backward). A stage with the head writes the mean cross-entropy over the
 * micro-batch's mbs x seq positions (nats per token) to *mean_loss; others
 * write 0, and so does one in a step kept on its backend
 * (stage_step_state), which sums the loss there. mean_loss may be NULL.
 */
int stage_forward(model_stage *stage, int slot, const stage_io *io,
                  float *mean_loss, pt_error *err);
/* The next forward's tokens (io->tokens, io->mbs) handed over early:
 * checked now, and the backend's host work on them (cuda: the copy into
 * pinned memory and the embedding's gradient plan) done while the device
 * still runs what is queued, so that the forward only sends them. The
 * forward that takes the same io->tokens and mbs uses that work; the
 * tokens must not change in between. A no-op on a backend with nothing
 * to do ahead. */
int stage_prepare_tokens(model_stage *stage, const stage_io *io,
                         pt_error *err);
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

/* Returns when the work of every forward and backward called before it
 * is done (see defer_sync). */
int stage_synchronize(model_stage *stage, pt_error *err);

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

/*
 * The same step in parts, for callers that time or interleave them (the
 * run's loop, the benchmark): begin (zero the gradients and the loss
 * sum), per micro-batch stage_step_forward and stage_step_backward (slot
 * 0), then apply (global norm, clipping, AdamW at learning_rate) and end,
 * which fills *out and leaves optimizer_steps counting the update only
 * when it was applied (a loss or norm that is not finite: nothing
 * changed; the caller reports it). Only a whole-model stage of one rank
 * (tp 1, one optimizer shard, no offload, not defer_sync) keeps the
 * step on a backend that can (cuda: no host wait between begin and
 * end); every other stage takes the host path, the calls train_step
 * made before. stage_step_abandon drops a step begun (the stop flag
 * between micro-batches); nothing of it is applied.
 */
int stage_step_begin(model_stage *stage, pt_error *err);
int stage_step_forward(model_stage *stage, const stage_io *io,
                       pt_error *err);
int stage_step_backward(model_stage *stage, const stage_io *io,
                        pt_error *err);
int stage_step_apply(model_stage *stage, const train_config *config,
                     float learning_rate, pt_error *err);
int stage_step_end(model_stage *stage, stage_step_totals *out,
                   pt_error *err);
void stage_step_abandon(model_stage *stage);
/* After stage_step_end of a step kept on a backend that marks its
 * progress (stage_step_state.marked; else it fails): when the device
 * reached mark `mark` of the step, in seconds from its begin. Mark 0 is
 * the begin, 2m + 1 the end of micro-batch m's forward, 2m + 2 of its
 * backward, 2M + 1 of the update (M micro-batches): the phases' device
 * times, where the host's clock sees only their queueing. */
int stage_step_mark_seconds(const model_stage *stage, int mark,
                            double *seconds, pt_error *err);

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

#endif
