/* Communication from the profiles' measured curves: the pipeline's
 * send/recv, the data-parallel gradient all-reduce (and the distributed
 * optimizer's halves: "reducescatter" and "allgather" curves where
 * measured) and the tied-embedding all-reduce use a profile's
 * "sendrecv" / "allreduce" curve when the GPUs involved sit in one node
 * of that profile's type, and the cluster's link figures otherwise;
 * where a curve prices a dp group, its sums beside the backward hide
 * nothing, and ZeRO-3's gathers the share measured beside products. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

/* GPT-2 XL activation of one micro-batch: 1 x 1024 x 1600 x 2 bytes. */
#define ACTIVATION_BYTES 3276800.0

static comm_sample *samples_of(const comm_sample *given, int count)
{
    comm_sample *copy = malloc((size_t)count * sizeof *copy);
    memcpy(copy, given, (size_t)count * sizeof *copy);
    return copy;
}

/* The fixture with curves on the A100 type (type 0) only: send/recv of 2
 * GPUs; all-reduce of 2 and 4 GPUs. */
static void open_with_curves(fixture *f, int a100_nodes, int a10_nodes)
{
    memset(f, 0, sizeof *f);
    f->model = gpt2_xl();
    make_cluster(&f->cluster, a100_nodes, a10_nodes);
    make_profiles(f->profiles);
    static const comm_sample sendrecv[] = {{2, 1e6, 50e-6, 0.0, 0.0},
                                           {2, 1e7, 200e-6, 0.0, 0.0}};
    static const comm_sample allreduce[] = {{2, 1e6, 40e-6, 0.0, 0.0},
                                            {2, 1e9, 10e-3, 0.0, 0.0},
                                            {4, 1e6, 60e-6, 0.0, 0.0},
                                            {4, 1e9, 15e-3, 0.0, 0.0}};
    f->profiles[0].sendrecv = (comm_curve){2, samples_of(sendrecv, 2)};
    f->profiles[0].allreduce = (comm_curve){4, samples_of(allreduce, 4)};
    pt_error err = {{0}};
    if (costmodel_open_with_profiles(&f->cm, &f->model, &f->cluster,
                                     f->profiles, &err) != 0)
        fail_msg("%s", err.message);
}

/* The curves above between or beyond their samples (piecewise linear,
 * the last slope beyond). */
static double sendrecv_curve(double bytes)
{
    return 50e-6 + (bytes - 1e6) / 9e6 * 150e-6;
}

static double allreduce_curve(int gpus, double bytes)
{
    double small = gpus == 2 ? 40e-6 : 60e-6, large = gpus == 2 ? 10e-3
                                                                : 15e-3;
    return small + (bytes - 1e6) / (1e9 - 1e6) * (large - small);
}

static estimate estimate_of(fixture *f, parallel_config config,
                            const int *order, int order_count,
                            const int *partition)
{
    estimate e;
    pt_error err = {{0}};
    if (costmodel_estimate(&f->cm, &config, order, order_count, partition,
                           false, &e, &err) != 0)
        fail_msg("%s", err.message);
    return e;
}

