/*
 * Runs that end early keep what finished (issue 18, items 5 and 6): a
 * loss that turns NaN ends the run with the iterations done and the
 * reason, and a state that is not finite is never saved over the last
 * good checkpoint; the stop flag, read between micro-batches, abandons a
 * one-stage iteration without applying any of it.
 */
#include "run_test_support.h"

#define LAYERS 2
#define HIDDEN 16
#define HEADS 2
#define SEQ 16

/* Two iterations saved into dir. */
static void make_checkpoint(const run_scratch *s, const plan *p,
                            const char *dir)
{
    run_options options = run_test_options(s, 2);
    options.save_dir = dir;
    run_result result;
    pt_error err = {{0}};
    if (run_training(p, &options, &result, &err) != 0)
        fail_msg("%s", err.message);
    run_result_free(&result);
}

/* Saves dir's checkpoint again with AdamW's second moments negative: the
 * next update takes their square root, so the parameters turn NaN. */
static void spoil_second_moments(const char *dir)
{
    checkpoint_manifest manifest;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_manifest(dir, &manifest, &err), 0);
    void *blobs[CHECKPOINT_MAX_BLOBS];
    for (int b = 0; b < manifest.blob_count; b++) {
        size_t bytes = (size_t)manifest.blobs[b].bytes;
        blobs[b] = malloc(bytes + 1);
        assert_non_null(blobs[b]);
        assert_int_equal(checkpoint_read_blob(dir, manifest.blobs[b].name,
                                              blobs[b], bytes, &err), 0);
        if (strcmp(manifest.blobs[b].name, "adam_v") == 0)
            for (size_t i = 0; i < bytes / sizeof(float); i++)
                ((float *)blobs[b])[i] = -1.0f;
    }
    checkpoint_writer writer;
    assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), 0);
    for (int b = 0; b < manifest.blob_count; b++) {
        assert_int_equal(checkpoint_write_blob(&writer, manifest.blobs[b].name,
                                               blobs[b],
                                               manifest.blobs[b].bytes, &err),
                         0);
        free(blobs[b]);
    }
    assert_int_equal(checkpoint_writer_commit(&writer, &err), 0);
}

static void nan_loss_keeps_what_finished(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, LAYERS, HIDDEN, HEADS, SEQ, 257, 4, 2);
    char dir[512];
    run_path(s, "spoiled", dir, sizeof dir);
    make_checkpoint(s, &p, dir);
    spoil_second_moments(dir);
    checkpoint_manifest before;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_manifest(dir, &before, &err), 0);

    /* iteration 3 finishes (its update makes the parameters NaN), the
       loss of iteration 4 is NaN: -2, with iteration 3 and its summary */
    run_options options = run_test_options(s, 10);
    options.load_dir = dir;
    run_result result;
    assert_int_equal(run_training(&p, &options, &result, &err), -2);
    assert_message_has(&err, "iteration 4: the loss");
    assert_message_has(&err, "not finite");
    assert_true(result.stopped);
    assert_int_equal(result.iteration_count, 1);
    assert_int_equal(result.iterations[0].iteration, 3);
    assert_non_null(result.events);
    assert_true(result.step_time_s > 0);
    assert_non_null(strstr(result.stop_reason, "iteration 4"));
    json_t *plan_json = plan_to_json(&p, NULL, &err);
    json_t *record = run_to_json(&result, plan_json, 1e9, &err);
    assert_non_null(record);
    json_t *training = json_object_get(record, "training");
    assert_true(json_is_true(json_object_get(training, "stopped_early")));
    assert_non_null(strstr(json_string_value(json_object_get(training,
                                                             "stop_reason")),
                           "not finite"));
    json_decref(record);
    json_decref(plan_json);
    run_result_free(&result);

    /* saving after iteration 3 would write NaN parameters: refused, the
       checkpoint of iteration 2 stays the one that loads */
    options.save_dir = dir;
    options.save_interval = 1;
    assert_int_equal(run_training(&p, &options, &result, &err), -2);
    assert_message_has(&err, "not finite");
    assert_message_has(&err, "the checkpoint before it stays");
    assert_int_equal(result.iteration_count, 1);
    assert_int_equal(result.last_checkpoint_iteration, 0);
    run_result_free(&result);
    checkpoint_manifest after;
    assert_int_equal(checkpoint_read_manifest(dir, &after, &err), 0);
    assert_int_equal(after.generation, before.generation);
    assert_int_equal(checkpoint_verify(dir, &err), 0);
    assert_int_equal(run_checkpoint_iteration(dir), 2);
    plan_free(&p);
}

/* The flag raised before the first micro-batch of iteration 3 of a
 * resumed run: that iteration is abandoned, nothing is recorded, saved
 * or applied, and the run returns 0 saying which iteration it was. */
static void stop_flag_abandons_the_iteration(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, LAYERS, HIDDEN, HEADS, SEQ, 257, 8, 1);
    char dir[512];
    run_path(s, "stopped", dir, sizeof dir);
    make_checkpoint(s, &p, dir);
    checkpoint_manifest before;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_manifest(dir, &before, &err), 0);

    volatile sig_atomic_t stop = 1;
    run_options options = run_test_options(s, 10);
    options.load_dir = dir;
    options.save_dir = dir;
    options.stop = &stop;
    run_result result;
    if (run_training(&p, &options, &result, &err) != 0)
        fail_msg("%s", err.message);
    assert_true(result.stopped);
    assert_int_equal(result.interrupted_iteration, 3);
    assert_int_equal(result.iteration_count, 0);
    assert_int_equal(result.last_checkpoint_iteration, 0);
    assert_string_equal(result.stop_reason, "stopped on request");
    run_result_free(&result);
    checkpoint_manifest after;
    assert_int_equal(checkpoint_read_manifest(dir, &after, &err), 0);
    assert_int_equal(after.generation, before.generation);

    /* and the next run resumes at iteration 3 as if nothing happened */
    options.stop = NULL;
    options.iterations = 3;
    if (run_training(&p, &options, &result, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(result.first_iteration, 3);
    assert_int_equal(result.iteration_count, 1);
    run_result_free(&result);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nan_loss_keeps_what_finished),
        cmocka_unit_test(stop_flag_abandons_the_iteration),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
