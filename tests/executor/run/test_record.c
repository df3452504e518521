/*
 * The run record (run.json) holds every field formats.md lists, with the
 * values of the run: written to a file, parsed back and checked field by
 * field; the events follow the estimate's schema (kinds the cost model
 * knows, one fwd and one bwd per micro-batch, then the optimizer, in time
 * order inside the chosen iteration).
 */
#include "run_test_support.h"

#include <math.h>

#include "costmodel/costmodel.h"

#define GBS 4
#define MBS 2
#define SEQ 16
#define ITERATIONS 4

static json_t *get(json_t *obj, const char *key)
{
    json_t *value = json_object_get(obj, key);
    if (value == NULL)
        fail_msg("run.json has no \"%s\"", key);
    return value;
}

static double number(json_t *obj, const char *key)
{
    json_t *value = get(obj, key);
    assert_true(json_is_number(value));
    return json_number_value(value);
}

/* The record parsed back from a file. */
static json_t *record_round_trip(const run_scratch *s, const run_result *r,
                                 double flops)
{
    char text[1024];
    tiny_plan_json(text, sizeof text, 2, 16, 2, SEQ, 257, GBS, MBS, 1);
    json_error_t json_err;
    json_t *plan_json = json_loads(text, 0, &json_err);
    assert_non_null(plan_json);
    pt_error err = {{0}};
    json_t *root = run_to_json(r, plan_json, flops, &err);
    assert_non_null(root);
    json_decref(plan_json);
    char path[512];
    run_path(s, "run.json", path, sizeof path);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(2)), 0);
    json_decref(root);
    json_t *back = json_load_file(path, 0, &json_err);
    assert_non_null(back);
    return back;
}

static void check_events(json_t *root, const run_result *r)
{
    json_t *events = get(root, "events");
    assert_int_equal(json_array_size(events), 2 * (GBS / MBS) + 1);
    long chosen = (long)number(root, "events_iteration");
    assert_true(chosen >= 2 && chosen <= ITERATIONS); /* never the first */
    double step_s = r->iterations[chosen - 1].step_time_s;
    double previous_end = 0;
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *event = json_array_get(events, i);
        const char *kind = json_string_value(get(event, "kind"));
        assert_non_null(kind);
        assert_true(event_kind_from_name(kind) >= 0);
        const char *expected = i + 1 == json_array_size(events) ? "optimizer"
                               : i % 2 == 0                     ? "fwd"
                                                                : "bwd";
        assert_string_equal(kind, expected);
        assert_int_equal((int)number(event, "microbatch"),
                         i + 1 == json_array_size(events) ? -1 : (int)i / 2);
        assert_int_equal((int)number(event, "rank"), 0);
        assert_int_equal((int)number(event, "stage"), 0);
        double start = number(event, "start_s"), end = number(event, "end_s");
        assert_true(start >= previous_end && end >= start && end <= step_s);
        previous_end = end;
    }
}

static void check_iterations(json_t *root, const run_result *r)
{
    json_t *iterations = get(root, "iterations");
    assert_int_equal(json_array_size(iterations), ITERATIONS);
    for (size_t i = 0; i < ITERATIONS; i++) {
        json_t *it = json_array_get(iterations, i);
        assert_int_equal((long)number(it, "iteration"), (long)i + 1);
        assert_true(number(it, "step_time_s") > 0);
        assert_true((float)number(it, "loss") == r->iterations[i].loss);
        assert_true((float)number(it, "grad_norm") ==
                    r->iterations[i].grad_norm);
        assert_true((float)number(it, "learning_rate") ==
                    r->iterations[i].learning_rate);
    }
}

