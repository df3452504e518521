/* ZeRO-2, ZeRO-3 and optimizer offload in the cost model (costmodel/
 * zero.c, docs/cost-model.md section 11), against their closed forms:
 * at dp 1 they change nothing; ZeRO-2 divides the gradients by dp and
 * adds two units in flight, ZeRO-3 the weights and their copy too;
 * offload takes AdamW's moments off the device and prices the step at
 * the host link and the CPU's rate; each unit's
 * gather and reduce-scatter pace its forward and backward when the dp
 * link is slow, a pass waits for its first gathers and for what the last
 * backward left on the units' stream, shared out as the schedule
 * orders the passes, and gathers nothing the pass before left held
 * (the executor's rule: test_zero_gathers.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fixtures.h"

static estimate estimate_of(fixture *f, parallel_config config,
                            const int *partition)
{
    estimate e;
    pt_error err = {{0}};
    int order[1] = {0};
    if (costmodel_estimate(&f->cm, &config, order, 1, partition, false, &e,
                           &err) != 0)
        fail_msg("%s", err.message);
    return e;
}

/* GPT-2 XL on one node of 4 A100s, pp 1. */
static void open_one_node(fixture *f, double intra_GBps)
{
    model_shape model = gpt2_xl();
    assert_int_equal(fixture_open(f, &model, 1, 0), 0);
    f->cluster.types[0].intra_node = link_of(intra_GBps, 5.0);
}

static void zero_at_dp_1_is_plain(void **state)
{
    (void)state;
    fixture f;
    open_one_node(&f, 230.0);
    f.cluster.types[0].gpus = 1;
    int partition[1] = {48};
    parallel_config plain = config_of(8, 1, 1, 1, 1);
    estimate base = estimate_of(&f, plain, partition);
    for (int zero = 1; zero <= 3; zero++) {
        parallel_config config = plain;
        parallel_set_zero_stage(&config, zero);
        estimate e = estimate_of(&f, config, partition);
        assert_true(e.step_time_s == base.step_time_s);
        assert_true(e.stages[0].peak_memory_bytes ==
                    base.stages[0].peak_memory_bytes);
        estimate_free(&e);
    }
    estimate_free(&base);
    fixture_close(&f);
}

static void sharded_memory_terms(void **state)
{
    (void)state;
    model_shape m = gpt2_xl();
    parallel_config plain = config_of(8, 1, 1, 4, 1);
    stage_memory base, z2, z3, off;
    costmodel_stage_memory(&m, &plain, 0, 0.0, &base);
    parallel_config config = plain;
    parallel_set_zero_stage(&config, 1);
    stage_memory z1;
    costmodel_stage_memory(&m, &config, 0, 0.0, &z1);
    parallel_set_zero_stage(&config, 2);
    costmodel_stage_memory(&m, &config, 0, 0.0, &z2);
    parallel_set_zero_stage(&config, 3);
    costmodel_stage_memory(&m, &config, 0, 0.0, &z3);
    config.offload_optimizer = true;
    costmodel_stage_memory(&m, &config, 0, 0.0, &off);
    /* the units of the one stage as the cuda executor holds them: the
     * embeddings (V + s) h, a layer, the head's final norm (its matrix is
     * the tied embedding); the head's 47 padding rows (V rounded up to
     * 50,304); the shard's fixed part the embeddings and the norm over 4,
     * with a run's 64 floats and one */
    double h = 1600.0, layer = model_layer_parameter_count(&m);
    double embedding = (50257.0 + 1024.0) * h, head = 2.0 * h;
    double pad = 47.0 * h, units = embedding + 2.0 * layer + head;
    double shard = (embedding + head) / 4.0 + 65.0;
    const pt_memory_term G = PT_MEMORY_GRADIENTS, W = PT_MEMORY_WEIGHTS,
                         M = PT_MEMORY_WEIGHT_MIRROR, O = PT_MEMORY_OPTIMIZER;
    /* ZeRO-2: the gradients' shard and the units with the padding */
    assert_true(close_to(z2.fixed.bytes[G],
                         4.0 * shard + 4.0 * (units + pad + 1.0), 1e-12));
    assert_true(close_to(z2.per_layer.bytes[G], base.per_layer.bytes[G] / 4.0,
                         1e-12));
    assert_true(z2.fixed.bytes[W] == base.fixed.bytes[W]);
    assert_true(z2.fixed.bytes[O] == z1.fixed.bytes[O]);
    /* ZeRO-3: the weights likewise, the bf16 copies of the units only,
     * the units' tables for the table of every parameter */
    assert_true(close_to(z3.fixed.bytes[W], 4.0 * shard + 4.0 * (units + 1.0),
                         1e-12));
    assert_true(close_to(z3.per_layer.bytes[W], base.per_layer.bytes[W] / 4.0,
                         1e-12));
    assert_true(close_to(z3.fixed.bytes[M], 2.0 * (units + pad + 1.0),
                         1e-12));
    assert_true(z3.per_layer.bytes[M] == 0.0);
    assert_true(z3.per_layer.bytes[O] < z1.per_layer.bytes[O]);
    /* offload: no AdamW moments on the device (the chunk tables stay, as
     * do the fp32 weights, the backend's working copy) */
    double layer_params = model_layer_parameter_count(&m);
    assert_true(close_to(z3.per_layer.bytes[O] - off.per_layer.bytes[O],
                         8.0 * layer_params / 4.0, 1e-9));
    assert_true(off.per_layer.bytes[O] > 0.0);
    assert_true(off.per_layer.bytes[W] == z3.per_layer.bytes[W]);
    assert_true(off.per_layer.bytes[G] == z3.per_layer.bytes[G]);
    /* the host holds 12 bytes a parameter of the rank's shard */
    double params = stage_parameters_per_gpu(&m, &config, 0, 48);
    assert_true(close_to(costmodel_offload_host_bytes(&m, &config, 0, 48),
                         12.0 * params / 4.0, 1e-12));
}

