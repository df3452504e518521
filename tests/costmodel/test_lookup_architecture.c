/* Property test (issue 35, item 4): a profile that holds GPT-2 layers and
 * Llama-family layers, of the same widths too, never prices a model's
 * layer by another architecture's measurements. Over random profiles
 * mixing five architectures and random models, every part's price, the
 * way it was priced and what it names are exactly those the profile
 * gives with only the shapes of the model's own architecture kept
 * (measured, other micro-batches and tp, neighbours on both sides or one;
 * else the profile's roofline, which no shape moves); and the shapes the
 * lookups pick are the model's architecture. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"
#include "fixtures.h"

/* The architectures drawn: GPT-2's; Llama's (grouped-query attention, a
 * quarter of the heads for keys and values); Llama's with one key/value
 * head a head; Qwen's (biases on q, k, v); GPT-2's with RMSNorm alone. */
#define ARCHITECTURES 5
#define TRIALS 1000

static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static int pick(uint64_t *state, int count)
{
    return (int)(next_random(state) % (uint64_t)count);
}

/* A layer of architecture `arch`, hidden h (heads of 16 channels), seq s,
 * vocabulary v; the MLP 4h wide (GELU) or 3h (SwiGLU), so that shapes of
 * one architecture are each other's neighbours. */
static model_shape layer_of(int arch, int hidden, int seq, int vocab)
{
    model_shape m = {.layers = 4, .hidden = hidden, .heads = hidden / 16,
                     .ffn_hidden = 4 * hidden, .seq = seq, .vocab = vocab,
                     .tied_embeddings = true};
    snprintf(m.name, sizeof m.name, "arch%d-h%d", arch, hidden);
    if (arch == 0)
        return m;
    m.norm = MODEL_NORM_RMSNORM;
    if (arch == 4)
        return m;
    m.mlp = MODEL_MLP_SWIGLU;
    m.ffn_hidden = 3 * hidden;
    m.positions = MODEL_POSITIONS_ROPE;
    m.rope_base = 10000.0;
    m.bias = arch == 3 ? MODEL_BIAS_QKV : MODEL_BIAS_NONE;
    m.kv_heads = arch == 2 ? m.heads : m.heads / 4;
    return m;
}

static int architecture_of(const model_shape *m)
{
    for (int arch = 0; arch < ARCHITECTURES; arch++) {
        model_shape probe = layer_of(arch, m->hidden, m->seq, m->vocab);
        profile_shape key = profile_shape_of_model(&probe);
        if (profile_shape_same_architecture(&key, m))
            return arch;
    }
    return -1;
}

/* A shape of the profile: points at tp 1 and most of 2 and 4 (those the
 * heads and key/value heads allow) and micro-batches 1, 2, 4; its times grow with
 * the work and carry the architecture in a factor of their own, so that
 * a price taken from another architecture could not come out equal. */
static void add_shape(profile *p, const model_shape *m, int arch,
                      uint64_t *state)
{
    profile_shape *shape = &p->shapes[p->shape_count++];
    *shape = profile_shape_of_model(m);
    shape->points = calloc(9, sizeof *shape->points);
    double work = model_layer_forward_flops(m, 1.0);
    double arch_factor = 1.0 + 0.37 * arch;
    double noise = 1.0 + 0.05 * pick(state, 7);
    for (int t = 1; t <= 4; t *= 2) {
        /* some tp left out, so that a model's architecture may lack the
           tp another architecture holds */
        if (m->heads % t != 0 || model_kv_heads(m) % t != 0 ||
            (t > 1 && pick(state, 3) == 0))
            continue;
        for (int b = 1; b <= 4; b *= 2) {
            profile_point *pt = &shape->points[shape->point_count++];
            double scale = arch_factor * noise * b / t;
            pt->tp = t;
            pt->mbs = b;
            pt->layer = (part_cost){work * 1e-12 * scale,
                                    2.1 * work * 1e-12 * scale, 0, 0};
            pt->embedding = (part_cost){1e-5 * m->hidden / 64.0 * scale,
                                        2e-5 * m->hidden / 64.0 * scale, 0,
                                        0};
            pt->head = (part_cost){3e-5 * m->hidden / 64.0 * scale,
                                   6e-5 * m->hidden / 64.0 * scale, 0, 0};
        }
    }
}

