/* Megatron's interleaved 1F1B and sequence parallelism in the cost model:
 * one chunk is the plain 1F1B event for event, a uniform pipeline's
 * bubble shrinks to (pp - 1) / v of the plain one, the sends multiply by
 * v, Megatron's warm-up and in-flight counts; sequence parallelism
 * prices its reduce-scatter and all-gather as the all-reduce it replaces
 * and divides the norm and residual activations by tp. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static double random_unit(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static int random_int(int low, int high)
{
    return low + (int)(random_unit() * (high - low + 1));
}

static void simulate_chunks(const interleave_stage *stages, int pp, int v,
                            int m, bool events, schedule_result *r)
{
    pt_error err = {{0}};
    if (interleave_simulate(stages, pp, v, m, events, r, &err) != 0)
        fail_msg("%s", err.message);
}

static int event_order(const void *a, const void *b)
{
    const timeline_event *x = a, *y = b;
    if (x->stage != y->stage)
        return x->stage - y->stage;
    if (x->kind != y->kind)
        return (int)x->kind - (int)y->kind;
    if (x->microbatch != y->microbatch)
        return x->microbatch - y->microbatch;
    return (x->start_s > y->start_s) - (x->start_s < y->start_s);
}

/* v = 1 is the plain 1F1B exactly: the same end, per-stage figures and
 * events, on random stages with random sends. */
static void one_chunk_is_the_plain_1f1b(void **state)
{
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        int pp = random_int(1, 7), m = random_int(1, 14);
        schedule_stage plain[8];
        interleave_stage chunks[8];
        for (int s = 0; s < pp; s++) {
            double ends_f = (s == 0 || s == pp - 1) ? random_unit() : 0.0;
            double layers_f = random_unit(), layers_b = 2 * random_unit();
            double send_f = s < pp - 1 ? 0.1 * random_unit() : 0.0;
            double send_b = s > 0 ? 0.1 * random_unit() : 0.0;
            plain[s] = (schedule_stage){layers_f + ends_f,
                                        layers_b + 2 * ends_f, send_f,
                                        send_b};
            chunks[s] = (interleave_stage){layers_f, layers_b, ends_f,
                                           2 * ends_f, send_f, send_b};
        }
        schedule_result a, b;
        pt_error err = {{0}};
        assert_int_equal(schedule_simulate(SCHEDULE_1F1B, plain, pp, m, true,
                                           &a, &err), 0);
        simulate_chunks(chunks, pp, 1, m, true, &b);
        assert_true(close_to(a.pipeline_end_s, b.pipeline_end_s, 1e-12));
        for (int s = 0; s < pp; s++) {
            assert_true(close_to(a.stage_end_s[s], b.stage_end_s[s], 1e-12));
            assert_true(close_to(a.stage_busy_s[s], b.stage_busy_s[s],
                                 1e-12));
        }
        assert_int_equal(a.event_count, b.event_count);
        qsort(a.events, (size_t)a.event_count, sizeof *a.events,
              event_order);
        qsort(b.events, (size_t)b.event_count, sizeof *b.events,
              event_order);
        for (int i = 0; i < a.event_count; i++) {
            assert_int_equal(a.events[i].kind, b.events[i].kind);
            assert_int_equal(a.events[i].microbatch, b.events[i].microbatch);
            assert_true(close_to(a.events[i].start_s, b.events[i].start_s,
                                 1e-12));
            assert_true(close_to(a.events[i].end_s, b.events[i].end_s,
                                 1e-12));
        }
        schedule_result_free(&a);
        schedule_result_free(&b);
    }
}

/* Uniform ranks, no sends, m a multiple of pp: the step is
 * m (F + B) + (pp - 1) (F + B) / v, Megatron's bubble (pp - 1) / v of
 * the plain schedule's. */
static void uniform_pipeline_bubble_shrinks_by_v(void **state)
{
    (void)state;
    interleave_stage chunks[8];
    for (int s = 0; s < 8; s++)
        chunks[s] = (interleave_stage){0.004, 0.008, 0.0, 0.0, 0.0, 0.0};
    for (int pp = 2; pp <= 8; pp++)
        for (int v = 1; v <= 4; v++)
            for (int m = pp; m <= 4 * pp; m += pp) {
                schedule_result r;
                simulate_chunks(chunks, pp, v, m, true, &r);
                double expected = (m + (pp - 1) / (double)v) * 0.012;
                if (!close_to(r.pipeline_end_s, expected, 1e-9))
                    fail_msg("pp %d, v %d, m %d: %.9f s, expected %.9f", pp,
                             v, m, r.pipeline_end_s, expected);
                /* v m forward and v m backward chunks a rank, each
                 * sending to a neighbour but the pipeline's two ends */
                assert_int_equal(r.event_count,
                                 2 * pp * v * m + 4 * (pp * v - 1) * m);
                schedule_result_free(&r);
            }
}

/* With sends, every chunk boundary pays one: a micro-batch alone goes
 * through pp x v chunks and pp x v - 1 sends each way. */
