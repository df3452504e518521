/*
 * In-memory models, clusters and profiles for the costmodel tests, built
 * field by field so that the tests do not depend on the file readers.
 * Each test executable includes this once.
 */
#ifndef PARTITA_TEST_COSTMODEL_FIXTURES_H
#define PARTITA_TEST_COSTMODEL_FIXTURES_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"

/* GPT-2 XL as in models/gpt2-xl.json. */
static inline model_shape gpt2_xl(void)
{
    model_shape m = {0};
    pt_copy_string(m.name, sizeof m.name, "gpt2-xl");
    m.layers = 48;
    m.hidden = 1600;
    m.heads = 25;
    m.ffn_hidden = 6400;
    m.seq = 1024;
    m.vocab = 50257;
    m.tied_embeddings = true;
    return m;
}

static inline link_spec link_of(double gigabytes_per_s, double latency_us)
{
    return (link_spec){gigabytes_per_s * 1e9, latency_us * 1e-6};
}

/* One node of `gpus` GPUs of the profile's name. */
static inline cluster one_node_cluster(const char *gpu, int gpus)
{
    cluster c;
    memset(&c, 0, sizeof c);
    pt_copy_string(c.name, sizeof c.name, "loo");
    c.type_count = 1;
    c.types = calloc(1, sizeof *c.types);
    pt_copy_string(c.types[0].name, sizeof c.types[0].name, "box");
    pt_copy_string(c.types[0].gpu, sizeof c.types[0].gpu, gpu);
    c.types[0].count = 1;
    c.types[0].gpus = gpus;
    c.types[0].intra_node = link_of(300.0, 5.0);
    c.node_count = 1;
    return c;
}

/* Type 0: `a100_nodes` nodes of 4 A100s; type 1: `a10_nodes` nodes of 4
 * A10s. Node instances: the A100 nodes first. */
static inline void make_cluster(cluster *c, int a100_nodes, int a10_nodes)
{
    memset(c, 0, sizeof *c);
    pt_copy_string(c->name, sizeof c->name, "test-hetero");
    c->type_count = 2;
    c->types = calloc(2, sizeof *c->types);
    node_type *a100 = &c->types[0], *a10 = &c->types[1];
    pt_copy_string(a100->name, sizeof a100->name, "a100");
    pt_copy_string(a100->gpu, sizeof a100->gpu, "A100-TEST");
    a100->count = a100_nodes;
    a100->gpus = 4;
    a100->intra_node = link_of(230.0, 5.0);
    a100->inter_node = link_of(5.0, 20.0);
    a100->price_per_hour = 32.0;
    pt_copy_string(a10->name, sizeof a10->name, "a10");
    pt_copy_string(a10->gpu, sizeof a10->gpu, "A10-TEST");
    a10->count = a10_nodes;
    a10->gpus = 4;
    a10->intra_node = link_of(16.0, 10.0);
    a10->inter_node = link_of(5.0, 20.0);
    a10->price_per_hour = 8.0;
    c->node_count = a100_nodes + a10_nodes;
}

/* A GPT-2 XL shape measured at tp 1, 2, 4 and mbs 1, 2, 4. The layer
 * forward at (tp, mbs) is layer_ms x mbs^0.9 / tp^0.8 milliseconds. */
static inline void make_profile(profile *p, const char *gpu, double memory_gib,
                         double layer_ms)
{
    memset(p, 0, sizeof *p);
    pt_copy_string(p->gpu, sizeof p->gpu, gpu);
    p->memory_gib = memory_gib;
    p->source = PROFILE_MEASURED;
    p->backward_over_forward = 2.0;
    p->mbs_scaling = MBS_SCALING_MEASURED;
    p->layer_times_include_tp_comm = true;
    p->workspace_gib = 0.5;
    p->optimizer_s_per_param = 2e-11;
    p->peak_tflops = 312.0;
    p->flops_efficiency = 0.0;
    p->memory_bandwidth_GBps = 1555.0;
    p->shape_count = 1;
    p->shapes = calloc(1, sizeof *p->shapes);
    profile_shape *shape = &p->shapes[0];
    *shape = (profile_shape){.hidden = 1600, .heads = 16, .ffn_hidden = 6400,
                             .seq = 1024, .vocab = 50257};
    shape->point_count = 9;
    shape->points = calloc(9, sizeof *shape->points);
    int tps[3] = {1, 2, 4}, mbss[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) {
            profile_point *pt = &shape->points[3 * i + j];
            double factor = pow(mbss[j], 0.9) / pow(tps[i], 0.8);
            pt->tp = tps[i];
            pt->mbs = mbss[j];
            pt->layer.forward_s = layer_ms * 1e-3 * factor;
            pt->layer.backward_s = 2.0 * pt->layer.forward_s;
            pt->embedding.forward_s = 0.2e-3 * factor;
            pt->embedding.backward_s = 0.4e-3 * factor;
            pt->head.forward_s = 0.8e-3 * factor;
            pt->head.backward_s = 1.6e-3 * factor;
        }
    }
}

