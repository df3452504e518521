/* Whole-plan estimates on in-memory clusters: memory by hand, stage
 * terms against the estimate, heterogeneous placement, plans that do not
 * fit, the per-step work and the timeline of every stage. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

static void run_estimate(fixture *f, const parallel_config *config,
                         const int *order, int order_count,
                         const int *partition, bool events, estimate *out)
{
    pt_error err = {{0}};
    if (costmodel_estimate(&f->cm, config, order, order_count, partition,
                           events, out, &err) != 0)
        fail_msg("%s", err.message);
}

/* Each term of stage_estimate.memory against the hand count below, and
 * the peak as their sum. */
static void assert_terms(const stage_estimate *st, const double *expected)
{
    double sum = 0.0;
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++) {
        if (!close_to(st->memory.bytes[t], expected[t], 1e-15))
            fail_msg("%s: %.0f bytes, expected %.0f",
                     pt_memory_term_name(t), st->memory.bytes[t],
                     expected[t]);
        sum += st->memory.bytes[t];
    }
    assert_true(close_to(st->peak_memory_bytes, sum, 1e-12));
}

/* GPT-2 XL (h 1600, a 25, f 6400, s 1024, V 50257, 48 layers) on one node
 * of 4 A100s, tp 1, dp 1, pp 4, mbs 1 (N = 1024 rows), gbs 8 (m = 8),
 * bf16, 12 layers a stage, 0.5 GiB workspace_gib (the context term). As
 * the cuda backend allocates (docs/cost-model.md, "Memory per GPU"):
 *   layer parameters 4h^2 + 2hf + 9h + f = 30,740,800 in 12 tensors of
 *     1,876 chunks of 16,384; stage 0 adds the embeddings V h + s h =
 *     82,049,600 (2 tensors, 5,009 chunks), stage 3 the final norm and
 *     the tied copy 2h + V h = 80,414,400 (3 tensors, 4,910 chunks) and
 *     the head's padding to Vp = 50,304 rows, (Vp - V) h = 75,200
 *   stage 0, P = 82,049,600 + 12 x 30,740,800 = 450,939,200, 146 tensors,
 *     27,521 chunks, 4 slots (1F1B: pp - stage):
 *     weights 4 (P + 1) = 1,803,756,804; gradients the same (no head);
 *     mirror 2 (P + 1) = 901,878,402; optimizer 8 (P + 1) + 32 x 27,521
 *     + 4 x 147 = 3,608,397,908
 *     activations 4 x (20 N + 4 [token ids] + 2 N h [input, bf16] +
 *       4 N h [the fp32 send buffer] + 12 x (16 N [norm statistics] +
 *       4 N h [norm outputs, bf16] + 8 N h [qkv and attention output,
 *       bf16] + 4 N a [log-sum-exp] + 4 N h [residual and output, bf16]
 *       + 2 N f [fc output, bf16])) = 1,932,541,968
 *     scratch 4 N h + 4 N h + 8 N h + 2 N f + 4 x (64 + (128 + 8) x
 *       2h) (the norm backward's counters, the warp-row kernel's 128
 *       blocks' partial rows, 8 rows each, and 8 groups' sums) + 4 x 4 x
 *       f (bias partials) + 4 f + 4 N a + 8,192 + 8 + 32 (the one-stage
 *       step's values) + 8 x 146 + 8 x 27,521 + 4 N h (received
 *       gradient) = 48,076,984 (no norm
 *       outputs: none recomputed, no sequence parallelism)
 *     workspace 32 MiB and cuDNN's attention backward's (head size 64,
 *       s a multiple of 128; no logits to lend it; dQ summed in fp32, not
 *       deterministic): 4 x 1 x 25 x 1024 row sums + 4 x 1 x 25 x 1024 x
 *       64 (the accumulator) = 6,656,000, in all 40,210,432;
 *     comm 2,048 + 4 N h (one send) = 6,555,648;
 *     rounding (6 + 4 slots + 1 + 1 [cuDNN's]) x 1 MiB = 12,582,912
 *   the other stages alike (stages 1 and 2 with an fp32 receive buffer
 *   too, 3 with that one only); stage 3's fused head computes its
 *   logits in one chunk of every row (2 N Vp = 103,022,592 bytes, under
 *   256 MiB) in its scratch arena (the logits term), which it lends to
 *   cuDNN and which holds its fc gradient (2 N f = 13,107,200 bytes
 *   fewer of scratch) and, behind it, the backward's stream-wide buffers
 *   but the fp32 input gradient (the bf16 stream and norm gradients, the
 *   attention's and the qkv product's: 2 N (2h + h + 3h) = 19,660,800
 *   bytes fewer), and holds 32 MiB: */
