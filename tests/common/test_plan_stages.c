/* plan.json's "stages" (issue 36): each stage's own tp and dp, the
 * per-stage configs derived from them, the round trip through the writer
 * and every refusal of the reader, each naming file, field and reason. */
#include "test_support.h"

/* The bundled hetero cluster (one a100 node of 4 GPUs, then seven a10
 * nodes of 4) under gpt2-xl (48 layers, 25 heads), or the model named,
 * with `fields` after the paths; written to plans/<name>. */
static int load_plan_text(void **state, const char *model_file,
                          const char *name, const char *fields, plan *p,
                          pt_error *err)
{
    char model[PT_PATH_MAX], cluster_path[PT_PATH_MAX];
    source_path(model_file, model, sizeof model);
    source_path("clusters/hetero.json", cluster_path, sizeof cluster_path);
    char text[4096], file[128], path[512];
    snprintf(text, sizeof text, "{\"model\": \"%s\", \"cluster\": \"%s\", %s}",
             model, cluster_path, fields);
    snprintf(file, sizeof file, "plans/%s", name);
    scratch_write(state, file, text, path, sizeof path);
    return plan_load_file(path, p, err);
}

/* pp 3 on the 32 GPUs: gbs 64, mbs 1, plan-wide tp 1 x dp 8 (8 samples a
 * micro-batch); stage 0 tp 4 x dp 2 (8 GPUs: the a100 node and an a10
 * node), stage 1 the plan's tp 1 x dp 8, stage 2 tp 2 x dp 8 (16). */
/* The fields a stage config derives (padding aside). */
static void assert_same_config(const parallel_config *a,
                               const parallel_config *b)
{
    assert_int_equal(a->gbs, b->gbs);
    assert_int_equal(a->mbs, b->mbs);
    assert_int_equal(a->tp, b->tp);
    assert_int_equal(a->dp, b->dp);
    assert_int_equal(a->pp, b->pp);
}

#define ASYMMETRIC                                                          \
    "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "            \
    "\"partition\": \"16-16-16\", "                                         \
    "\"stages\": [{\"tp\": 4, \"dp\": 2}, {}, {\"tp\": 2}]"

