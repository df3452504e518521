/*
 * Memory per GPU, term by term (docs/cost-model.md, "Memory per GPU"):
 * the formulas mirror what the executor's cuda backend allocates
 * (executor/cuda/buffers.c: fp32 weights, gradients and AdamW moments,
 * a bf16 weight mirror, one activation arena per micro-batch in flight,
 * one backward scratch, the fused head's chunk of logits, the cuBLASLt
 * workspace, cuDNN's attention workspace where the head cannot lend it),
 * each chunk of the
 * interleaved 1F1B counted as the stage of its own the executor makes
 * of it, plus the comm's buffers and the profile's context. Linear in the stage's layer count,
 * for the partition solvers; where the executor's sizes are not (ZeRO-1
 * shard boundaries, the optimizer's chunk table of a shard), the linear
 * form is within a few KiB, which tests/costmodel/test_memory.c bounds.
 */
#include <math.h>

#include "costmodel/internal.h"

/* The executor's constants (executor/cuda/kernel_sizes.h, buffers.h,
 * comm/nccl_internal.h), restated: the cost model does not link the
 * executor; test_memory.c checks these formulas against its plan. */
enum {
    VOCAB_ROUNDING = 128,              /* logits' row stride */
    CHUNK_ELEMENTS = 16384,            /* parameters per optimizer chunk */
    CHUNK_BYTES = 32,                  /* sizeof(param_chunk) */
    LAYERNORM_ROWS = 32,               /* rows per generic-kernel partial */
    LAYERNORM_ROW_KERNEL_ROWS = 8,     /* the warp-row and fused kernels',
                                          at least */
    LAYERNORM_ROW_KERNEL_BLOCKS = 256, /* and their partials, at most */
    LAYERNORM_GROUP = 16,              /* partials one fused block sums */
    LAYERNORM_COUNTERS = 64,           /* counter floats' alignment */
    BIAS_ROWS = 256,                   /* rows per bias-gradient partial */
    SQUARE_BLOCKS = 1024,              /* doubles of a sum of squares */
    STEP_VALUES_BYTES = 32,            /* sizeof(cuda_step_values) */
    NCCL_SCRATCH_BYTES = 256 * 8,      /* the NCCL comm's host reduce */
};
#define GEMM_WORKSPACE_BYTES (32.0 * 1024 * 1024)
/* The fused head's chunks (buffers.h: HEAD_CHUNK_BYTES, HEAD_CHUNK_ROW_
 * MULTIPLE, HEAD_CHUNK_MIN_ROWS, ATTENTION_LENT_ROOM,
 * ATTENTION_LENT_SLACK). */
#define HEAD_CHUNK_BYTES (256.0 * 1024 * 1024)
#define ATTENTION_LENT_ROOM (288.0 * 1024 * 1024)
#define HEAD_CHUNK_ROW_MULTIPLE 128.0
#define HEAD_CHUNK_MIN_ROWS 4096.0
#define ATTENTION_LENT_SLACK (1024.0 * 1024)
/* cuDNN's attention workspace pieces are 256-byte aligned. */
#define CUDNN_ALIGNMENT 256.0
/* Expected rounding of one allocation to the driver's 2 MiB pages. */
#define ROUNDING_PER_ALLOCATION (1024.0 * 1024)

static double ceil_div(double a, double b)
{
    return ceil(a / b);
}

/* The sizes one tensor-parallel rank computes with (tp rank 0: the
 * largest vocabulary shard). */
