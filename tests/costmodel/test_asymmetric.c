/*
 * Plans whose stages run their own tp and dp (issue 36): a plan whose
 * stages all share their degrees estimates exactly (to the last bit)
 * what the symmetric plan of those degrees estimates, time, memory and
 * timeline; the re-sharding between stages of different degrees against
 * its closed form (docs/cost-model.md, "Stages of their own degrees");
 * each stage's dp reduction on its own group and memory at its own
 * degrees; and the estimate's JSON naming each stage's ranks.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"
#include "costmodel/internal.h"

/* Two doubles the same to the last bit, or the test fails naming what. */
static void assert_same(double a, double b, const char *what, int index)
{
    if (memcmp(&a, &b, sizeof a) != 0)
        fail_msg("%s [%d]: %.17g differs from %.17g", what, index, a, b);
}

static void assert_same_estimates(const estimate *a, const estimate *b)
{
    assert_same(a->step_time_s, b->step_time_s, "step_time_s", -1);
    assert_same(a->tokens_per_s, b->tokens_per_s, "tokens_per_s", -1);
    assert_same(a->tflops_per_gpu, b->tflops_per_gpu, "tflops", -1);
    assert_same(a->bubble_fraction, b->bubble_fraction, "bubble", -1);
    assert_same(a->cost_per_step_usd, b->cost_per_step_usd, "cost", -1);
    assert_int_equal(a->fits, b->fits);
    assert_int_equal(a->worst_stage, b->worst_stage);
    assert_int_equal(a->stage_count, b->stage_count);
    for (int s = 0; s < a->stage_count; s++) {
        const stage_estimate *x = &a->stages[s], *y = &b->stages[s];
        assert_int_equal(x->layers, y->layers);
        assert_int_equal(x->first_rank, y->first_rank);
        assert_int_equal(x->ranks, y->ranks);
        assert_string_equal(x->gpu, y->gpu);
        assert_same(x->forward_s, y->forward_s, "forward_s", s);
        assert_same(x->backward_s, y->backward_s, "backward_s", s);
        assert_same(x->send_s, y->send_s, "send_s", s);
        assert_same(x->send_bwd_s, y->send_bwd_s, "send_bwd_s", s);
        assert_same(x->dp_allreduce_s, y->dp_allreduce_s, "dp", s);
        assert_same(x->embedding_allreduce_s, y->embedding_allreduce_s,
                    "embedding", s);
        assert_same(x->optimizer_s, y->optimizer_s, "optimizer", s);
        assert_same(x->peak_memory_bytes, y->peak_memory_bytes, "memory",
                    s);
        assert_same(x->memory_cap_bytes, y->memory_cap_bytes, "cap", s);
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            assert_same(x->memory.bytes[t], y->memory.bytes[t], "term", t);
    }
    assert_int_equal(a->event_count, b->event_count);
    for (int i = 0; i < a->event_count; i++) {
        const timeline_event *x = &a->events[i], *y = &b->events[i];
        assert_int_equal(x->stage, y->stage);
        assert_int_equal(x->microbatch, y->microbatch);
        assert_int_equal(x->kind, y->kind);
        assert_same(x->start_s, y->start_s, "event start", i);
        assert_same(x->end_s, y->end_s, "event end", i);
    }
    assert_int_equal(a->pricing_count, b->pricing_count);
}

/* The levers each degree layout is tried under. */
static void set_lever(parallel_config *c, int lever)
{
    switch (lever) {
    case 1:
        c->recompute = true;
        break;
    case 2:
        parallel_set_zero_stage(c, 1);
        break;
    case 3:
        parallel_set_zero_stage(c, 2);
        break;
    case 4:
        c->sequence_parallel = c->tp > 1;
        break;
    case 5:
        c->schedule = SCHEDULE_GPIPE;
        break;
    case 6:
        c->grad_precision = GRAD_PRECISION_BF16;
        c->runtime = RUNTIME_MEGATRON;
        break;
    default:
        break;
    }
}

/* Every (tp, dp, pp) filling 16 GPUs at mbs 1 and 2, on two node
 * orders, under each lever: the symmetric plan, and the same stages
 * written as stages of their own degrees under plan-wide degrees they
 * do not use (tp 1 or 2 against theirs, dp x mbs the same samples). */
