/* Shapes a profile does not hold, priced from its measured neighbours:
 * leave-one-out over the bundled measured profiles (every shape taken
 * out in turn and priced from the others), within the error
 * docs/profiles.md states; and the method every entry reports. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

/* The bounds docs/profiles.md ("Shapes between the measured ones")
 * states: largest |priced / measured - 1| of a layer's forward plus
 * backward, and of any single part and direction (a head timed fused:
 * its forward plus backward), for shapes with measured neighbours on
 * both sides and on one side. */
#define BOUND_LAYER_BETWEEN 0.115
#define BOUND_ANY_BETWEEN 0.25
#define BOUND_LAYER_ONE_SIDE 0.13
#define BOUND_ANY_ONE_SIDE 0.15

static const char *const measured_profiles[] = {"H100", "H200", "H200-40SM",
                                                "H200-16SM"};

static void load_bundled(const char *gpu, profile *out)
{
    char path[PT_PATH_MAX];
    const char *root = getenv("PARTITA_SOURCE");
    snprintf(path, sizeof path, "%s/profiles/%s.json", root ? root : ".",
             gpu);
    pt_error err = {{0}};
    if (profile_load_file(path, out, &err) != 0)
        fail_msg("%s", err.message);
}

/* p without its shape `drop`. */
static void drop_shape(profile *p, int drop)
{
    free(p->shapes[drop].points);
    memmove(&p->shapes[drop], &p->shapes[drop + 1],
            (size_t)(p->shape_count - drop - 1) * sizeof *p->shapes);
    p->shape_count--;
}

typedef struct loo_error {
    double layer;      /* forward + backward of the layer */
    double any;        /* any part and direction */
    int points;
} loo_error;

static double relative(double priced, double measured)
{
    return measured > 0.0 ? fabs(priced / measured - 1.0) : 0.0;
}

/* Prices every point of shape `held` of source from the source without
 * it; adds the errors to between / one_side by the method reported. */
static void leave_out(const profile *source, int held, loo_error *between,
                      loo_error *one_side)
{
    const profile_shape *shape = &source->shapes[held];
    profile reduced;
    pt_error err = {{0}};
    if (profile_copy(&reduced, source, &err) != 0)
        fail_msg("%s", err.message);
    drop_shape(&reduced, held);
    /* the shape's own layer (a Llama shape is priced as one) */
    model_shape m = profile_shape_model(shape);
    m.layers = 2;
    snprintf(m.name, sizeof m.name, "h%d", shape->hidden);
    cluster c = one_node_cluster(source->gpu, 8);
    costmodel cm;
    if (costmodel_open_with_profiles(&cm, &m, &c, &reduced, &err) != 0)
        fail_msg("%s", err.message);
    for (int i = 0; i < shape->point_count; i++) {
        const profile_point *point = &shape->points[i];
        parallel_config config = config_of(point->mbs, point->mbs, point->tp,
                                           1, 1);
        pricing_entry entries[3];
        if (costmodel_pricing(&cm, 0, &config, entries, &err) != 0)
            fail_msg("%s", err.message);
        loo_error *into = entries[1].method == PRICE_INTERPOLATED ? between
                          : entries[1].method == PRICE_EXTRAPOLATED
                              ? one_side
                              : NULL;
        if (!into)
            continue;
        const part_cost measured[3] = {point->embedding, point->layer,
                                       point->head};
        double worst = 0.0;
        for (int part = 0; part < 3; part++) {
            if (part == 2 && point->head_fused) {
                /* a head timed fused is one kernel chain: its backward
                 * is the pair's time less the forward's, a remainder
                 * under 5 % of the pair and within the rounds' spread on
                 * the slices (H200-16SM, GPT-2 1.5B, micro-batch 1: 34
                 * us of 5,445), so the chain is held to its sum */
                worst = fmax(worst,
                             relative(entries[part].forward_s +
                                          entries[part].backward_s,
                                      measured[part].forward_s +
                                          measured[part].backward_s));
                continue;
            }
            worst = fmax(worst, relative(entries[part].forward_s,
                                         measured[part].forward_s));
            worst = fmax(worst, relative(entries[part].backward_s,
                                         measured[part].backward_s));
        }
        double layer = relative(entries[1].forward_s + entries[1].backward_s,
                                point->layer.forward_s +
                                    point->layer.backward_s);
        if (getenv("PARTITA_LOO_VERBOSE"))
            printf("%-10s h%-5d tp %d mbs %2d %-12s layer %+6.1f %%  worst "
                   "part %5.1f %%\n",
                   source->gpu, shape->hidden, point->tp, point->mbs,
                   price_method_name(entries[1].method),
                   100.0 * ((entries[1].forward_s + entries[1].backward_s) /
                                (point->layer.forward_s +
                                 point->layer.backward_s) -
                            1.0),
                   100.0 * worst);
        into->layer = fmax(into->layer, layer);
        into->any = fmax(into->any, worst);
        into->points++;
    }
    costmodel_close(&cm);
    cluster_free(&c);
    profile_free(&reduced);
}

static void leave_one_out_within_the_stated_error(void **state)
{
    (void)state;
    loo_error between = {0}, one_side = {0};
    for (size_t g = 0; g < sizeof measured_profiles /
                               sizeof measured_profiles[0]; g++) {
        profile source;
        load_bundled(measured_profiles[g], &source);
        for (int s = 0; s < source.shape_count; s++)
            leave_out(&source, s, &between, &one_side);
        profile_free(&source);
    }
    printf("leave-one-out: between %d points, layer %.1f %%, any %.1f %%; "
           "one side %d points, layer %.1f %%, any %.1f %%\n",
           between.points, 100.0 * between.layer, 100.0 * between.any,
           one_side.points, 100.0 * one_side.layer, 100.0 * one_side.any);
    assert_true(between.points > 0 && one_side.points > 0);
    assert_true(between.layer <= BOUND_LAYER_BETWEEN);
    assert_true(between.any <= BOUND_ANY_BETWEEN);
    assert_true(one_side.layer <= BOUND_LAYER_ONE_SIDE);
    assert_true(one_side.any <= BOUND_ANY_ONE_SIDE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(leave_one_out_within_the_stated_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