static void one_microbatch_pays_every_chunk_send(void **state)
{
    (void)state;
    for (int trial = 0; trial < 50; trial++) {
        int pp = random_int(2, 6), v = random_int(2, 4);
        interleave_stage chunks[6];
        double expected = 0.0;
        for (int s = 0; s < pp; s++) {
            chunks[s] = (interleave_stage){random_unit(), random_unit(),
                                           s == 0 || s == pp - 1
                                               ? random_unit()
                                               : 0.0,
                                           0.0, 0.1 * random_unit(),
                                           0.1 * random_unit()};
            expected += chunks[s].layers_forward_s +
                        chunks[s].layers_backward_s +
                        chunks[s].ends_forward_s +
                        v * (chunks[s].send_fwd_s + chunks[s].send_bwd_s);
        }
        /* the very last forward and the very first backward send nothing */
        expected -= chunks[pp - 1].send_fwd_s + chunks[0].send_bwd_s;
        /* pp micro-batches (m must be a multiple of pp); a pipeline of
         * one micro-batch is the same sum when only micro-batch 0 moves:
         * simulate m = pp and check the first micro-batch's last
         * backward on rank 0 against the sum */
        schedule_result r;
        simulate_chunks(chunks, pp, v, pp, true, &r);
        double first_done = INFINITY;
        for (int i = 0; i < r.event_count; i++) {
            const timeline_event *e = &r.events[i];
            if (e->stage == 0 && e->kind == EVENT_BWD && e->microbatch == 0)
                first_done = e->end_s; /* the last chunk's backward */
        }
        assert_true(first_done >= expected - 1e-9);
        schedule_result_free(&r);
    }
}

/* Megatron's warm-up, the chunks held at the peak and each chunk's
 * slots. */
static void warmup_and_in_flight_follow_megatron(void **state)
{
    (void)state;
    /* pp 4, v 2, m 8: 2 (4 - i - 1) + 4 */
    int expected[4] = {10, 8, 6, 4};
    for (int i = 0; i < 4; i++)
        assert_int_equal(interleave_warmup(4, 2, i, 8), expected[i]);
    assert_int_equal(interleave_warmup(4, 1, 0, 8), 3);
    assert_int_equal(interleave_warmup(4, 3, 0, 4), 12); /* 6 + 8 = 14 > 12 */
    parallel_config config = config_of(64, 1, 1, 8, 4);
    config.virtual_stages = 2;
    assert_int_equal(costmodel_chunks_in_flight(&config, 0, 8), 11);
    assert_int_equal(costmodel_microbatches_in_flight(&config, 3, 8), 5);
    /* each chunk's own peak: the executor's slots, more than the rank
     * holds at once (docs/cost-model.md 6.1) */
    const int slots[4][2] = {{8, 4}, {8, 4}, {7, 3}, {5, 1}};
    for (int i = 0; i < 4; i++) {
        int got[2];
        parallel_chunk_slots(4, 2, i, 8, got);
        assert_int_equal(got[0], slots[i][0]);
        assert_int_equal(got[1], slots[i][1]);
    }
    config.virtual_stages = 1;
    for (int i = 0; i < 4; i++)
        assert_int_equal(costmodel_chunks_in_flight(&config, i, 8),
                         costmodel_microbatches_in_flight(&config, i, 8));
}

static void estimate_of(fixture *f, const parallel_config *config,
                        const int *partition, bool events, estimate *out)
{
    pt_error err = {{0}};
    int order[2] = {0, 1};
    if (costmodel_estimate(&f->cm, config, order, 2, partition, events, out,
                           &err) != 0)
        fail_msg("%s", err.message);
}

/* A whole estimate: v = 1 and virtual_stages 0 are the plain plan; v = 2
 * cuts the bubble; the layer activations per micro-batch slot shrink
 * while the chunks in flight grow, as the formula says. */
static void estimate_interleaves(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 2, 0), 0);
    parallel_config config = config_of(16, 1, 2, 1, 4);
    int partition[4] = {12, 12, 12, 12};
    estimate plain, one, two;
    estimate_of(&f, &config, partition, true, &plain);
    config.virtual_stages = 1;
    estimate_of(&f, &config, partition, true, &one);
    assert_true(plain.step_time_s == one.step_time_s);
    assert_true(plain.stages[0].peak_memory_bytes ==
                one.stages[0].peak_memory_bytes);
    config.virtual_stages = 2;
    estimate_of(&f, &config, partition, true, &two);
    assert_true(two.bubble_fraction < plain.bubble_fraction);
    /* stage 0 holds 2 (4 - 1) + 4 + 1 = 11 chunk micro-batches of 6
     * layers against 4 micro-batches of 12: 66 layer activations
     * against 48; inputs 11 against 4 */
    double layer_part = (two.stages[0].memory.bytes[PT_MEMORY_ACTIVATIONS] -
                         plain.stages[0].memory.bytes[PT_MEMORY_ACTIVATIONS]);
    assert_true(layer_part > 0.0);
    /* every stage sends both ways: the comm term holds two buffers */
    assert_true(two.stages[0].memory.bytes[PT_MEMORY_COMM] >
                plain.stages[0].memory.bytes[PT_MEMORY_COMM]);
    estimate_free(&plain);
    estimate_free(&one);
    estimate_free(&two);
    fixture_close(&f);
}