typedef struct shard_dims {
    double N, C, A, F, NH, B, T;
    double V;          /* vocabulary rows of the shard */
    double Vp;         /* rounded up to VOCAB_ROUNDING */
    double e;          /* bytes of a half-precision buffer's element */
    double r;          /* of the residual stream's (e in every runtime:
                          parallel_residual_bytes) */
    double g;          /* of a main gradient's */
    bool unfused;      /* attention keeps its a s x s scores (not under
                          selective recompute, which recomputes them) */
    bool selective;    /* Megatron's selective recompute */
    bool no_mirror;    /* fp32 under Megatron-LM or DeepSpeed */
    int tp;
    double S;          /* sequence shards: tp under sequence parallelism,
                          else 1 (the layer norms' and the residual
                          stream's tensors are divided by it) */
    /* the architecture (docs/cost-model.md, "Llama-family layers"):
     * GPT-2's is A, 1, false, false, true, true */
    double KV;         /* key (or value) channels of the rank */
    double U;          /* the MLP's first product's columns over F: 2
                          for SwiGLU's gate and up */
    bool rms;          /* RMSNorm: one statistic a row, no bias */
    bool rope;         /* no position embedding */
    bool bias, qkv_bias;
    bool deterministic; /* cuDNN's deterministic attention backward (a
                           plan's "deterministic") */
} shard_dims;

static shard_dims dims_of(const model_shape *m, const parallel_config *c)
{
    int tp = c->tp > 1 ? c->tp : 1;
    double V = ceil_div(m->vocab, tp);
    shard_dims d = {
        .B = c->mbs, .T = m->seq, .C = m->hidden, .A = m->hidden / tp,
        .F = m->ffn_hidden / tp, .NH = m->heads / tp,
        .V = V, .Vp = ceil_div(V, VOCAB_ROUNDING) * VOCAB_ROUNDING,
        .e = precision_bytes(c->precision), .tp = tp,
        .r = parallel_residual_bytes(c), .g = parallel_gradient_bytes(c),
        .unfused = parallel_attention(c) == ATTENTION_UNFUSED,
        .selective = c->selective_recompute,
        .no_mirror = c->precision == PRECISION_FP32 &&
                     c->runtime != RUNTIME_PARTITA,
        .S = costmodel_sequence_shards(c),
        .U = m->mlp == MODEL_MLP_SWIGLU ? 2.0 : 1.0,
        .rms = m->norm == MODEL_NORM_RMSNORM,
        .rope = m->positions == MODEL_POSITIONS_ROPE,
        .bias = m->bias == MODEL_BIAS_ALL,
        .qkv_bias = m->bias != MODEL_BIAS_NONE,
        .deterministic = c->deterministic};
    d.N = d.B * d.T;
    d.KV = model_kv_heads(m) == m->heads
               ? d.A
               : model_kv_heads_per_rank(m, tp) * (m->hidden / m->heads);
    return d;
}

/* One tensor's parameters and chunks, added to a part of the stage. */
typedef struct tensor_tally {
    double params, chunks, tensors;
} tensor_tally;

static void add_tensor(tensor_tally *t, double count)
{
    t->params += count;
    t->chunks += ceil_div(count, CHUNK_ELEMENTS);
    t->tensors += 1.0;
}

/* A norm's tensors: LayerNorm's weight and bias, RMSNorm's weight. */
static void add_norm(tensor_tally *t, const shard_dims *d)
{
    add_tensor(t, d->C);
    if (!d->rms)
        add_tensor(t, d->C);
}

/* A layer's tensors, as stage_parameter_layout lays out a shard (GPT-2);
 * other layers as Megatron holds them: q, k and v one product of A + 2
 * KV columns, SwiGLU's gate and up one of 2F, biases where the model
 * has them. */
static tensor_tally layer_tensors(const shard_dims *d)
{
    tensor_tally t = {0};
    double C = d->C, A = d->A, F = d->F;
    double qkv = d->KV == A ? 3 * A : A + 2 * d->KV;
    add_norm(&t, d);                                  /* ln1 */
    add_tensor(&t, qkv * C);                          /* qkv */
    if (d->qkv_bias)
        add_tensor(&t, qkv);
    add_tensor(&t, C * A);                            /* projection */
    if (d->bias)
        add_tensor(&t, C);
    add_norm(&t, d);                                  /* ln2 */
    add_tensor(&t, d->U * F * C);                     /* fc */
    if (d->bias)
        add_tensor(&t, d->U * F);
    add_tensor(&t, C * F);                            /* MLP projection */
    if (d->bias)
        add_tensor(&t, C);
    return t;
}

