/*
 * Private to the cuda backend: the state of a cuda stage, which
 * model_cuda.c (its memory plan, buffers and optimizer) and passes.c (its
 * forward and backward) share. The design of both is described at the
 * top of model_cuda.c.
 */
#ifndef PARTITA_EXECUTOR_CUDA_STAGE_H
#define PARTITA_EXECUTOR_CUDA_STAGE_H

#include "executor/comm/comm.h"
#include "executor/cuda/attention_runner.h"
#include "executor/cuda/buffers.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_ops.h"
#include "executor/cuda/gemm.h"
#include "executor/cuda/unit_holds.h"

/* The offset of a tensor the model lacks (a norm's bias under RMSNorm,
 * a linear layer's without biases, learned positions under RoPE). */
#define CUDA_NO_TENSOR SIZE_MAX

/* Offsets (in floats) of one transformer layer's tensors in the
 * parameter-sized buffers (the bf16 mirror: see mirror_offset), or
 * CUDA_NO_TENSOR. */
typedef struct layer_offsets {
    size_t ln1_weight, ln1_bias;
    size_t qkv_weight, qkv_bias;
    size_t attn_proj_weight, attn_proj_bias;
    size_t ln2_weight, ln2_bias;
    size_t fc_weight, fc_bias;
    size_t mlp_proj_weight, mlp_proj_bias;
} layer_offsets;

/* Offsets of every tensor of the stage; only those the stage holds are
 * meaningful. */
typedef struct stage_offsets {
    size_t token_embedding, position_embedding;
    layer_offsets *layers;          /* owned: one per local layer */
    size_t final_norm_weight, final_norm_bias;
    size_t head_weight;             /* lm_head_weight or token_embedding */
} stage_offsets;

/* A device table of parameter chunks (param_chunk) followed by the index
 * of each tensor's first chunk: tensor t is chunks [tensor_starts[t],
 * tensor_starts[t + 1]). */
typedef struct chunk_table {
    param_chunk *chunks;            /* device; owns the allocation */
    int count;
    int *tensor_starts;             /* device, tensor_count + 1, inside it */
} chunk_table;

/* ZeRO-2/3's gradient units on a cuda stage (grad_units.c; the stage's
 * grads_by_unit): a backward writes each unit's gradients into a buffer
 * of the block buffer_grad_units_of carves (layers alternate between
 * two: unit_holds.h's buffers), and as each unit is enqueued its
 * reduce-scatter over dp and the addition of the rank's part into the
 * shard go on a stream of their own, so they run while the backward
 * goes on with the units below. */
typedef struct cuda_grad_units {
    float *block;                   /* owned device memory */
    float *buffer[GRAD_UNIT_BUFFERS];
    cudaStream_t stream;            /* the units' collectives */
    cudaEvent_t produced[GRAD_UNIT_BUFFERS]; /* the stage's stream, after
                                                the unit's backward */
    cudaEvent_t reduced[GRAD_UNIT_BUFFERS];  /* the units' stream, after
                                                its reduction and add */
    bool in_flight[GRAD_UNIT_BUFFERS];       /* reduced not yet waited */
} cuda_grad_units;

/* ZeRO-3's parameter units on a cuda stage (param_units.c; the stage's
 * params_by_unit): params hold the optimizer's range only, and before a
 * unit's forward or backward its fp32 weights are gathered into a
 * buffer of the fp32 block and converted into the bf16 block's (the
 * products read them), on the gradient units' stream, one unit ahead of
 * the one computing (layers alternate between two buffers of each). A
 * unit a buffer still holds is not gathered again (unit_holds.h). */
typedef struct cuda_param_units {
    bool active;                    /* stage->params_by_unit */
    float *block;                   /* owned device memory, fp32 */
    float *buffer[GRAD_UNIT_BUFFERS];
    pt_bf16 *mirror[GRAD_UNIT_BUFFERS]; /* in state->mirror */
    param_chunk *tables;            /* owned device memory: each kind's
                                       conversion chunks, offsets from the
                                       unit's start */
    param_chunk *table[STAGE_UNIT_KINDS];
    int table_count[STAGE_UNIT_KINDS];
    cudaEvent_t issued[GRAD_UNIT_BUFFERS];  /* the stage's stream when a
                                               fetch was asked */
    cudaEvent_t ready[GRAD_UNIT_BUFFERS];   /* the units' stream after it */
    unit_holds holds;               /* what the buffers hold gathered
                                       with the parameters as they are;
                                       forgotten when they change */
    bool regather;                  /* PARTITA_CUDA_UNIT_HOLDS=0: each
                                       pass forgets them first */
} cuda_param_units;

