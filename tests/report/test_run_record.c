/* The run.json reader: what it keeps, and errors that name the file, the
 * field and the reason. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"

/* A valid run of a one-rank plan; tests replace parts of it. */
static const char *valid_run =
    "{ \"format\": \"partita-run/1\","
    "  \"plan\": { \"gbs\": 8, \"mbs\": 4, \"tp\": 1, \"dp\": 1, \"pp\": 1 },"
    "  \"training\": { \"backend\": \"cpu\" },"
    "  \"iterations\": [ { \"iteration\": 1, \"step_time_s\": 0.02,"
    "                      \"loss\": 5.5 },"
    "                    { \"iteration\": 2, \"step_time_s\": 0.015,"
    "                      \"loss\": 5.4 } ],"
    "  \"events_iteration\": 2,"
    "  \"events\": [ { \"rank\": 0, \"stage\": 0, \"microbatch\": 0,"
    "                  \"kind\": \"fwd\", \"start_s\": 0, \"end_s\": 0.003 },"
    "                { \"rank\": 0, \"stage\": 0, \"microbatch\": -1,"
    "                  \"kind\": \"optimizer\", \"start_s\": 0.012,"
    "                  \"end_s\": 0.013 } ],"
    "  \"peak_memory_gib\": [ 0.0015 ],"
    "  \"step_time_s\": 0.015, \"tokens_per_s\": 34133,"
    "  \"tflops_per_gpu\": 0.004, \"notes\": [] }";

/* Parses valid_run, applies edit (a JSON object merged over the root,
 * or NULL), reads it; returns the reader's status. */
static int read_edited(const char *edit, run_record *run, pt_error *err)
{
    json_error_t json_err;
    json_t *root = json_loads(valid_run, 0, &json_err);
    assert_non_null(root);
    if (edit != NULL) {
        json_t *patch = json_loads(edit, 0, &json_err);
        assert_non_null(patch);
        json_object_update(root, patch);
        json_decref(patch);
    }
    int status = run_record_from_json(root, "runs/run.json", run, err);
    json_decref(root);
    return status;
}

static void reads_a_valid_run(void **state)
{
    (void)state;
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_edited(NULL, &run, &err), 0);
    assert_int_equal(run.rank_count, 1);
    assert_int_equal(run.iteration_count, 2);
    assert_int_equal(run.event_count, 2);
    assert_int_equal(run.events[1].kind, EVENT_OPTIMIZER);
    assert_int_equal(run.events[1].microbatch, -1);
    assert_int_equal(run.events_iteration, 2);
    assert_int_equal(run.gbs, 8);
    assert_string_equal(run.backend, "cpu");
    assert_true(run.step_time_s == 0.015);
    assert_null(run.memory_terms); /* an older file: none */
    run_record_free(&run);
}

/* memory_terms_gib: one entry per rank, null where a term (or the whole
 * rank) is not known. */
static void reads_memory_terms(void **state)
{
    (void)state;
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_edited("{\"memory_terms_gib\": [ {\"weights\": "
                                 "0.5, \"logits\": 0.25, \"context\": "
                                 "null} ]}",
                                 &run, &err),
                     0);
    assert_non_null(run.memory_terms);
    assert_true(run.memory_terms[0].bytes[PT_MEMORY_WEIGHTS] ==
                0.5 * PT_GIB);
    assert_true(run.memory_terms[0].bytes[PT_MEMORY_LOGITS] ==
                0.25 * PT_GIB);
    assert_true(isnan(run.memory_terms[0].bytes[PT_MEMORY_CONTEXT]));
    assert_true(isnan(run.memory_terms[0].bytes[PT_MEMORY_SCRATCH]));
    run_record_free(&run);
    assert_int_equal(read_edited("{\"memory_terms_gib\": [ null ]}", &run,
                                 &err),
                     0);
    assert_true(isnan(run.memory_terms[0].bytes[PT_MEMORY_WEIGHTS]));
    run_record_free(&run);
}

