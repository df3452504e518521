/* The per-kernel roofline (costmodel/roofline.c): its shape, its fit on
 * profiles made from known parameters (full and SM-limited GPUs), the
 * committed derived profiles (each reproduces the profiles it was fitted
 * on within the error it states, and is what a fit on them gives today),
 * and the cost model pricing any shape through a derived profile. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>

#include "fixtures.h"

static const char *const derived_gpus[] = {"A10", "RTX3090", "A100-40GB",
                                           "A100-80GB", "V100-16GB",
                                           "V100-32GB"};
#define DERIVED_COUNT 6

static model_shape shape_of(int hidden, int heads, int seq, int vocab)
{
    model_shape m = {.layers = 1, .hidden = hidden, .heads = heads,
                     .ffn_hidden = 4 * hidden, .seq = seq, .vocab = vocab,
                     .tied_embeddings = true};
    return m;
}

static void large_gemms_approach_the_peak(void **state)
{
    (void)state;
    roofline_params p = known_roofline_params();
    p.kernel_overhead_s = 0.0;
    roofline_device device = h200_device(132);
    model_part_costs costs;
    /* a wide layer: its time is close to FLOPs / (peak x efficiency) */
    model_shape wide = shape_of(12288, 96, 2048, 50257);
    roofline_part_costs(&p, &device, &wide, (roofline_shard){1, 4, 2.0, false, 4.0, true, true}, &costs);
    double h = 12288, tokens = 4.0 * 2048;
    double flops = 2.0 * tokens * (4.0 * h * h + 2.0 * h * 4.0 * h) +
                   4.0 * 4 * 2048.0 * 2048 * h;
    double ideal = flops / (989e12 * 0.75);
    assert_true(costs.layer.forward_s > ideal);
    assert_true(costs.layer.forward_s < 1.1 * ideal);
    /* backward GEMMs do twice the FLOPs: a little more than 2x overall
       (flash attention's backward does 2.5x its forward) */
    double ratio = costs.layer.backward_s / costs.layer.forward_s;
    assert_true(ratio > 2.0 && ratio < 2.2);
    /* the embedding is memory bound: 3 b s h x 2 bytes */
    double embedding_bytes = 3.0 * 4 * 2048 * 12288 * 2.0;
    assert_true(close_to(costs.embedding.forward_s,
                         embedding_bytes / (4800e9 * 0.85), 1e-12));
}

static void small_work_pays_overheads_and_ramps(void **state)
{
    (void)state;
    roofline_params p = known_roofline_params();
    roofline_device device = h200_device(132);
    model_shape small = shape_of(768, 12, 1024, 50257);
    model_part_costs one, sixteen, tp_two;
    roofline_part_costs(&p, &device, &small, (roofline_shard){1, 1, 2.0, false, 4.0, true, true}, &one);
    roofline_part_costs(&p, &device, &small, (roofline_shard){1, 16, 2.0, false, 4.0, true, true}, &sixteen);
    roofline_part_costs(&p, &device, &small, (roofline_shard){2, 1, 2.0, false, 4.0, true, true}, &tp_two);
    /* 16x the work costs less than 16x the time: small GEMMs reach less
       of the peak and every kernel pays its overhead */
    assert_true(sixteen.layer.forward_s > 4.0 * one.layer.forward_s);
    assert_true(sixteen.layer.forward_s < 16.0 * one.layer.forward_s);
    /* half the layer per rank at tp 2, but not half the time */
    assert_true(tp_two.layer.forward_s < one.layer.forward_s);
    assert_true(tp_two.layer.forward_s > 0.5 * one.layer.forward_s);
}

/* With a 1 s overhead every kernel shows up as a whole second. */
static void every_part_runs_its_kernels(void **state)
{
    (void)state;
    roofline_params p = known_roofline_params();
    p.kernel_overhead_s = 1.0;
    roofline_device device = h200_device(132);
    model_shape small = shape_of(768, 12, 1024, 50257);
    model_part_costs costs;
    roofline_part_costs(&p, &device, &small, (roofline_shard){2, 1, 2.0, false, 4.0, true, true}, &costs);
    /* embedding: one kernel each way */
    assert_int_equal((int)floor(costs.embedding.forward_s), 1);
    assert_int_equal((int)floor(costs.embedding.backward_s), 1);
    /* layer: 2 norms, 4 GEMMs, attention, bias + GELU, 2 bias + residual;
       backward: each GEMM twice */
    assert_int_equal((int)floor(costs.layer.forward_s), 10);
    assert_int_equal((int)floor(costs.layer.backward_s), 14);
    /* head: norm, LM head GEMM, the fused classifier; backward: the norm
       and the GEMM twice (the classifier's gradient is written in the
       forward) */
    assert_int_equal((int)floor(costs.head.forward_s), 3);
    assert_int_equal((int)floor(costs.head.backward_s), 3);
}

