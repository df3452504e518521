/*
 * What a run refuses before it trains, with a message that says why, and
 * without writing anything: tensor-parallel plans, a missing dataset, a
 * vocabulary below the data's tokens, too little memory, bad options, and
 * checkpoints that are corrupt, of another model, of another seed or
 * already at the end.
 */
#include "run_test_support.h"

#include <math.h>

#define HIDDEN 16
#define SEQ 16

/* A committed checkpoint of a 2-layer model after two iterations. */
static void make_checkpoint(const run_scratch *s, const plan *p,
                            const char *dir)
{
    run_options options = run_test_options(s, 2);
    options.save_dir = dir;
    pt_error err = {{0}};
    run_result result;
    int status = run_training(p, &options, &result, &err);
    if (status != 0)
        fail_msg("%s", err.message);
    run_result_free(&result);
}

/* A tiny GPT-2 plan on one node of 4 GPUs, its degrees (and anything
 * after them) given as JSON fields. */
static void tiny_plan_on_four(const char *degrees, plan *p)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{ \"model\": { \"name\": \"tiny\", \"layers\": 2, "
             "\"hidden\": 16, \"heads\": 2, \"seq\": 16, "
             "\"vocab\": 257 },"
             "  \"cluster\": { \"name\": \"one\", \"nodes\": ["
             "    { \"name\": \"box\", \"gpu\": \"A100-FASOP\", "
             "\"gpus\": 4, \"intra_node\": { \"bandwidth_GBps\": 230,"
             "      \"latency_us\": 5 } } ] }, %s }",
             degrees);
    json_error_t json_err;
    json_t *root = json_loads(text, 0, &json_err);
    pt_error err = {{0}};
    if (plan_from_json(root, NULL, p, &err) != 0)
        fail_msg("%s", err.message);
    json_decref(root);
}

/* A tensor-parallel degree that does not divide the heads is refused
 * before anything is written (tp = 2 runs: test_parallel.c). */
static void tensor_parallel_plan_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan_on_four("\"gbs\": 4, \"mbs\": 2, \"tp\": 4, \"dp\": 1, "
                      "\"pp\": 1",
                      &p);
    run_options options = run_test_options(s, 2);
    char dir[512];
    run_path(s, "never", dir, sizeof dir);
    options.save_dir = dir;
    run_expect_refusal(&p, &options, "tp 4 must divide the 2 heads");
    plan_free(&p);
}

/* A plan whose stages have their own tp or dp runs (issue 36;
 * test_asymmetric.c), but for what exec cannot do with them, refused in
 * one line: the tied embedding between a first and a last stage of
 * different degrees summed from ZeRO-1's shards of bf16 gradients. */
static void asymmetric_plan_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan_on_four("\"gbs\": 4, \"mbs\": 1, \"tp\": 1, \"dp\": 2, "
                      "\"pp\": 2, \"stages\": [{ \"tp\": 2, \"dp\": 1 }, "
                      "{}], \"distributed_optimizer\": true, "
                      "\"grad_precision\": \"bf16\"",
                      &p);
    run_options options = run_test_options(s, 2);
    run_expect_refusal(&p, &options,
                   "grad_precision: bf16 with the distributed optimizer and "
                   "tied embeddings between a first stage of tp 2 x dp 1 "
                   "and a last of tp 1 x dp 2");
    plan_free(&p);
}

static void missing_dataset_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, HIDDEN, 2, SEQ, 257, 4, 2);
    run_options options = run_test_options(s, 2);
    char prefix[512];
    run_path(s, "no-such-data", prefix, sizeof prefix);
    options.data_prefix = prefix;
    run_expect_refusal(&p, &options, "no-such-data.idx");
    plan_free(&p);
}

static void small_vocabulary_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, HIDDEN, 2, SEQ, 200, 4, 2);
    run_options options = run_test_options(s, 2);
    run_expect_refusal(&p, &options, "vocab 200");
    run_expect_refusal(&p, &options, "token 256");
    plan_free(&p);
}

static void too_little_memory_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, HIDDEN, 2, SEQ, 257, 4, 2);
    run_options options = run_test_options(s, 2);
    double activations = 0;
    double needed = run_cpu_stage_bytes(&p.model, 2, false, &activations);
    assert_true(activations > 0 && needed > activations);
    /* 16 bytes per parameter besides the activations */
    assert_true(fabs(needed - activations -
                     16.0 * model_parameter_count(&p.model)) < 0.5);
    options.memory_available_bytes = needed / 2;
    run_expect_refusal(&p, &options, "not enough memory");
    run_expect_refusal(&p, &options, "16 bytes per parameter");
    options.memory_available_bytes = needed * 2;
    pt_error err = {{0}};
    run_result result;
    assert_int_equal(run_training(&p, &options, &result, &err), 0);
    run_result_free(&result);
    plan_free(&p);
}

