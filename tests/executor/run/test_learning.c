/*
 * Training on the bundled corpus learns: a tiny byte-level GPT (2 layers,
 * hidden 32, 2 heads, seq 32, vocab 257) starts near the uniform loss
 * ln 257 = 5.55 nats and, in 30 iterations of 4 sequences at a rate of
 * 1e-2, falls by well over a nat towards the bytes' unigram entropy
 * (about 3 nats for English text). Observed on the build machine: 5.54
 * at the first iteration, a mean of about 3.4 over the last ten.
 */
#include "run_test_support.h"

#include <math.h>

#define ITERATIONS 30

static void loss_falls_on_the_corpus(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, 2, 32, 2, 32, 257, 4, 4);
    run_options options = run_options_defaults(ITERATIONS);
    options.data_prefix = s->corpus;
    options.train.schedule.max_lr = 1e-2;
    options.train.schedule.min_lr = 1e-3;
    pt_error err = {{0}};
    run_result result;
    int status = run_training(&p, &options, &result, &err);
    if (status != 0)
        fail_msg("%s", err.message);
    assert_int_equal(result.iteration_count, ITERATIONS);
    float first = result.iterations[0].loss;
    assert_true(fabsf(first - logf(257.0f)) < 0.15f);
    double last_ten = 0;
    for (int i = ITERATIONS - 10; i < ITERATIONS; i++) {
        assert_true(isfinite(result.iterations[i].loss));
        last_ten += result.iterations[i].loss / 10.0;
    }
    if (!(last_ten < first - 1.5 && last_ten < 4.0))
        fail_msg("loss went from %.3f to a mean of %.3f over the last ten "
                 "iterations",
                 first, last_ten);
    assert_int_equal(result.largest_token, 256);
    assert_int_equal(result.dataset_documents, 560);
    run_result_free(&result);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loss_falls_on_the_corpus),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