static void fewer_sms_are_slower(void **state)
{
    (void)state;
    roofline_params p = known_roofline_params();
    model_shape m = shape_of(1600, 16, 1024, 50257);
    model_part_costs full, forty, sixteen;
    roofline_device d = h200_device(132);
    roofline_part_costs(&p, &d, &m, (roofline_shard){1, 8, 2.0, false, 4.0, true, true}, &full);
    d = h200_device(40);
    roofline_part_costs(&p, &d, &m, (roofline_shard){1, 8, 2.0, false, 4.0, true, true}, &forty);
    d = h200_device(16);
    roofline_part_costs(&p, &d, &m, (roofline_shard){1, 8, 2.0, false, 4.0, true, true}, &sixteen);
    assert_true(forty.layer.forward_s > 2.0 * full.layer.forward_s);
    assert_true(sixteen.layer.forward_s > 2.0 * forty.layer.forward_s);
    /* 40 of 132 SMs (30%) is below the 45% that saturates bandwidth:
       the memory-bound embedding slows by 0.45 / (40 / 132) */
    assert_true(close_to(forty.embedding.forward_s - 4e-6,
                         (full.embedding.forward_s - 4e-6) * 0.45 * 132 / 40,
                         1e-9));
}

/* A measured-looking profile of one device: shapes x tp x mbs, forward
 * and backward of every part from params. */
static void synthetic_profile(profile *p, const char *gpu,
                              const roofline_params *params,
                              roofline_device device)
{
    memset(p, 0, sizeof *p);
    pt_copy_string(p->gpu, sizeof p->gpu, gpu);
    p->source = PROFILE_MEASURED;
    p->peak_tflops = device.peak_flops / 1e12;
    p->memory_bandwidth_GBps = device.bandwidth_bytes_per_s / 1e9;
    p->sms = device.sms;
    p->sm_limit = device.sms_used < device.sms ? device.sms_used : 0;
    model_shape shapes[2] = {shape_of(768, 12, 1024, 50257),
                             shape_of(2048, 16, 2048, 50257)};
    int tps[4] = {1, 2, 4, 8}, mbss[5] = {1, 2, 4, 8, 16};
    p->shape_count = 2;
    p->shapes = calloc(2, sizeof *p->shapes);
    for (int s = 0; s < 2; s++) {
        profile_shape *shape = &p->shapes[s];
        *shape = (profile_shape){.hidden = shapes[s].hidden,
                                 .heads = shapes[s].heads,
                                 .ffn_hidden = shapes[s].ffn_hidden,
                                 .seq = shapes[s].seq,
                                 .vocab = shapes[s].vocab};
        shape->point_count = 20;
        shape->points = calloc(20, sizeof *shape->points);
        for (int i = 0; i < 20; i++) {
            profile_point *pt = &shape->points[i];
            pt->tp = tps[i / 5];
            pt->mbs = mbss[i % 5];
            model_part_costs costs;
            roofline_part_costs(params, &device, &shapes[s],
                                (roofline_shard){pt->tp, pt->mbs, 2.0, false, 4.0,
                                                 true, true},
                                &costs);
            pt->embedding = costs.embedding;
            pt->layer = costs.layer;
            pt->head = costs.head;
        }
    }
}

static void fit_recovers_known_parameters(void **state)
{
    (void)state;
    roofline_params truth = known_roofline_params();
    profile sources[4];
    synthetic_profile(&sources[0], "H200", &truth, h200_device(132));
    synthetic_profile(&sources[1], "H200-40SM", &truth, h200_device(40));
    synthetic_profile(&sources[2], "H200-16SM", &truth, h200_device(16));
    synthetic_profile(&sources[3], "H100", &truth,
                      (roofline_device){989e12, 3350e9, 132, 132});
    roofline_fit_result fit;
    pt_error err = {{0}};
    if (roofline_fit(sources, 4, &fit, &err) != 0)
        fail_msg("%s", err.message);
    /* the layer's and the head's times; the embedding's are left out */
    assert_int_equal(fit.all.points, 4 * 2 * 20 * 4);
    assert_int_equal(fit.all.left_out, 4 * 2 * 20 * 2);
    /* every time within 1% (the parameters are rounded to 4 digits) */
    assert_true(fit.all.max_error < 0.01);
    assert_true(close_to(fit.params.gemm_efficiency, 0.75, 0.02));
    assert_true(close_to(fit.params.kernel_overhead_s, 4e-6, 0.05));
    assert_true(close_to(fit.params.bandwidth_saturation_sm_fraction, 0.45,
                         0.05));
    assert_string_equal(fit.sources[1].gpu, "H200-40SM");
    for (int i = 0; i < 4; i++)
        profile_free(&sources[i]);
}