/* The edit must fail with a message holding every one of the parts. */
static void expect_failure(const char *edit, const char *part1,
                           const char *part2)
{
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_edited(edit, &run, &err), -1);
    if (strstr(err.message, "runs/run.json") == NULL ||
        strstr(err.message, part1) == NULL ||
        (part2 && strstr(err.message, part2) == NULL))
        fail_msg("message '%s' lacks '%s' or '%s'", err.message, part1,
                 part2 ? part2 : "");
    /* Nothing is left to free after a failure; freeing again is safe. */
    assert_null(run.events);
    run_record_free(&run);
}

static void errors_name_file_field_and_reason(void **state)
{
    (void)state;
    expect_failure("{\"format\": \"partita-plan/1\"}", "format",
                   "partita-run/1");
    expect_failure("{\"step_time_s\": -1}", "step_time_s", NULL);
    expect_failure("{\"events\": {}}", "events", "array");
    expect_failure("{\"events\": [ { \"rank\": 0, \"stage\": 0, "
                   "\"microbatch\": 0, \"kind\": \"lunch\", \"start_s\": 0, "
                   "\"end_s\": 1 } ]}",
                   "events[0].kind", "lunch");
    expect_failure("{\"events\": [ { \"rank\": 3, \"stage\": 0, "
                   "\"microbatch\": 0, \"kind\": \"fwd\", \"start_s\": 0, "
                   "\"end_s\": 1 } ]}",
                   "events[0]", "rank");
    expect_failure("{\"events\": [ { \"rank\": 0, \"stage\": 0, "
                   "\"microbatch\": 0, \"kind\": \"fwd\", \"start_s\": 2, "
                   "\"end_s\": 1 } ]}",
                   "events[0].end_s", "before it starts");
    expect_failure("{\"peak_memory_gib\": [1, 2]}", "peak_memory_gib",
                   "ranks");
    expect_failure("{\"peak_memory_gib\": [\"lots\"]}", "peak_memory_gib[0]",
                   "GiB");
    expect_failure("{\"iterations\": [ {\"iteration\": 1} ]}",
                   "iterations[0]", "step_time_s");
    expect_failure("{\"plan\": 3}", "plan", NULL);
    expect_failure("{\"memory_terms_gib\": [ {}, {} ]}", "memory_terms_gib",
                   "one per rank");
    expect_failure("{\"memory_terms_gib\": [ {\"lunch\": 1} ]}",
                   "memory_terms_gib[0].lunch", "not a memory term");
    expect_failure("{\"memory_terms_gib\": [ {\"weights\": -1} ]}",
                   "memory_terms_gib[0].weights", ">= 0");
    expect_failure("{\"memory_terms_gib\": [ 3 ]}", "memory_terms_gib[0]",
                   NULL);
}

/* issue 18, item 16: keys the writer never writes and arrays it never
 * leaves empty are refused, naming the key, in every object it writes. */
static void unknown_keys_and_empty_arrays_are_refused(void **state)
{
    (void)state;
    expect_failure("{\"step_time\": 0.015}", "step_time", "unknown key");
    expect_failure("{\"training\": {\"backend\": \"cpu\", \"sed\": 1}}",
                   "training.sed", "unknown key");
    expect_failure("{\"software\": {\"partita\": \"0.1\", \"gcc\": 1}}",
                   "software.gcc", "unknown key");
    expect_failure("{\"data\": {\"prefix\": \"c\", \"token\": 1}}",
                   "data.token", "unknown key");
    expect_failure("{\"iterations\": [ {\"iteration\": 1, "
                   "\"step_time_s\": 0.02, \"los\": 5.5} ]}",
                   "iterations[0].los", "unknown key");
    expect_failure("{\"events\": [ { \"rank\": 0, \"stage\": 0, "
                   "\"microbatch\": 0, \"kind\": \"fwd\", \"start_s\": 0, "
                   "\"end_s\": 1, \"gpu\": 0 } ]}",
                   "events[0].gpu", "unknown key");
    expect_failure("{\"devices\": [ {\"rank\": 0, \"nmae\": \"cpu\"} ]}",
                   "devices[0].nmae", "unknown key");
    expect_failure("{\"devices\": []}", "devices", "non-empty array");
    expect_failure("{\"max_rss_gib\": []}", "max_rss_gib", "non-empty array");
    expect_failure("{\"peak_memory_gib\": []}", "peak_memory_gib",
                   "non-empty array");
    /* what the writer does write, empty or not, still reads */
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(read_edited("{\"devices\": [ {\"rank\": 0, \"name\": "
                                 "\"cpu\", \"sms_used\": null} ], "
                                 "\"max_rss_gib\": [0.1], \"notes\": [], "
                                 "\"training\": {\"backend\": \"cpu\", "
                                 "\"stop_reason\": null}}",
                                 &run, &err), 0);
    run_record_free(&run);
}