/* What lets a step run without host waits (optimizer_step.c): the upload
 * of a micro-batch's tokens marked by an event, so that the host block
 * is written again only once the copy has read it (the host runs ahead
 * of the device; not under defer_sync, whose calls pass the same
 * tokens), and the pinned block a one-stage step kept on the device is
 * read back into, once, when `done` has passed. */
typedef struct cuda_device_step {
    cudaEvent_t tokens_sent;
    bool tokens_in_flight;          /* tokens_sent recorded, not waited */
    cudaEvent_t done;
    cuda_step_values *host;         /* owned pinned memory */
    cudaEvent_t *marks;             /* owned: timed events of the step's
                                       marks, mark_count made so far */
    int mark_count;
} cuda_device_step;

/* The one-stage step's passes replayed as CUDA graphs (step_graphs.c):
 * a step kept on the device (stage.h) runs the same kernels with the
 * same pointers every step, so its forward (after the tokens' upload)
 * and its backward (up to the embedding's, whose grid follows the
 * micro-batch's distinct tokens) are captured once and replayed, which
 * leaves the launches' host time and most of the gaps between kernels
 * out of the step. One graph of each, for the calls of one slot, micro-
 * batch size and loss scale: another key runs plainly once (lazy
 * allocations, cuDNN's plans), is captured at its second call and
 * replaces the graph. */
typedef struct cuda_pass_graph {
    cudaGraphExec_t exec;           /* NULL: not captured (yet) */
    int slot, mbs;                  /* the calls it replays */
    float loss_scale;
    int plain_calls;                /* of this key, run without a graph */
} cuda_pass_graph;

typedef struct cuda_pass_graphs {
    bool enabled;                   /* PARTITA_CUDA_GRAPHS is not "0" and
                                       no capture has failed */
    cuda_pass_graph forward[2];     /* [1]: a step's first forward, which
                                       zeroes the gradients beside it
                                       (cuda_side_zero) */
    cuda_pass_graph backward[2];    /* [1]: a step's first backward,
                                       whose products write their weights'
                                       gradients (cuda_side_zero) */
    /* A pipeline stage's passes (cuda_slot_pass_run): one graph of each
     * pass per activation slot, the same pointers every call of a slot;
     * slot_count entries of each, allocated at first use (NULL before). */
    cuda_pass_graph *slot_forward, *slot_backward;
    int slot_graphs;
    /* a slot pass's body is running: the head's loss read and the
     * pass's closing wait are left to the caller (passes.c) */
    bool in_slot_pass;
    long replays;                   /* launches of any of them */
} cuda_pass_graphs;

/* A range of the gradients' buffer, in its elements. */
typedef struct cuda_grad_range {
    size_t first, count;
} cuda_grad_range;

/* The gradients of a step kept on the device zeroed beside the step's
 * first forward, on a stream of their own joined before the first
 * gradient is written, instead of ahead of the forward on the stage's
 * stream, where the GPU did nothing else for 0.1-1 ms a step at GPT-2's
 * sizes (step_graphs.c). Most of them need no zeroing at all: the
 * weights of the layers' linear products and an untied head take their
 * gradient whole from one product a micro-batch, which the step's first
 * micro-batch may write (beta 0) instead of adding to zeros; the fill
 * then covers the rest only (norms, biases, the embedding: what a kernel
 * adds to), which spared the memory traffic of the fill beside the
 * forward's products and the read of zeros in the backward's (8 layers
 * of Llama-3-8B on an H200: 1.0-1.7 % of the median step, 2.0-2.6 % of
 * the mean; docs/cuda-backend.md). */
typedef struct cuda_side_zero {
    cudaStream_t stream;            /* NULL until first needed */
    cudaEvent_t fork, done;
    size_t bytes;                   /* of the gradients' buffer */
    size_t element_bytes;           /* of one gradient */
    cuda_grad_range *rest;          /* owned: what no product writes,
                                       ascending; NULL where the
                                       gradients are by unit */
    int rest_count;
    bool pending;                   /* zero_grads left it to the next
                                       forward */
    bool forked;                    /* the fill enqueued, not joined */
    bool products_write;            /* the fill covers `rest` only: the
                                       step's first forward (the fused
                                       head's) and backward products write
                                       their gradients (cuda_grad_written) */
    bool first_forward;             /* the step's first forward is under
                                       way: only its fused head writes */
} cuda_side_zero;