static void memory_matches_hand_computation(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config config = config_of(8, 1, 1, 1, 4);
    int order[1] = {0}, partition[4] = {12, 12, 12, 12};
    estimate e;
    run_estimate(&f, &config, order, 1, partition, false, &e);
    /* the fixture's measured context (workspace_gib 0.5, less the 0.5
     * allowance) and NCCL's buffers of a pipeline rank: the world's
     * communicator and the pipeline's sends (costmodel/memory.c) */
    const double context = (1.24 + 0.45) * PT_GIB, workspace = 33554432.0;
    const double with_cudnn = workspace + 6656000.0, mib = 1048576.0;
    /* weights, mirror, gradients, optimizer, activations, logits,
       scratch, workspace, comm, rounding, context (common.h's order) */
    const double expected[4][PT_MEMORY_TERM_COUNT] = {
        {1803756804.0, 901878402.0, 1803756804.0, 3608397908.0,
         1932541968.0, 0.0, 48076984.0, with_cudnn, 6555648.0,
         11534336.0 + mib, context},
        {1475558404.0, 737779202.0, 1475558404.0, 2951840844.0,
         1469067276.0, 0.0, 48036904.0, with_cudnn, 13109248.0,
         10485760.0 + mib, context},
        {1475558404.0, 737779202.0, 1475558404.0, 2951840844.0,
         979378184.0, 0.0, 48036904.0, with_cudnn, 13109248.0,
         9437184.0 + mib, context},
        {1797216004.0, 898758402.0, 1797516804.0, 3595313176.0,
         483135492.0, 106311680.0, 8754608.0, workspace, 6555648.0,
         8388608.0, context}};
    for (int s = 0; s < 4; s++) {
        assert_terms(&e.stages[s], expected[s]);
        assert_true(close_to(e.stages[s].memory_cap_bytes, 39.59 * PT_GIB,
                             1e-12));
    }
    assert_true(e.fits);
    assert_int_equal(e.worst_stage, 0);
    estimate_free(&e);
    fixture_close(&f);
}

/* Same model, tp 2, dp 2, pp 1, mbs 2 (N = 2048), gbs 8 (m = 2, 1 slot),
 * distributed optimizer, full recompute. One stage holds the tp shard:
 * A = 800 channels, F = 3,200 features, 13 heads, V_s = 25,129 rows
 * (Vp 25,216), P = V_s h + s h + 48 x 15,379,200 + 2h = 779,857,600.
 *   weights 4 (P + 1) = 3,119,430,404; gradients 4 (P + 87 h + 1) =
 *     3,119,987,204; mirror 2 (P + 87 h + 1) = 1,559,993,602
 *   optimizer: moments 8 (P / 2 + 64 + 1) (the shard, runs of 64 floats:
 *     exactly 8 (389,928,832 + 1)), the table of every parameter
 *     32 x 48,061 + 4 x 581, the shard's 32 x (48,061 / 2 + 2) + 4 x 581
 *     (exactly 24,018 chunks): 3,121,742,560 (720 over the executor's)
 *   activations 20 N + 4 + 2 N h + 48 x 2 N h = 321,167,364 (bf16)
 *   logits 2 N h + 12 N + 2 N Vp = 109,862,912
 *   (tp 2: the slot keeps its whole logits, no fused head)
 *   scratch with the recomputed layer and the tp sums' 4 N h + 16 N:
 *     115,667,760 (its residual after attention bf16; no norm outputs
 *     but the recomputed layer's; the one-stage step's 32 bytes; the norm
 *     backward's 4 x (64 + (256 + 16) x 2h): the warp-row kernel's 256
 *     blocks); comm 2,048 (no sends);
 *     rounding (6 + 1 + 1 + 1) MiB */
static void memory_with_recompute_and_distributed_optimizer(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config config = config_of(8, 2, 2, 2, 1);
    config.recompute = true;
    config.distributed_optimizer = true;
    int order[1] = {0}, partition[1] = {48};
    estimate e;
    run_estimate(&f, &config, order, 1, partition, false, &e);
    const double expected[PT_MEMORY_TERM_COUNT] = {
        3119430404.0, 1559993602.0, 3119987204.0, 3121742560.0,
        321167364.0, 109862912.0, 115667760.0, 33554432.0, 2048.0,
        9437184.0, 3.0 * 1.24 * PT_GIB /* NCCL: world, tp, dp groups */};
    assert_terms(&e.stages[0], expected);
    estimate_free(&e);
    fixture_close(&f);
}

/* Deterministic pseudo-random numbers (a 64-bit LCG). */
static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static int random_int(int low, int high)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return low + (int)((rng_state >> 33) % (uint64_t)(high - low + 1));
}

static void random_partition(int layers, int pp, int *partition)
{
    for (int s = 0; s < pp; s++)
        partition[s] = 0;
    for (int l = 0; l < layers; l++)
        partition[random_int(0, pp - 1)]++;
}