static void shared_degrees_estimate_as_symmetric(void **state)
{
    (void)state;
    model_shape model = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &model, 2, 2), 0);
    static const int layouts[][3] = {{1, 4, 4}, {2, 2, 4}, {4, 1, 4},
                                     {2, 4, 2}, {4, 2, 2}, {1, 8, 2},
                                     {1, 2, 8}, {2, 1, 8}, {4, 4, 1}};
    static const int orders[2][4] = {{0, 1, 2, 3}, {3, 0, 2, 1}};
    int compared = 0;
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++)
        for (int mbs = 1; mbs <= 2; mbs++)
            for (int order = 0; order < 2; order++)
                for (int lever = 0; lever <= 6; lever++) {
                    int tp = layouts[l][0], dp = layouts[l][1];
                    int pp = layouts[l][2];
                    parallel_config sym = config_of(32, mbs, tp, dp, pp);
                    set_lever(&sym, lever);
                    parallel_config wide = sym;
                    wide.tp = tp == 1 ? 2 : 1;
                    wide.dp = dp * mbs;
                    wide.mbs = 1;
                    stage_degrees stages[8];
                    for (int s = 0; s < pp; s++)
                        stages[s] = (stage_degrees){tp, dp};
                    int partition[8];
                    partition_even(model.layers, pp, partition);
                    estimate a, b;
                    pt_error err = {{0}};
                    if (costmodel_estimate(&f.cm, &sym, orders[order], 4,
                                           partition, true, &a, &err) != 0)
                        fail_msg("symmetric: %s", err.message);
                    if (costmodel_estimate_stages(&f.cm, &wide, stages,
                                                  orders[order], 4, partition,
                                                  true, &b, &err) != 0)
                        fail_msg("stages: %s", err.message);
                    assert_true(stage_degrees_first_own(&wide, stages) >= 0);
                    assert_same_estimates(&a, &b);
                    estimate_free(&a);
                    estimate_free(&b);
                    compared++;
                }
    assert_int_equal(compared, 9 * 2 * 2 * 7);
    fixture_close(&f);
}

/* The closed form with hand numbers: gpt2-xl's activation is 1024 x 1600
 * x 2 = 3,276,800 bytes a sample. From tp 1 x dp 4 (mbs 1) to tp 2 x dp
 * 1 (mbs 4): A = 4 samples = 13,107,200 bytes; each of the 2 receivers
 * takes A / 2, each of the 4 senders gives A / 4; k = 4 / 2 = 2 messages
 * of A / 4; then the receiving pair all-gathers A. */
static void reshard_closed_form(void **state)
{
    (void)state;
    model_shape model = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &model, 1, 0), 0);
    link_spec link = link_of(10.0, 20.0), gather = link_of(100.0, 5.0);
    parallel_config from = config_of(32, 1, 1, 4, 2);
    parallel_config to = config_of(32, 4, 2, 1, 2);
    double a = 13107200.0;
    double expected = 2.0 * (20e-6 + (a / 4.0) / 10e9) +
                      (0.5 * a / 100e9 + 5e-6);
    double got = costmodel_reshard_seconds(&f.cm, &from, &to, -1, link,
                                           gather);
    assert_true(close_to(got, expected, 1e-12));
    assert_true(close_to(got, 7.6589600e-4, 1e-7));
    /* the gradient back: 2 senders, 4 receivers of A / 4, each sender
       gives A / 2 in 2 messages; no gather at tp 1 */
    double back = costmodel_reshard_seconds(&f.cm, &to, &from, -1, link,
                                            gather);
    assert_true(close_to(back, 2.0 * (20e-6 + (a / 4.0) / 10e9), 1e-12));
    /* under sequence parallelism the receivers keep their shards: no
       gather */
    to.sequence_parallel = true;
    got = costmodel_reshard_seconds(&f.cm, &from, &to, -1, link, gather);
    assert_true(close_to(got, 2.0 * (20e-6 + (a / 4.0) / 10e9), 1e-12));
    /* 3 senders to 2 receivers: ceil(1.5) = 2 messages */
    parallel_config three = config_of(36, 2, 1, 3, 2);
    parallel_config two = config_of(36, 3, 1, 2, 2);
    double six = 6.0 * 3276800.0;
    got = costmodel_reshard_seconds(&f.cm, &three, &two, -1, link, gather);
    assert_true(close_to(got, 2.0 * (20e-6 + (six / 2.0 / 2.0) / 10e9),
                         1e-12));
    fixture_close(&f);
}