static void asymmetric_plan_reads(void **state)
{
    plan p;
    pt_error err = {""};
    if (load_plan_text(state, "models/gpt2-xl.json", "a.json", ASYMMETRIC,
                       &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(plan_first_asymmetric_stage(&p), 0);
    parallel_config s0 = parallel_stage_config(&p.config, p.stages, 0);
    parallel_config s1 = parallel_stage_config(&p.config, p.stages, 1);
    parallel_config s2 = parallel_stage_config(&p.config, p.stages, 2);
    assert_int_equal(s0.tp, 4);
    assert_int_equal(s0.dp, 2);
    assert_int_equal(s0.mbs, 4); /* 8 samples over 2 replicas */
    assert_int_equal(s1.tp, 1);
    assert_int_equal(s1.dp, 8);
    assert_int_equal(s1.mbs, 1);
    assert_int_equal(s2.tp, 2);
    assert_int_equal(s2.dp, 8);
    /* every stage runs the plan's micro-batches */
    assert_int_equal(parallel_microbatches(&s0), 8);
    assert_int_equal(parallel_microbatches(&s2), 8);
    assert_int_equal(stage_degrees_first_rank(&p.config, p.stages, 0), 0);
    assert_int_equal(stage_degrees_first_rank(&p.config, p.stages, 1), 8);
    assert_int_equal(stage_degrees_first_rank(&p.config, p.stages, 2), 16);
    assert_int_equal(stage_degrees_ranks(&p.config, p.stages, 2), 16);
    plan_free(&p);
}

/* A symmetric config is its own stage config, bit for bit, and its
 * ranks are parallel_stage_first_rank's. */
static void symmetric_stage_config_is_the_config(void **state)
{
    (void)state;
    parallel_config config = {.gbs = 64, .mbs = 2, .tp = 2, .dp = 4,
                              .pp = 4};
    stage_degrees same[4] = {{0, 0}, {2, 4}, {2, 0}, {0, 4}};
    for (int s = 0; s < 4; s++) {
        parallel_config a = parallel_stage_config(&config, NULL, s);
        parallel_config b = parallel_stage_config(&config, same, s);
        assert_same_config(&a, &config);
        assert_same_config(&b, &config);
        assert_int_equal(stage_degrees_first_rank(&config, same, s),
                         parallel_stage_first_rank(&config, s));
    }
    assert_int_equal(stage_degrees_first_own(&config, same), -1);
    assert_int_equal(stage_degrees_first_own(&config, NULL), -1);
}

/* Written and read back: the same degrees; "stages" only where a stage
 * has its own, so a symmetric plan's file is as it always was. */
static void stages_round_trip(void **state)
{
    plan p, back;
    pt_error err = {""};
    if (load_plan_text(state, "models/gpt2-xl.json", "rt.json", ASYMMETRIC,
                       &p, &err) != 0)
        fail_msg("%s", err.message);
    json_t *root = plan_to_json(&p, NULL, &err);
    assert_non_null(root);
    const json_t *stages = json_object_get(root, "stages");
    assert_non_null(stages);
    assert_int_equal(json_array_size(stages), 3);
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(stages, 1), "dp")),
                     8);
    if (plan_from_json(root, NULL, &back, &err) != 0)
        fail_msg("%s", err.message);
    json_decref(root);
    for (int s = 0; s < 3; s++) {
        parallel_config a = parallel_stage_config(&p.config, p.stages, s);
        parallel_config b = parallel_stage_config(&back.config, back.stages,
                                                  s);
        assert_same_config(&a, &b);
    }
    plan_free(&back);
    plan_free(&p);

    /* every stage at the plan's degrees: no "stages" written */
    if (load_plan_text(state, "models/gpt2-xl.json", "same.json",
                       "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 4, "
                       "\"pp\": 8, \"stages\": [{\"tp\": 1, \"dp\": 4}, {}, "
                       "{}, {}, {}, {}, {}, {\"dp\": 4}]",
                       &p, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(plan_first_asymmetric_stage(&p), -1);
    root = plan_to_json(&p, NULL, &err);
    assert_null(json_object_get(root, "stages"));
    json_decref(root);
    plan_free(&p);
}

static void refusals(void **state)
{
    static const struct {
        const char *model, *fields, *message;
    } cases[] = {
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"stages\": [{}, {}]",
         "plans/bad.json: stages: has 2 entries, but pp is 3"},
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"stages\": 5",
         "plans/bad.json: stages: must be an array"},
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"stages\": [{}, {\"pp\": 2}, {}]",
         "plans/bad.json: stages[1].pp: unknown key (allowed: tp, dp, notes)"},
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"stages\": [{}, {\"tp\": 0}, {}]",
         "plans/bad.json: stages[1].tp:"},
        /* 8 samples a micro-batch do not split over 3 replicas */
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"stages\": [{\"tp\": 4, \"dp\": 2}, {\"dp\": 3}, {}]",
         "plans/bad.json: stages[1].dp: 3 replicas cannot share a "
         "micro-batch of dp x mbs = 8 x 1 = 8 samples"},
        /* the stages run past node_order's 32 GPUs */
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"stages\": [{\"tp\": 4, \"dp\": 4}, {}, {\"tp\": 2}]",
         "plans/bad.json: stages[2]: tp x dp = 2 x 8 = 16 GPUs from rank "
         "24, but the 8 nodes of node_order hold 32 GPUs"},
        /* or leave some unused */
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"stages\": [{\"tp\": 2, \"dp\": 2}, {}, {\"tp\": 2}]",
         "plans/bad.json: stages: the 3 stages take 28 GPUs (tp x dp of "
         "each), but the 8 nodes of node_order hold 32"},
        /* llama3-8b's 32 heads and 8 key/value heads */
        {"models/llama3-8b.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"partition\": \"11-11-10\", "
         "\"stages\": [{\"tp\": 4, \"dp\": 2}, {}, {\"tp\": 3, \"dp\": 4}, "
         "{}]",
         "plans/bad.json: stages: has 4 entries, but pp is 3"},
        {"models/llama3-8b.json",
         "\"gbs\": 48, \"mbs\": 2, \"tp\": 1, \"dp\": 6, \"pp\": 3, "
         "\"partition\": \"11-11-10\", "
         "\"stages\": [{\"tp\": 4, \"dp\": 2}, {\"tp\": 1, \"dp\": 12}, "
         "{\"tp\": 3, \"dp\": 4}]",
         "plans/bad.json: stages[2].tp: model llama3-8b: tp 3 does not "
         "divide its 32 attention heads"},
        {"models/gpt2-xl.json",
         "\"gbs\": 48, \"mbs\": 1, \"tp\": 1, \"dp\": 8, \"pp\": 3, "
         "\"partition\": \"16-16-16\", \"virtual_stages\": 2, "
         "\"stages\": [{\"tp\": 4, \"dp\": 2}, {}, {\"tp\": 2}]",
         "plans/bad.json: stages[0]: has its own tp or dp, which the "
         "interleaved 1F1B (virtual_stages 2) does not take"},
        {"models/gpt2-xl.json",
         "\"gbs\": 64, \"mbs\": 1, \"tp\": 2, \"dp\": 8, \"pp\": 3, "
         "\"sequence_parallel\": true, "
         "\"stages\": [{\"tp\": 2, \"dp\": 4}, {\"tp\": 1, \"dp\": 8}, "
         "{\"tp\": 2, \"dp\": 8}]",
         "plans/bad.json: stages[1]: sequence_parallel: needs tp >= 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan p;
        pt_error err = {""};
        if (load_plan_text(state, cases[i].model, "bad.json",
                           cases[i].fields, &p, &err) == 0)
            fail_msg("case %zu loaded; expected \"%s\"", i,
                     cases[i].message);
        EXPECT_MESSAGE(&err, cases[i].message);
        plan_free(&p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(asymmetric_plan_reads),
        cmocka_unit_test(symmetric_stage_config_is_the_config),
        cmocka_unit_test(stages_round_trip),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, scratch_open, scratch_close);
}