/* A measured profile with a roofline (it prices what no shape does, and
 * no shape moves it) and up to 10 shapes of random architectures and
 * widths. */
static void random_profile(profile *p, uint64_t *state)
{
    *p = (profile){
        .gpu = "MIXED", .memory_gib = 80.0, .source = PROFILE_MEASURED,
        .provenance = json_pack("{s:s}", "test", "random"),
        .mbs_scaling = MBS_SCALING_MEASURED, .workspace_gib = 1.0,
        .optimizer_s_per_param = 1e-11, .peak_tflops = 989.0,
        .memory_bandwidth_GBps = 4800.0, .sms = 132,
        .roofline = {true, 0.7, 1e7, 0.8, 0.6, 5e-6, 0.5},
        .shapes = calloc(10, sizeof(profile_shape))};
    int count = 1 + pick(state, 10);
    static const int hiddens[] = {64, 128, 192, 256, 320};
    for (int i = 0; i < count; i++) {
        int arch = pick(state, ARCHITECTURES);
        model_shape m = layer_of(arch, hiddens[pick(state, 5)],
                                 32 << pick(state, 2), 100);
        if (profile_find_shape(p, &m) >= 0)
            continue; /* one shape a key */
        add_shape(p, &m, arch, state);
    }
}

/* p with only the shapes of the model's architecture. */
static void same_architecture_only(const profile *p, const model_shape *m,
                                   profile *out)
{
    pt_error err = {{0}};
    if (profile_copy(out, p, &err) != 0)
        fail_msg("%s", err.message);
    int kept = 0;
    for (int i = 0; i < out->shape_count; i++) {
        if (profile_shape_same_architecture(&out->shapes[i], m))
            out->shapes[kept++] = out->shapes[i];
        else
            free(out->shapes[i].points);
    }
    out->shape_count = kept;
}

static void price(const profile *p, const model_shape *m,
                  const parallel_config *config, pricing_entry out[3])
{
    cluster c = one_node_cluster(p->gpu, 8);
    costmodel cm;
    pt_error err = {{0}};
    if (costmodel_open_with_profiles(&cm, m, &c, p, &err) != 0 ||
        costmodel_pricing(&cm, 0, config, out, &err) != 0)
        fail_msg("%s", err.message);
    costmodel_close(&cm);
    cluster_free(&c);
}

typedef struct tally {
    int by_method[PRICE_EFFICIENCY + 1];
    int other_architecture_same_widths;
    int llama_measured;
} tally;

static void one_trial(uint64_t *state, tally *t)
{
    profile full, own;
    random_profile(&full, state);
    static const int hiddens[] = {64, 128, 192, 256, 320};
    int arch = pick(state, ARCHITECTURES);
    model_shape m = layer_of(arch, hiddens[pick(state, 5)],
                             32 << pick(state, 2), 100);
    /* the lookups pick the model's architecture only */
    const profile_shape *held = lookup_held_shape(&full, &m);
    if (held != NULL)
        assert_true(profile_shape_same_architecture(held, &m));
    for (int i = 0; i < full.shape_count; i++)
        if (profile_shape_prices(&full.shapes[i], &m))
            assert_ptr_equal(held, &full.shapes[i]);
        else if (full.shapes[i].hidden == m.hidden &&
                 full.shapes[i].seq == m.seq)
            t->other_architecture_same_widths++;
    int tps[] = {1, 2, 4, 8};
    int tp = tps[pick(state, 4)];
    while (m.heads % tp != 0 || model_kv_heads(&m) % tp != 0)
        tp /= 2;
    shape_neighbours near;
    if (lookup_shape_neighbours(&full, &m, tp, &near)) {
        assert_true(profile_shape_same_architecture(near.a, &m));
        if (near.b != NULL)
            assert_true(profile_shape_same_architecture(near.b, &m));
    }
    /* and every price is what the model's own architecture alone gives */
    same_architecture_only(&full, &m, &own);
    parallel_config config = config_of(8, 1 << pick(state, 4), tp, 1, 1);
    pricing_entry from_full[3], from_own[3];
    price(&full, &m, &config, from_full);
    price(&own, &m, &config, from_own);
    for (int part = 0; part < 3; part++) {
        assert_int_equal(from_full[part].method, from_own[part].method);
        assert_true(from_full[part].forward_s == from_own[part].forward_s);
        assert_true(from_full[part].backward_s == from_own[part].backward_s);
        assert_string_equal(from_full[part].how, from_own[part].how);
    }
    t->by_method[from_full[1].method]++;
    if (arch != 0 && from_full[1].method == PRICE_MEASURED)
        t->llama_measured++;
    profile_free(&full);
    profile_free(&own);
}