static void sends_inside_a_node_use_the_sendrecv_curve(void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 2, 1);
    /* pp 12 over a100[0], a100[1], a10[0]: stages 0-3, 4-7, 8-11 */
    int order[3] = {0, 1, 2}, partition[12];
    for (int s = 0; s < 12; s++)
        partition[s] = 4;
    estimate e = estimate_of(&f, config_of(12, 1, 1, 1, 12), order, 3,
                             partition);
    /* inside an A100 node: the curve */
    assert_true(close_to(e.stages[0].send_s, sendrecv_curve(ACTIVATION_BYTES),
                         1e-12));
    assert_true(close_to(e.stages[1].send_bwd_s,
                         sendrecv_curve(ACTIVATION_BYTES), 1e-12));
    /* between two A100 nodes: the inter-node link (5 GB/s, 20 us) */
    assert_true(close_to(e.stages[3].send_s,
                         p2p_time(ACTIVATION_BYTES, link_of(5.0, 20.0)),
                         1e-12));
    /* inside the A10 node, whose profile has no curve: its intra link */
    assert_true(close_to(e.stages[8].send_s,
                         p2p_time(ACTIVATION_BYTES, link_of(16.0, 10.0)),
                         1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

static void dp_allreduce_inside_a_node_uses_the_allreduce_curve(void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 2, 0);
    int order[2] = {0, 1}, one_stage[1] = {48};
    parallel_config config = config_of(8, 1, 1, 4, 1);
    estimate e = estimate_of(&f, config, order, 1, one_stage);
    double gradient_bytes =
        stage_parameters_per_gpu(&f.model, &config, 0, 48) * 4.0;
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         allreduce_curve(4, gradient_bytes), 1e-12));
    estimate_free(&e);

    /* the distributed optimizer: a reduce-scatter and an all-gather, each
       half of the curve's all-reduce of its buffer */
    config.distributed_optimizer = true;
    e = estimate_of(&f, config, order, 1, one_stage);
    double params = stage_parameters_per_gpu(&f.model, &config, 0, 48);
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         0.5 * allreduce_curve(4, params * 4.0) +
                             0.5 * allreduce_curve(4, params * 4.0) +
                             mirror_rebuild_s(params, f.cm.profiles[0]
                                                          .optimizer_s_per_param),
                         1e-12));
    estimate_free(&e);

    /* tp 4, dp 2 over two nodes: the dp group crosses the network */
    config = config_of(8, 1, 4, 2, 1);
    e = estimate_of(&f, config, order, 2, one_stage);
    gradient_bytes = stage_parameters_per_gpu(&f.model, &config, 0, 48) * 4.0;
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         allreduce_time(gradient_bytes, 2, link_of(5.0, 20.0)),
                         1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

/* A measured reduce-scatter curve (`partita profile` since 2026-11-29)
 * prices the distributed optimizer's reduce-scatter by itself, not as
 * half the all-reduce; its all-gather too where the profile holds no
 * all-gather curve, else that curve. Where the curves lack the group
 * size, half the all-reduce each, as before. */
static void a_reduce_scatter_curve_prices_the_reduce_scatter(void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 2, 0);
    static const comm_sample scatter[] = {{4, 1e6, 25e-6, 0.0, 0.0},
                                          {4, 1e9, 6e-3, 0.0, 0.0}};
    f.cm.profiles[0].reduce_scatter = (comm_curve){2, samples_of(scatter, 2)};
    int order[2] = {0, 1}, one_stage[1] = {48};
    parallel_config config = config_of(8, 1, 1, 4, 1);
    config.distributed_optimizer = true;
    estimate e = estimate_of(&f, config, order, 1, one_stage);
    double bytes = stage_parameters_per_gpu(&f.model, &config, 0, 48) * 4.0;
    double curve = 25e-6 + (bytes - 1e6) / (1e9 - 1e6) * (6e-3 - 25e-6);
    double rebuild = mirror_rebuild_s(
        bytes / 4.0, f.cm.profiles[0].optimizer_s_per_param);
    assert_true(close_to(e.stages[0].dp_allreduce_s, 2.0 * curve + rebuild,
                         1e-12));
    estimate_free(&e);
    /* an all-gather curve prices the parameter gather */
    static const comm_sample gather[] = {{4, 1e6, 20e-6, 0.0, 0.0},
                                         {4, 1e9, 5e-3, 0.0, 0.0}};
    f.cm.profiles[0].all_gather = (comm_curve){2, samples_of(gather, 2)};
    e = estimate_of(&f, config, order, 1, one_stage);
    double gathered = 20e-6 + (bytes - 1e6) / (1e9 - 1e6) * (5e-3 - 20e-6);
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         curve + gathered + rebuild, 1e-12));
    estimate_free(&e);
    /* a curve of 2-GPU samples only: dp 4 falls back to the all-reduce */
    static const comm_sample pair[] = {{2, 1e6, 25e-6, 0.0, 0.0},
                                       {2, 1e9, 6e-3, 0.0, 0.0}};
    free(f.cm.profiles[0].reduce_scatter.samples);
    free(f.cm.profiles[0].all_gather.samples);
    f.cm.profiles[0].reduce_scatter = (comm_curve){2, samples_of(pair, 2)};
    f.cm.profiles[0].all_gather = (comm_curve){2, samples_of(pair, 2)};
    e = estimate_of(&f, config, order, 1, one_stage);
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         allreduce_curve(4, bytes) + rebuild, 1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