static void offload_prices_the_host_step(void **state)
{
    (void)state;
    fixture f;
    open_one_node(&f, 230.0);
    int partition[1] = {48};
    parallel_config config = config_of(8, 1, 1, 4, 1);
    parallel_set_zero_stage(&config, 2);
    config.offload_optimizer = true;
    /* fp32 gradients down, fp32 weights up, the host's AdamW */
    double per_param = 8.0 / 25e9 + 1.0 / 1.08e9;
    assert_true(close_to(costmodel_offload_s_per_param(&config, 0.0, 0.0),
                         per_param, 1e-12));
    /* a profile that measured its host's AdamW is priced at that rate,
     * one that measured its link's copies at theirs */
    assert_true(close_to(costmodel_offload_s_per_param(&config, 2e-9, 0.0),
                         8.0 / 25e9 + 2e-9, 1e-12));
    assert_true(close_to(costmodel_offload_s_per_param(&config, 2e-9, 1.6e-10),
                         1.6e-10 + 2e-9, 1e-12));
    /* the GPU's own memory-bound work (the gradient norm, the slices'
     * sums and ZeRO's unit kernels) stays at its streaming rate */
    type_costs offloaded, on_gpu;
    pt_error err = {{0}};
    parallel_config plain = config;
    plain.offload_optimizer = false;
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &config, &offloaded,
                                          &err), 0);
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &plain, &on_gpu, &err),
                     0);
    assert_true(close_to(offloaded.optimizer_s_per_param, per_param, 1e-12));
    assert_true(offloaded.stream_s_per_byte == on_gpu.stream_s_per_byte);
    assert_true(close_to(on_gpu.stream_s_per_byte,
                         on_gpu.optimizer_s_per_param / 30.0, 1e-12));
    estimate e = estimate_of(&f, config, partition);
    double held = stage_parameters_per_gpu(&f.model, &config, 0, 48) / 4.0;
    assert_true(close_to(e.stages[0].optimizer_s, held * per_param, 1e-12));
    estimate_free(&e);
    fixture_close(&f);
}

/* ZeRO-3's work on the units' stream for a unit of `params` on separate
 * GPUs: the gather is the transfer, the rank's part copied (8 / d bytes
 * a parameter) and the conversion to bf16 (6); the reduce the transfer
 * and the add into the shard (12 / d). */
static double gather_of(double params, int dp, link_spec link, double s)
{
    return reduce_scatter_time(4.0 * params, dp, link) +
           (8.0 / dp + 6.0) * params * s;
}

static double reduce_of(double params, int dp, link_spec link, double s)
{
    return reduce_scatter_time(4.0 * params, dp, link) +
           12.0 / dp * params * s;
}

static type_costs costs_of(fixture *f, const parallel_config *config)
{
    type_costs costs;
    pt_error err = {{0}};
    assert_int_equal(costmodel_type_costs(&f->cm, 0, config, &costs, &err),
                     0);
    return costs;
}

/* What a first stage's backward of GPT-2 XL leaves on the units' stream:
 * the embeddings' reduce, and the first layer's where it outlasts the
 * embeddings' backward. */