/* Tensor parallelism's backward sums beside the weight gradients
 * (tp_sums.c; PARTITA_CUDA_TP_OVERLAP=1, PARTITA_CUDA_TP_SM_MARGIN): a
 * column-parallel layer's input gradient is summed over the group on a
 * stream of its own while the stage's stream runs the layer's
 * weight-gradient product on all but sm_margin SMs (cuBLASLt's SM
 * target: its kernels are persistent and would otherwise hold every SM
 * until they end, the collective's waiting for them), and the stage's
 * stream waits for the sum before the norm's backward reads it, as
 * Megatron-LM overlaps the input gradient's all-reduce with the weight
 * gradient. */
typedef struct cuda_tp_overlap {
    bool enabled;
    bool forward;                   /* also the forward's row-parallel
                                       products, in two halves of rows,
                                       the first half's sum beside the
                                       second's product (=2) */
    int sm_margin;                  /* SMs left to the collective */
    int split_percent;              /* =2: the first part's share of a
                                       product's rows (PARTITA_CUDA_TP_SPLIT,
                                       default 50) */
    bool split_wide_only;           /* =2: only products whose shard's
                                       input is at least twice the
                                       output's width over tp, the MLP's
                                       projection
                                       (PARTITA_CUDA_TP_SPLIT_WIDE=1) */
    bool halves;                    /* =3: the forward in two halves of
                                       the micro-batch, each half's sums
                                       beside the other half's products
                                       (cuda_tp_forward_halves) */
    int active_half;                /* the half whose segment is being
                                       enqueued; -1: none */
    cudaStream_t stream;            /* the sums' (made at open) */
    cudaEvent_t fork, join;
    cudaEvent_t half_done[2];       /* each half's last sum enqueued */
    bool half_pending[2];           /* ... and not yet waited for (a
                                       graph's capture may wait only on
                                       its own events) */
} cuda_tp_overlap;

/* backend_state of a cuda stage. */
typedef struct cuda_stage_state {
    int device;
    cudaStream_t stream;
    gemm_context *gemm;
    attention_runner *attention;    /* cuDNN's or the own kernels */
    /* What the head lends the attention's backward for cuDNN's
     * workspace (B x NH x T x T bf16 at most, or a piece of it:
     * buffer_layout.attention_split), 0 without a head: the fused head's
     * chunk buffer (scratch.head_logits), dead outside the head's
     * forward, or else a slot's logits (N x ld_logits bf16 at full
     * micro-batches), dead from the head's backward to the slot's next
     * forward; attention_lent is the one of the backward under way, NULL
     * outside a backward. */
    size_t logits_bytes;
    void *attention_lent;
    stage_offsets offsets;
    int layer_count;
    bool llama_layer;               /* the Llama family's layer
                                       (passes_llama.c): any model but
                                       GPT-2 */
    int ld_logits;                  /* Vp: the vocabulary rounded up */
    size_t head_offset;             /* fp32 offset of the head weight */
    size_t head_pad;                /* (Vp - V) x C, 0 without a head */
    buffer_layout layout;           /* what the buffers are sized from
                                       (ld_logits and head_pad are its) */
    /* full recompute (spec.recompute_layers): slots keep each layer's
     * output only; every forward, and the forward run again before a
     * layer's backward, write this one set in the scratch arena, its
     * `output` pointed at the slot's */
    layer_activations recomputed;
    bool fuse_epilogues;
    bool residual_in_norm;          /* pass_skip_to_norm's switch */
    pt_bf16 *mirror;                /* owned: bf16 copy of params */
    chunk_table all_chunks;         /* every parameter: the mirror */
    chunk_table optimizer_chunks;   /* the optimizer's range (AdamW, the
                                       gradient norms): all_chunks' own
                                       memory unless a ZeRO-1 shard */
    activation_slot *slots;         /* owned host array */
    backward_scratch scratch;
    token_block host_tokens;        /* pinned host, one micro-batch */
    int host_unique_tokens;         /* groups of host_tokens' plan */
    void *host_block;               /* owned pinned memory */
    cuda_device_step device_step;
    cuda_pass_graphs graphs;
    cuda_side_zero side_zero;
    cuda_tp_overlap tp_overlap;
    void *token_counts;             /* owned host scratch of the
                                       embedding plan, zeroed */
    size_t device_bytes;            /* asked of cudaMalloc (the cap's) */
    pt_memory_terms tally;          /* the same by term, with what the
                                       allocator rounds up */
    cuda_grad_hook grad_hook;       /* NULL: none (cuda_backend.h) */
    void *grad_hook_data;
    cuda_grad_units grad_units;     /* with stage->grads_by_unit */
    cuda_param_units param_units;   /* with stage->params_by_unit */
} cuda_stage_state;