static void a_curve_without_that_gpu_count_falls_back_to_the_link(
    void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 1, 0);
    /* tp 2 takes GPU pairs; dp 2 then pairs GPU 0 with GPU 2 inside the
       node: 2 members, sampled */
    int order[1] = {0}, one_stage[1] = {48};
    parallel_config config = config_of(8, 1, 2, 2, 1);
    estimate e = estimate_of(&f, config, order, 1, one_stage);
    double gradient_bytes =
        stage_parameters_per_gpu(&f.model, &config, 0, 48) * 4.0;
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         allreduce_curve(2, gradient_bytes), 1e-12));
    estimate_free(&e);
    fixture_close(&f);

    /* the same with a curve of 4-GPU samples only: the intra-node link */
    memset(&f, 0, sizeof f);
    f.model = gpt2_xl();
    make_cluster(&f.cluster, 1, 0);
    make_profiles(f.profiles);
    static const comm_sample four_only[] = {{4, 1e6, 60e-6, 0.0, 0.0}};
    f.profiles[0].allreduce = (comm_curve){1, samples_of(four_only, 1)};
    pt_error err = {{0}};
    assert_int_equal(costmodel_open_with_profiles(&f.cm, &f.model, &f.cluster,
                                                  f.profiles, &err), 0);
    e = estimate_of(&f, config, order, 1, one_stage);
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         allreduce_time(gradient_bytes, 2,
                                        link_of(230.0, 5.0)),
                         1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

static void embedding_allreduce_inside_a_node_uses_the_curve(void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 2, 0);
    /* tp 2, pp 2 in one node: first and last stage share a100[0] */
    int order[2] = {0, 1}, two_stages[2] = {24, 24};
    parallel_config config = config_of(8, 1, 2, 1, 2);
    estimate e = estimate_of(&f, config, order, 1, two_stages);
    double bytes = 50257.0 * 1600 / 2 * 4.0;
    assert_true(close_to(e.stages[0].embedding_allreduce_s,
                         allreduce_curve(2, bytes), 1e-12));
    assert_true(close_to(e.stages[1].embedding_allreduce_s,
                         allreduce_curve(2, bytes), 1e-12));
    estimate_free(&e);

    /* tp 4, pp 2: the two stages on two nodes, over the network */
    config = config_of(8, 1, 4, 1, 2);
    e = estimate_of(&f, config, order, 2, two_stages);
    bytes = 50257.0 * 1600 / 4 * 4.0;
    assert_true(close_to(e.stages[0].embedding_allreduce_s,
                         allreduce_time(bytes, 2, link_of(5.0, 20.0)), 1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

/* The stage terms the partition solvers use see the same send times. */
static void stage_terms_use_the_curves_too(void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 1, 0);
    parallel_config config = config_of(8, 1, 1, 1, 4);
    int order[1] = {0};
    stage_placement placement[4];
    pt_error err = {{0}};
    assert_int_equal(costmodel_place(&f.cm, &config, order, 1, placement,
                                     &err), 0);
    assert_int_equal(placement[0].next_curve_type, 0);
    assert_int_equal(placement[0].dp_curve_type, 0);
    stage_terms middle;
    assert_int_equal(costmodel_stage_terms(&f.cm, &config, placement, 1,
                                           &middle, &err), 0);
    /* a middle stage: its activation out and its gradient back, and
       its four boundary conversions */
    double boundary = boundary_of(&f.cm, 0, &config);
    assert_true(boundary > 0.0);
    assert_true(close_to(middle.fixed_s,
                         2.0 * sendrecv_curve(ACTIVATION_BYTES) +
                             4.0 * boundary,
                         1e-12));
    fixture_close(&f);
}

/* The estimate with its timeline. */
static estimate timed_estimate_of(fixture *f, parallel_config config,
                                  const int *order, const int *partition)
{
    estimate e;
    pt_error err = {{0}};
    if (costmodel_estimate(&f->cm, &config, order, 1, partition, true, &e,
                           &err) != 0)
        fail_msg("%s", err.message);
    return e;
}

/* Seconds from stage 0's last backward's end to its dp sync's end. */
static double sync_after_backward(const estimate *e)
{
    double backward_end = 0.0, sync_end = -1.0;
    for (int i = 0; i < e->event_count; i++) {
        const timeline_event *ev = &e->events[i];
        if (ev->stage != 0)
            continue;
        if (ev->kind == EVENT_BWD && ev->end_s > backward_end)
            backward_end = ev->end_s;
        if (ev->kind == EVENT_DP_ALLREDUCE && sync_end < 0.0)
            sync_end = ev->end_s;
    }
    assert_true(sync_end >= 0.0);
    return sync_end - backward_end;
}

/* Whole GPUs of one node whose all-reduce curve is measured: NCCL's
 * kernels for the gradient sums beside the last backward hold its SMs
 * for the sums' whole time, so none of the sum is hidden (docs/cost-
 * model.md 7.1); on a node type priced by its link (the A10s here) the
 * overlap hides all but the tail, as before. */
static void dp_sums_beside_the_backward_contend_where_curves_price_them(
    void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 1, 1);
    parallel_config config = config_of(8, 1, 1, 4, 1);
    int a100[1] = {0}, a10[1] = {1}, one_stage[1] = {48};
    stage_placement place;
    pt_error err = {{0}};
    assert_int_equal(costmodel_place(&f.cm, &config, a100, 1, &place, &err),
                     0);
    assert_true(place.dp_collectives_contend);
    estimate e = timed_estimate_of(&f, config, a100, one_stage);
    assert_true(close_to(sync_after_backward(&e), e.stages[0].dp_allreduce_s,
                         1e-9));
    estimate_free(&e);
    assert_int_equal(costmodel_place(&f.cm, &config, a10, 1, &place, &err),
                     0);
    assert_false(place.dp_collectives_contend);
    e = timed_estimate_of(&f, config, a10, one_stage);
    assert_true(sync_after_backward(&e) < e.stages[0].dp_allreduce_s);
    estimate_free(&e);
    fixture_close(&f);
}