static void stage_terms_agree_with_the_estimate(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 3), 0); /* 16 GPUs */
    const int degrees[][3] = {{1, 1, 16}, {1, 2, 8}, {2, 2, 4}, {4, 1, 4},
                              {1, 4, 4}, {2, 1, 8}, {4, 4, 1}, {1, 8, 2}};
    for (int trial = 0; trial < 64; trial++) {
        const int *d = degrees[trial % 8];
        parallel_config config = config_of(32 * d[1], 1 << random_int(0, 2),
                                           d[0], d[1], d[2]);
        config.gbs = config.dp * config.mbs * random_int(1, 12);
        config.schedule = trial % 3 == 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
        config.recompute = trial % 4 == 1;
        config.distributed_optimizer = trial % 5 == 3;
        int order[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) {
            int j = random_int(0, i), swap = order[i];
            order[i] = order[j];
            order[j] = swap;
        }
        int partition[16];
        random_partition(48, config.pp, partition);
        estimate e;
        run_estimate(&f, &config, order, 4, partition, false, &e);
        stage_placement placement[16];
        pt_error err = {{0}};
        assert_int_equal(costmodel_place(&f.cm, &config, order, 4, placement,
                                         &err), 0);
        bool fits = true;
        for (int s = 0; s < config.pp; s++) {
            stage_terms terms;
            assert_int_equal(costmodel_stage_terms(&f.cm, &config, placement,
                                                   s, &terms, &err), 0);
            const stage_estimate *st = &e.stages[s];
            double layers = partition[s];
            assert_true(close_to(terms.fixed_s + layers * terms.per_layer_s,
                                 st->forward_s + st->backward_s + st->send_s +
                                     st->send_bwd_s,
                                 1e-12));
            assert_true(close_to(terms.fixed_bytes +
                                     layers * terms.per_layer_bytes,
                                 st->peak_memory_bytes, 1e-12));
            assert_true(terms.cap_bytes == st->memory_cap_bytes);
            bool stage_fits = st->peak_memory_bytes <= st->memory_cap_bytes;
            assert_true(stage_fits == (partition[s] <= terms.max_layers));
            if (terms.max_layers >= 0 && terms.max_layers < 48) {
                assert_true(terms.fixed_bytes +
                                terms.max_layers * terms.per_layer_bytes <=
                            terms.cap_bytes);
                assert_true(terms.fixed_bytes +
                                (terms.max_layers + 1) * terms.per_layer_bytes >
                            terms.cap_bytes);
            }
            fits = fits && stage_fits;
        }
        assert_true(e.fits == fits);
        estimate_free(&e);
    }
    fixture_close(&f);
}

static void stages_run_at_their_slowest_gpu(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 2), 0); /* a100[0], a10[0..1] */
    parallel_config config = config_of(16, 1, 1, 4, 3);
    int order[3] = {1, 2, 0}, partition[3] = {16, 16, 16};
    estimate e;
    run_estimate(&f, &config, order, 3, partition, false, &e);
    assert_string_equal(e.stages[0].gpu, "A10-TEST");
    assert_string_equal(e.stages[1].gpu, "A10-TEST");
    assert_string_equal(e.stages[2].gpu, "A100-TEST");
    /* stage 1: 16 A10 layers and both boundaries; stage 2: 16 A100
       layers, the head and the boundary it receives at; its head is
       fused (tp 1, partita), so its forward runs the head's backward
       products too: the whole 1.6 ms backward of a profile without a
       roofline (price.c, head_products_share) */
    double a10_boundary = boundary_of(&f.cm, 1, &config);
    double a100_boundary = boundary_of(&f.cm, 0, &config);
    assert_true(a10_boundary > 0.0 && a100_boundary > 0.0);
    assert_true(close_to(e.stages[1].forward_s,
                         16 * 2.4e-3 + 2.0 * a10_boundary, 1e-12));
    assert_true(close_to(e.stages[2].forward_s,
                         16 * 1.6e-3 + 0.8e-3 + 1.6e-3 + a100_boundary,
                         1e-12));
    assert_true(close_to(e.stages[2].memory_cap_bytes, 39.59 * PT_GIB, 1e-12));
    assert_true(close_to(e.stages[0].memory_cap_bytes, 22.2 * PT_GIB, 1e-12));
    /* activations leave a10[1] for a100[0]: the inter-node link */
    link_spec inter = link_of(5.0, 20.0);
    assert_true(close_to(e.stages[1].send_s, p2p_time(3276800.0, inter),
                         1e-12));
    estimate_free(&e);

    /* one stage over an A100 node and an A10 node: the A10's pace and
       memory, and its dp group crosses the inter-node link */
    config = config_of(16, 1, 1, 8, 1);
    int mixed_order[2] = {0, 1}, whole[1] = {48};
    run_estimate(&f, &config, mixed_order, 2, whole, false, &e);
    assert_string_equal(e.stages[0].gpu, "A10-TEST");
    /* (the fused head's forward runs its 1.6 ms of backward products) */
    assert_true(close_to(e.stages[0].forward_s,
                         48 * 2.4e-3 + 0.2e-3 + 0.8e-3 + 1.6e-3, 1e-12));
    assert_true(close_to(e.stages[0].memory_cap_bytes, 22.2 * PT_GIB, 1e-12));
    double params = model_parameter_count(&m);
    /* NCCL over 2 nodes of 4 members: a ring through all 8 whose
       network hops use the 4 rails (4 x 5 GB/s, capped by the A10's
       16 GB/s inside), faster than the hierarchy here */
    comm_group group = {8, 2, link_of(16.0, 10.0), inter};
    comm_price price = nccl_allreduce(params * 4.0, &group);
    assert_int_equal(price.algorithm, ALLREDUCE_RING);
    assert_true(close_to(e.stages[0].dp_allreduce_s, price.seconds, 1e-12));
    assert_true(close_to(price.seconds,
                         allreduce_time(params * 4.0, 8,
                                        link_of(16.0, 20.0)),
                         1e-12));
    stage_placement placement[1];
    pt_error err = {{0}};
    assert_int_equal(costmodel_place(&f.cm, &config, mixed_order, 2, placement,
                                     &err), 0);
    assert_int_equal(placement[0].slow_type, 1);
    assert_int_equal(placement[0].small_type, 1);
    /* the dp group crosses nodes: no node's measured curve prices it */
    assert_int_equal(placement[0].dp_curve_type, -1);
    assert_false(placement[0].tp_spans_nodes);
    estimate_free(&e);
    fixture_close(&f);
}

/* GPT-2 XL as dp 4, mbs 8, one stage on the four A10s of node 1. */
static const int a10_node[1] = {1}, all_layers[1] = {48};