static inline stage_dims dims_of(const model_stage *stage, int mbs)
{
    return dims_of_shape(&stage->shape, &stage->spec, mbs);
}

static inline cuda_stage_state *state_of(const model_stage *stage)
{
    return stage->backend_state;
}

/* Where a tensor at fp32 offset `offset` sits in the bf16 mirror: after
 * the head weight, further on by the head's zero padding. */
static inline size_t mirror_offset(const cuda_stage_state *state, size_t offset)
{
    return offset > state->head_offset ? offset + state->head_pad : offset;
}

/* The stage's tensor-parallel collectives (tp_sums.c). Whether they are
 * enqueued on the stage's stream (a comm with stream-ordered collectives:
 * NCCL, the device exchange). */
bool cuda_tp_on_stream(const model_stage *stage);
/* Waits for the stage's stream: through the comm when collectives were
 * enqueued on it (one a failed peer never joins ends the wait at the
 * comm's deadline instead of never), else plainly. */
int cuda_sync_stage_stream(const model_stage *stage, pt_error *err);
/* Reduces `count` floats (sum or max) over the tp group: on the stream
 * when the comm can, else after draining it through the blocking comm.
 * Nothing on an unsplit or compute-only stage. */
int cuda_tp_reduce(const model_stage *stage, float *data, size_t count,
                   comm_reduce_op op, pt_error *err);
/* Megatron's bf16 sums of a layer, in place on the stream
 * (cuda_tp_on_stream only): each shard's partial rounded once to bf16
 * and the sum once more. */
int cuda_tp_sum_bf16(const model_stage *stage, pt_bf16 *data, size_t count,
                     pt_error *err);
/* The backward's sums beside the weight gradients (cuda_tp_overlap):
 * open makes the stream and events where PARTITA_CUDA_TP_OVERLAP asks
 * and the stage is split; overlapped: whether a layer's input-gradient
 * sum goes beside (a stream-ordered comm, no sequence parallelism);
 * sum_beside enqueues the bf16 sum of `data` on the overlap's stream
 * behind the stage's; join: the stage's stream waits for it; sm_count:
 * the SMs a product beside it may take. */
int cuda_tp_overlap_open(model_stage *stage, pt_error *err);
void cuda_tp_overlap_close(cuda_tp_overlap *overlap);
bool cuda_tp_overlapped(const model_stage *stage, const stage_dims *d);
/* Whether a row-parallel product of input width `in` and output width
 * `out` runs in two parts (=2, within PARTITA_CUDA_TP_SPLIT_WIDE), and
 * the rows of its first part out of `rows` (a multiple of 64). */
bool cuda_tp_split_product(const model_stage *stage, const stage_dims *d,
                           int in, int out);
int cuda_tp_split_rows(const model_stage *stage, int rows);
bool cuda_tp_overlapped_forward(const model_stage *stage,
                                const stage_dims *d);
int cuda_tp_sum_bf16_beside(model_stage *stage, pt_bf16 *data, size_t count,
                            pt_error *err);
int cuda_tp_join_beside(model_stage *stage, pt_error *err);
int cuda_tp_beside_sm_count(const model_stage *stage);
/* The forward in two halves of the micro-batch (=3, DeepSpeed Domino's
 * idea; docs/cuda-backend.md): whether a forward of these dims runs so
 * (a stream-ordered comm, no sequence parallelism, no recomputation, an
 * even micro-batch, GPT-2's layer); sum_half enqueues the bf16 sum of
 * `data` beside the stage's stream as half `half`'s, wait_half makes the
 * stage's stream wait for that half's last sum. */
bool cuda_tp_forward_halves(const model_stage *stage, const stage_dims *d);
int cuda_tp_sum_half(model_stage *stage, pt_bf16 *data, size_t count,
                     int half, pt_error *err);
int cuda_tp_wait_half(model_stage *stage, int half, pt_error *err);
/* Sequence parallelism over an N x C buffer of `type` in place, shard t's
 * rows at t x R x C: their sum over the group to each shard
 * (reduce-scatter; fp32 only off the stream), and each shard's rows to
 * every shard (all-gather). */
