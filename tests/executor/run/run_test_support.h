/* Helpers shared by the tests of single-stage runs: a scratch directory
 * holding the bundled corpus prepped into a dataset, tiny plans written as
 * inline JSON, and whole-file helpers. */
#ifndef PARTITA_RUN_TEST_SUPPORT_H
#define PARTITA_RUN_TEST_SUPPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/scratch_tree.h"
#include "executor/executor.h"

/* One test's directory, with the corpus prepped at dir/corpus. */
typedef struct run_scratch {
    char dir[256];
    char corpus[300];        /* dataset prefix */
} run_scratch;

static inline int run_scratch_open(void **state)
{
    run_scratch *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -1;
    snprintf(s->dir, sizeof s->dir, "/tmp/partita-run-test-XXXXXX");
    if (mkdtemp(s->dir) == NULL) {
        free(s);
        return -1;
    }
    snprintf(s->corpus, sizeof s->corpus, "%s/corpus", s->dir);
    const char *source = getenv("PARTITA_SOURCE");
    char input[1024];
    snprintf(input, sizeof input, "%s/data/corpus.txt",
             source != NULL ? source : ".");
    pt_error err = {{0}};
    if (prep_run(input, PREP_FORMAT_TEXT, s->corpus, NULL, &err) != 0) {
        fprintf(stderr, "prep of the corpus failed: %s\n", err.message);
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static inline int run_scratch_close(void **state)
{
    run_scratch *s = *state;
    remove_scratch_tree(s->dir);
    free(s);
    return 0;
}

/* dir/name into out. */
static inline void run_path(const run_scratch *s, const char *name,
                            char *out, size_t size)
{
    snprintf(out, size, "%s/%s", s->dir, name);
}

static inline bool run_path_exists(const char *path)
{
    struct stat info;
    return stat(path, &info) == 0;
}

/* A plan of one stage on a single-GPU node, model and cluster inline. */
static inline void tiny_plan_json(char *out, size_t size, int layers,
                                  int hidden, int heads, int seq, int vocab,
                                  int gbs, int mbs, int pp)
{
    snprintf(out, size,
             "{ \"model\": { \"name\": \"tiny\", \"layers\": %d, "
             "\"hidden\": %d, \"heads\": %d, \"seq\": %d, \"vocab\": %d },"
             "  \"cluster\": { \"name\": \"one\", \"nodes\": ["
             "    { \"name\": \"box\", \"gpu\": \"A100-FASOP\", \"gpus\": %d,"
             "      \"intra_node\": { \"bandwidth_GBps\": 230,"
             "                        \"latency_us\": 5 } } ] },"
             "  \"gbs\": %d, \"mbs\": %d, \"tp\": 1, \"dp\": 1, \"pp\": %d }",
             layers, hidden, heads, seq, vocab, pp, gbs, mbs, pp);
}

static inline void tiny_plan(plan *out, int layers, int hidden, int heads,
                             int seq, int vocab, int gbs, int mbs)
{
    char text[1024];
    tiny_plan_json(text, sizeof text, layers, hidden, heads, seq, vocab, gbs,
                   mbs, 1);
    json_error_t json_err;
    json_t *root = json_loads(text, 0, &json_err);
    assert_non_null(root);
    pt_error err = {{0}};
    int status = plan_from_json(root, NULL, out, &err);
    if (status != 0)
        fprintf(stderr, "%s\n", err.message);
    assert_int_equal(status, 0);
    json_decref(root);
}

/* A run of the prepped corpus for `iterations` iterations, with the
 * library's defaults otherwise. */
static inline run_options run_test_options(const run_scratch *s,
                                           long iterations)
{
    run_options options = run_options_defaults(iterations);
    options.data_prefix = s->corpus;
    return options;
}

/* ...with a little warm-up, so that the learning rate changes between
 * steps. */
static inline run_options run_test_warm_options(const run_scratch *s,
                                                long iterations)
{
    run_options options = run_test_options(s, iterations);
    options.train.schedule.warmup_steps = 1;
    return options;
}

/* The Llama-shaped model of tests/data/models/llama-tiny.json (4
 * layers, hidden 64, 4 heads sharing 2 key/value heads). */
static inline json_t *run_test_llama_model(void)
{
    const char *source = getenv("PARTITA_SOURCE");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/models/llama-tiny.json",
             source != NULL ? source : ".");
    model_shape shape;
    pt_error err = {{0}};
    if (model_load_file(path, &shape, &err) != 0)
        fail_msg("%s", err.message);
    return model_to_json(&shape);
}

/* A plan of `model` (a reference is taken) on one node of `gpus`
 * "gpus" at those degrees, `extra` (", \"partition\": \"3-1\"", levers,
 * "stages") after them. */
static inline void run_test_node_plan(plan *out, json_t *model, int gpus,
                                      int gbs, int mbs, int tp, int dp,
                                      int pp, const char *extra)
{
    char text[1600];
    snprintf(text, sizeof text,
             "{ \"cluster\": { \"name\": \"one\", \"nodes\": ["
             "    { \"name\": \"box\", \"gpu\": \"A100-FASOP\", \"gpus\": %d,"
             "      \"intra_node\": { \"bandwidth_GBps\": 230,"
             "                        \"latency_us\": 5 } } ] },"
             "  \"gbs\": %d, \"mbs\": %d, \"tp\": %d, \"dp\": %d, \"pp\": %d"
             "%s }",
             gpus, gbs, mbs, tp, dp, pp, extra);
    json_error_t json_err;
    json_t *root = json_loads(text, 0, &json_err);
    if (root == NULL)
        fail_msg("%s: %s", json_err.text, text);
    json_object_set_new(root, "model", model);
    pt_error err = {{0}};
    if (plan_from_json(root, NULL, out, &err) != 0)
        fail_msg("%s", err.message);
    json_decref(root);
}

/* meta.json's "iteration": the iteration the checkpoint a load of dir
 * reads was saved after. */
static inline long run_checkpoint_iteration(const char *dir)
{
    pt_error err = {{0}};
    uint64_t bytes = 0;
    if (checkpoint_blob_size(dir, "meta.json", &bytes, &err) != 0)
        fail_msg("%s", err.message);
    char *text = calloc(1, (size_t)bytes + 1);
    assert_non_null(text);
    assert_int_equal(checkpoint_read_blob(dir, "meta.json", text,
                                          (size_t)bytes, &err), 0);
    json_error_t json_err;
    json_t *meta = json_loads(text, 0, &json_err);
    assert_non_null(meta);
    long iteration = (long)json_integer_value(json_object_get(meta,
                                                              "iteration"));
    json_decref(meta);
    free(text);
    return iteration;
}

/* The test's message check: prints the message when it fails. */
static inline void assert_message_has(const pt_error *err, const char *part)
{
    if (strstr(err->message, part) == NULL)
        fail_msg("\"%s\" not in \"%s\"", part, err->message);
}

/* Runs p and fails the test, with the message, if the run fails. */
static inline void run_train_ok(const plan *p, const run_options *options,
                                run_result *out)
{
    pt_error err = {{0}};
    int status = run_training(p, options, out, &err);
    if (status != 0)
        fail_msg("run failed (%d): %s", status, err.message);
}

/* Runs and expects a refusal (-1) whose message holds `part`, with the
 * save directory, when given, never created. */
static inline void run_expect_refusal(const plan *p,
                                      const run_options *options,
                                      const char *part)
{
    pt_error err = {{0}};
    run_result result;
    int status = run_training(p, options, &result, &err);
    run_result_free(&result);
    if (status != -1)
        fail_msg("expected a refusal mentioning \"%s\", got status %d (%s)",
                 part, status, err.message);
    assert_message_has(&err, part);
    if (options->save_dir != NULL)
        assert_false(run_path_exists(options->save_dir));
}

/* The bytes of a checkpoint's blob. */
static inline uint64_t run_blob_bytes(const char *dir, const char *name)
{
    uint64_t bytes = 0;
    pt_error err = {{0}};
    if (checkpoint_blob_size(dir, name, &bytes, &err) != 0)
        fail_msg("%s", err.message);
    return bytes;
}

/* got's first `count` iterations against want's (the one-stage run on
 * the same data and seed): losses, gradient norms and learning rates
 * within 1e-5 relative (fp32 round-off of sums taken in another order),
 * and the loss moving. `layout` names the run in a failure. */
static inline void run_expect_same_iterations(const run_result *got,
                                              const run_result *want,
                                              long count, const char *layout)
{
    for (long i = 0; i < count; i++) {
        const run_iteration *g = &got->iterations[i];
        const run_iteration *w = &want->iterations[i];
        assert_int_equal(g->iteration, w->iteration);
        assert_true(isfinite(g->loss) && g->loss > 0.0f);
        const double pairs[3][2] = {{g->loss, w->loss},
                                    {g->grad_norm, w->grad_norm},
                                    {g->learning_rate, w->learning_rate}};
        static const char *const names[3] = {"loss", "grad norm",
                                             "learning rate"};
        for (int k = 0; k < 3; k++) {
            double scale = fabs(pairs[k][1]) > 1e-30 ? fabs(pairs[k][1])
                                                     : 1.0;
            if (!(fabs(pairs[k][0] - pairs[k][1]) <= 1e-5 * scale))
                fail_msg("%s, iteration %ld: %s %.9g, one-stage run %.9g",
                         layout, g->iteration, names[k], pairs[k][0],
                         pairs[k][1]);
        }
    }
    /* training moved: the last loss differs from the first */
    assert_true(got->iterations[0].loss != got->iterations[count - 1].loss);
}

/* The last 2 iterations of a 4-iteration straight run, bit for bit. */
static inline void run_expect_resumed_equals_straight(
    const run_result *resumed, const run_result *straight)
{
    assert_int_equal(resumed->first_iteration, 3);
    assert_int_equal(resumed->iteration_count, 2);
    for (int i = 0; i < 2; i++) {
        const run_iteration *got = &resumed->iterations[i];
        const run_iteration *want = &straight->iterations[2 + i];
        assert_int_equal(got->iteration, want->iteration);
        if (got->loss != want->loss || got->grad_norm != want->grad_norm)
            fail_msg("iteration %ld: resumed loss %.9g norm %.9g, straight "
                     "%.9g %.9g",
                     got->iteration, got->loss, got->grad_norm, want->loss,
                     want->grad_norm);
        assert_true(got->learning_rate == want->learning_rate);
    }
}

/* Resumes `options`' run from dir, expects the straight run's last 2
 * iterations and frees the three records; returns the resuming options. */
static inline run_options run_expect_resume_matches(const plan *p,
                                                    run_options options,
                                                    const char *dir,
                                                    run_result *straight,
                                                    run_result *first)
{
    run_result second;
    options.load_dir = dir;
    run_train_ok(p, &options, &second);
    run_expect_resumed_equals_straight(&second, straight);
    run_result_free(straight);
    run_result_free(first);
    run_result_free(&second);
    return options;
}

#endif