static parallel_config open_dp4_on_the_a10s(fixture *f)
{
    model_shape m = gpt2_xl();
    assert_int_equal(fixture_open(f, &m, 1, 1), 0);
    return config_of(8, 1, 1, 4, 1);
}

static void dp_inside_a_node_uses_the_intra_node_link(void **state)
{
    (void)state;
    fixture f;
    parallel_config config = open_dp4_on_the_a10s(&f);
    model_shape m = f.model;
    const int *order = a10_node, *whole = all_layers;
    estimate e;
    run_estimate(&f, &config, order, 1, whole, false, &e);
    double params = model_parameter_count(&m);
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         allreduce_time(params * 4.0, 4, link_of(16.0, 10.0)),
                         1e-12));
    /* a10 optimizer: 5e-11 s per parameter held */
    assert_true(close_to(e.stages[0].optimizer_s, params * 5e-11, 1e-12));
    estimate_free(&e);

    config.distributed_optimizer = true;
    run_estimate(&f, &config, order, 1, whole, false, &e);
    link_spec intra = link_of(16.0, 10.0);
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         reduce_scatter_time(params * 4.0, 4, intra) +
                             reduce_scatter_time(params * 4.0, 4, intra) +
                             mirror_rebuild_s(params, 5e-11),
                         1e-12));
    assert_true(close_to(e.stages[0].optimizer_s, params / 4 * 5e-11, 1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

/* The end of stage 0's last `bwd` and its `dp_allreduce` event. */
static void last_backward_and_sync(const estimate *e, double *backward_end,
                                   const timeline_event **sync)
{
    *backward_end = 0.0;
    *sync = NULL;
    for (int i = 0; i < e->event_count; i++) {
        const timeline_event *ev = &e->events[i];
        if (ev->stage != 0)
            continue;
        if (ev->kind == EVENT_BWD && ev->end_s > *backward_end)
            *backward_end = ev->end_s;
        if (ev->kind == EVENT_DP_ALLREDUCE && *sync == NULL)
            *sync = ev;
    }
    assert_non_null(*sync);
}

/* The dp sync runs in buckets during the last backward (7.1): after it
 * is left max(R x tail, R - B), the tail being the embedding's share of
 * the first stage's gradients; ZeRO-1 on the tied embedding's pair keeps
 * all of R after the backward. */
static void dp_sync_overlaps_the_last_backward(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config config = config_of(8, 1, 1, 4, 1);
    int order[1] = {1}, whole[1] = {48};
    estimate e;
    run_estimate(&f, &config, order, 1, whole, true, &e);
    double backward_end = 0.0;
    const timeline_event *sync = NULL;
    last_backward_and_sync(&e, &backward_end, &sync);
    double reduce = e.stages[0].dp_allreduce_s;
    double tail = (50257.0 + 1024.0) * 1600 * 4.0 /
                  (model_parameter_count(&m) * 4.0);
    double exposed = reduce * tail;
    if (reduce - e.stages[0].backward_s > exposed)
        exposed = reduce - e.stages[0].backward_s;
    assert_true(close_to(sync->end_s - backward_end, exposed, 1e-9));
    assert_true(close_to(sync->end_s - sync->start_s, reduce, 1e-9));
    assert_true(sync->end_s - backward_end < reduce);
    estimate_free(&e);
    fixture_close(&f);

    /* pp 2 x dp 2 under ZeRO-1: stage 0 holds the tied embedding */
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    config = config_of(8, 1, 1, 2, 2);
    config.distributed_optimizer = true;
    int halves[2] = {24, 24};
    run_estimate(&f, &config, order, 1, halves, true, &e);
    last_backward_and_sync(&e, &backward_end, &sync);
    assert_true(close_to(sync->start_s, backward_end, 1e-9));
    estimate_free(&e);
    fixture_close(&f);
}

/* dp sums on slices of one GPU (every device entry names index 0): the
 * device exchange's kernels, 2 G bytes (G / dp written under ZeRO-1) at
 * the AdamW step's streaming rate, lengthen the step; on separate GPUs
 * (indices differ, or no entries) they do not. */
static void dp_sums_on_slices_of_one_gpu_take_the_backward_sms(void **state)
{
    (void)state;
    fixture f;
    parallel_config config = open_dp4_on_the_a10s(&f);
    model_shape m = f.model;
    const int *order = a10_node, *whole = all_layers;
    estimate apart, sliced;
    run_estimate(&f, &config, order, 1, whole, false, &apart);
    stage_placement place;
    pt_error err = {{0}};
    assert_int_equal(costmodel_place(&f.cm, &config, order, 1, &place, &err),
                     0);
    assert_false(place.slices_of_one_gpu);
    node_type *a10 = &f.cluster.types[1];
    a10->device_count = 4;
    for (int i = 0; i < 4; i++)
        a10->devices[i] = (device_spec){.index = 0, .sm_limit = 16};
    assert_int_equal(costmodel_place(&f.cm, &config, order, 1, &place, &err),
                     0);
    assert_true(place.slices_of_one_gpu);
    step_work work;
    type_costs costs;
    assert_int_equal(costmodel_type_costs(&f.cm, 1, &config, &costs, &err),
                     0);
    costmodel_step_work(&f.cm, &config, &place, 0, 48, &costs, &work);
    double gradient_bytes = model_parameter_count(&m) * 4.0;
    /* a10 optimizer: 5e-11 s per parameter, 30 bytes a parameter */
    assert_true(close_to(work.sum_kernels_s,
                         2.0 * gradient_bytes * 5e-11 / 30.0, 1e-9));
    run_estimate(&f, &config, order, 1, whole, false, &sliced);
    assert_true(sliced.step_time_s > apart.step_time_s);
    assert_true(sliced.step_time_s <=
                apart.step_time_s + work.sum_kernels_s + 1e-12);
    config.distributed_optimizer = true;
    costmodel_step_work(&f.cm, &config, &place, 0, 48, &costs, &work);
    assert_true(close_to(work.sum_kernels_s,
                         1.25 * gradient_bytes * 5e-11 / 30.0, 1e-9));
    config.distributed_optimizer = false;
    a10->devices[3].index = 1; /* one slice on another GPU */
    assert_int_equal(costmodel_place(&f.cm, &config, order, 1, &place, &err),
                     0);
    assert_false(place.slices_of_one_gpu);
    estimate_free(&apart);
    estimate_free(&sliced);
    fixture_close(&f);
}

/* The gradient-norm pass: the square sum of the fp32 gradients a rank
 * steps (its shard under ZeRO-1), 4 bytes a parameter at the AdamW
 * step's streaming rate (30 bytes a parameter); every rank's optimizer
 * step starts when the slowest rank's norm is done (the world's host
 * all-reduce of the norm). */
static void the_gradient_norm_precedes_every_optimizer_step(void **state)
{
    (void)state;
    fixture f;
    parallel_config config = open_dp4_on_the_a10s(&f);
    model_shape m = f.model;
    stage_placement place;
    pt_error err = {{0}};
    assert_int_equal(costmodel_place(&f.cm, &config, a10_node, 1, &place,
                                     &err), 0);
    type_costs costs;
    assert_int_equal(costmodel_type_costs(&f.cm, 1, &config, &costs, &err),
                     0);
    step_work work;
    costmodel_step_work(&f.cm, &config, &place, 0, 48, &costs, &work);
    double params = model_parameter_count(&m);
    /* a10 optimizer: 5e-11 s per parameter */
    assert_true(close_to(work.norm_s, params * 4.0 * 5e-11 / 30.0, 1e-9));
    assert_true(close_to(work.norm_s, work.optimizer_s * 4.0 / 30.0, 1e-9));
    config.distributed_optimizer = true;
    costmodel_step_work(&f.cm, &config, &place, 0, 48, &costs, &work);
    assert_true(close_to(work.norm_s, params / 4 * 4.0 * 5e-11 / 30.0, 1e-9));
    fixture_close(&f);

    /* four stages: the optimizer steps start together, after the latest
       stage's per-step communication and its norm */
    m = gpt2_xl();
    assert_int_equal(fixture_open(&f, &m, 1, 3), 0);
    config = config_of(64, 1, 1, 4, 4);
    int order[4] = {1, 2, 3, 0}, partition[4] = {10, 13, 13, 12};
    estimate e;
    run_estimate(&f, &config, order, 4, partition, true, &e);
    double optimizer_start = -1.0, ready = 0.0;
    for (int i = 0; i < e.event_count; i++) {
        const timeline_event *ev = &e.events[i];
        if (ev->kind == EVENT_OPTIMIZER) {
            assert_true(optimizer_start < 0.0 ||
                        ev->start_s == optimizer_start);
            optimizer_start = ev->start_s;
        } else if (ev->end_s > ready) {
            ready = ev->end_s;
        }
    }
    assert_true(optimizer_start > ready);
    estimate_free(&e);
    fixture_close(&f);
}

static void placement_errors_are_clear(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 2), 0);
    stage_placement placement[8];
    pt_error err = {{0}};
    parallel_config config = config_of(8, 1, 1, 2, 4);
    int three[3] = {0, 1, 2};
    assert_int_equal(costmodel_place(&f.cm, &config, three, 3, placement,
                                     &err), -1);
    assert_non_null(strstr(err.message, "gives 12 GPUs"));
    assert_non_null(strstr(err.message, "needs 8"));
    config = config_of(8, 1, 1, 1, 8);
    int twice[2] = {1, 1};
    assert_int_equal(costmodel_place(&f.cm, &config, twice, 2, placement,
                                     &err), -1);
    assert_non_null(strstr(err.message, "a10[0]"));
    int missing[2] = {1, 7};
    assert_int_equal(costmodel_place(&f.cm, &config, missing, 2, placement,
                                     &err), -1);
    assert_non_null(strstr(err.message, "node 7"));
    fixture_close(&f);
}