int cuda_tp_scatter_rows(const model_stage *stage, void *data,
                         comm_element type, const stage_dims *d,
                         pt_error *err);
int cuda_tp_gather_rows(const model_stage *stage, void *data,
                        comm_element type, const stage_dims *d,
                        pt_error *err);

/* The gradient units (grad_units.c). open: the stream and events, the
 * block being allocated by the caller; close: safe on a zeroed one.
 * begin: the unit's buffer, once its last reduction is done, zeroed on
 * the stage's stream for the unit's backward; done: the unit's backward
 * is enqueued, its reduction follows (on the units' stream when the
 * stage's units_on_stream, else blocking). settle: the stage's stream
 * waits for every reduction (before anything reads the gradients). */
int cuda_grad_units_open(cuda_grad_units *units, pt_error *err);
void cuda_grad_units_close(cuda_grad_units *units);
int cuda_grad_unit_begin(model_stage *stage, stage_unit_kind kind, int layer,
                         pt_error *err);
int cuda_grad_unit_done(model_stage *stage, stage_unit_kind kind, int layer,
                        pt_error *err);
int cuda_grad_units_settle(const model_stage *stage, pt_error *err);
/* Where the gradient of parameter `offset` is written during a backward:
 * in the gradients' buffer (fp32, or bf16 under llm.c's recipe), or its
 * unit's buffer (fp32: the recipe is refused with units). */
cuda_grad cuda_grad_at(const model_stage *stage, size_t offset);

/* ZeRO-3's units (param_units.c). open: the events and the conversion
 * tables (host chunks filled here, copied into `tables`, allocated by
 * the caller: buffer_unit_tables_bytes); close: safe on a zeroed one.
 * pass_begin: a forward's or backward's first fetches; unit_use: unit
 * (kind, layer) gathered for the stage's stream, the pass's next unit's
 * gather enqueued behind it (each only where its buffer does not hold
 * it still). Nothing without params_by_unit. params_changed: the
 * parameters were written (the optimizer step, a copy from the host),
 * so every unit is gathered again. */
int cuda_param_units_open(model_stage *stage, cuda_stage_state *state,
                          pt_error *err);
void cuda_param_units_close(cuda_param_units *units);
void cuda_param_units_changed(cuda_stage_state *state);
int cuda_param_pass_begin(model_stage *stage, bool backward, pt_error *err);
int cuda_param_unit_use(model_stage *stage, stage_unit_kind kind, int layer,
                        bool backward, pt_error *err);
/* Where parameter `offset` is read during a pass: fp32, and its bf16
 * copy (the mirror, or its unit's buffers under ZeRO-3). */
const float *cuda_param_at(const model_stage *stage, size_t offset);
pt_bf16 *cuda_mirror_at(const cuda_stage_state *state, size_t offset);

/* Where unit (kind, layer) starts in the parameter buffer. */
static inline size_t unit_first_of(const stage_units *u, stage_unit_kind kind,
                                   int layer)
{
    return u->first[kind] +
           (kind == STAGE_UNIT_LAYER ? (size_t)layer * u->count[kind] : 0);
}

/* Where parameter `offset` lies in the units' blocks: the buffer of its
 * unit (in *buffer) and its place in it. */
static inline size_t unit_place_of(const stage_units *u, size_t offset,
                                   int *buffer)
{
    int layer = 0;
    stage_unit_kind kind = stage_unit_at(u, offset, &layer);
    *buffer = unit_buffer_of(kind, layer);
    return offset - unit_first_of(u, kind, layer);
}

/* step_graphs.c. pass_run: `body` (a pass's kernels, nothing the host
 * reads back) for the slot's micro-batch, through the graph of that
 * pass when the stage's step is kept on the device and graphs are on
 * (else plainly); a capture that fails turns the stage's graphs off and
 * runs the body plainly. graphs_close: safe on a zeroed one. */
typedef int (*cuda_pass_body)(model_stage *stage, int slot,
                              const stage_io *io, pt_error *err);
int cuda_pass_run(model_stage *stage, cuda_pass_graph *graph, int slot,
                  const stage_io *io, cuda_pass_body body, pt_error *err);