/* One a100 node of 4: stage 0 tp 2 x dp 1 (mbs 2), stage 1 tp 1 x dp 2
 * (mbs 1), under plan-wide tp 1 x dp 2, mbs 1. Both stages in one node:
 * the boundary crosses its intra-node link (230 GB/s, 5 us; the test
 * profiles have no send curve). */
static void boundary_priced_in_the_estimate(void **state)
{
    (void)state;
    model_shape model = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &model, 1, 0), 0);
    parallel_config wide = config_of(8, 1, 1, 2, 2);
    stage_degrees stages[2] = {{2, 1}, {0, 0}};
    int order[1] = {0}, partition[2] = {24, 24};
    estimate e;
    pt_error err = {{0}};
    if (costmodel_estimate_stages(&f.cm, &wide, stages, order, 1, partition,
                                  true, &e, &err) != 0)
        fail_msg("%s", err.message);
    double a = 2.0 * 3276800.0, bw = 230e9, lat = 5e-6;
    /* 2 senders, 2 receivers of A / 2; stage 1 is tp 1: no gather */
    assert_true(close_to(e.stages[0].send_s, lat + a / 2.0 / bw, 1e-12));
    /* the gradient back to the tp pair, gathered there */
    assert_true(close_to(e.stages[1].send_bwd_s,
                         lat + a / 2.0 / bw + (0.5 * a / bw + lat), 1e-12));
    /* stage 0's one replica has no dp reduction; stage 1's two do */
    assert_true(e.stages[0].dp_allreduce_s == 0.0);
    assert_true(e.stages[1].dp_allreduce_s > 0.0);
    assert_int_equal(e.stages[0].first_rank, 0);
    assert_int_equal(e.stages[1].first_rank, 2);
    assert_int_equal(e.stages[1].ranks, 2);
    /* each stage's memory at its own degrees */
    for (int s = 0; s < 2; s++) {
        parallel_config own = parallel_stage_config(&wide, stages, s);
        stage_memory memory;
        costmodel_stage_memory(&model, &own, s,
                               costmodel_context_bytes(&f.cm, &own, 0),
                               &memory);
        pt_memory_terms terms;
        stage_memory_at(&memory, partition[s], &terms);
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            assert_same(e.stages[s].memory.bytes[t], terms.bytes[t], "term",
                        t);
    }
    /* the JSON names each stage's ranks and, where its own, degrees */
    json_t *root = estimate_to_json(&e, &wide, 0, &err);
    assert_non_null(root);
    const json_t *second = json_array_get(json_object_get(root, "stages"), 1);
    assert_int_equal(json_integer_value(json_array_get(
                         json_object_get(second, "ranks"), 0)),
                     2);
    const json_t *first = json_array_get(json_object_get(root, "stages"), 0);
    assert_int_equal(json_integer_value(json_object_get(first, "tp")), 2);
    assert_null(json_object_get(second, "tp"));
    json_decref(root);
    estimate_free(&e);
    fixture_close(&f);
}

/* What the estimate refuses, naming the stage. */
static void refusals_name_the_stage(void **state)
{
    (void)state;
    model_shape model = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &model, 1, 0), 0);
    int order[1] = {0}, partition[2] = {24, 24};
    estimate e;
    pt_error err = {{0}};
    parallel_config wide = config_of(8, 1, 1, 2, 2);
    stage_degrees split3[2] = {{1, 3}, {0, 0}};
    assert_int_equal(costmodel_estimate_stages(&f.cm, &wide, split3, order, 1,
                                               partition, false, &e, &err),
                     -1);
    assert_non_null(strstr(err.message, "plan: stage 0: dp 3 does not split "
                                        "the micro-batch of dp x mbs = 2"));
    stage_degrees too_many[2] = {{2, 2}, {0, 0}};
    assert_int_equal(costmodel_estimate_stages(&f.cm, &wide, too_many, order,
                                               1, partition, false, &e, &err),
                     -1);
    assert_non_null(strstr(err.message, "plan: node_order gives 4 GPUs but "
                                        "the stages' tp x dp sum to 6"));
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shared_degrees_estimate_as_symmetric),
        cmocka_unit_test(reshard_closed_form),
        cmocka_unit_test(boundary_priced_in_the_estimate),
        cmocka_unit_test(refusals_name_the_stage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
