/* Writing plans: a plan read from paths is written self-contained (model
 * and cluster inline, "origin" for people), loads back the same from any
 * folder, and carries the sections of other layers untouched. */
#include "test_support.h"

/* Loads docs/examples/plan-gpt2xl-hetero.json (model and cluster by
 * path). */
static void load_example(plan *p)
{
    char path[PT_PATH_MAX];
    source_path("docs/examples/plan-gpt2xl-hetero.json", path, sizeof path);
    pt_error err = {""};
    if (plan_load_file(path, p, &err) != 0)
        fail_msg("%s", err.message);
}

static void assert_same_plan(const plan *a, const plan *b)
{
    assert_memory_equal(&a->model, &b->model, sizeof a->model);
    assert_memory_equal(&a->config, &b->config, sizeof a->config);
    assert_memory_equal(a->partition, b->partition,
                        sizeof(int) * (size_t)a->config.pp);
    assert_int_equal(a->node_order_count, b->node_order_count);
    assert_memory_equal(a->node_order, b->node_order,
                        sizeof(int) * (size_t)a->node_order_count);
    assert_string_equal(a->cluster.name, b->cluster.name);
    assert_int_equal(a->cluster.type_count, b->cluster.type_count);
    for (int t = 0; t < a->cluster.type_count; t++) {
        const node_type *x = &a->cluster.types[t], *y = &b->cluster.types[t];
        assert_string_equal(x->name, y->name);
        assert_string_equal(x->gpu, y->gpu);
        assert_int_equal(x->count, y->count);
        assert_int_equal(x->gpus, y->gpus);
        assert_true(x->intra_node.bandwidth_bytes_per_s ==
                    y->intra_node.bandwidth_bytes_per_s);
        assert_true(x->intra_node.latency_s == y->intra_node.latency_s);
        assert_true(x->inter_node.bandwidth_bytes_per_s ==
                    y->inter_node.bandwidth_bytes_per_s);
        assert_true(x->inter_node.latency_s == y->inter_node.latency_s);
        assert_true(x->price_per_hour == y->price_per_hour);
        assert_int_equal(x->device_count, y->device_count);
        assert_memory_equal(x->devices, y->devices,
                            sizeof x->devices[0] * (size_t)x->device_count);
    }
}

static void test_written_plan_stands_alone(void **state)
{
    plan original;
    load_example(&original);
    assert_non_null(strstr(original.model_origin, "models/gpt2-xl.json"));
    assert_non_null(strstr(original.cluster_origin, "clusters/hetero.json"));
    /* an interleaved schedule travels too (m 16, pp 8, 6 layers a
     * stage: 3 in each chunk) */
    original.config.virtual_stages = 2;
    partition_even(original.model.layers, original.config.pp,
                   original.partition);
    /* a throttled device list travels too */
    node_type *a100 = &original.cluster.types[0];
    a100->device_count = a100->gpus;
    for (int i = 0; i < a100->gpus; i++)
        a100->devices[i] = (device_spec){.index = i, .sm_limit = 40 + i,
                                         .memory_limit_gib = 20.5};

    char path[600];
    snprintf(path, sizeof path, "%s/elsewhere", scratch_dir(state));
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/elsewhere/plan.json", scratch_dir(state));
    pt_error err = {""};
    if (plan_write_file(&original, NULL, path, &err) != 0)
        fail_msg("%s", err.message);
    size_t length;
    char *text = read_whole_file(path, &length);
    assert_null(strstr(text, "../"));
    assert_non_null(strstr(text, "\"origin\": {"));
    free(text);

    plan again;
    if (plan_load_file(path, &again, &err) != 0)
        fail_msg("%s", err.message);
    assert_same_plan(&original, &again);
    assert_string_equal(again.model_ref, "");
    assert_string_equal(again.cluster_ref, "");
    assert_string_equal(again.model_origin, original.model_origin);
    assert_string_equal(again.cluster_origin, original.cluster_origin);
    /* written again, it is the same file */
    char second[640];
    snprintf(second, sizeof second, "%s/second.json", scratch_dir(state));
    assert_int_equal(plan_write_file(&again, NULL, second, &err), 0);
    char *first_text = read_whole_file(path, &length);
    char *second_text = read_whole_file(second, &length);
    assert_string_equal(first_text, second_text);
    free(first_text);
    free(second_text);
    plan_free(&again);
    plan_free(&original);
}

static void test_sections_are_carried_not_read(void **state)
{
    (void)state;
    plan p;
    load_example(&p);
    p.model_origin[0] = '\0';
    p.cluster_origin[0] = '\0';
    json_t *estimate = json_pack("{s:f, s:[]}", "step_time_s", 1.5,
                                 "timeline");
    json_t *alternatives = json_pack("[{s:i}]", "tp", 2);
    plan_json_sections sections = {.estimate = estimate,
                                   .alternatives = alternatives};
    pt_error err = {""};
    json_t *root = plan_to_json(&p, &sections, &err);
    assert_non_null(root);
    /* the writer took its own references */
    assert_int_equal(estimate->refcount, 2);
    assert_ptr_equal(json_object_get(root, "estimate"), estimate);
    assert_ptr_equal(json_object_get(root, "alternatives"), alternatives);
    assert_null(json_object_get(root, "pareto"));
    assert_null(json_object_get(root, "origin"));
    assert_true(json_is_object(json_object_get(root, "model")));
    assert_true(json_is_object(json_object_get(root, "cluster")));
    plan again;
    if (plan_from_json(root, NULL, &again, &err) != 0)
        fail_msg("%s", err.message);
    assert_same_plan(&p, &again);
    plan_free(&again);
    json_decref(root);
    json_decref(estimate);
    json_decref(alternatives);
    plan_free(&p);
}

static void test_origin_is_checked_and_kept(void **state)
{
    (void)state;
    const char *inline_plan =
        "{\"model\": {\"name\": \"toy\", \"layers\": 2, \"hidden\": 64, "
        "\"heads\": 4, \"seq\": 32, \"vocab\": 100}, \"cluster\": {\"name\": "
        "\"solo\", \"nodes\": [{\"name\": \"h\", \"gpu\": \"H200\", "
        "\"gpus\": 1, \"intra_node\": {\"bandwidth_GBps\": 450, "
        "\"latency_us\": 3}}]}, \"gbs\": 2, \"mbs\": 1, \"tp\": 1, "
        "\"dp\": 1, \"pp\": 1, \"origin\": %s}";
    const struct {
        const char *origin, *message;
    } cases[] = {
        {"{\"model\": \"models/toy.json\", \"cluster\": \"c.json\"}", NULL},
        {"\"models/toy.json\"", "<inline>: origin: "},
        {"{\"model\": 3}", "<inline>: origin.model: "},
        {"{\"file\": \"x\"}", "<inline>: origin.file: unknown key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, inline_plan, cases[i].origin);
        json_error_t parse_error;
        json_t *root = json_loads(text, 0, &parse_error);
        assert_non_null(root);
        plan p;
        pt_error err = {""};
        int status = plan_from_json(root, NULL, &p, &err);
        if (cases[i].message == NULL) {
            if (status != 0)
                fail_msg("%s", err.message);
            assert_string_equal(p.model_origin, "models/toy.json");
            assert_string_equal(p.cluster_origin, "c.json");
        } else {
            assert_int_equal(status, -1);
            EXPECT_MESSAGE(&err, cases[i].message);
        }
        plan_free(&p);
        json_decref(root);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_written_plan_stands_alone,
                                        scratch_open, scratch_close),
        cmocka_unit_test(test_sections_are_carried_not_read),
        cmocka_unit_test(test_origin_is_checked_and_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