/* The embedding's and the head's tensors of a stage. */
static tensor_tally end_tensors(const model_shape *m,
                                const parallel_config *c,
                                const shard_dims *d, int stage)
{
    tensor_tally t = {0};
    bool first = stage == 0, last = stage == c->pp - 1;
    if (first) {
        add_tensor(&t, d->V * d->C);
        if (!d->rope)
            add_tensor(&t, d->T * d->C);
    }
    if (last) {
        add_norm(&t, d);
        if (!m->tied_embeddings || !first)
            add_tensor(&t, d->V * d->C);
    }
    return t;
}

/* Weights, gradients, the mirror and the optimizer's moments and tables
 * for `part` (fixed: its constant slack; per layer: none). */
static void add_parameter_terms(const parallel_config *c, const shard_dims *d,
                                const tensor_tally *part, bool fixed,
                                double head_pad, pt_memory_terms *out)
{
    double one = fixed ? 1.0 : 0.0;
    double P = part->params;
    out->bytes[PT_MEMORY_WEIGHTS] += 4.0 * (P + one);
    out->bytes[PT_MEMORY_GRADIENTS] += d->g * (P + head_pad + one);
    /* the half-precision copy the products read; an fp32 plan under
     * Megatron-LM or DeepSpeed computes on the weights themselves */
    if (!d->no_mirror)
        out->bytes[PT_MEMORY_WEIGHT_MIRROR] += d->e * (P + head_pad + one);
    bool sharded = c->distributed_optimizer && c->dp > 1;
    double dp = sharded ? c->dp : 1.0;
    /* a ZeRO-1 shard: runs of 64 floats, the first shards the fullest;
     * none under offload (host memory, zero.c) but the one float each */
    double moments = c->offload_optimizer
                         ? 0.0
                         : P / dp + (sharded && fixed ? 64.0 : 0.0);
    out->bytes[PT_MEMORY_OPTIMIZER] += 2.0 * 4.0 * (moments + one);
    /* the chunk table of every parameter; a shard's own besides */
    out->bytes[PT_MEMORY_OPTIMIZER] +=
        CHUNK_BYTES * part->chunks + 4.0 * (part->tensors + one);
    if (sharded)
        out->bytes[PT_MEMORY_OPTIMIZER] +=
            CHUNK_BYTES * (part->chunks / dp + (fixed ? 2.0 : 0.0)) +
            4.0 * (part->tensors + one);
}

/* Unfused attention's s x s activations of one layer: its softmax
 * output (e bytes a score), dropout mask (1) and dropout output (e). */
static double unfused_scores_bytes(const shard_dims *d)
{
    return (2.0 * d->e + 1.0) * d->N * d->NH * d->T;
}

/* One layer's activations kept per micro-batch in flight (the cuda
 * backend recomputes the GELU's or SwiGLU's output; full recompute keeps
 * the layer's output only). The residual stream in r bytes; unfused attention keeps
 * its softmax output (e bytes a score), dropout mask (1) and dropout
 * output (e), as Megatron's activation memory counts them. */