/* A tp group over two nodes: its all-reduces run as NCCL runs them over
 * those nodes (ring, tree or the hierarchy: nccl_allreduce, with the
 * slower of the two nodes' inter-node links between them and the slower
 * intra-node link inside) instead of inside a node, and groups that
 * start inside a node and end in the next are placed the same way. */
static link_spec slower_of(link_spec a, link_spec b)
{
    return a.bandwidth_bytes_per_s < b.bandwidth_bytes_per_s ? a : b;
}

static void tp_groups_may_span_nodes(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 2), 0);
    stage_placement placement[4];
    pt_error err = {{0}};
    parallel_config config = config_of(8, 1, 8, 1, 1);
    int two[2] = {0, 1};
    assert_int_equal(costmodel_place(&f.cm, &config, two, 2, placement, &err),
                     0);
    assert_true(placement[0].tp_spans_nodes);
    link_spec inter = link_of(5.0, 20.0);
    assert_true(close_to(placement[0].tp_link.bandwidth_bytes_per_s,
                         inter.bandwidth_bytes_per_s, 1e-12));
    assert_int_equal(placement[0].slow_type, 1); /* the a10 sets the pace */
    type_costs a10;
    assert_int_equal(costmodel_type_costs(&f.cm, 1, &config, &a10, &err), 0);
    stage_terms terms;
    assert_int_equal(costmodel_stage_terms(&f.cm, &config, placement, 0,
                                           &terms, &err), 0);
    double bytes = 1.0 * m.seq * m.hidden * 2.0;
    assert_int_equal(placement[0].tp_nodes, 2);
    link_spec intra = slower_of(f.cm.cluster->types[0].intra_node,
                                f.cm.cluster->types[1].intra_node);
    assert_true(close_to(placement[0].tp_intra_link.bandwidth_bytes_per_s,
                         intra.bandwidth_bytes_per_s, 1e-12));
    comm_group group = {.members = 8, .nodes = 2, .intra = intra,
                        .inter = inter};
    double across = nccl_allreduce(bytes, &group).seconds;
    assert_true(across < allreduce_time(bytes, 8, inter));
    double expected = a10.layer_forward_s + a10.layer_backward_s +
                      4.0 * (across - a10.tp_allreduce_s);
    assert_true(close_to(terms.per_layer_s, expected, 1e-12));
    assert_true(terms.per_layer_s >
                a10.layer_forward_s + a10.layer_backward_s);
    /* tp 3 over three nodes of 4 GPUs: groups 1 and 2 straddle */
    config = config_of(8, 1, 3, 1, 4);
    int three[3] = {0, 1, 2};
    assert_int_equal(costmodel_place(&f.cm, &config, three, 3, placement,
                                     &err), 0);
    assert_true(placement[1].tp_spans_nodes);
    fixture_close(&f);
}