static void bad_options_are_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, HIDDEN, 2, SEQ, 257, 4, 2);
    run_options options = run_test_options(s, 0);
    run_expect_refusal(&p, &options, "iterations must be >= 1");
    options = run_test_options(s, 2);
    options.save_interval = -1;
    run_expect_refusal(&p, &options, "save interval");
    options = run_test_options(s, 2);
    options.train.schedule.min_lr = 1.0;
    run_expect_refusal(&p, &options, "min_lr");
    options = run_test_options(s, 2);
    options.data_prefix = NULL;
    run_expect_refusal(&p, &options, "no dataset");
    plan_free(&p);
}

/* Flips one byte in the middle of a blob of the committed generation. */
static void corrupt_blob(const char *dir, const char *name)
{
    checkpoint_manifest manifest;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_manifest(dir, &manifest, &err), 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/gen-%06llu/%s", dir,
             (unsigned long long)manifest.generation, name);
    FILE *file = fopen(path, "r+b");
    assert_non_null(file);
    assert_int_equal(fseek(file, 0, SEEK_END), 0);
    long size = ftell(file);
    assert_true(size > 0);
    assert_int_equal(fseek(file, size / 2, SEEK_SET), 0);
    int byte = fgetc(file);
    assert_int_equal(fseek(file, size / 2, SEEK_SET), 0);
    fputc(byte ^ 0x40, file);
    fclose(file);
}

static void corrupt_checkpoint_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, HIDDEN, 2, SEQ, 257, 4, 2);
    char dir[512], fresh[512];
    run_path(s, "corrupt", dir, sizeof dir);
    run_path(s, "corrupt-next", fresh, sizeof fresh);
    make_checkpoint(s, &p, dir);
    corrupt_blob(dir, "adam_v");
    run_options options = run_test_options(s, 4);
    options.load_dir = dir;
    options.save_dir = fresh;
    run_expect_refusal(&p, &options, "checksum mismatch");
    run_expect_refusal(&p, &options, "adam_v");
    /* saving into the corrupt directory itself must not replace it */
    options.save_dir = dir;
    pt_error err = {{0}};
    run_result result;
    assert_int_equal(run_training(&p, &options, &result, &err), -1);
    run_result_free(&result);
    checkpoint_manifest manifest;
    assert_int_equal(checkpoint_read_manifest(dir, &manifest, &err), 0);
    assert_int_equal((int)manifest.generation, 1);
    plan_free(&p);
}

static void checkpoint_of_another_shape_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p, wider, deeper;
    tiny_plan(&p, 2, HIDDEN, 2, SEQ, 257, 4, 2);
    tiny_plan(&wider, 2, 24, 2, SEQ, 257, 4, 2);
    tiny_plan(&deeper, 3, HIDDEN, 2, SEQ, 257, 4, 2);
    char dir[512];
    run_path(s, "shape", dir, sizeof dir);
    make_checkpoint(s, &p, dir);
    run_options options = run_test_options(s, 4);
    options.load_dir = dir;
    run_expect_refusal(&wider, &options, "model.hidden is 16");
    run_expect_refusal(&wider, &options, "another model");
    run_expect_refusal(&deeper, &options, "model.layers is 2");
    /* the same shape loads */
    pt_error err = {{0}};
    run_result result;
    int status = run_training(&p, &options, &result, &err);
    if (status != 0)
        fail_msg("%s", err.message);
    assert_int_equal(result.first_iteration, 3);
    run_result_free(&result);
    plan_free(&p);
    plan_free(&wider);
    plan_free(&deeper);
}

static void other_seed_or_finished_checkpoint_is_refused(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, HIDDEN, 2, SEQ, 257, 4, 2);
    char dir[512];
    run_path(s, "seeded", dir, sizeof dir);
    make_checkpoint(s, &p, dir);
    run_options options = run_test_options(s, 4);
    options.load_dir = dir;
    options.seed = 99;
    options.seed_given = true;
    run_expect_refusal(&p, &options, "seed 1234");
    options = run_test_options(s, 2);
    options.load_dir = dir;
    run_expect_refusal(&p, &options, "nothing left to run");
    run_expect_refusal(&p, &options, "at iteration 2");
    char missing[512];
    run_path(s, "no-checkpoint-here", missing, sizeof missing);
    options = run_test_options(s, 4);
    options.load_dir = missing;
    run_expect_refusal(&p, &options, "no manifest.json");
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tensor_parallel_plan_is_refused),
        cmocka_unit_test(asymmetric_plan_is_refused),
        cmocka_unit_test(missing_dataset_is_refused),
        cmocka_unit_test(small_vocabulary_is_refused),
        cmocka_unit_test(too_little_memory_is_refused),
        cmocka_unit_test(bad_options_are_refused),
        cmocka_unit_test(corrupt_checkpoint_is_refused),
        cmocka_unit_test(checkpoint_of_another_shape_is_refused),
        cmocka_unit_test(other_seed_or_finished_checkpoint_is_refused),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