static double first_stage_backlog(const fixture *f, const type_costs *costs,
                                  int dp, link_spec link)
{
    double s = costs->stream_s_per_byte;
    double layer = model_layer_parameter_count(&f->model);
    double embedding = (50257.0 + 1024.0) * 1600.0;
    return reduce_of(embedding, dp, link, s) +
           fmax(0.0, reduce_of(layer, dp, link, s) -
                         costs->embedding_backward_s);
}

/* On a slow dp link, ZeRO-3's forward of a layer is the next layer's
 * gather and its backward that and the last layer's reduce. The step's
 * first forward waits for its first unit's gather (the embeddings, then
 * the first layer behind the embeddings' compute); a forward after a
 * backward (m - 1 of m at pp 1) finds the embeddings, the first two
 * layers and the head held, and the third layer's gather waits behind
 * that backward's last reduces (the backlog) where they outlast the
 * first two units' compute; a backward after a forward finds the tied
 * head's embeddings, the head and the last two layers held, the third
 * layer's gather behind the head's and the last layer's reduces.
 * ZeRO-2 only reduces. */
static void slow_link_paces_every_unit(void **state)
{
    (void)state;
    fixture f;
    open_one_node(&f, 0.05);
    link_spec link = f.cluster.types[0].intra_node;
    int partition[1] = {48};
    parallel_config config = config_of(12, 1, 1, 4, 1); /* m = 3 */
    type_costs costs = costs_of(&f, &config);
    double s = costs.stream_s_per_byte;
    double layer = model_layer_parameter_count(&f.model);
    double embedding = (50257.0 + 1024.0) * 1600.0, head = 2.0 * 1600.0;
    double gather_layer = gather_of(layer, 4, link, s);
    double reduce_layer = reduce_of(layer, 4, link, s);
    double gather_embedding = gather_of(embedding, 4, link, s);
    double reduce_embedding = reduce_scatter_time(4.0 * embedding, 4, link);
    double reduce_head = reduce_of(head, 4, link, s);
    assert_true(gather_layer > costs.layer_backward_s);
    assert_true(gather_layer > costs.head_backward_s);
    assert_true(gather_layer > costs.embedding_forward_s);
    assert_true(reduce_layer > costs.layer_backward_s);
    assert_true(reduce_head < reduce_layer);

    parallel_set_zero_stage(&config, 3);
    estimate e = estimate_of(&f, config, partition);
    double backlog = first_stage_backlog(&f, &costs, 4, link);
    double c_e = costs.embedding_forward_s, c_f = costs.layer_forward_s;
    /* the first forward: every unit gathered (the head's gather hidden
     * under the last layer's term) */
    double first_forward = gather_embedding + gather_layer +
                           48.0 * gather_layer + costs.head_forward_s;
    /* a forward after a backward: the embeddings and the first two
     * layers computed as they come, the third's gather behind the
     * backlog, 45 layers against the next one's gather, the last
     * against the held head */
    double later_forward = c_e + c_f +
                           fmax(0.0, backlog - c_e - c_f) + gather_layer +
                           45.0 * gather_layer + c_f +
                           costs.head_forward_s;
    double forward = (first_forward + 2.0 * later_forward) / 3.0;
    /* every backward follows a forward: the head computed as it comes
     * (the gathers at its start and the last layer's behind it held);
     * the two held layers' gathers are worth more on this link than the
     * pass's start, the most a pass saves (the stage terms' fixed part),
     * so the 48 layers stay priced against a gather and a reduce; the
     * stream gradient widened for the embedding */
    double backward = costs.head_backward_s +
                      48.0 * (gather_layer + reduce_layer) +
                      costs.embedding_backward_s + costs.boundary_s;
    assert_true(close_to(e.stages[0].forward_s, forward, 1e-9));
    assert_true(close_to(e.stages[0].backward_s, backward, 1e-9));
    /* after the backward: the embedding's reduce-scatter, no gather */
    assert_true(close_to(e.stages[0].dp_allreduce_s, reduce_embedding, 1e-9));
    estimate_free(&e);

    parallel_set_zero_stage(&config, 2);
    e = estimate_of(&f, config, partition);
    double collective_layer = reduce_scatter_time(4.0 * layer, 4, link);
    double collective_head = reduce_scatter_time(4.0 * head, 4, link);
    assert_true(close_to(e.stages[0].forward_s,
                         48.0 * costs.layer_forward_s +
                             costs.embedding_forward_s + costs.head_forward_s,
                         1e-9));
    assert_true(close_to(e.stages[0].backward_s,
                         48.0 * fmax(costs.layer_backward_s,
                                     collective_layer) +
                             costs.embedding_backward_s +
                             fmax(costs.head_backward_s, collective_head) +
                             costs.boundary_s,
                         1e-9));
    /* ZeRO-2 still gathers the updated weights once, as ZeRO-1: the fp32
     * master copy the executor gathers, 4 bytes a parameter */
    double params = stage_parameters_per_gpu(&f.model, &config, 0, 48);
    assert_true(close_to(e.stages[0].dp_allreduce_s,
                         reduce_embedding +
                             reduce_scatter_time(4.0 * params, 4, link) +
                             mirror_rebuild_s(params, f.cm.profiles[0]
                                                          .optimizer_s_per_param),
                         1e-9));
    estimate_free(&e);
    fixture_close(&f);
}