/* The same for a stage whose step is not kept on the device (a pipeline
 * stage): slot_graphable says whether its forward (backward false) or
 * backward may be replayed from graphs of their slot (graphs on, a GPU
 * of its own, no tensor parallelism, no ZeRO units, no offload, not the
 * profiler's calls; a backward, no gradient hook); slot_pass_run
 * runs `body` of the forward (backward false) or the backward through
 * its slot's graph with graphs.in_slot_pass set, else plainly. */
bool cuda_slot_graphable(const model_stage *stage, bool backward);
int cuda_slot_pass_run(model_stage *stage, bool backward, int slot,
                       const stage_io *io, cuda_pass_body body,
                       pt_error *err);
void cuda_pass_graphs_close(cuda_pass_graphs *graphs);
/* The side zeroing (cuda_side_zero). plan: at allocation, after the
 * offsets, the ranges no product writes (none with gradients by unit).
 * defer: whether zero_grads may leave the `bytes` of gradients to the
 * next forward (a step kept on the device, one buffer of gradients),
 * which it then marks pending, and products_write where the ranges are
 * planned. fork: in a forward's passes, the fill (of the ranges under
 * products_write) on the side stream when pending (no longer pending
 * then). join: the stage's stream waits for a forked fill (before the
 * first gradient is written). settle: a pending fill made whole on the
 * stage's stream (products_write off), a forked one joined (at the
 * backward's start). settle_all: the same before the gradients are
 * copied, and under products_write the ranges the backward's products
 * have yet to write zeroed too (products_write off): a copy sees what a
 * whole fill would have left. written: whether the product of the weight
 * at `offset` writes its gradient (beta 0) rather than adding to it: under
 * products_write, until the step's first backward ends
 * (cuda_stage_backward), a layer's linear weight or the head's where it
 * is the last tensor and not the token embedding (to which the
 * embedding's backward adds). close: safe on a zeroed one. */
int cuda_side_zero_plan(model_stage *stage, size_t element_bytes,
                        pt_error *err);
int cuda_side_zero_defer(model_stage *stage, size_t bytes, bool *deferred,
                         pt_error *err);
int cuda_side_zero_fork(model_stage *stage, pt_error *err);
int cuda_side_zero_join(model_stage *stage, pt_error *err);
int cuda_side_zero_settle(const model_stage *stage, pt_error *err);
int cuda_side_zero_settle_all(const model_stage *stage, pt_error *err);
bool cuda_grad_written(const model_stage *stage, size_t offset);
void cuda_side_zero_close(cuda_side_zero *zero);

/* optimizer_step.c: the backend's gradient norms, AdamW and the step
 * kept on the device with its marks (entries of stage_backend). open:
 * the events and the pinned block of the step kept on the device (close:
 * safe on a zeroed one). tokens_writable: waits until the last upload
 * has read the host block; tokens_sent: marks an upload just enqueued.
 * loss_add: a forward's mean loss into the step's sum. */
int cuda_grad_square_sum(const model_stage *stage, double *out,
                         pt_error *err);
int cuda_grad_square_sums(const model_stage *stage, double *per_tensor,
                          pt_error *err);
int cuda_adamw_step(model_stage *stage, const adamw_config *config,
                    float learning_rate, float grad_scale, pt_error *err);
int cuda_device_step_open(cuda_device_step *step, pt_error *err);
void cuda_device_step_close(cuda_device_step *step);
int cuda_tokens_writable(cuda_stage_state *state, pt_error *err);
int cuda_tokens_sent(cuda_stage_state *state, pt_error *err);
int cuda_step_loss_add(model_stage *stage, const float *losses, int count,
                       pt_error *err);
int cuda_step_apply(model_stage *stage, const adamw_config *config,
                    float learning_rate, float max_grad_norm, pt_error *err);
int cuda_step_totals(model_stage *stage, stage_step_totals *out,
                     pt_error *err);
int cuda_step_mark(model_stage *stage, int mark, pt_error *err);
int cuda_step_mark_seconds(const model_stage *stage, int mark,
                           double *seconds, pt_error *err);

/* The host's work on a micro-batch's tokens ahead of its forward
 * (stage_backend's prepare_tokens, passes.c). */
int cuda_prepare_tokens(model_stage *stage, const stage_io *io,
                        pt_error *err);

/* The forward and backward of a cuda stage (passes.c), the entries of
 * the backend's table for stage_backend.forward and .backward. */
int cuda_stage_forward(model_stage *stage, int slot_index,
                       const stage_io *io, float *mean_loss, pt_error *err);
int cuda_stage_backward(model_stage *stage, int slot_index,
                        const stage_io *io, pt_error *err);

#endif