static void fit_leaves_out_times_it_cannot_model(void **state)
{
    (void)state;
    roofline_params truth = known_roofline_params();
    profile source;
    synthetic_profile(&source, "H200", &truth, h200_device(132));
    /* times taken inside a real tp group hold its all-reduces; backward
       times filled in by a ratio are not measurements */
    source.layer_times_include_tp_comm = true;
    source.backward_over_forward = 2.0;
    for (int s = 0; s < source.shape_count; s++)
        for (int i = 0; i < source.shapes[s].point_count; i++) {
            profile_point *pt = &source.shapes[s].points[i];
            pt->layer.backward_s = 2.0 * pt->layer.forward_s;
        }
    roofline_observation *obs = NULL;
    int count = 0, left_out = 0;
    pt_error err = {{0}};
    assert_int_equal(roofline_observations(&truth, &source, &obs, &count,
                                           &left_out, &err), 0);
    /* tp 1: 5 mbs x 2 shapes x (the layer's and the head's 4 times - the
       layer's filled backward); the embedding's are never fitted */
    assert_int_equal(count, 2 * 5 * 3);
    assert_int_equal(left_out, 2 * 20 * 6 - count);
    for (int i = 0; i < count; i++) {
        assert_int_equal(obs[i].tp, 1);
        assert_true(close_to(obs[i].predicted_s, obs[i].measured_s, 1e-12));
    }
    free(obs);
    profile_free(&source);
}

/* issue 35, item 4: a profile that holds a measured Llama layer (RMSNorm,
 * SwiGLU, rotary positions, 4 key/value heads of 16, no biases) beside a
 * GPT-2 layer of the same widths is fitted with each shape's own kernels:
 * times made from known parameters come back exactly, the two layers'
 * times differ, and a fit on them recovers the parameters. */
static void llama_shapes_are_fitted_as_llama_layers(void **state)
{
    (void)state;
    roofline_params truth = known_roofline_params();
    model_shape gpt = shape_of(2048, 16, 2048, 128256);
    gpt.ffn_hidden = 5632;
    model_shape llama = gpt;
    llama.kv_heads = 4;
    llama.norm = MODEL_NORM_RMSNORM;
    llama.mlp = MODEL_MLP_SWIGLU;
    llama.positions = MODEL_POSITIONS_ROPE;
    llama.rope_base = 500000.0;
    llama.bias = MODEL_BIAS_NONE;
    model_shape layers[2] = {gpt, llama};
    roofline_device device = h200_device(132);
    profile p;
    memset(&p, 0, sizeof p);
    pt_copy_string(p.gpu, sizeof p.gpu, "H200");
    p.source = PROFILE_MEASURED;
    p.peak_tflops = 989.0;
    p.memory_bandwidth_GBps = 4800.0;
    p.sms = 132;
    p.shape_count = 2;
    p.shapes = calloc(2, sizeof *p.shapes);
    for (int s = 0; s < 2; s++) {
        profile_shape *shape = &p.shapes[s];
        *shape = profile_shape_of_model(&layers[s]);
        shape->point_count = 12;
        shape->points = calloc(12, sizeof *shape->points);
        for (int i = 0; i < 12; i++) {
            profile_point *pt = &shape->points[i];
            pt->tp = 1 << (i / 4);
            pt->mbs = 1 << (i % 4);
            model_part_costs costs;
            roofline_part_costs(&truth, &device, &layers[s],
                                (roofline_shard){pt->tp, pt->mbs, 2.0, false,
                                                 4.0, true, true},
                                &costs);
            pt->embedding = costs.embedding;
            pt->layer = costs.layer;
            pt->head = costs.head;
        }
    }
    /* the same widths, not the same layer: SwiGLU's third matrix costs
       more than grouped-query attention saves */
    assert_true(p.shapes[1].points[0].layer.forward_s >
                1.05 * p.shapes[0].points[0].layer.forward_s);
    roofline_observation *obs = NULL;
    int count = 0, left_out = 0;
    pt_error err = {{0}};
    assert_int_equal(roofline_observations(&truth, &p, &obs, &count,
                                           &left_out, &err), 0);
    assert_int_equal(count, 2 * 12 * 4);
    for (int i = 0; i < count; i++)
        if (!close_to(obs[i].predicted_s, obs[i].measured_s, 1e-12))
            fail_msg("shape %d tp %d mbs %d part %d: %g s predicted, %g s "
                     "made", obs[i].shape_index, obs[i].tp, obs[i].mbs,
                     obs[i].part, obs[i].predicted_s, obs[i].measured_s);
    free(obs);
    /* beside fit_recovers_known_parameters' four sources, as a derived
       profile is fitted on the measured ones */
    profile sources[5];
    synthetic_profile(&sources[0], "H200-40SM", &truth, h200_device(40));
    synthetic_profile(&sources[1], "H200-16SM", &truth, h200_device(16));
    synthetic_profile(&sources[2], "H100", &truth,
                      (roofline_device){989e12, 3350e9, 132, 132});
    synthetic_profile(&sources[3], "H200-8SM", &truth, h200_device(8));
    sources[4] = p;
    roofline_fit_result fit;
    if (roofline_fit(sources, 5, &fit, &err) != 0)
        fail_msg("%s", err.message);
    assert_true(fit.sources[4].max_error < 0.01);
    assert_true(fit.all.max_error < 0.01);
    assert_true(close_to(fit.params.gemm_efficiency, 0.75, 0.02));
    for (int i = 0; i < 5; i++)
        profile_free(&sources[i]);
}