/* The schedule orders the passes, and the executor keeps what the pass
 * before gathered: at pp 2 with 4 micro-batches the first stage's 1F1B
 * runs F F B F B F B B (two forwards after a backward, one after a
 * forward; three backwards after a forward, one after a backward), GPipe
 * F F F F B B B B. A forward after a forward finds the embeddings held;
 * one after a backward the first two layers too, the third layer's
 * gather behind the backlog (what the units' stream still holds of that
 * backward's reduces); a backward after a forward the last two layers,
 * one after a backward none and the backlog ahead of its first gather.
 * The last stage runs F B F B F B F B under 1F1B: its forwards after a
 * backward find the head and the first two layers, under GPipe its
 * forwards after a forward the head only (its gather larger than a
 * layer's: the untied head's matrix at pp 2). A pass saves at most
 * what its price holds beyond its layers' terms. */
static void backlog_follows_the_schedule(void **state)
{
    (void)state;
    fixture f;
    open_one_node(&f, 0.05);
    link_spec link = f.cluster.types[0].intra_node;
    int partition[2] = {24, 24};
    parallel_config config = config_of(8, 1, 1, 2, 2); /* m = 4 */
    type_costs costs = costs_of(&f, &config);
    double backlog = first_stage_backlog(&f, &costs, 2, link);
    parallel_set_zero_stage(&config, 3);
    estimate one_f_one_b = estimate_of(&f, config, partition);
    config.schedule = SCHEDULE_GPIPE;
    estimate gpipe = estimate_of(&f, config, partition);
    const stage_estimate *a = &one_f_one_b.stages[0], *b = &gpipe.stages[0];
    double s = costs.stream_s_per_byte;
    double layer = model_layer_parameter_count(&f.model);
    double head = (50257.0 + 2.0) * 1600.0;
    double gather_layer = gather_of(layer, 2, link, s);
    double gather_head = gather_of(head, 2, link, s);
    double reduce_layer = reduce_of(layer, 2, link, s);
    double c_e = costs.embedding_forward_s, c_f = costs.layer_forward_s;
    double c_b = costs.layer_backward_s;
    assert_true(gather_head > gather_layer);
    assert_true(reduce_layer > c_b);
    assert_true(close_to(a->forward_s - b->forward_s,
                         (c_e + c_f + fmax(0.0, backlog - c_e - c_f) -
                          2.0 * gather_layer) / 2.0,
                         1e-9));
    /* every backward finds the embeddings held, and saves no more than
     * their gather (its ends' part) after a forward or after a backward,
     * so the schedules' backwards differ by the backlog's shares */
    assert_true(close_to(b->backward_s - a->backward_s, 2.0 / 4.0 * backlog,
                         1e-9));
    /* the last stage: a forward after a backward saves the most a pass
     * may (its lead, the head's gather, the backlog: the two held
     * layers' gathers are worth more than the backlog adds to the
     * third's on this link), one after a forward its head's gather and
     * the last layer's term against it (it gathers no head) less that
     * layer's compute: 1F1B's forwards come out shorter by 3/4 of it */
    double tail = reduce_layer + fmax(0.0, reduce_layer - c_b);
    assert_true(2.0 * gather_layer - 2.0 * c_f - fmax(0.0, tail - c_f) >
                0.0);
    assert_true(close_to(one_f_one_b.stages[1].forward_s -
                             gpipe.stages[1].forward_s,
                         -3.0 / 4.0 * c_f, 1e-9));
    estimate_free(&one_f_one_b);
    estimate_free(&gpipe);
    fixture_close(&f);
}

/* What the held units save never takes a pass below its compute: on
 * stages of 0 to 5 layers (first or last of pp 2), tied and untied,
 * both schedules, slow and fast links, ZeRO-3's forward and backward
 * together are at least ZeRO-1's (which runs no collective during them;
 * its fused head moves work from the backward into the forward). */
