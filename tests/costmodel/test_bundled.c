/* The cost model on the files shipped with Partita: the GPT-2 XL model,
 * the FASOP heterogeneous cluster and its published A100 / A10 profiles,
 * and the example plan of docs/examples. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include <stdio.h>

#include "fixtures.h"

static void source_path(const char *relative, char *out, size_t size)
{
    const char *root = getenv("PARTITA_SOURCE");
    snprintf(out, size, "%s/%s", root ? root : ".", relative);
}

static void example_plan_is_estimated(void **state)
{
    (void)state;
    char path[PT_PATH_MAX];
    source_path("docs/examples/plan-gpt2xl-hetero.json", path, sizeof path);
    plan p;
    pt_error err = {{0}};
    if (plan_load_file(path, &p, &err) != 0)
        fail_msg("%s", err.message);
    costmodel cm;
    if (costmodel_open(&cm, &p.model, &p.cluster, NULL, &err) != 0)
        fail_msg("%s", err.message);
    /* the profiles hold GPT-2 XL at mbs 1: nothing was stretched */
    assert_int_equal(cm.note_count, 0);

    estimate e;
    if (costmodel_estimate(&cm, &p.config, p.node_order, p.node_order_count,
                           p.partition, true, &e, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(e.stage_count, 8);
    assert_true(e.fits);
    for (int s = 0; s < 7; s++)
        assert_string_equal(e.stages[s].gpu, "A10-FASOP");
    assert_string_equal(e.stages[7].gpu, "A100-FASOP");
    /* stage 1: 11 A10 layers at 2.342229 ms forward, backward 2x, and
       the two boundary conversions of a middle stage each way */
    type_costs a10_costs = {0};
    for (int t = 0; t < p.cluster.type_count; t++)
        if (strcmp(cm.profiles[t].gpu, "A10-FASOP") == 0)
            assert_int_equal(costmodel_type_costs(&cm, t, &p.config,
                                                  &a10_costs, &err), 0);
    double boundary = a10_costs.boundary_s;
    assert_true(boundary > 0.0 && boundary < 1e-3);
    assert_true(close_to(e.stages[1].forward_s,
                         11 * 2.342229e-3 + 2.0 * boundary, 1e-9));
    assert_true(close_to(e.stages[1].backward_s,
                         2 * 11 * 2.342229e-3 + 2.0 * boundary, 1e-9));
    /* 16 micro-batches through a pipeline led by a 77 ms stage, plus the
       gradient all-reduce: between 1 and 3 seconds a step */
    assert_true(e.step_time_s > 1.0 && e.step_time_s < 3.0);
    assert_true(e.tflops_per_gpu > 1.0 && e.tflops_per_gpu < 60.0);
    /* the timeline once per stage, for every rank of it */
    int stages_seen[8] = {0};
    for (int i = 0; i < e.event_count; i++) {
        assert_int_equal(e.events[i].rank, -1);
        assert_true(e.events[i].stage >= 0 && e.events[i].stage < 8);
        stages_seen[e.events[i].stage] = 1;
    }
    for (int s = 0; s < 8; s++)
        assert_int_equal(stages_seen[s], 1);

    stage_placement placement[8];
    assert_int_equal(costmodel_place(&cm, &p.config, p.node_order,
                                     p.node_order_count, placement, &err), 0);
    for (int s = 0; s < 8; s++) {
        stage_terms terms;
        assert_int_equal(costmodel_stage_terms(&cm, &p.config, placement, s,
                                               &terms, &err), 0);
        const stage_estimate *st = &e.stages[s];
        assert_true(close_to(terms.fixed_s + p.partition[s] * terms.per_layer_s,
                             st->forward_s + st->backward_s + st->send_s +
                                 st->send_bwd_s,
                             1e-12));
        assert_true(p.partition[s] <= terms.max_layers);
    }
    estimate_free(&e);
    costmodel_close(&cm);
    plan_free(&p);
}

static void bundled_files_price_both_gpus(void **state)
{
    (void)state;
    char model_path[PT_PATH_MAX], cluster_path[PT_PATH_MAX];
    source_path("models/gpt2-xl.json", model_path, sizeof model_path);
    source_path("clusters/hetero.json", cluster_path, sizeof cluster_path);
    model_shape m;
    cluster c;
    pt_error err = {{0}};
    if (model_load_file(model_path, &m, &err) != 0 ||
        cluster_load_file(cluster_path, &c, &err) != 0)
        fail_msg("%s", err.message);
    costmodel cm;
    if (costmodel_open(&cm, &m, &c, NULL, &err) != 0)
        fail_msg("%s", err.message);
    parallel_config config = {.gbs = 64, .mbs = 1, .tp = 1, .dp = 1, .pp = 1};
    type_costs a100, a10;
    assert_int_equal(costmodel_type_costs(&cm, 0, &config, &a100, &err), 0);
    assert_int_equal(costmodel_type_costs(&cm, 1, &config, &a10, &err), 0);
    /* FASOP's published layer forwards: 1.638 ms (A100), 2.342 ms (A10) */
    assert_true(close_to(a100.layer_forward_s, 1.638458e-3, 1e-9));
    assert_true(close_to(a10.layer_forward_s, 2.342229e-3, 1e-9));
    assert_true(close_to(a10.layer_backward_s, 2 * 2.342229e-3, 1e-9));
    assert_true(a100.memory_cap_bytes > a10.memory_cap_bytes);
    /* mbs 4 is linear from the measured mbs 1: more than 2x outside */
    config.mbs = 4;
    assert_int_equal(costmodel_type_costs(&cm, 1, &config, &a10, &err), 0);
    assert_true(close_to(a10.layer_forward_s, 4 * 2.342229e-3, 1e-9));
    assert_true(has_note_containing(&cm, "A10-FASOP: micro-batch 4"));
    costmodel_close(&cm);
    cluster_free(&c);
}

static void unknown_gpu_fails_with_the_node(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    cluster c;
    make_cluster(&c, 1, 1);
    pt_copy_string(c.types[1].gpu, sizeof c.types[1].gpu, "NoSuchGPU");
    pt_copy_string(c.types[0].gpu, sizeof c.types[0].gpu, "A100-FASOP");
    costmodel cm;
    pt_error err = {{0}};
    assert_int_equal(costmodel_open(&cm, &m, &c, NULL, &err), -1);
    assert_non_null(strstr(err.message, "NoSuchGPU"));
    assert_non_null(strstr(err.message, "nodes[1]"));
    cluster_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(example_plan_is_estimated),
        cmocka_unit_test(bundled_files_price_both_gpus),
        cmocka_unit_test(unknown_gpu_fails_with_the_node),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
