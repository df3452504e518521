/* The cost model's memory terms against the cuda backend's memory plan
 * (executor/cuda/buffers.c, the code model_cuda.c allocates with), run
 * without a GPU: for random small models (GPT-2's layer and the Llama
 * family's) and plans (sequence parallelism among them), every stage's
 * estimated terms equal the bytes the executor's largest rank of that
 * stage allocates (the sum of its chunks' under the interleaved 1F1B), but where the linear form approximates (the ZeRO-1
 * shard's optimizer range, the allocator's rounding, what a stage of no
 * layers does not hold), within the bounds docs/cost-model.md states;
 * and cuDNN's attention workspace by hand. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "executor/cuda/buffers.h"
#include "executor/parallel/parallel.h"

/* The cuBLASLt workspace (executor/cuda/kernel_sizes.h). */
#define GEMM_BYTES ((double)CUDA_GEMM_WORKSPACE_BYTES)

/* Deterministic pseudo-random numbers (a 64-bit LCG). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static int random_int(int low, int high)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return low + (int)((rng_state >> 33) % (uint64_t)(high - low + 1));
}

/* A small GPT, or in a third of the draws a Llama-family model
 * (RMSNorm, SwiGLU, rotary positions, grouped-query attention with
 * kv_heads a multiple of tp, no biases or qkv biases, an untied head),
 * whose shard sizes the cuda backend accepts at tp (hidden and
 * ffn_hidden multiples of 8 tp, head sizes multiples of 8). */
static model_shape random_model(int tp)
{
    model_shape m = {0};
    bool llama = random_int(0, 2) == 0;
    pt_copy_string(m.name, sizeof m.name, "random");
    int head_size = 8 * random_int(1, 2);
    m.heads = tp * random_int(1, 3);
    m.hidden = m.heads * head_size;
    m.ffn_hidden = 4 * m.hidden;
    /* a third with sequences cuDNN's attention takes (its workspace) */
    m.seq = random_int(0, 2) == 0 ? 128 * random_int(1, 2)
                                  : random_int(2, 48);
    m.vocab = random_int(40, 700);
    m.layers = random_int(1, 8);
    m.tied_embeddings = random_int(0, 1) == 1;
    if (llama) {
        m.norm = MODEL_NORM_RMSNORM;
        m.mlp = MODEL_MLP_SWIGLU;
        m.positions = MODEL_POSITIONS_ROPE;
        m.rope_base = 10000.0;
        m.norm_eps = 1e-5;
        m.bias = random_int(0, 1) == 1 ? MODEL_BIAS_NONE : MODEL_BIAS_QKV;
        m.tied_embeddings = false;
        /* tp key/value heads or a whole share of the query heads */
        m.kv_heads = random_int(0, 1) == 1 ? tp : m.heads;
        m.ffn_hidden = 8 * tp * random_int(1, 4);
    }
    return m;
}

static void random_partition(int layers, int pp, int *partition)
{
    for (int s = 0; s < pp; s++)
        partition[s] = 0;
    for (int l = 0; l < layers; l++)
        partition[random_int(0, pp - 1)]++;
}

/* The activation slots of a chunk of a stage: a plan of one rank trains
 * one micro-batch at a time (executor/run/run.c), a parallel one keeps
 * its schedule's. */
static int slots_of(const pipeline_layout *layout, int stage, int chunk)
{
    return layout->rank_count == 1
               ? 1
               : pipeline_chunk_slot_count(layout, stage, chunk);
}

/* The executor's plan of one rank of a pipeline layout: the sum of its
 * chunks' (each a stage of its own under the interleaved 1F1B). */
static pt_memory_terms rank_plan(const pipeline_layout *layout, int rank)
{
    pt_error err = {{0}};
    int stage = pipeline_rank_stage(layout, rank);
    pt_memory_terms sum = {{0}};
    for (int c = 0; c < pipeline_chunk_count(layout); c++) {
        stage_spec spec;
        if (pipeline_rank_chunk_spec(layout, rank, c, &spec, &err) != 0)
            fail_msg("%s", err.message);
        pt_memory_terms plan;
        if (cuda_stage_memory_plan(&layout->shape, &spec, layout->config.mbs,
                                   slots_of(layout, stage, c), NULL, &plan,
                                   &err) != 0)
            fail_msg("%s", err.message);
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            sum.bytes[t] += plan.bytes[t];
    }
    return sum;
}