static double layer_activation_bytes(const shard_dims *d, bool recompute)
{
    double N = d->N, C = d->C, A = d->A, F = d->F, e = d->e, S = d->S;
    double r = d->r;
    if (recompute)
        return r * N * C / S;
    double scores = d->unfused && !d->selective ? unfused_scores_bytes(d)
                                                : 0.0;
    /* RMSNorm keeps one statistic a row; grouped-query attention's K and
     * V are KV wide (RoPE's rotated Q and K replace the unrotated ones:
     * the rotation is linear and keeps nothing); SwiGLU keeps its gate
     * and up (2F), its product made again in the backward as the GELU's
     * is (executor/cuda/passes_llama.c) */
    double norm_stats = d->rms ? 8.0 : 16.0;
    double qkvo = d->KV == A ? 4.0 * N * A : N * (2.0 * A + 2.0 * d->KV);
    double mlp = d->U * N * F;
    return norm_stats * N / S             /* two norms' statistics */
           + e * 2.0 * N * C / S          /* the norms' outputs */
           + e * qkvo                     /* qkv, attention output */
           + 4.0 * d->B * d->NH * d->T    /* attention's log-sum-exp */
           + scores                       /* unfused: the s x s scores */
           + r * N * C / S                /* residual after attention */
           + e * mlp                      /* fc output before the GELU
                                             (SwiGLU: gate and up) */
           + r * N * C / S;               /* the layer's output */
}

/* The layer the backward works on under full recompute: everything but
 * its output (the sequence shard's rows under sequence parallelism),
 * once, in the scratch. */
static double recomputed_layer_bytes(const shard_dims *d)
{
    return layer_activation_bytes(d, false) - d->r * d->N * d->C / d->S;
}

/* The layer-norm backward's scratch: completion counters (padded), the
 * blocks' partial rows (the generic kernel's 32-row blocks, or the
 * warp-row and fused kernels' up to 256 of at least 8 rows) and the
 * groups' sums (cuda_layernorm_backward_scratch). */
static double layernorm_scratch_bytes(double N, double C)
{
    double blocks = fmax(ceil_div(N, LAYERNORM_ROWS),
                         fmin(ceil_div(N, LAYERNORM_ROW_KERNEL_ROWS),
                              LAYERNORM_ROW_KERNEL_BLOCKS));
    double groups = ceil_div(blocks, LAYERNORM_GROUP);
    double counters = ceil_div(groups + 1.0, LAYERNORM_COUNTERS) *
                      LAYERNORM_COUNTERS;
    return 4.0 * (counters + (blocks + groups) * 2.0 * C);
}

/* The backward scratch but its per-tensor and per-chunk partials;
 * fc_in_head: the fc gradient lives in the fused head's chunk. */
static double scratch_bytes(const shard_dims *d, bool last, bool fc_in_head)
{
    double N = d->N, C = d->C, A = d->A, F = d->F, e = d->e;
    double qkv = d->KV == A ? 3.0 * A : A + 2.0 * d->KV;
    double widest = fmax(fmax(qkv, d->U * F), C);
    /* the norm outputs are gathered there under sequence parallelism
     * (and made again there under PARTITA_CUDA_RECOMPUTE=norm, which the
     * cost model does not price) */
    double norm_outputs = d->S > 1 ? 1.0 : 0.0;
    double bytes = 4.0 * N * C                 /* the fp32 input gradient */
                   + e * (2.0 + norm_outputs) * N * C /* bf16 stream,
                                                  norm gradient */
                   + e * N * (A + qkv)         /* attention, qkv grads */
                   + (fc_in_head ? 0.0 : e * N * F) /* fc gradient
                                                  (SwiGLU's input
                                                  gradient is written
                                                  over its input) */
                   + layernorm_scratch_bytes(N, C)
                   + 4.0 * ceil_div(N, BIAS_ROWS) * widest
                   + 4.0 * F                   /* an epilogue's bias grad */
                   + 4.0 * d->B * d->NH * d->T /* attention backward */
                   + 8.0 * SQUARE_BLOCKS + 8.0 /* a double read back */
                   + STEP_VALUES_BYTES;        /* the step's on the device */
    if (d->tp > 1)
        bytes += 4.0 * N * C + (last ? 16.0 * N : 0.0);
    if (d->S > 1)
        bytes += 16.0 * C; /* a layer's norm gradients before their sum */
    if (!last)
        bytes += 4.0 * N * C; /* the received output gradient */
    return bytes;
}