static void plan_errors_are_clear(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    int order[1] = {0};
    estimate e;
    pt_error err = {{0}};
    parallel_config config = config_of(8, 1, 1, 1, 4);
    int short_partition[4] = {12, 12, 12, 11};
    assert_int_equal(costmodel_estimate(&f.cm, &config, order, 1,
                                        short_partition, false, &e, &err), -1);
    assert_non_null(strstr(err.message, "47 layers"));
    assert_null(e.stages);
    int negative[4] = {13, 13, 23, -1};
    assert_int_equal(costmodel_estimate(&f.cm, &config, order, 1, negative,
                                        false, &e, &err), -1);
    assert_non_null(strstr(err.message, "partition[3]"));
    config.gbs = 6;
    config.mbs = 4;
    int even[4] = {12, 12, 12, 12};
    assert_int_equal(costmodel_estimate(&f.cm, &config, order, 1, even, false,
                                        &e, &err), -1);
    assert_non_null(strstr(err.message, "gbs 6"));
    /* issue 18, item 11: a schedule beyond what the cost model simulates
       is refused at once, naming the bound, not simulated for a minute */
    config.gbs = 100000000;
    config.mbs = 1;
    assert_int_equal(costmodel_estimate(&f.cm, &config, order, 1, even, true,
                                        &e, &err), -1);
    assert_non_null(strstr(err.message, "gbs 100000000"));
    assert_non_null(strstr(err.message, "simulates at most 262144"));
    assert_null(e.stages);
    fixture_close(&f);
}

static void plan_over_memory_is_estimated_with_its_worst_stage(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    /* two stages of two A10s each on a10[0], mbs 4 */
    parallel_config config = config_of(32, 4, 1, 2, 2);
    int a10[1] = {1};
    int front_heavy[2] = {46, 2}, back_heavy[2] = {2, 46};
    estimate e;
    run_estimate(&f, &config, a10, 1, front_heavy, false, &e);
    assert_false(e.fits);
    assert_int_equal(e.worst_stage, 0);
    assert_true(e.stages[0].peak_memory_bytes > e.stages[0].memory_cap_bytes);
    assert_true(e.step_time_s > 0.0);
    estimate_free(&e);
    run_estimate(&f, &config, a10, 1, back_heavy, false, &e);
    assert_false(e.fits);
    assert_int_equal(e.worst_stage, 1);
    estimate_free(&e);
    fixture_close(&f);
}

/* Step work: the embedding all-reduce of first and last stage waits for
 * both, everything ends by the step time, tokens, FLOPs and dollars. */