/* Activation slots of all the chunks of a stage. */
static int stage_slots(const pipeline_layout *layout, int stage)
{
    int slots = 0;
    for (int c = 0; c < pipeline_chunk_count(layout); c++)
        slots += slots_of(layout, stage, c);
    return slots;
}

static void describe(const pipeline_layout *layout, int stage, char *out,
                     size_t size)
{
    const parallel_config *c = &layout->config;
    const model_shape *m = &layout->shape;
    snprintf(out, size,
             "h %d a %d kv %d %s s %d V %d l %d tied %d; tp %d dp %d pp %d "
             "mbs %d gbs %d %s v %d recompute %d zero %d sp %d grads %s; "
             "stage %d of %d layers",
             m->hidden, m->heads, model_kv_heads(m),
             model_is_gpt(m) ? "gpt" : "llama", m->seq, m->vocab, m->layers,
             m->tied_embeddings, c->tp, c->dp, c->pp, c->mbs, c->gbs,
             schedule_name(c->schedule), pipeline_chunk_count(layout),
             c->recompute, parallel_zero_stage(c), c->sequence_parallel,
             grad_precision_name(c->grad_precision), stage,
             layout->partition[stage]);
}

/* Bytes of the chunk tables of every parameter of rank 0 of a stage
 * (of each of its chunks under the interleaved 1F1B). */
static double all_chunk_table_bytes(const pipeline_layout *layout, int stage)
{
    pt_error err = {{0}};
    double bytes = 0.0;
    for (int c = 0; c < pipeline_chunk_count(layout); c++) {
        stage_spec spec;
        if (pipeline_rank_chunk_spec(layout,
                                     pipeline_rank_of(layout, stage, 0, 0),
                                     c, &spec, &err) != 0)
            fail_msg("%s", err.message);
        size_t params = 0;
        int count = stage_parameter_layout(&layout->shape, &spec, NULL,
                                           &params, &err);
        param_tensor *tensors = calloc((size_t)count + 1, sizeof *tensors);
        assert_non_null(tensors);
        stage_parameter_layout(&layout->shape, &spec, tensors, NULL, &err);
        int chunks = buffer_chunks_in_range(tensors, count, 0, params);
        free(tensors);
        bytes += (double)buffer_chunk_table_bytes(chunks, count);
    }
    return bytes;
}

/* Whether the cuda executor holds the stage's ZeRO-2/3 shards and units
 * (buffers.c's buffer_grads_by_unit for rank 0 of the stage). */
static bool zero_units_held(const pipeline_layout *layout, int stage)
{
    pt_error err = {{0}};
    stage_spec spec;
    if (pipeline_rank_chunk_spec(layout,
                                 pipeline_rank_of(layout, stage, 0, 0), 0,
                                 &spec, &err) != 0)
        fail_msg("%s", err.message);
    return buffer_grads_by_unit(&layout->shape, &spec);
}

/* cuDNN's attention backward's workspace of a whole micro-batch of
 * the layout's shard, with the 1 MiB the head's chunk adds over it, or
 * 0 where cuDNN does not take the shape. */
static double whole_cudnn_workspace(const pipeline_layout *layout)
{
    const model_shape *m = &layout->shape;
    int tp = layout->config.tp;
    if (!cuda_cudnn_attention_shape(m->seq, m->hidden / tp, m->heads / tp))
        return 0.0;
    return (double)cuda_cudnn_backward_workspace_bytes(
               layout->config.mbs, m->seq, m->heads / tp,
               (int)model_kv_heads_per_rank(m, tp), m->hidden / m->heads,
               layout->config.deterministic) +
           ATTENTION_LENT_SLACK;
}