/* ZeRO-3 on whole GPUs of one node: a unit's gather beside the compute
 * takes from it its copies and the share of its transfer the all-gather
 * curve measured beside products (compute_lost; the measured sample
 * nearest in bytes), else the whole transfer. GPT-2 XL, dp 4, pp 1: the
 * forward holds 48 layers' gathers beside the layers and the head's
 * final norm's, so half the lost share takes 0.5 (48 T_L + T_H) off it,
 * and up to one more layer's half where the embeddings' forward hides
 * the first layer's gather (not below that gather's own time). */
static void zero3_gathers_take_the_measured_share(void **state)
{
    (void)state;
    fixture f;
    open_with_curves(&f, 1, 0);
    static const comm_sample gather[] = {{4, 1e6, 20e-6, 0.0, 0.0},
                                         {4, 1e9, 5e-3, 0.0, 0.0}};
    f.cm.profiles[0].all_gather = (comm_curve){2, samples_of(gather, 2)};
    parallel_config config = config_of(8, 1, 1, 4, 1);
    parallel_set_zero_stage(&config, 3);
    int order[1] = {0}, one_stage[1] = {48};
    estimate whole = estimate_of(&f, config, order, 1, one_stage);
    f.cm.profiles[0].all_gather.samples[1].compute_lost = 0.5;
    estimate half = estimate_of(&f, config, order, 1, one_stage);
    double layer_bytes = 4.0 * model_layer_parameters_per_rank(&f.model, 1);
    double T_L = 20e-6 + (layer_bytes - 1e6) / (1e9 - 1e6) * (5e-3 - 20e-6);
    double T_H = 20e-6; /* below the curve: its smallest sample */
    double least = 0.5 * (48.0 * T_L + T_H), most = least + 0.5 * T_L;
    double got = whole.stages[0].forward_s - half.stages[0].forward_s;
    if (got < least * (1.0 - 1e-9) || got > most * (1.0 + 1e-9))
        fail_msg("the forward lost %g s less, expected %g to %g", got, least,
                 most);
    estimate_free(&whole);
    estimate_free(&half);
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sends_inside_a_node_use_the_sendrecv_curve),
        cmocka_unit_test(dp_allreduce_inside_a_node_uses_the_allreduce_curve),
        cmocka_unit_test(
            dp_sums_beside_the_backward_contend_where_curves_price_them),
        cmocka_unit_test(a_reduce_scatter_curve_prices_the_reduce_scatter),
        cmocka_unit_test(a_curve_without_that_gpu_count_falls_back_to_the_link),
        cmocka_unit_test(embedding_allreduce_inside_a_node_uses_the_curve),
        cmocka_unit_test(stage_terms_use_the_curves_too),
        cmocka_unit_test(zero3_gathers_take_the_measured_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