static void fit_needs_spec_figures(void **state)
{
    (void)state;
    roofline_params truth = known_roofline_params();
    profile source;
    synthetic_profile(&source, "H200", &truth, h200_device(132));
    source.sms = 0;
    roofline_fit_result fit;
    pt_error err = {{0}};
    assert_int_equal(roofline_fit(&source, 1, &fit, &err), -1);
    assert_non_null(strstr(err.message, "profile H200"));
    assert_non_null(strstr(err.message, "sms"));
    profile_free(&source);
}

static void load_profile_named(const char *gpu, profile *out)
{
    char path[PT_PATH_MAX];
    pt_error err = {{0}};
    if (profile_find(gpu, NULL, NULL, path, sizeof path, &err) != 0 ||
        profile_load_file(path, out, &err) != 0)
        fail_msg("%s", err.message);
}

/* Its provenance names the profiles it was fitted on and its error; they
 * are completed from the spec table as the generator completes them. */
static void fitted_on(const profile *derived, profile *sources, int *count,
                      double *max_error_percent)
{
    char specs_path[PT_PATH_MAX];
    snprintf(specs_path, sizeof specs_path, "%s/profiles/specs.json",
             getenv("PARTITA_SOURCE") ? getenv("PARTITA_SOURCE") : ".");
    gpu_spec_table specs;
    pt_error err = {{0}};
    if (gpu_spec_table_load(specs_path, &specs, &err) != 0)
        fail_msg("%s", err.message);
    const json_t *names = json_object_get(derived->provenance, "fitted_on");
    const json_t *fit = json_object_get(derived->provenance, "fit");
    assert_true(json_is_array(names));
    assert_true(json_is_object(fit));
    *max_error_percent =
        json_number_value(json_object_get(fit, "max_error_percent"));
    *count = (int)json_array_size(names);
    assert_true(*count >= 1 && *count <= ROOFLINE_MAX_SOURCES);
    for (int i = 0; i < *count; i++) {
        load_profile_named(json_string_value(json_array_get(names, i)),
                           &sources[i]);
        char said[256];
        if (gpu_spec_complete_source(&specs, &sources[i], said, sizeof said,
                                     &err) != 0)
            fail_msg("%s", err.message);
    }
    gpu_spec_table_free(&specs);
}

/* The roofline a calibrated profile was transferred with
 * (provenance.calibrated_on.transferred_roofline); *out unchanged when
 * the profile was not calibrated. */