/* Bytes of the backward's buffers the fused head's chunk may share
 * (buffer_head_shared_bytes, unaligned, with the fp32 input gradient):
 * the chunk of a stage of no layers lends cuDNN nothing, so it may hold
 * them where the linear form, which counts that workspace, does not. */
static double head_shared_bound(const pipeline_layout *layout)
{
    const model_shape *m = &layout->shape;
    int tp = layout->config.tp;
    double N = (double)layout->config.mbs * m->seq, C = m->hidden;
    double A = (double)m->hidden / tp;
    double KV = (double)model_kv_heads_per_rank(m, tp) *
                (m->hidden / m->heads);
    return 4.0 * N * C + 2.0 * 2.0 * N * C + 2.0 * N * (2.0 * A + 2.0 * KV);
}

/* The cost model fuses the head (memory and phases, costmodel/head.c)
 * exactly where the executor does: on the chunk that holds it, of every
 * rank of the stage. */
static void check_head_fused(const pipeline_layout *layout, int stage,
                             const char *what)
{
    pt_error err = {{0}};
    bool model = costmodel_head_fused(&layout->shape, &layout->config,
                                      stage);
    bool held = false;
    for (int rank = 0; rank < layout->rank_count; rank++) {
        if (pipeline_rank_stage(layout, rank) != stage)
            continue;
        for (int c = 0; c < pipeline_chunk_count(layout); c++) {
            stage_spec spec;
            if (pipeline_rank_chunk_spec(layout, rank, c, &spec, &err) != 0)
                fail_msg("%s", err.message);
            if (!spec.has_head)
                continue;
            held = true;
            if (buffer_head_fused(&layout->shape, &spec) != model)
                fail_msg("%s: the executor %s the head, the cost model "
                         "%s", what,
                         model ? "does not fuse" : "fuses",
                         model ? "does" : "does not");
        }
    }
    if (held != (stage == layout->config.pp - 1) || (!held && model))
        fail_msg("%s: the head is %son this stage, the cost model fuses "
                 "it %s", what, held ? "" : "not ", model ? "here" : "not");
}

/* One stage: the estimate against its largest rank's plan, term by
 * term, and that rank (tp rank 0, replica 0, the rank the cost model
 * describes) the largest indeed. */