/* cuDNN's fused attention backward's workspace of b sequences: b x NH
 * x T fp32 row sums, then b x NH x T x T bf16 deterministic, else dQ's
 * fp32 accumulator of b x NH x T x head size, and under grouped-query
 * attention b x NH x T x head size fp32 more, each 256-byte aligned;
 * 0 for a shape cuDNN does not take (head size a multiple of 8 up to
 * 128, T a multiple of 128). The same as executor/cuda/kernel_sizes.h's
 * cuda_cudnn_backward_workspace_bytes (tests/costmodel/test_memory.c
 * holds them together). */
static double cudnn_workspace_bytes(const shard_dims *d, double b)
{
    double head_size = d->A / d->NH;
    if (head_size != floor(head_size) || fmod(head_size, 8.0) != 0.0 ||
        head_size > 128.0 || fmod(d->T, 128.0) != 0.0)
        return 0.0;
    double rows = b * d->NH * d->T;
    double per_head =
        ceil_div(4.0 * rows * head_size, CUDNN_ALIGNMENT) * CUDNN_ALIGNMENT;
    double products =
        d->deterministic
            ? ceil_div(2.0 * rows * d->T, CUDNN_ALIGNMENT) * CUDNN_ALIGNMENT
            : per_head;
    return ceil_div(4.0 * rows, CUDNN_ALIGNMENT) * CUDNN_ALIGNMENT +
           products + (d->KV < d->A ? per_head : 0.0);
}

/* The head's logits and cuDNN's workspace of a chunk (executor/cuda/
 * buffers.c, plan_head): under the partita runtime at tp 1 with
 * gradients in the one buffer, the fused head keeps one chunk of rows of
 * logits (every row under bf16 gradients, else the fewest chunks of at
 * most HEAD_CHUNK_BYTES, of at least HEAD_CHUNK_MIN_ROWS) in the
 * scratch, none in the slots; otherwise each slot keeps N x Vp. cuDNN's backward runs in the fewest pieces of
 * whole sequences whose workspace fits in what the head lends (the
 * chunk, or up to ATTENTION_LENT_ROOM, which the chunk then grows to
 * hold; a slot's logits), else in a workspace of its own. The linear form
 * counts the workspace for a stage of no layers too (which prepares no
 * attention). */
typedef struct head_memory {
    double slot_logits;        /* per slot */
    double chunk;              /* the fused head's buffer, once */
    double borrowed;           /* cuDNN's workspace in it, with its
                                  slack */
    double attention;          /* cuDNN's own workspace */
} head_memory;

static head_memory head_memory_of(const model_shape *m,
                                  const parallel_config *c,
                                  const shard_dims *d, int stage, bool head)
{
    head_memory h = {0};
    bool fused = head && costmodel_head_fused(m, c, stage);
    double lendable = 0.0;
    if (fused) {
        double rows = d->N;
        if (c->grad_precision != GRAD_PRECISION_BF16) {
            double chunks = ceil_div(d->e * d->N * d->Vp, HEAD_CHUNK_BYTES);
            rows = fmin(d->N, fmax(ceil_div(ceil_div(d->N, chunks),
                                            HEAD_CHUNK_ROW_MULTIPLE) *
                                       HEAD_CHUNK_ROW_MULTIPLE,
                                   HEAD_CHUNK_MIN_ROWS));
        }
        h.chunk = d->e * rows * d->Vp;
        /* up to what the whole logits would lend (buffers.c) */
        lendable = fmax(fmax(h.chunk, ATTENTION_LENT_ROOM),
                        d->e * d->N * d->Vp);
    } else if (head) {
        h.slot_logits = d->e * d->N * d->Vp;
        lendable = h.slot_logits;
    }
    double whole = cudnn_workspace_bytes(d, d->B);
    if (whole == 0.0)
        return h;
    for (double pieces = 1.0; pieces <= d->B; pieces += 1.0) {
        double piece = cudnn_workspace_bytes(d, d->B / pieces);
        if (fmod(d->B, pieces) != 0.0 || piece > lendable)
            continue;
        if (fused && piece > h.chunk)
            h.chunk = piece + ATTENTION_LENT_SLACK;
        h.borrowed = fused ? piece + ATTENTION_LENT_SLACK : 0.0;
        return h;
    }
    h.attention = whole;
    return h;
}