static void step_figures_follow_from_the_timeline(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 3), 0);
    parallel_config config = config_of(64, 1, 1, 4, 4);
    int order[4] = {1, 2, 3, 0}, partition[4] = {10, 13, 13, 12};
    estimate e;
    run_estimate(&f, &config, order, 4, partition, true, &e);
    assert_int_equal(e.stage_count, 4);
    /* tied embeddings over a10[0] and a100[0]: V h / tp x 4 bytes, 2
       members, the inter-node link */
    double embedding = allreduce_time(50257.0 * 1600 * 4.0, 2,
                                      link_of(5.0, 20.0));
    assert_true(close_to(e.stages[0].embedding_allreduce_s, embedding, 1e-12));
    assert_true(close_to(e.stages[3].embedding_allreduce_s, embedding, 1e-12));
    assert_true(e.stages[1].embedding_allreduce_s == 0.0);
    assert_true(close_to(e.tokens_per_s, 64.0 * 1024 / e.step_time_s, 1e-12));
    assert_true(close_to(e.tflops_per_gpu,
                         model_flops_per_iteration(&m, 64, false) /
                             e.step_time_s / 16 / 1e12,
                         1e-12));
    assert_true(close_to(e.cost_per_step_usd,
                         e.step_time_s / 3600.0 * (3 * 8.0 + 32.0), 1e-12));
    assert_true(e.bubble_fraction > 0.0 && e.bubble_fraction < 1.0);

    /* One copy of the timeline per stage, stages in order, rank -1: every
       rank of the stage runs it. */
    double latest = 0.0, embedding_start[2] = {-1.0, -1.0};
    int counted[4] = {0}, previous_stage = 0;
    for (int i = 0; i < e.event_count; i++) {
        const timeline_event *ev = &e.events[i];
        assert_int_equal(ev->rank, -1);
        assert_true(ev->stage >= previous_stage && ev->stage < 4);
        previous_stage = ev->stage;
        assert_true(ev->end_s >= ev->start_s);
        counted[ev->stage]++;
        if (ev->end_s > latest)
            latest = ev->end_s;
        bool per_step = ev->kind == EVENT_DP_ALLREDUCE ||
                        ev->kind == EVENT_EMBEDDING_ALLREDUCE ||
                        ev->kind == EVENT_OPTIMIZER;
        assert_true(per_step == (ev->microbatch == -1));
        if (ev->kind == EVENT_EMBEDDING_ALLREDUCE) {
            assert_true(ev->stage == 0 || ev->stage == 3);
            embedding_start[ev->stage == 0 ? 0 : 1] = ev->start_s;
        }
    }
    assert_true(close_to(latest, e.step_time_s, 1e-12));
    assert_true(embedding_start[0] >= 0.0);
    assert_true(embedding_start[0] == embedding_start[1]);
    /* m = 16 per replica: stage 0 has 16 fwd, 16 bwd, 16 send_fwd, 16
       recv_bwd, then dp all-reduce, embedding all-reduce, optimizer */
    assert_int_equal(counted[0], 4 * 16 + 3);
    assert_int_equal(counted[1], 6 * 16 + 2);
    assert_int_equal(counted[3], 4 * 16 + 3);
    assert_int_equal(e.event_count, 2 * (4 * 16 + 3) + 2 * (6 * 16 + 2));

    estimate quiet;
    run_estimate(&f, &config, order, 4, partition, false, &quiet);
    assert_null(quiet.events);
    assert_int_equal(quiet.event_count, 0);
    assert_true(quiet.step_time_s == e.step_time_s);
    estimate_free(&quiet);
    estimate_free(&e);
    fixture_close(&f);
}

static void notes_reach_the_estimate_context(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config config = config_of(64, 16, 1, 1, 4);
    int order[1] = {0}, partition[4] = {12, 12, 12, 12};
    estimate e;
    run_estimate(&f, &config, order, 1, partition, false, &e);
    assert_true(has_note_containing(&f.cm, "A100-TEST: micro-batch 16 is "
                                           "more than 2x outside"));
    /* the A10 is not in this plan: no note about it */
    assert_false(has_note_containing(&f.cm, "A10-TEST"));
    estimate_free(&e);
    fixture_close(&f);
}


/* The dp event of a stage: [start, end] of its dp_allreduce. */
static void dp_event(const estimate *e, int stage, double *start, double *end)
{
    for (int i = 0; i < e->event_count; i++)
        if (e->events[i].stage == stage &&
            e->events[i].kind == EVENT_DP_ALLREDUCE) {
            *start = e->events[i].start_s;
            *end = e->events[i].end_s;
            return;
        }
    fail_msg("no dp_allreduce event on stage %d", stage);
}

/* The context term: on a measured profile the context the profile
 * measured (workspace_gib less its allowance), never below 0, plus
 * NCCL's buffers as measured on two H200s for a plan of several ranks
 * (costmodel/memory.c): 1.24 GiB a summing communicator (the world's,
 * and a tp or dp group's that is not the world), 0.45 GiB for a
 * pipeline's sends; a derived profile keeps its workspace_gib whole. */
static void context_prices_nccl_buffers_by_communicator(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config one = config_of(8, 1, 1, 1, 1);
    parallel_config dp2 = config_of(8, 1, 1, 2, 1);
    parallel_config pp2 = config_of(8, 1, 1, 1, 2);
    parallel_config tp2_dp2 = config_of(8, 1, 2, 2, 1);
    parallel_config tp2_pp2 = config_of(8, 1, 2, 1, 2);
    double context = 1.25 - PROFILE_WORKSPACE_ALLOWANCE_GIB;
    f.cm.profiles[0].workspace_gib = 1.25;
    assert_true(close_to(costmodel_context_bytes(&f.cm, &one, 0),
                         context * PT_GIB, 1e-12));
    assert_true(close_to(costmodel_context_bytes(&f.cm, &dp2, 0),
                         (context + 1.24) * PT_GIB, 1e-12));
    assert_true(close_to(costmodel_context_bytes(&f.cm, &pp2, 0),
                         (context + 1.24 + 0.45) * PT_GIB, 1e-12));
    /* the world, the tp group and the dp group: three communicators */
    assert_true(close_to(costmodel_context_bytes(&f.cm, &tp2_dp2, 0),
                         (context + 3 * 1.24) * PT_GIB, 1e-12));
    assert_true(close_to(costmodel_context_bytes(&f.cm, &tp2_pp2, 0),
                         (context + 2 * 1.24 + 0.45) * PT_GIB, 1e-12));
    f.cm.profiles[0].workspace_gib = 0.25;
    assert_true(costmodel_context_bytes(&f.cm, &one, 0) == 0.0);
    f.cm.profiles[0].source = PROFILE_DERIVED;
    assert_true(close_to(costmodel_context_bytes(&f.cm, &one, 0),
                         0.25 * PT_GIB, 1e-12));
    assert_true(close_to(costmodel_context_bytes(&f.cm, &pp2, 0),
                         0.25 * PT_GIB, 1e-12));
    fixture_close(&f);
}