static void check_stage(const pipeline_layout *layout, int stage)
{
    const parallel_config *c = &layout->config;
    int layers = layout->partition[stage];
    stage_memory memory;
    costmodel_stage_memory(&layout->shape, c, stage, 0.0, &memory);
    pt_memory_terms est;
    stage_memory_at(&memory, layers, &est);
    pt_memory_terms plan =
        rank_plan(layout, pipeline_rank_of(layout, stage, 0, 0));
    char what[256];
    describe(layout, stage, what, sizeof what);
    double largest_other = 0.0;
    for (int replica = 0; replica < c->dp; replica++)
        for (int t = 0; t < c->tp; t++) {
            pt_memory_terms other =
                rank_plan(layout, pipeline_rank_of(layout, stage, replica, t));
            double total = pt_memory_terms_total(&other, false);
            largest_other = total > largest_other ? total : largest_other;
        }
    if (pt_memory_terms_total(&plan, false) < largest_other)
        fail_msg("%s: rank (tp 0, replica 0) is not the largest", what);
    check_head_fused(layout, stage, what);
    const pt_memory_term exact[] = {
        PT_MEMORY_WEIGHTS, PT_MEMORY_WEIGHT_MIRROR, PT_MEMORY_GRADIENTS,
        PT_MEMORY_ACTIVATIONS};
    /* interleaved, a layer's activations are priced at the chunks' slots
     * over v, which a double may not hold exactly: to 1e-12. ZeRO-2/3's
     * shards: the linear form's run (P / d and 64 floats) against the
     * executor's, within 1 KiB; a stage of no layers holds no layer
     * units, which the linear form counts (two of each kind: fp32
     * gradients and weights, bf16 copies) */
    int v = pipeline_chunk_count(layout);
    bool units = zero_units_held(layout, stage);
    double unit_slack =
        units && layers == 0 ? 2.0 * model_layer_parameter_count(&layout->shape)
                             : 0.0;
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        pt_memory_term t = exact[i];
        bool shard = units && (t == PT_MEMORY_GRADIENTS ||
                               (t == PT_MEMORY_WEIGHTS &&
                                parallel_zero_stage(c) >= 3));
        bool copies = units && t == PT_MEMORY_WEIGHT_MIRROR &&
                      parallel_zero_stage(c) >= 3;
        double error = est.bytes[t] - plan.bytes[t];
        double bound = v > 1 ? 1e-12 * plan.bytes[t] : 0.0;
        if (shard)
            bound = 1024.0 + 4.0 * unit_slack;
        if (copies)
            bound = 2.0 * unit_slack;
        if ((shard || copies) ? error < 0.0 || error > bound
                              : fabs(error) > bound)
            fail_msg("%s: %s estimated %.0f bytes, allocated %.0f", what,
                     pt_memory_term_name(t), est.bytes[t], plan.bytes[t]);
    }
    /* the logits: exact, but that the fused head's chunk of a stage of
     * no layers holds no cuDNN workspace (no attention prepared), which
     * the linear form counts: at most the whole backward's and 1 MiB */
    double logits_error =
        est.bytes[PT_MEMORY_LOGITS] - plan.bytes[PT_MEMORY_LOGITS];
    double logits_bound = v > 1 ? 1e-12 * plan.bytes[PT_MEMORY_LOGITS] : 0.0;
    if (layers == 0)
        logits_bound += whole_cudnn_workspace(layout);
    if (fabs(logits_error) > logits_bound &&
        (layers > 0 || logits_error < 0.0))
        fail_msg("%s: logits estimated %.0f bytes, allocated %.0f", what,
                 est.bytes[PT_MEMORY_LOGITS], plan.bytes[PT_MEMORY_LOGITS]);
    /* a stage of no layers has no recompute working set; the linear form
     * counts it (docs/cost-model.md) */
    double scratch_slack =
        c->recompute && layers == 0
            ? memory.fixed.bytes[PT_MEMORY_SCRATCH] -
                  plan.bytes[PT_MEMORY_SCRATCH]
            : 0.0;
    assert_true(scratch_slack >= 0.0);
    /* ... and its fused head's chunk, which lends cuDNN nothing and
     * does not grow for it, may hold what the linear form keeps in the
     * scratch or the other way round (head_shared_bound) */
    double shared_slack =
        layers == 0 && stage == c->pp - 1 ? head_shared_bound(layout) : 0.0;
    double scratch_error = est.bytes[PT_MEMORY_SCRATCH] - scratch_slack -
                           plan.bytes[PT_MEMORY_SCRATCH];
    if (fabs(scratch_error) > shared_slack)
        fail_msg("%s: scratch estimated %.0f bytes, allocated %.0f", what,
                 est.bytes[PT_MEMORY_SCRATCH], plan.bytes[PT_MEMORY_SCRATCH]);
    /* a stage of no layers prepares no attention, so holds no cuDNN
     * workspace; the linear form counts it (docs/cost-model.md) */
    double cudnn_estimated = est.bytes[PT_MEMORY_WORKSPACE] - v * GEMM_BYTES;
    double workspace_slack = layers == 0 ? cudnn_estimated : 0.0;
    if (est.bytes[PT_MEMORY_WORKSPACE] - workspace_slack !=
        plan.bytes[PT_MEMORY_WORKSPACE])
        fail_msg("%s: workspace estimated %.0f bytes, allocated %.0f", what,
                 est.bytes[PT_MEMORY_WORKSPACE],
                 plan.bytes[PT_MEMORY_WORKSPACE]);
    /* the optimizer: exact without ZeRO-1; each chunk's shard's moments
     * (runs of 64 floats) within 1 KiB, its own chunk table within the
     * size of the table of every parameter */
    double optimizer_bound =
        c->distributed_optimizer && c->dp > 1
            ? v * 1024.0 + all_chunk_table_bytes(layout, stage)
            : 0.0;
    double optimizer_error =
        fabs(est.bytes[PT_MEMORY_OPTIMIZER] - plan.bytes[PT_MEMORY_OPTIMIZER]);
    /* ZeRO-3 on a stage of no layers: the layer's conversion table */
    if (units && layers == 0)
        optimizer_bound += 32.0 * (unit_slack / 16384.0 + 12.0);
    if (optimizer_error > optimizer_bound)
        fail_msg("%s: optimizer estimated %.0f bytes, allocated %.0f", what,
                 est.bytes[PT_MEMORY_OPTIMIZER],
                 plan.bytes[PT_MEMORY_OPTIMIZER]);
    /* rounding: 1 MiB expected per allocation, against each one's pages
     * and the arenas' 256-byte alignment (at most 256 bytes a piece) */
    double allocations =
        v * (6.0 + (c->distributed_optimizer && c->dp > 1) + 1.0 +
             (cudnn_estimated > 0.0)) +
        (units ? (parallel_zero_stage(c) >= 3 ? 2.0 : 1.0) : 0.0) +
        stage_slots(layout, stage);
    double rounding_bound =
        allocations * (1024.0 * 1024.0 + 256.0 * (40.0 + 13.0 * layers));
    if (fabs(est.bytes[PT_MEMORY_ROUNDING] - plan.bytes[PT_MEMORY_ROUNDING]) >
        rounding_bound)
        fail_msg("%s: rounding estimated %.0f bytes, allocated %.0f", what,
                 est.bytes[PT_MEMORY_ROUNDING],
                 plan.bytes[PT_MEMORY_ROUNDING]);
    /* the stage's own terms only: no comm, no context */
    assert_true(plan.bytes[PT_MEMORY_COMM] == 0.0 &&
                plan.bytes[PT_MEMORY_CONTEXT] == 0.0);
}