/* Bytes rounded up to the arena's 256-byte alignment (the executor's
 * ARENA_ALIGNMENT, the same as cuDNN's). */
static double aligned(double bytes)
{
    return ceil_div(bytes, CUDNN_ALIGNMENT) * CUDNN_ALIGNMENT;
}

/* The backward's buffers the fused head's chunk shares (buffers.h,
 * buffer_head_shared_bytes and buffer_layout.head_shared_offset): the
 * bf16 stream gradient, the norm's, the attention's and the qkv
 * product's gradients, and with the embedding on the stage the fp32
 * input gradient, placed behind the fc gradient (fc_in_head) and cuDNN's
 * borrowed workspace if the chunk holds them all. Returns the bytes
 * scratch_bytes counts of them that the chunk holds instead, or 0. */
static double head_shared_bytes(const shard_dims *d, const head_memory *h,
                                bool fc_in_head, bool embedding)
{
    double N = d->N, C = d->C, e = d->e;
    double qkv = d->A + 2.0 * d->KV;
    double fp32 = embedding ? 4.0 * N * C : 0.0;
    double front = aligned(fmax(fc_in_head ? e * N * d->F : 0.0,
                                h->borrowed));
    double held = aligned(fp32) + 2.0 * aligned(e * N * C) +
                  aligned(e * N * d->A) + aligned(e * N * qkv);
    if (h->chunk == 0.0 || front == 0.0 || front + held > h->chunk)
        return 0.0;
    return fp32 + 2.0 * e * N * C + e * N * (d->A + qkv);
}

/* What a rank allocates once per chunk (the interleaved 1F1B's chunks
 * are stages of their own in the executor; v = 1: the rank's one stage):
 * each chunk's activation slots, summed, and the head chunk's; each
 * chunk's backward scratch, cuDNN workspace and allocations. */
typedef struct chunk_totals {
    double slots, head_slots;
    /* the partita runtime's fp32 pipeline boundary (buffers.c): per slot
     * a receive buffer on every chunk but the embedding's, a send buffer
     * on every chunk but the head's */
    double boundaries;
    double scratch, attention, attention_allocations;
    double head_chunk;         /* the fused head's buffer (in the head
                                  chunk's scratch arena) */
    double slot_logits;        /* per slot of the head's chunk */
} chunk_totals;

static chunk_totals chunk_totals_of(const model_shape *model,
                                    const parallel_config *config,
                                    const shard_dims *d, int stage)
{
    int v = parallel_virtual_stages(config);
    int microbatches = config->gbs / (config->dp * config->mbs);
    int slots[PLAN_MAX_VIRTUAL_STAGES];
    if (v > 1)
        parallel_chunk_slots(config->pp, v, stage, microbatches, slots);
    else
        slots[0] =
            costmodel_microbatches_in_flight(config, stage, microbatches);
    chunk_totals t = {0};
    for (int c = 0; c < v; c++) {
        /* the last stage's last chunk holds the head */
        bool head = stage == config->pp - 1 && c == v - 1;
        head_memory h = head_memory_of(model, config, d, stage, head);
        double attention = h.attention;
        t.head_chunk += h.chunk;
        if (head)
            t.slot_logits = h.slot_logits;
        t.slots += slots[c];
        t.head_slots += head ? slots[c] : 0.0;
        bool embedding = stage == 0 && c == 0;
        t.boundaries += slots[c] * ((embedding ? 0.0 : 1.0) +
                                    (head ? 0.0 : 1.0));
        bool fc_in_head = h.chunk >= d->e * d->N * d->F;
        t.scratch += scratch_bytes(d, head, fc_in_head) -
                     head_shared_bytes(d, &h, fc_in_head, embedding);
        t.attention += attention;
        t.attention_allocations += attention > 0.0 ? 1.0 : 0.0;
    }
    return t;
}

