/*
 * Checkpoints of a run resume exactly: 3 iterations, a stop, a save, a
 * load and 3 more give the same losses, norms, rates and final state,
 * bit for bit, as 6 iterations straight. Also: an iteration is
 * train_step on the sampler's next gbs samples, the stop flag ends a run
 * after the current iteration, and interval saves happen where asked.
 */
#include "run_test_support.h"

#define LAYERS 2
#define HIDDEN 16
#define HEADS 2
#define SEQ 16
#define GBS 4
#define MBS 2
#define ITERATIONS 6

/* Raises the stop flag once the run has done `stop_after` iterations, as a
 * signal handler would. */
typedef struct stopper {
    volatile sig_atomic_t flag;
    long stop_after;
    int calls;
} stopper;

static void stop_when_due(const run_result *so_far, void *data)
{
    stopper *s = data;
    s->calls++;
    if (so_far->iterations[so_far->iteration_count - 1].iteration ==
        s->stop_after)
        s->flag = 1;
}

static run_options small_options(const run_scratch *s)
{
    run_options options = run_options_defaults(ITERATIONS);
    options.data_prefix = s->corpus;
    /* a large rate, so that the state moves visibly between steps */
    options.train.schedule.max_lr = 1e-2;
    options.train.schedule.min_lr = 1e-3;
    options.train.schedule.warmup_steps = 2;
    return options;
}

static void assert_same_blob(const char *dir_a, const char *dir_b,
                             const char *name, size_t bytes)
{
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    assert_non_null(a);
    assert_non_null(b);
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_blob(dir_a, name, a, bytes, &err), 0);
    assert_int_equal(checkpoint_read_blob(dir_b, name, b, bytes, &err), 0);
    assert_memory_equal(a, b, bytes);
    free(a);
    free(b);
}

static void resume_equals_straight_run(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, LAYERS, HIDDEN, HEADS, SEQ, 257, GBS, MBS);
    char straight_dir[512], resumed_dir[512];
    run_path(s, "straight", straight_dir, sizeof straight_dir);
    run_path(s, "resumed", resumed_dir, sizeof resumed_dir);
    pt_error err = {{0}};

    run_options options = small_options(s);
    options.save_dir = straight_dir;
    run_result straight;
    assert_int_equal(run_training(&p, &options, &straight, &err), 0);
    assert_int_equal(straight.iteration_count, ITERATIONS);

    stopper stop = {.stop_after = 3};
    options.save_dir = resumed_dir;
    options.stop = &stop.flag;
    options.observer = stop_when_due;
    options.observer_data = &stop;
    run_result first_half;
    assert_int_equal(run_training(&p, &options, &first_half, &err), 0);
    assert_true(first_half.stopped);
    assert_int_equal(first_half.iteration_count, 3);
    assert_int_equal(first_half.last_checkpoint_iteration, 3);
    assert_int_equal(stop.calls, 3);

    options = small_options(s);
    options.load_dir = resumed_dir;
    options.save_dir = resumed_dir;
    run_result second_half;
    int status = run_training(&p, &options, &second_half, &err);
    if (status != 0)
        fail_msg("%s", err.message);
    assert_int_equal(second_half.first_iteration, 4);
    assert_int_equal(second_half.iteration_count, 3);
    assert_string_equal(second_half.resumed_from, resumed_dir);

    for (long i = 0; i < ITERATIONS; i++) {
        const run_iteration *a = &straight.iterations[i];
        const run_iteration *b = i < 3 ? &first_half.iterations[i]
                                       : &second_half.iterations[i - 3];
        assert_int_equal(a->iteration, b->iteration);
        /* exact: the same operations on the same bits */
        assert_memory_equal(&a->loss, &b->loss, sizeof a->loss);
        assert_memory_equal(&a->grad_norm, &b->grad_norm, sizeof a->grad_norm);
        assert_memory_equal(&a->learning_rate, &b->learning_rate,
                            sizeof a->learning_rate);
    }
    /* the losses moved, so equality above is not of constants */
    assert_true(straight.iterations[5].loss != straight.iterations[0].loss);

    stage_spec spec = stage_spec_whole_model(&p.model);
    size_t floats = 0;
    assert_true(stage_parameter_layout(&p.model, &spec, NULL, &floats, &err) >
                0);
    const char *state_blobs[] = {"params", "adam_m", "adam_v"};
    for (int i = 0; i < 3; i++)
        assert_same_blob(straight_dir, resumed_dir, state_blobs[i],
                         floats * sizeof(float));
    assert_same_blob(straight_dir, resumed_dir, "optimizer_steps", 8);
    assert_same_blob(straight_dir, resumed_dir, "data_position",
                     DATA_POSITION_BYTES);
    run_result_free(&straight);
    run_result_free(&first_half);
    run_result_free(&second_half);
    plan_free(&p);
}