static void transferred_roofline(const profile *derived, roofline_params *out)
{
    const json_t *on = json_object_get(derived->provenance, "calibrated_on");
    const json_t *r = json_object_get(on, "transferred_roofline");
    if (!json_is_object(r))
        return;
    out->gemm_efficiency =
        json_number_value(json_object_get(r, "gemm_efficiency"));
    out->gemm_half_work_flop =
        1e9 * json_number_value(
                  json_object_get(r, "gemm_half_work_gflop_per_sm"));
    out->attention_efficiency =
        json_number_value(json_object_get(r, "attention_efficiency"));
    out->bandwidth_efficiency =
        json_number_value(json_object_get(r, "bandwidth_efficiency"));
    out->kernel_overhead_s =
        1e-6 * json_number_value(json_object_get(r, "kernel_overhead_us"));
    out->bandwidth_saturation_sm_fraction = json_number_value(
        json_object_get(r, "bandwidth_saturation_sm_fraction"));
}

static void derived_profiles_reproduce_their_sources(void **state)
{
    (void)state;
    for (int g = 0; g < DERIVED_COUNT; g++) {
        profile derived;
        load_profile_named(derived_gpus[g], &derived);
        assert_int_equal(derived.source, PROFILE_DERIVED);
        assert_true(derived.roofline.present);
        assert_int_equal(derived.shape_count, 0);
        profile sources[ROOFLINE_MAX_SOURCES];
        int count = 0;
        double stated_percent = 0.0;
        fitted_on(&derived, sources, &count, &stated_percent);
        assert_true(stated_percent > 0.0);
        int fitted = 0;
        for (int i = 0; i < count; i++) {
            roofline_observation *obs = NULL;
            int n = 0, left_out = 0;
            pt_error err = {{0}};
            roofline_params from_sources = derived.roofline;
            transferred_roofline(&derived, &from_sources);
            if (roofline_observations(&from_sources, &sources[i], &obs,
                                      &n, &left_out, &err) != 0)
                fail_msg("%s", err.message);
            for (int j = 0; j < n; j++) {
                double error = fabs(obs[j].predicted_s / obs[j].measured_s -
                                    1.0);
                if (error > stated_percent / 100.0 + 1e-6)
                    fail_msg("%s: %s time %d of %s is off by %.2f%%, more "
                             "than the stated %.1f%%", derived_gpus[g],
                             sources[i].gpu, j, sources[i].gpu,
                             100.0 * error, stated_percent);
            }
            fitted += n;
            free(obs);
        }
        assert_true(fitted > 0);
        /* the committed parameters are what the fit gives today; every
         * derived profile comes from the same sources, so one fit (the
         * slow part: hundreds of times, ten starts) serves them all */
        static roofline_fit_result fit;
        static bool fitted_once = false;
        pt_error err = {{0}};
        if (!fitted_once && roofline_fit(sources, count, &fit, &err) != 0)
            fail_msg("%s", err.message);
        fitted_once = true;
        /* a profile calibrated on training runs keeps the roofline its
         * calibration started from (test_published checks the rest) */
        roofline_params transferred = derived.roofline;
        transferred_roofline(&derived, &transferred);
        const roofline_params *a = &fit.params, *b = &transferred;
        assert_true(close_to(a->gemm_efficiency, b->gemm_efficiency, 1e-6));
        assert_true(close_to(a->gemm_half_work_flop, b->gemm_half_work_flop,
                             1e-6));
        assert_true(close_to(a->attention_efficiency,
                             b->attention_efficiency, 1e-6));
        assert_true(close_to(a->bandwidth_efficiency,
                             b->bandwidth_efficiency, 1e-6));
        assert_true(close_to(a->kernel_overhead_s, b->kernel_overhead_s,
                             1e-6));
        assert_true(close_to(a->bandwidth_saturation_sm_fraction,
                             b->bandwidth_saturation_sm_fraction, 1e-6));
        for (int i = 0; i < count; i++)
            profile_free(&sources[i]);
        profile_free(&derived);
    }
}