void costmodel_stage_memory(const model_shape *model,
                            const parallel_config *config, int stage,
                            double context_bytes, stage_memory *out)
{
    *out = (stage_memory){0};
    shard_dims d = dims_of(model, config);
    bool first = stage == 0, last = stage == config->pp - 1;
    int v = parallel_virtual_stages(config);
    chunk_totals chunks = chunk_totals_of(model, config, &d, stage);
    pt_memory_terms *fixed = &out->fixed, *layer = &out->per_layer;

    tensor_tally ends = end_tensors(model, config, &d, stage);
    tensor_tally one_layer = layer_tensors(&d);
    tensor_tally no_tensors = {0};
    double head_pad = last ? (d.Vp - d.V) * d.C : 0.0;
    add_parameter_terms(config, &d, &ends, true, head_pad, fixed);
    /* every other chunk's buffers: their constant slack */
    for (int c = 1; c < v; c++)
        add_parameter_terms(config, &d, &no_tensors, true, 0.0, fixed);
    add_parameter_terms(config, &d, &one_layer, false, 0.0, layer);
    /* ZeRO-2/3's shards and units (zero.c), as buffers.c lays them out */
    zero_unit_sizes units = {
        .layer = one_layer.params,
        .embedding = first ? (d.V + (d.rope ? 0.0 : d.T)) * d.C : 0.0,
        .head = last ? (d.rms ? 1.0 : 2.0) * d.C +
                           (!model->tied_embeddings || !first ? d.V * d.C
                                                              : 0.0)
                     : 0.0,
        .head_pad = head_pad,
        .every_table_fixed = CHUNK_BYTES * ends.chunks +
                             4.0 * (ends.tensors + 1.0),
        .every_table_layer = CHUNK_BYTES * one_layer.chunks +
                             4.0 * one_layer.tensors,
        .unit_tables = CHUNK_BYTES * (ends.chunks + one_layer.chunks + 1.0),
    };
    costmodel_zero_memory(model, config, stage, &units, fixed, layer);

    /* per slot of each chunk: token ids and embedding plan, the input
     * (and the partita runtime's fp32 messages beside its bf16 stream);
     * per layer its activations (each chunk holds L / v of them); the
     * head's chunk's slots the head's */
    fixed->bytes[PT_MEMORY_ACTIVATIONS] +=
        chunks.slots * (20.0 * d.N + 4.0 + d.r * d.N * d.C / d.S);
    if (config->runtime == RUNTIME_PARTITA)
        fixed->bytes[PT_MEMORY_ACTIVATIONS] +=
            chunks.boundaries * 4.0 * d.N * d.C / d.S;
    layer->bytes[PT_MEMORY_ACTIVATIONS] +=
        chunks.slots / v * layer_activation_bytes(&d, config->recompute);
    if (last)
        fixed->bytes[PT_MEMORY_LOGITS] +=
            chunks.head_slots * (d.e * d.N * d.C + 12.0 * d.N +
                                 chunks.slot_logits) +
            chunks.head_chunk;

    /* selective recompute: one layer's scores made again in the backward */
    fixed->bytes[PT_MEMORY_SCRATCH] +=
        chunks.scratch + 8.0 * (ends.tensors + ends.chunks) +
        (config->recompute ? v * recomputed_layer_bytes(&d) : 0.0) +
        (d.selective && d.unfused ? v * unfused_scores_bytes(&d) : 0.0);
    layer->bytes[PT_MEMORY_SCRATCH] +=
        8.0 * (one_layer.tensors + one_layer.chunks);

    fixed->bytes[PT_MEMORY_WORKSPACE] =
        v * GEMM_WORKSPACE_BYTES + chunks.attention;
    if (config->tp * config->dp * config->pp > 1) {
        /* NCCL: the host reduce's scratch and one staging buffer per
         * direction the stage sends in */
        double sends = v > 1 ? 2.0 /* the chunks wrap around */
                             : (first ? 0.0 : 1.0) + (last ? 0.0 : 1.0);
        fixed->bytes[PT_MEMORY_COMM] =
            NCCL_SCRATCH_BYTES + sends * 4.0 * d.N * d.C / d.S;
    }
    /* the allocations of each chunk: four parameter-sized buffers and the
     * mirror, the chunk table (two under ZeRO-1), the slots, the scratch
     * and cuDNN's workspace (the GEMM workspace is whole pages) */
    bool sharded = config->distributed_optimizer && config->dp > 1;
    /* ZeRO-2/3: the gradient units' block; ZeRO-3 the parameter units'
     * and their tables instead of the table of every parameter */
    double zero_blocks = 0.0;
    if (costmodel_zero_sharded_stage(model, config, stage))
        zero_blocks = parallel_zero_stage(config) >= 3 ? 2.0 : 1.0;
    double allocations =
        v * (6.0 + (sharded ? 1.0 : 0.0) + 1.0) + zero_blocks +
        chunks.slots + chunks.attention_allocations;
    fixed->bytes[PT_MEMORY_ROUNDING] = allocations * ROUNDING_PER_ALLOCATION;
    fixed->bytes[PT_MEMORY_CONTEXT] = context_bytes;
}

