/* ZeRO-3's all-gathers a step in the cost model (costmodel_zero3_gathers,
 * docs/cost-model.md section 11) against the executor's rule itself
 * (executor/cuda/unit_holds.c, which builds without CUDA): for stages of
 * 0 to 9 layers of pipelines of 1 to 4 stages, 1 to 6 micro-batches,
 * 1F1B and GPipe, the passes in the executor's order (parallel/step.c's
 * run_schedule: the warm-up's forwards, then one forward one backward,
 * then the backwards left), the units held from pass to pass and
 * forgotten at the optimizer step. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "executor/cuda/unit_holds.h"
#include "fixtures.h"

/* The gathers of two steps of stage s as the executor runs them. */
static long executor_gathers(const parallel_config *config, int stage,
                             int layers, bool tied)
{
    int m = parallel_microbatches(config);
    int warm_up = config->schedule == SCHEDULE_1F1B
                      ? parallel_chunk_warmup(config->pp, 1, stage, m)
                      : m;
    unit_pass_shape shape = {
        .has_embedding = stage == 0, .has_head = stage == config->pp - 1,
        .tied_head = tied && config->pp == 1, .layers = layers};
    unit_holds holds = {{0}, 0};
    for (int step = 0; step < 2; step++) {
        int forwards = 0, backwards = 0;
        while (backwards < m) {
            bool forward = forwards < m && (forwards < warm_up ||
                                            forwards - warm_up == backwards);
            unit_holds_pass(&holds, &shape, !forward);
            forward ? forwards++ : backwards++;
        }
        unit_holds_forget(&holds); /* the optimizer step */
    }
    return holds.gathers;
}

static void gathers_follow_the_executor(void **state)
{
    (void)state;
    for (int tied = 0; tied <= 1; tied++) {
        model_shape m = gpt2_xl();
        m.tied_embeddings = tied;
        for (int pp = 1; pp <= 4; pp++)
            for (int micro = 1; micro <= 6; micro++)
                for (int gpipe = 0; gpipe <= 1; gpipe++) {
                    parallel_config config = config_of(2 * micro, 1, 1, 2,
                                                       pp);
                    config.schedule = gpipe ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
                    parallel_set_zero_stage(&config, 3);
                    for (int s = 0; s < pp; s++)
                        for (int layers = 0; layers <= 9; layers++) {
                            double model = costmodel_zero3_gathers(
                                &m, &config, s, layers);
                            /* the tied pair of a pipeline keeps whole
                             * buffers: nothing gathered */
                            bool pair = tied && pp > 1 &&
                                        (s == 0 || s == pp - 1);
                            long executor =
                                pair ? 0
                                     : executor_gathers(&config, s, layers,
                                                        tied);
                            assert_true(2.0 * model == (double)executor);
                        }
                }
    }
}

/* Below ZeRO-3 or at dp 1 nothing is gathered; at pp 1 with m
 * micro-batches 1F1B gathers every unit once and L - 2 layers in each of
 * the 2 m - 1 passes after. */
static void gathers_by_hand(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    parallel_config config = config_of(8, 1, 1, 2, 1); /* m = 4 */
    assert_true(costmodel_zero3_gathers(&m, &config, 0, 48) == 0.0);
    parallel_set_zero_stage(&config, 2);
    assert_true(costmodel_zero3_gathers(&m, &config, 0, 48) == 0.0);
    parallel_set_zero_stage(&config, 3);
    assert_true(costmodel_zero3_gathers(&m, &config, 0, 48) ==
                2.0 + 48.0 + 7.0 * 46.0);
    config.dp = 1;
    config.gbs = 4;
    assert_true(costmodel_zero3_gathers(&m, &config, 0, 48) == 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gathers_follow_the_executor),
        cmocka_unit_test(gathers_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