/* Every stage of the layout of `partition` checked (check_stage). */
static void check_layout(const model_shape *m, const parallel_config *c,
                         const int *partition, int trial)
{
    pipeline_layout layout;
    pt_error err = {{0}};
    if (pipeline_layout_init(&layout, m, c, partition, c->pp, &err) != 0)
        fail_msg("trial %d: %s", trial, err.message);
    for (int s = 0; s < c->pp; s++)
        check_stage(&layout, s);
}

static void estimate_matches_the_executor_plan(void **state)
{
    (void)state;
    const int tps[] = {1, 2, 4};
    for (int trial = 0; trial < 300; trial++) {
        int tp = tps[random_int(0, 2)];
        model_shape m = random_model(tp);
        int pp = random_int(1, m.layers < 4 ? m.layers : 4);
        parallel_config c = {
            .tp = tp, .dp = random_int(1, 3), .pp = pp,
            .mbs = random_int(1, 3),
            .schedule = random_int(0, 1) ? SCHEDULE_GPIPE : SCHEDULE_1F1B,
            .precision = PRECISION_BF16,
            .recompute = random_int(0, 1) == 1};
        /* no sharding, ZeRO-1, 2 or 3 */
        int zero = random_int(0, 3);
        if (zero > 0)
            parallel_set_zero_stage(&c, zero);
        c.gbs = c.dp * c.mbs * random_int(1, 5);
        /* llm.c's recipe (bf16 gradients) where the cuda backend runs
         * it: without ZeRO-2/3's gradient shards */
        if (zero < 2 && random_int(0, 1) == 1)
            c.grad_precision = GRAD_PRECISION_BF16;
        /* sequence parallelism where it applies: the norms, the residual
         * stream and the stage's input are the shard's rows */
        c.sequence_parallel =
            tp > 1 && m.seq % tp == 0 && random_int(0, 1) == 1;
        /* cuDNN's deterministic attention backward or the accumulating
         * one (their workspaces differ) */
        c.deterministic = random_int(0, 1) == 1;
        int partition[PT_MAX_STAGES];
        random_partition(m.layers, pp, partition);
        check_layout(&m, &c, partition, trial);
    }
}