static void check_figures(json_t *root, const run_result *r, double flops,
                          const model_shape *shape)
{
    double times[ITERATIONS - 1];
    for (int i = 1; i < ITERATIONS; i++)
        times[i - 1] = r->iterations[i].step_time_s;
    for (int i = 0; i < ITERATIONS - 1; i++) /* sort three numbers */
        for (int j = i + 1; j < ITERATIONS - 1; j++)
            if (times[j] < times[i]) {
                double t = times[i];
                times[i] = times[j];
                times[j] = t;
            }
    double step_s = number(root, "step_time_s");
    assert_true(step_s == times[1]);
    assert_true(fabs(number(root, "tokens_per_s") - GBS * SEQ / step_s) <
                1e-6 * GBS * SEQ / step_s);
    assert_true(fabs(number(root, "tflops_per_gpu") - flops / step_s / 1e12) <
                1e-9 * (flops / step_s / 1e12));
    json_t *peak = get(root, "peak_memory_gib");
    assert_int_equal(json_array_size(peak), 1);
    double expected = run_cpu_stage_bytes(shape, MBS, false, NULL) / PT_GIB;
    assert_true(fabs(json_number_value(json_array_get(peak, 0)) - expected) <
                1e-9 * expected);
    assert_non_null(strstr(json_string_value(get(root, "peak_memory_basis")),
                           "computed"));
    /* the cpu backend tallies no device memory by term */
    json_t *terms = get(root, "memory_terms_gib");
    assert_int_equal(json_array_size(terms), 1);
    assert_true(json_is_null(json_array_get(terms, 0)));
    json_t *rss = get(root, "max_rss_gib");
    assert_true(json_number_value(json_array_get(rss, 0)) > 0);
}

static void check_context(json_t *root)
{
    assert_string_equal(json_string_value(get(root, "format")),
                        "partita-run/1");
    json_t *model = get(get(root, "plan"), "model");
    assert_int_equal((int)number(model, "hidden"), 16);
    json_t *devices = get(root, "devices");
    assert_int_equal(json_array_size(devices), 1);
    json_t *device = json_array_get(devices, 0);
    assert_non_null(strstr(json_string_value(get(device, "name")), "cpu ("));
    assert_non_null(strstr(json_string_value(get(device, "name")), " cores)"));
    assert_true(number(device, "memory_cap_gib") > 0);
    assert_true(json_is_null(get(device, "sms_used")));
    assert_true(json_is_null(get(device, "driver_version")));
    assert_true(json_is_null(get(device, "cuda_version")));
    json_t *software = get(root, "software");
    assert_string_equal(json_string_value(get(software, "partita")),
                        PARTITA_VERSION);
    assert_true(strlen(json_string_value(get(software, "compiler"))) > 3);
    assert_string_equal(json_string_value(get(software, "jansson")),
                        jansson_version_str());
    json_t *data = get(root, "data");
    assert_int_equal((long)number(data, "tokens"), 168221);
    assert_int_equal((long)number(data, "documents"), 560);
    assert_int_equal((long)number(data, "largest_token"), 256);
    json_t *training = get(root, "training");
    assert_string_equal(json_string_value(get(training, "backend")), "cpu");
    assert_int_equal((long)number(training, "gbs"), GBS);
    assert_int_equal((long)number(training, "micro_batches"), GBS / MBS);
    assert_int_equal((long)number(training, "tokens_per_iteration"),
                     GBS * SEQ);
    assert_int_equal((long)number(training, "seed"), 1234);
    assert_int_equal((long)number(training, "last_iteration"), ITERATIONS);
    assert_true(json_is_false(get(training, "stopped_early")));
    assert_true(json_is_null(get(training, "resumed_from")));
    assert_true(json_is_null(get(training, "last_checkpoint_iteration")));
    assert_int_equal(strlen(json_string_value(get(training, "started_utc"))),
                     20);
    json_t *notes = get(root, "notes");
    assert_int_equal(json_array_size(notes), 1);
    assert_non_null(strstr(json_string_value(json_array_get(notes, 0)),
                           "bf16"));
}

static void record_holds_every_field(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, 16, 2, SEQ, 257, GBS, MBS);
    run_options options = run_options_defaults(ITERATIONS);
    options.data_prefix = s->corpus;
    pt_error err = {{0}};
    run_result result;
    assert_int_equal(run_training(&p, &options, &result, &err), 0);
    double flops = model_flops_per_iteration(&p.model, GBS, false);
    json_t *root = record_round_trip(s, &result, flops);
    check_context(root);
    check_iterations(root, &result);
    check_events(root, &result);
    check_figures(root, &result, flops, &p.model);
    json_decref(root);
    run_result_free(&result);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(record_holds_every_field),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