/* profiles[0]: A100 (39.59 GiB, 1.6 ms), profiles[1]: A10 (22.2 GiB,
 * 2.4 ms), matching make_cluster's types. */
static inline void make_profiles(profile profiles[2])
{
    make_profile(&profiles[0], "A100-TEST", 39.59, 1.6);
    make_profile(&profiles[1], "A10-TEST", 22.2, 2.4);
    profiles[1].peak_tflops = 125.0;
    profiles[1].memory_bandwidth_GBps = 600.0;
    profiles[1].optimizer_s_per_param = 5e-11;
}

/* A ready costmodel over make_cluster / make_profiles. */
typedef struct fixture {
    model_shape model;
    cluster cluster;
    profile profiles[2];
    costmodel cm;
} fixture;

static inline int fixture_open(fixture *f, const model_shape *model, int a100_nodes,
                        int a10_nodes)
{
    memset(f, 0, sizeof *f);
    f->model = *model;
    make_cluster(&f->cluster, a100_nodes, a10_nodes);
    make_profiles(f->profiles);
    pt_error err = {{0}};
    return costmodel_open_with_profiles(&f->cm, &f->model, &f->cluster,
                                        f->profiles, &err);
}

static inline void fixture_close(fixture *f)
{
    costmodel_close(&f->cm);
    profile_free(&f->profiles[0]);
    profile_free(&f->profiles[1]);
    cluster_free(&f->cluster);
}

static inline parallel_config config_of(int gbs, int mbs, int tp, int dp, int pp)
{
    return (parallel_config){.gbs = gbs, .mbs = mbs, .tp = tp, .dp = dp,
                             .pp = pp, .schedule = SCHEDULE_1F1B,
                             .precision = PRECISION_BF16};
}

/* One stage-boundary conversion of type `type` under `config`
 * (type_costs.boundary_s; 0 unless the runtime is Partita's). */
static inline double boundary_of(costmodel *cm, int type,
                                 const parallel_config *config)
{
    type_costs costs;
    pt_error err = {{0}};
    if (costmodel_type_costs(cm, type, config, &costs, &err) != 0)
        return -1.0;
    return costs.boundary_s;
}

/* Roofline parameters of the order the fits find, and an H200's
 * figures on sms_used SMs, for the tests that price from the roofline. */
static inline roofline_params known_roofline_params(void)
{
    return (roofline_params){.present = true,
                             .gemm_efficiency = 0.75,
                             .gemm_half_work_flop = 2e7,
                             .attention_efficiency = 0.9,
                             .bandwidth_efficiency = 0.85,
                             .kernel_overhead_s = 4e-6,
                             .bandwidth_saturation_sm_fraction = 0.45};
}

static inline roofline_device h200_device(int sms_used)
{
    return (roofline_device){989e12, 4800e9, 132, sms_used};
}

static inline bool has_note_containing(const costmodel *cm, const char *text)
{
    for (int i = 0; i < cm->note_count; i++)
        if (strstr(cm->notes[i], text))
            return true;
    return false;
}

/* Deterministic pseudo-random integers in [low, high] (a 64-bit LCG on
 * *state), for the tests over random shapes. */
static inline int fixture_random_int(uint64_t *state, int low, int high)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return low + (int)((*state >> 33) % (uint64_t)(high - low + 1));
}

/* GPT-2 XL with random heads (a multiple of tp), widths, sequence,
 * vocabulary and layers. */
static inline model_shape fixture_random_shape(uint64_t *state, int tp)
{
    model_shape m = gpt2_xl();
    m.heads = tp * fixture_random_int(state, 1, 16);
    m.hidden = m.heads * 8 * fixture_random_int(state, 1, 16);
    m.ffn_hidden = 4 * m.hidden;
    m.seq = 64 * fixture_random_int(state, 1, 32);
    m.vocab = fixture_random_int(state, 1000, 160000);
    m.layers = fixture_random_int(state, 2, 48);
    return m;
}

/* Partita's rebuild of the half-precision copy after ZeRO-1's (and
 * ZeRO-2's) all-gather at dp > 1: 6 bytes a parameter at the streaming
 * rate of the AdamW step, which moves 30 (costmodel/stage.c). */
static inline double mirror_rebuild_s(double params,
                                      double optimizer_s_per_param)
{
    return params * 6.0 * optimizer_s_per_param / 30.0;
}

static inline bool close_to(double a, double b, double relative)
{
    double scale = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return fabs(a - b) <= relative * (scale > 1e-300 ? scale : 1e-300);
}

#endif