/* Sequence parallelism: the layer's tp collectives cost what the
 * all-reduces did (a ring's reduce-scatter and all-gather are its two
 * halves), the pipeline's messages are the sequence shard, and the
 * activations of norms and residuals are divided by tp. */
static void sequence_parallel_prices_and_saves(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 2, 0), 0);
    f.profiles[0].layer_times_include_tp_comm = false;
    parallel_config config = config_of(16, 2, 2, 1, 4);
    int partition[4] = {12, 12, 12, 12};
    pt_error err = {{0}};
    type_costs plain_costs, sp_costs;
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &config, &plain_costs,
                                          &err), 0);
    parallel_config sp = config;
    sp.sequence_parallel = true;
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &sp, &sp_costs, &err), 0);
    assert_true(plain_costs.tp_allreduce_s > 0.0);
    assert_true(close_to(sp_costs.tp_allreduce_s, plain_costs.tp_allreduce_s,
                         1e-12));
    assert_true(costmodel_pipeline_message_bytes(&m, &sp) ==
                costmodel_pipeline_message_bytes(&m, &config) / 2.0);
    estimate a, b;
    estimate_of(&f, &config, partition, false, &a);
    estimate_of(&f, &sp, partition, false, &b);
    /* per layer and slot: 16 N + 2 e N h [norm outputs] + 2 e N h [the
     * bf16 residual and output] of the layer's activations, and the
     * stage's bf16 input 2 N h with its fp32 send buffer 4 N h, halved;
     * stage 0 holds 4 slots of 12 layers; N = mbs x seq */
    double N = 2.0 * 1024, h = 1600, e = 2.0;
    double per_layer = 16.0 * N + 2.0 * e * N * h + 2.0 * e * N * h;
    double saved = 4.0 * (12.0 * per_layer + 6.0 * N * h) / 2.0;
    double got = a.stages[0].memory.bytes[PT_MEMORY_ACTIVATIONS] -
                 b.stages[0].memory.bytes[PT_MEMORY_ACTIVATIONS];
    if (!close_to(got, saved, 1e-12))
        fail_msg("saved %.0f bytes, expected %.0f", got, saved);
    assert_true(b.stages[1].send_s < a.stages[1].send_s);
    assert_true(b.step_time_s <= a.step_time_s);
    estimate_free(&a);
    estimate_free(&b);
    fixture_close(&f);
}

/* The backward of a layer under sequence parallelism in Partita's
 * executor: the two norm outputs gathered again for the weight
 * gradients, the group's sum of the norms' gradients (4 h floats) and
 * the shard's rows copied into the gathered buffer (2 each pass, 4 bytes
 * a value moved); under Megatron's runtime none of it (its gather hides
 * under the input gradient's product). */
static void sequence_parallel_backward_gathers_again(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    fixture f;
    assert_int_equal(fixture_open(&f, &m, 2, 0), 0);
    f.cm.profiles[0].layer_times_include_tp_comm = false;
    parallel_config plain = config_of(16, 2, 2, 1, 4);
    plain.runtime = RUNTIME_PARTITA;
    parallel_config sp = plain;
    sp.sequence_parallel = true;
    pt_error err = {{0}};
    type_costs a, b;
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &plain, &a, &err), 0);
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &sp, &b, &err), 0);
    double bytes = 2.0 * 1024 * 1600 * 2.0;
    link_spec intra = f.cluster.types[0].intra_node;
    double gather = costmodel_all_gather_seconds(&f.cm, bytes, 2, 0, intra);
    double sum = allreduce_time(4.0 * 1600 * 4.0, 2, intra);
    double copies = 2.0 * 2.0 * bytes / 2.0 * a.stream_s_per_byte;
    double tp = b.tp_allreduce_s - a.tp_allreduce_s;
    assert_true(close_to(b.layer_forward_s - a.layer_forward_s,
                         2.0 * tp + copies, 1e-9));
    assert_true(close_to(b.layer_backward_s - a.layer_backward_s,
                         2.0 * tp + 2.0 * gather + sum + copies, 1e-9));
    plain.runtime = sp.runtime = RUNTIME_MEGATRON;
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &plain, &a, &err), 0);
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &sp, &b, &err), 0);
    assert_true(close_to(b.layer_backward_s - a.layer_backward_s,
                         2.0 * (b.tp_allreduce_s - a.tp_allreduce_s), 1e-9));
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_chunk_is_the_plain_1f1b),
        cmocka_unit_test(uniform_pipeline_bubble_shrinks_by_v),
        cmocka_unit_test(one_microbatch_pays_every_chunk_send),
        cmocka_unit_test(warmup_and_in_flight_follow_megatron),
        cmocka_unit_test(estimate_interleaves),
        cmocka_unit_test(sequence_parallel_prices_and_saves),
        cmocka_unit_test(sequence_parallel_backward_gathers_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