/* The interleaved 1F1B: every chunk a stage of its own in the executor,
 * its slots, scratch, workspaces and buffers; the estimate is their sum.
 * Stages of whole multiples of v layers, micro-batches a multiple of
 * pp. */
static void interleaved_estimate_matches_the_chunks(void **state)
{
    (void)state;
    const int tps[] = {1, 2};
    for (int trial = 0; trial < 150; trial++) {
        int tp = tps[random_int(0, 1)];
        model_shape m = random_model(tp);
        int pp = random_int(2, 4), v = random_int(2, 4);
        int partition[PT_MAX_STAGES];
        m.layers = 0;
        for (int s = 0; s < pp; s++) {
            partition[s] = v * random_int(0, 2);
            m.layers += partition[s];
        }
        if (m.layers == 0) {
            partition[pp - 1] = v;
            m.layers = v;
        }
        parallel_config c = {
            .tp = tp, .dp = random_int(1, 2), .pp = pp,
            .mbs = random_int(1, 2), .schedule = SCHEDULE_1F1B,
            .precision = PRECISION_BF16, .virtual_stages = v,
            .recompute = random_int(0, 1) == 1,
            .distributed_optimizer = random_int(0, 1) == 1};
        c.gbs = c.dp * c.mbs * pp * random_int(1, 3);
        c.grad_precision = random_int(0, 1) == 1 ? GRAD_PRECISION_BF16
                                                 : GRAD_PRECISION_FP32;
        c.sequence_parallel =
            tp > 1 && m.seq % tp == 0 && random_int(0, 1) == 1;
        /* cuDNN's deterministic attention backward or the accumulating
         * one (their workspaces differ) */
        c.deterministic = random_int(0, 1) == 1;
        check_layout(&m, &c, partition, trial);
    }
}

/* cuDNN's attention backward's workspace, by hand: h 64 in 8 heads of 8,
 * s 128, mbs 1, pp 2 (one layer a stage): B x NH x T = 1,024 rows, so
 * deterministic 4 x 1,024 row sums + 2 x 1,024 x 128 = 266,240 bytes,
 * else the row sums and dQ's fp32 accumulator, 4 x 1,024 x 8: 36,864
 * bytes. Stage 0 has no
 * head to lend it; stage 1's fused head lends its chunk of logits, 2 N
 * Vp: at V 2,000, 524,288 bytes, enough; at V 100, 32,768 bytes, which
 * grows to the workspace and 1 MiB (ATTENTION_LENT_ROOM allows it), so
 * neither holds a workspace of its own; s 120 goes to the own kernels. */