/* NCCL's own device memory on a rank, what `partita exec` left in use
 * beyond every buffer it allocated and the profile's CUDA context, on
 * every rank of the 12 plans of two H200s of 2026-11-29 (NV18 NVLink,
 * NCCL 2.28; docs/accuracy.md, "The real 2-GPU suite of the eleventh
 * session"): 1.24 GiB on ranks that only sum (dp, tp, ZeRO-2/3: 1.75
 * GiB measured, within 0.01, against the profile's 0.51), 0.45 GiB more
 * on ranks that also send and receive a pipeline's activations (2.19-
 * 2.22 GiB). Each communicator the executor sums over connects its own
 * channels (executor/comm/nccl_world.c: the world's, and each tp or dp
 * group that is not the world); the pipeline's sends connect the two
 * message communicators. Measured with two members on NVLink only. */
#define NCCL_SUMMING_COMM_GIB 1.24
#define NCCL_PIPELINE_PEERS_GIB 0.45

/* NCCL's buffers on a rank of config (GiB): a communicator for the world
 * (the loss and the gradient norm) and one for each of the tp and dp
 * groups that is not the whole world; the pipeline's on top. */
static double nccl_buffers_gib(const parallel_config *config)
{
    int world = config->tp * config->dp * config->pp;
    if (world == 1)
        return 0.0;
    int summing = 1 + (config->tp > 1 && config->tp < world) +
                  (config->dp > 1 && config->dp < world);
    return summing * NCCL_SUMMING_COMM_GIB +
           (config->pp > 1 ? NCCL_PIPELINE_PEERS_GIB : 0.0);
}

/* A measured profile's workspace_gib is its CUDA context plus
 * PROFILE_WORKSPACE_ALLOWANCE_GIB for the libraries' buffers: the
 * context, then NCCL's buffers as measured above in place of the
 * allowance. A derived profile's is taken whole. */
double costmodel_context_bytes(const costmodel *cm,
                               const parallel_config *config, int type)
{
    const profile *prof = &cm->profiles[type];
    double gib = prof->workspace_gib;
    if (prof->source == PROFILE_MEASURED)
        gib = fmax(0.0, gib - PROFILE_WORKSPACE_ALLOWANCE_GIB) +
              nccl_buffers_gib(config);
    return gib * PT_GIB;
}

void stage_memory_at(const stage_memory *memory, int layers,
                     pt_memory_terms *out)
{
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        out->bytes[t] = memory->fixed.bytes[t] +
                        layers * memory->per_layer.bytes[t];
}