static void sources_are_completed_from_the_spec_table(void **state)
{
    (void)state;
    gpu_spec_table table = {.count = 2};
    gpu_spec specs[2] = {
        {.gpu = "H200", .tensor_tflops = 989, .memory_bandwidth_GBps = 4800,
         .sms = 132},
        {.gpu = "H100", .tensor_tflops = 989, .memory_bandwidth_GBps = 3350,
         .sms = 132}};
    table.specs = specs;
    profile p;
    memset(&p, 0, sizeof p);
    pt_copy_string(p.gpu, sizeof p.gpu, "H200-40SM");
    char said[256];
    pt_error err = {{0}};
    assert_int_equal(gpu_spec_complete_source(&table, &p, said, sizeof said,
                                              &err), 0);
    assert_true(p.peak_tflops == 989 && p.memory_bandwidth_GBps == 4800);
    assert_int_equal(p.sms, 132);
    assert_int_equal(p.sm_limit, 40);
    assert_non_null(strstr(said, "measured on 40 of 132 SMs"));
    /* a limit in the provenance wins over the name */
    memset(&p, 0, sizeof p);
    pt_copy_string(p.gpu, sizeof p.gpu, "H200-40SM");
    p.provenance = json_pack("{s:i}", "sm_limit", 16);
    assert_int_equal(gpu_spec_complete_source(&table, &p, said, sizeof said,
                                              &err), 0);
    assert_int_equal(p.sm_limit, 16);
    json_decref(p.provenance);
    /* no row named like it */
    memset(&p, 0, sizeof p);
    pt_copy_string(p.gpu, sizeof p.gpu, "B300");
    assert_int_equal(gpu_spec_complete_source(&table, &p, said, sizeof said,
                                              &err), -1);
    assert_non_null(strstr(err.message, "profile B300"));
}

/* Any shape, tp and micro-batch: a model no profile holds. */
static void derived_profile_prices_any_shape(void **state)
{
    (void)state;
    model_shape big = shape_of(5120, 40, 2048, 50257);
    big.layers = 40;
    cluster c;
    make_cluster(&c, 1, 1);
    pt_copy_string(c.types[0].gpu, sizeof c.types[0].gpu, "A100-40GB");
    pt_copy_string(c.types[1].gpu, sizeof c.types[1].gpu, "V100-32GB");
    costmodel cm;
    pt_error err = {{0}};
    if (costmodel_open(&cm, &big, &c, NULL, &err) != 0)
        fail_msg("%s", err.message);
    assert_true(has_note_containing(&cm, "A100-40GB: derived profile"));
    assert_true(has_note_containing(&cm, "priced by its roofline"));
    type_costs one, four, tp_four;
    parallel_config plain = config_of(8, 1, 1, 1, 1);
    parallel_config larger = config_of(8, 4, 1, 1, 1);
    parallel_config split = config_of(8, 1, 4, 1, 1);
    assert_int_equal(costmodel_type_costs(&cm, 0, &plain, &one, &err), 0);
    assert_int_equal(costmodel_type_costs(&cm, 0, &larger, &four, &err), 0);
    assert_int_equal(costmodel_type_costs(&cm, 0, &split, &tp_four, &err),
                     0);
    assert_true(one.layer_forward_s > 0.0 && one.head_backward_s > 0.0);
    assert_true(four.layer_forward_s > one.layer_forward_s);
    /* a quarter of the layer per GPU plus the tp all-reduces added from
       the intra-node link (a derived profile holds no communication) */
    double allreduce = allreduce_time(1.0 * 2048 * 5120 * 2, 4,
                                      c.types[0].intra_node);
    assert_true(tp_four.layer_forward_s > 2.0 * allreduce);
    assert_true(tp_four.layer_forward_s - 2.0 * allreduce <
                one.layer_forward_s);
    /* a V100 is slower than an A100 on the same layer */
    type_costs v100;
    assert_int_equal(costmodel_type_costs(&cm, 1, &plain, &v100, &err), 0);
    assert_true(v100.layer_forward_s > one.layer_forward_s);
    assert_true(close_to(v100.memory_cap_bytes, (31.68 - 0.5) * PT_GIB,
                         1e-9));
    costmodel_close(&cm);
    cluster_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(large_gemms_approach_the_peak),
        cmocka_unit_test(small_work_pays_overheads_and_ramps),
        cmocka_unit_test(every_part_runs_its_kernels),
        cmocka_unit_test(fewer_sms_are_slower),
        cmocka_unit_test(fit_recovers_known_parameters),
        cmocka_unit_test(fit_leaves_out_times_it_cannot_model),
        cmocka_unit_test(fit_needs_spec_figures),
        cmocka_unit_test(llama_shapes_are_fitted_as_llama_layers),
        cmocka_unit_test(derived_profiles_reproduce_their_sources),
        cmocka_unit_test(sources_are_completed_from_the_spec_table),
        cmocka_unit_test(derived_profile_prices_any_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