/* The first iteration equals train_step on the first GBS samples of the
 * sampler at seed 1234, from a stage initialised with that seed. */
static void iteration_is_train_step(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, LAYERS, HIDDEN, HEADS, SEQ, 257, GBS, MBS);
    pt_error err = {{0}};
    run_options options = small_options(s);
    options.iterations = 1;
    options.train.schedule.warmup_steps = 0;
    options.train.schedule.decay_steps = 1;
    run_result result;
    assert_int_equal(run_training(&p, &options, &result, &err), 0);

    indexed_dataset ds;
    gpt_sampler sampler;
    assert_int_equal(indexed_dataset_open(&ds, s->corpus, &err), 0);
    assert_int_equal(gpt_sampler_init(&sampler, &ds, SEQ, 1234, 257, &err), 0);
    uint32_t tokens[GBS * (SEQ + 1)];
    data_position position = {0, 0};
    for (int i = 0; i < GBS; i++)
        assert_int_equal(gpt_sampler_next(&sampler, &position,
                                          tokens + i * (SEQ + 1), &err),
                         0);
    model_stage stage;
    stage_spec spec = stage_spec_whole_model(&p.model);
    assert_int_equal(model_stage_create(&stage, &p.model, &spec, BACKEND_CPU,
                                        MBS, 1, &err),
                     0);
    assert_int_equal(model_stage_init_parameters(&stage, 1234, &err), 0);
    step_result step;
    assert_int_equal(train_step(&stage, &options.train, tokens, GBS / MBS,
                                MBS, &step, &err),
                     0);
    assert_memory_equal(&step.loss, &result.iterations[0].loss,
                        sizeof step.loss);
    assert_memory_equal(&step.grad_norm, &result.iterations[0].grad_norm,
                        sizeof step.grad_norm);
    assert_memory_equal(&step.learning_rate,
                        &result.iterations[0].learning_rate,
                        sizeof step.learning_rate);
    model_stage_destroy(&stage);
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
    run_result_free(&result);
    plan_free(&p);
}

static void interval_saves_and_final_save(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 1, HIDDEN, HEADS, SEQ, 257, 2, 2);
    char dir[512];
    run_path(s, "interval", dir, sizeof dir);
    pt_error err = {{0}};
    run_options options = small_options(s);
    options.iterations = 5;
    options.save_dir = dir;
    options.save_interval = 2;
    run_result result;
    stopper seen = {.stop_after = -1};
    options.observer = stop_when_due;
    options.observer_data = &seen;
    assert_int_equal(run_training(&p, &options, &result, &err), 0);
    assert_int_equal(result.last_checkpoint_iteration, 5);
    assert_false(result.stopped);
    checkpoint_manifest manifest;
    assert_int_equal(checkpoint_read_manifest(dir, &manifest, &err), 0);
    /* saves at iterations 2, 4 and 5: three generations */
    assert_int_equal((int)manifest.generation, 3);
    unsigned char steps[8];
    assert_int_equal(checkpoint_read_blob(dir, "optimizer_steps", steps, 8,
                                          &err),
                     0);
    assert_int_equal(steps[0], 5);
    run_result_free(&result);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resume_equals_straight_run),
        cmocka_unit_test(iteration_is_train_step),
        cmocka_unit_test(interval_saves_and_final_save),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