/* The end of a stage's last backward in an estimate. */
static double last_backward_end(const estimate *e, int stage)
{
    double end = 0.0;
    for (int i = 0; i < e->event_count; i++)
        if (e->events[i].stage == stage && e->events[i].kind == EVENT_BWD &&
            e->events[i].end_s > end)
            end = e->events[i].end_s;
    return end;
}

/* With the bucket-by-bucket model (--dp-overlap F) on, buckets reduce
 * during the last backward: all of what they can hide is hidden at
 * fraction 1, none at 0 (then the buckets' own latencies make it slower
 * than the default's closed form); off, the default closed form
 * (dp_sync_overlaps_the_last_backward). The planner's floor share is
 * 1 - fraction. */
static void dp_overlap_hides_the_reduction(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 1, 1), 0);
    parallel_config config = config_of(8, 1, 1, 4, 1);
    int order[1] = {1}, whole[1] = {48};
    estimate off, hidden, none;
    assert_false(f.cm.dp_overlap.enabled);
    /* the default closed form may hide all but one bucket's share */
    assert_true(costmodel_dp_overlap_floor_share(&f.cm) == 0.0);
    run_estimate(&f, &config, order, 1, whole, true, &off);
    f.cm.dp_overlap.enabled = true;
    f.cm.dp_overlap.hidden_fraction = 1.0;
    run_estimate(&f, &config, order, 1, whole, true, &hidden);
    f.cm.dp_overlap.hidden_fraction = 0.0;
    run_estimate(&f, &config, order, 1, whole, true, &none);
    assert_true(costmodel_dp_overlap_floor_share(&f.cm) == 1.0);
    f.cm.dp_overlap.hidden_fraction = 0.25;
    assert_true(close_to(costmodel_dp_overlap_floor_share(&f.cm), 0.75,
                         1e-12));

    /* the reduction's own time is reported unchanged */
    assert_true(close_to(hidden.stages[0].dp_allreduce_s,
                         off.stages[0].dp_allreduce_s, 1e-12));
    double start = 0.0, end = 0.0, reduce = off.stages[0].dp_allreduce_s;
    dp_event(&off, 0, &start, &end);
    assert_true(close_to(end - start, reduce, 1e-9));
    double backward_end = last_backward_end(&off, 0);
    double off_exposed = end - backward_end;
    assert_true(close_to(last_backward_end(&hidden, 0), backward_end, 1e-12));
    dp_event(&hidden, 0, &start, &end);
    /* 48 layers of 30.7 M parameters, 123 MB of gradients a layer (a
       bucket each, 11.6 ms over the A10s' 16 GB/s, more than a layer's
       4.8 ms backward: the stream is busy from the first layer's end),
       then the embeddings' 328 MB when the backward ends */
    link_spec intra = link_of(16.0, 10.0);
    double layer_bytes = 4.0 * model_layer_parameter_count(&m);
    double fixed_bytes = 4.0 * model_parameter_count(&m) - 48 * layer_bytes;
    double head_s = 1.6e-3, layer_s = 4.8e-3, embedding_s = 0.4e-3;
    double stream = head_s + layer_s + 48 * allreduce_time(layer_bytes, 4,
                                                           intra);
    double ready = head_s + 48 * layer_s + embedding_s;
    double tail = fmax(stream, ready) + allreduce_time(fixed_bytes, 4, intra) -
                  ready;
    assert_true(start < backward_end);
    assert_true(close_to(end - backward_end, tail, 1e-9));
    assert_true(close_to(off.step_time_s - hidden.step_time_s,
                         off_exposed - tail, 1e-9));
    assert_true(none.step_time_s >= off.step_time_s);
    estimate_free(&off);
    estimate_free(&hidden);
    estimate_free(&none);
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(memory_matches_hand_computation),
        cmocka_unit_test(memory_with_recompute_and_distributed_optimizer),
        cmocka_unit_test(dp_sync_overlaps_the_last_backward),
        cmocka_unit_test(stage_terms_agree_with_the_estimate),
        cmocka_unit_test(stages_run_at_their_slowest_gpu),
        cmocka_unit_test(dp_inside_a_node_uses_the_intra_node_link),
        cmocka_unit_test(dp_sums_on_slices_of_one_gpu_take_the_backward_sms),
        cmocka_unit_test(the_gradient_norm_precedes_every_optimizer_step),
        cmocka_unit_test(placement_errors_are_clear),
        cmocka_unit_test(tp_groups_may_span_nodes),
        cmocka_unit_test(plan_errors_are_clear),
        cmocka_unit_test(plan_over_memory_is_estimated_with_its_worst_stage),
        cmocka_unit_test(step_figures_follow_from_the_timeline),
        cmocka_unit_test(notes_reach_the_estimate_context),
        cmocka_unit_test(dp_overlap_hides_the_reduction),
        cmocka_unit_test(context_prices_nccl_buffers_by_communicator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