static void lookups_never_mix_architectures(void **state)
{
    (void)state;
    uint64_t seed = 0x5eed35u;
    tally t = {{0}, 0, 0};
    for (int trial = 0; trial < TRIALS; trial++)
        one_trial(&seed, &t);
    printf("layer priced: measured %d, other micro-batch %d, other tp %d, "
           "interpolated %d, extrapolated %d, roofline %d; %d shapes of "
           "another architecture at the model's widths; %d Llama-family "
           "layers measured\n",
           t.by_method[PRICE_MEASURED], t.by_method[PRICE_MICROBATCH],
           t.by_method[PRICE_TP_SCALED], t.by_method[PRICE_INTERPOLATED],
           t.by_method[PRICE_EXTRAPOLATED], t.by_method[PRICE_ROOFLINE],
           t.other_architecture_same_widths, t.llama_measured);
    /* not vacuous: each way of pricing was met, and shapes of another
       architecture stood at the model's widths */
    assert_true(t.by_method[PRICE_MEASURED] > 0);
    assert_true(t.by_method[PRICE_INTERPOLATED] > 0);
    assert_true(t.by_method[PRICE_ROOFLINE] > 0);
    assert_true(t.other_architecture_same_widths > 20);
    assert_true(t.llama_measured > 10);
}

/* A profile without a roofline prices a shape it lacks by the efficiency
 * its own architecture's measured layers reach (every shape's when it
 * holds none of it): a GPT-2 layer at half the peak and a Llama layer at
 * a quarter price a GPT-2 and a Llama model of other vocabularies (no
 * neighbours) at those rates. */
static void efficiency_of_the_models_own_architecture(void **state)
{
    (void)state;
    uint64_t seed = 35;
    profile p;
    random_profile(&p, &seed);
    for (int i = 0; i < p.shape_count; i++)
        free(p.shapes[i].points);
    p.shape_count = 0;
    p.roofline.present = false;
    p.flops_efficiency = 0.0;
    const double rates[2] = {0.5, 0.25};
    for (int arch = 0; arch < 2; arch++) {
        model_shape m = layer_of(arch, 128, 64, 100);
        add_shape(&p, &m, arch, &seed);
        profile_shape *shape = &p.shapes[p.shape_count - 1];
        for (int i = 0; i < shape->point_count; i++) {
            profile_point *pt = &shape->points[i];
            pt->layer.forward_s = model_layer_forward_flops(&m, pt->mbs) /
                                  pt->tp / (rates[arch] * 989e12);
        }
    }
    parallel_config config = config_of(8, 1, 1, 1, 1);
    for (int arch = 0; arch < 2; arch++) {
        model_shape other = layer_of(arch, 256, 64, 200);
        pricing_entry entries[3];
        price(&p, &other, &config, entries);
        assert_int_equal(entries[1].method, PRICE_EFFICIENCY);
        char want[64];
        snprintf(want, sizeof want, "x %.3f efficiency", rates[arch]);
        if (strstr(entries[1].how, want) == NULL)
            fail_msg("architecture %d: \"%s\" lacks \"%s\"", arch,
                     entries[1].how, want);
    }
    /* a third architecture the profile lacks: every shape's mean */
    model_shape qwen = layer_of(3, 256, 64, 200);
    pricing_entry entries[3];
    price(&p, &qwen, &config, entries);
    assert_non_null(strstr(entries[1].how, "x 0.375 efficiency"));
    profile_free(&p);
}

/* The architectures drawn are told apart by the key. */
static void architectures_are_distinct(void **state)
{
    (void)state;
    for (int a = 0; a < ARCHITECTURES; a++) {
        model_shape m = layer_of(a, 128, 64, 100);
        assert_int_equal(architecture_of(&m), a);
        assert_int_equal(model_is_gpt(&m), a == 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(architectures_are_distinct),
        cmocka_unit_test(lookups_never_mix_architectures),
        cmocka_unit_test(efficiency_of_the_models_own_architecture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