static void missing_file_and_mismatched_plan(void **state)
{
    (void)state;
    run_record run;
    pt_error err = {{0}};
    assert_int_equal(run_record_load_file("/nonexistent/run.json", &run,
                                          &err), -1);
    assert_non_null(strstr(err.message, "/nonexistent/run.json"));
    run_record_free(&run);

    assert_int_equal(read_edited(NULL, &run, &err), 0);
    plan p;
    memset(&p, 0, sizeof p);
    p.config = (parallel_config){.gbs = 8, .mbs = 2, .tp = 1, .dp = 1,
                                 .pp = 1};
    assert_int_equal(run_record_check_plan(&run, &p, &err), -1);
    assert_non_null(strstr(err.message, "runs/run.json"));
    assert_non_null(strstr(err.message, "plan.mbs"));
    p.config.mbs = 4;
    assert_int_equal(run_record_check_plan(&run, &p, &err), 0);
    run_record_free(&run);
}

/* Issue 33, item 2: only tp, dp, pp, gbs and mbs were compared, so a run
 * of a model twice as wide was reported against the plan. The whole plan
 * a run.json records must be the one reported. */
static void run_of_another_plan_is_refused(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/examples/plan-tiny-cpu.json",
             getenv("PARTITA_SOURCE"));
    plan p;
    pt_error err = {{0}};
    assert_int_equal(plan_load_file(path, &p, &err), 0);
    json_error_t json_err;
    json_t *root = json_loads(valid_run, 0, &json_err);
    json_object_set_new(root, "plan", plan_to_json(&p, NULL, &err));
    run_record run;
    assert_int_equal(run_record_from_json(root, "runs/run.json", &run, &err),
                     0);
    json_decref(root);
    assert_int_equal(run_record_check_plan(&run, &p, &err), 0);
    assert_int_equal(run_record_check_same_plan(&run, &p, &err), 0);

    p.model.hidden = 128;  /* same degrees and batches, another model */
    assert_int_equal(run_record_check_plan(&run, &p, &err), 0);
    assert_int_equal(run_record_check_same_plan(&run, &p, &err), -1);
    assert_string_equal(err.message, "runs/run.json: plan.model.hidden: the "
                                     "run's plan has 64, the plan being "
                                     "reported has 128: they are not the "
                                     "same plan");
    p.model.hidden = 64;
    p.cluster.types[0].intra_node.latency_s *= 2;
    assert_int_equal(run_record_check_same_plan(&run, &p, &err), -1);
    assert_non_null(strstr(err.message, "plan.cluster.nodes[0].intra_node"));
    p.cluster.types[0].intra_node.latency_s /= 2;
    p.config.recompute = true;
    assert_int_equal(run_record_check_same_plan(&run, &p, &err), -1);
    assert_non_null(strstr(err.message, "recompute"));
    run_record_free(&run);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_a_valid_run),
        cmocka_unit_test(run_of_another_plan_is_refused),
        cmocka_unit_test(reads_memory_terms),
        cmocka_unit_test(errors_name_file_field_and_reason),
        cmocka_unit_test(unknown_keys_and_empty_arrays_are_refused),
        cmocka_unit_test(missing_file_and_mismatched_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
