/*
 * A run never replaces a checkpoint it was not asked to (issue 18, item
 * 4): --save onto a folder that holds another run's checkpoint is refused
 * unless the run resumes from it or may overwrite it; and the newest N
 * generations stay, each loadable from its own folder, so even an
 * overwrite leaves the one before.
 */
#include "run_test_support.h"

#define LAYERS 2
#define HIDDEN 16
#define HEADS 2
#define SEQ 16

/* Runs to the end; returns the last checkpoint iteration. */
static long train(const plan *p, const run_options *options)
{
    run_result result;
    pt_error err = {{0}};
    int status = run_training(p, options, &result, &err);
    if (status != 0)
        fail_msg("run_training: %s", err.message);
    long saved = result.last_checkpoint_iteration;
    run_result_free(&result);
    return saved;
}

/* The generation folders of dir, in out (newest last), and their count. */
static int generations(const char *dir, char out[][600], int most)
{
    int count = 0;
    for (int g = 1; g < 100 && count < most; g++) {
        snprintf(out[count], 600, "%s/gen-%06d", dir, g);
        if (run_path_exists(out[count]))
            count++;
    }
    return count;
}

static void another_runs_checkpoint_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, LAYERS, HIDDEN, HEADS, SEQ, 257, 4, 2);
    char dir[512];
    run_path(s, "ckpt", dir, sizeof dir);
    run_options options = run_test_options(s, 10);
    options.save_dir = dir;
    assert_int_equal(train(&p, &options), 10);

    /* a shorter fresh run into the same folder: refused before training,
       the 10-iteration checkpoint untouched */
    options = run_test_options(s, 3);
    options.save_dir = dir;
    run_result result;
    pt_error err = {{0}};
    assert_int_equal(run_training(&p, &options, &result, &err), -1);
    assert_int_equal(result.iteration_count, 0);
    run_result_free(&result);
    assert_message_has(&err, dir);
    assert_message_has(&err, "already holds a checkpoint");
    assert_message_has(&err, "--overwrite");
    assert_int_equal(run_checkpoint_iteration(dir), 10);

    /* resuming from it may save into it */
    options = run_test_options(s, 12);
    options.load_dir = dir;
    options.save_dir = dir;
    assert_int_equal(train(&p, &options), 12);

    /* --overwrite replaces it, and the generation before stays */
    options = run_test_options(s, 3);
    options.save_dir = dir;
    options.overwrite_checkpoint = true;
    assert_int_equal(train(&p, &options), 3);
    assert_int_equal(run_checkpoint_iteration(dir), 3);
    char folders[4][600];
    assert_int_equal(generations(dir, folders, 4), 2);
    assert_int_equal(run_checkpoint_iteration(folders[0]), 12);
    assert_int_equal(run_checkpoint_iteration(folders[1]), 3);
    plan_free(&p);
}

static void newest_generations_are_kept(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, LAYERS, HIDDEN, HEADS, SEQ, 257, 4, 2);
    char dir[512];
    run_path(s, "keep3", dir, sizeof dir);
    run_options options = run_test_options(s, 5);
    options.save_dir = dir;
    options.save_interval = 1;
    options.checkpoint_keep = 3;
    assert_int_equal(train(&p, &options), 5);
    char folders[8][600];
    assert_int_equal(generations(dir, folders, 8), 3);
    for (int g = 0; g < 3; g++) {
        pt_error err = {{0}};
        if (checkpoint_verify(folders[g], &err) != 0)
            fail_msg("%s", err.message);
        assert_int_equal(run_checkpoint_iteration(folders[g]), 3 + g);
    }

    /* an older generation resumes from its folder */
    options = run_test_options(s, 6);
    options.load_dir = folders[0];
    run_result result;
    pt_error err = {{0}};
    if (run_training(&p, &options, &result, &err) != 0)
        fail_msg("%s", err.message);
    assert_int_equal(result.first_iteration, 4);
    run_result_free(&result);

    /* one generation when asked */
    run_path(s, "keep1", dir, sizeof dir);
    options = run_test_options(s, 3);
    options.save_dir = dir;
    options.save_interval = 1;
    options.checkpoint_keep = 1;
    assert_int_equal(train(&p, &options), 3);
    assert_int_equal(generations(dir, folders, 8), 1);
    assert_int_equal(run_checkpoint_iteration(dir), 3);

    options.checkpoint_keep = 0;
    assert_int_equal(run_training(&p, &options, &result, &err), -1);
    run_result_free(&result);
    assert_message_has(&err, "checkpoints kept");
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(another_runs_checkpoint_is_refused),
        cmocka_unit_test(newest_generations_are_kept),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