static void held_units_keep_the_compute(void **state)
{
    (void)state;
    const double links[2] = {0.05, 230.0};
    for (int l = 0; l < 4; l++) {
        fixture f;
        model_shape model = gpt2_xl();
        model.tied_embeddings = l % 2 == 0;
        assert_int_equal(fixture_open(&f, &model, 1, 0), 0);
        f.cluster.types[0].intra_node = link_of(links[l / 2], 5.0);
        for (int small = 0; small <= 1; small++)
            for (int gpipe = 0; gpipe <= 1; gpipe++)
                for (int layers = 0; layers <= 5; layers++) {
                    int partition[2] = {small ? layers : 48 - layers,
                                        small ? 48 - layers : layers};
                    const int pp = 2;
                    parallel_config config = config_of(8, 1, 1, 2, pp);
                    config.schedule =
                        gpipe ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
                    parallel_set_zero_stage(&config, 1);
                    estimate one = estimate_of(&f, config, partition);
                    parallel_set_zero_stage(&config, 3);
                    estimate three = estimate_of(&f, config, partition);
                    for (int s = 0; s < pp; s++) {
                        const stage_estimate *a = &one.stages[s];
                        const stage_estimate *b = &three.stages[s];
                        if (b->forward_s + b->backward_s <
                            a->forward_s + a->backward_s - 1e-12)
                            fail_msg("link %d small %d gpipe %d layers %d "
                                     "stage %d: ZeRO-3 %.9g / %.9g s, "
                                     "ZeRO-1 %.9g / %.9g s",
                                     l, small, gpipe, layers, s,
                                     b->forward_s, b->backward_s,
                                     a->forward_s, a->backward_s);
                    }
                    estimate_free(&one);
                    estimate_free(&three);
                }
        fixture_close(&f);
    }
}

/* On slices of one GPU (every device entry index 0) the units'
 * collectives run their kernels in the rank's own SMs: a gather 14 bytes
 * a parameter, a reduce-scatter and its add 4 (1 + 4 / d), at the
 * profile's streaming rate (its AdamW step over 30 bytes a parameter),
 * and the exchange kernel bounds each transfer from below; they
 * lengthen the stage's forward (ZeRO-3) and backward, by at most those
 * bytes over the stage's parameters; on separate GPUs they do not. */
static void unit_kernels_take_the_slices_sms(void **state)
{
    (void)state;
    fixture f;
    open_one_node(&f, 230.0);
    int partition[1] = {48};
    parallel_config config = config_of(8, 1, 1, 4, 1);
    double params = stage_parameters_per_gpu(&f.model, &config, 0, 48);
    type_costs costs;
    pt_error err = {{0}};
    assert_int_equal(costmodel_type_costs(&f.cm, 0, &config, &costs, &err), 0);
    for (int zero = 2; zero <= 3; zero++) {
        parallel_set_zero_stage(&config, zero);
        estimate apart = estimate_of(&f, config, partition);
        node_type *type = &f.cluster.types[0];
        type->device_count = 4;
        for (int i = 0; i < 4; i++)
            type->devices[i] = (device_spec){.index = 0, .sm_limit = 32};
        estimate sliced = estimate_of(&f, config, partition);
        type->device_count = 0;
        double gather = zero >= 3 ? 14.0 * params * costs.stream_s_per_byte
                                  : 0.0;
        double reduce = 4.0 * (1.0 + 4.0 / 4.0) * params *
                        costs.stream_s_per_byte;
        const stage_estimate *a = &apart.stages[0], *b = &sliced.stages[0];
        if (zero >= 3)
            assert_true(b->forward_s > a->forward_s);
        else
            assert_true(b->forward_s == a->forward_s);
        assert_true(b->forward_s <= a->forward_s + gather + 1e-12);
        assert_true(b->backward_s > a->backward_s);
        assert_true(b->backward_s <=
                    a->backward_s + gather + reduce + 1e-12);
        estimate_free(&apart);
        estimate_free(&sliced);
    }
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(zero_at_dp_1_is_plain),
        cmocka_unit_test(sharded_memory_terms),
        cmocka_unit_test(offload_prices_the_host_step),
        cmocka_unit_test(slow_link_paces_every_unit),
        cmocka_unit_test(backlog_follows_the_schedule),
        cmocka_unit_test(held_units_keep_the_compute),
        cmocka_unit_test(unit_kernels_take_the_slices_sms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