static void cudnn_workspace_where_no_logits_lend_it(void **state)
{
    (void)state;
    const struct {
        int seq, vocab;
        bool deterministic;
        double stage_workspace[2];
    } cases[] = {
        {128, 100, true, {GEMM_BYTES + 266240.0, GEMM_BYTES}},
        {128, 2000, true, {GEMM_BYTES + 266240.0, GEMM_BYTES}},
        {128, 100, false, {GEMM_BYTES + 36864.0, GEMM_BYTES}},
        {120, 100, true, {GEMM_BYTES, GEMM_BYTES}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        model_shape m = {.hidden = 64, .heads = 8, .ffn_hidden = 256,
                         .seq = cases[i].seq, .vocab = cases[i].vocab,
                         .layers = 2};
        pt_copy_string(m.name, sizeof m.name, "cudnn");
        parallel_config c = {.tp = 1, .dp = 1, .pp = 2, .mbs = 1, .gbs = 2,
                             .schedule = SCHEDULE_1F1B,
                             .precision = PRECISION_BF16,
                             .deterministic = cases[i].deterministic};
        int partition[2] = {1, 1};
        pipeline_layout layout;
        pt_error err = {{0}};
        if (pipeline_layout_init(&layout, &m, &c, partition, 2, &err) != 0)
            fail_msg("%s", err.message);
        for (int s = 0; s < 2; s++) {
            stage_memory memory;
            costmodel_stage_memory(&m, &c, s, 0.0, &memory);
            pt_memory_terms est;
            stage_memory_at(&memory, 1, &est);
            if (est.bytes[PT_MEMORY_WORKSPACE] !=
                cases[i].stage_workspace[s])
                fail_msg("s %d V %d stage %d: workspace %.0f, expected %.0f",
                         m.seq, m.vocab, s, est.bytes[PT_MEMORY_WORKSPACE],
                         cases[i].stage_workspace[s]);
            check_stage(&layout, s); /* the executor's plan alike */
        }
    }
}

/* Llama-3.2-1B (models/llama3.2-1b.json) at sequence 2048, micro-batch
 * 4, as issue 35's speed row trains it: its fused head's chunk of 4,096
 * rows of 128,256 logits (1,050,673,152 bytes) holds the fc gradient
 * (8,192 x 8,192 bf16, 128 MiB) and cuDNN's attention backward's
 * workspace (4 x 32 x 2,048 fp32 row sums, 1 MiB, and under grouped
 * queries two fp32 accumulators of 4 x 32 x 2,048 x 64, 64 MiB each:
 * 135,266,304 bytes, and 1 MiB for what cuDNN's plan may ask more than
 * that) and, behind the larger, the backward's stream-wide
 * buffers: the fp32 input gradient (64 MiB), the bf16 stream and norm
 * gradients (32 MiB each), the attention's (32 MiB) and the grouped qkv
 * product's (8,192 x 3,072 bf16, 48 MiB): 208 MiB. cuDNN is lent the
 * chunk up to them. On the last of two stages the fp32 input gradient is
 * sent while the next forward runs, so it stays in the scratch (144
 * MiB). Both stages as the cost model prices them. */
static void head_chunk_shares_the_backward_buffers(void **state)
{
    (void)state;
    const char *root = getenv("PARTITA_SOURCE");
    if (root == NULL)
        fail_msg("PARTITA_SOURCE is not set: run the tests with meson test");
    char path[PT_PATH_MAX];
    snprintf(path, sizeof path, "%s/models/llama3.2-1b.json", root);
    model_shape m;
    pt_error err = {{0}};
    if (model_load_file(path, &m, &err) != 0)
        fail_msg("%s", err.message);
    m.seq = 2048;
    const double MiB = 1024.0 * 1024.0;
    for (int pp = 1; pp <= 2; pp++) {
        parallel_config c = {.tp = 1, .dp = 1, .pp = pp, .mbs = 4,
                             .gbs = 8, .schedule = SCHEDULE_1F1B,
                             .precision = PRECISION_BF16};
        int partition[2] = {pp == 1 ? 16 : 8, 8};
        pipeline_layout layout;
        if (pipeline_layout_init(&layout, &m, &c, partition, pp, &err) != 0)
            fail_msg("%s", err.message);
        int last = pp - 1;
        stage_spec spec;
        if (pipeline_rank_chunk_spec(&layout,
                                     pipeline_rank_of(&layout, last, 0, 0),
                                     0, &spec, &err) != 0)
            fail_msg("%s", err.message);
        buffer_layout buffers;
        if (cuda_stage_buffer_layout(&m, &spec, c.mbs, NULL, &buffers,
                                     &err) != 0)
            fail_msg("%s", err.message);
        size_t shared = buffer_head_shared_bytes(&buffers);
        assert_int_equal(buffers.head_rows, 4096);
        assert_true(buffers.head_chunk_bytes == 1050673152u);
        assert_true(buffers.head_shared_offset == 136314880u);
        assert_true((double)shared == (pp == 1 ? 208.0 : 144.0) * MiB);
        assert_true(buffers.head_shared_offset + shared <=
                    buffers.head_chunk_bytes);
        assert_true(buffer_logits_lendable_bytes(&buffers) ==
                    buffers.head_shared_offset);
        check_stage(&layout, last);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(head_chunk_shares_the_backward_buffers),
        cmocka_unit_test(estimate_matches_the_executor_plan),
        cmocka_unit_test(interleaved_estimate_matches_the_chunks),
        cmocka_unit_test(cudnn_workspace_where_no_logits_lend_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
