/*
 * partita profile --compare A.json B.json [--tolerance P]: every entry of
 * two profiles side by side with its difference, B against A, in percent;
 * the repeatability check of two measurements of one GPU. An entry is
 * one part's forward or backward time at a (tp, micro-batch) point of a
 * shape, the optimizer's time per parameter, or one communication sample.
 */
#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int profile_layer_stack(const profile *p)
{
    json_t *runs = json_object_get(p->provenance, "runs");
    json_t *stack = json_object_get(runs, "layer_stack");
    return json_is_integer(stack) ? (int)json_integer_value(stack) : 1;
}

typedef struct compare_tally {
    double tolerance_percent;
    int entries;
    int over;                    /* differ by more than the tolerance */
    int missing;                 /* in one profile only */
    double worst_percent;        /* largest |difference| */
    char worst[224];
    /* the same over the times of LONG_ENTRY_S or more, which repeat far
     * better than launch-bound ones (docs/profiles.md, "Repeatability") */
    int long_entries;
    int long_over;
    double long_worst_percent;
} compare_tally;

#define LONG_ENTRY_S 0.5e-3

static void format_value(double value, bool per_param, char *out,
                         size_t size)
{
    if (per_param)
        snprintf(out, size, "%.4g s/param", value);
    else
        pt_format_seconds(value, out, size);
}

static void compare_entry(compare_tally *t, const char *name, double a,
                          double b, bool per_param)
{
    char a_text[32], b_text[32];
    format_value(a, per_param, a_text, sizeof a_text);
    format_value(b, per_param, b_text, sizeof b_text);
    double percent = a > 0.0 ? 100.0 * (b - a) / a : INFINITY;
    bool over = !(fabs(percent) <= t->tolerance_percent);
    t->entries++;
    t->over += over;
    if (!(fabs(percent) <= t->worst_percent)) {
        t->worst_percent = fabs(percent);
        pt_copy_string(t->worst, sizeof t->worst, name);
    }
    if (!per_param && a >= LONG_ENTRY_S) {
        t->long_entries++;
        t->long_over += over;
        if (!(fabs(percent) <= t->long_worst_percent))
            t->long_worst_percent = fabs(percent);
    }
    printf("  %-40s %17s %17s %+9.2f %%%s\n", name, a_text, b_text, percent,
           over ? "  over" : "");
}

static void missing_entry(compare_tally *t, const char *name, bool in_a)
{
    t->entries++;
    t->missing++;
    printf("  %-40s %17s %17s %11s  only in %s\n", name, in_a ? "yes" : "-",
           in_a ? "-" : "yes", "", in_a ? "A" : "B");
}

static void compare_point(compare_tally *t, const char *prefix,
                          const profile_point *a, const profile_point *b)
{
    static const char *const parts[] = {"embedding", "layer", "head"};
    const part_cost *a_parts[] = {&a->embedding, &a->layer, &a->head};
    const part_cost *b_parts[] = {&b->embedding, &b->layer, &b->head};
    /* a head timed fused in one and not the other (head.fused) differs
     * by the backward products moved, not by noise: said with its name */
    const char *how = a->head_fused == b->head_fused ? ""
                      : a->head_fused ? " (fused in A only)"
                                      : " (fused in B only)";
    for (int i = 0; i < 3; i++) {
        const char *note = i == 2 ? how : "";
        char name[224];
        snprintf(name, sizeof name, "%stp %d mbs %d %s forward%s", prefix,
                 a->tp, a->mbs, parts[i], note);
        compare_entry(t, name, a_parts[i]->forward_s, b_parts[i]->forward_s,
                      false);
        snprintf(name, sizeof name, "%stp %d mbs %d %s backward%s", prefix,
                 a->tp, a->mbs, parts[i], note);
        compare_entry(t, name, a_parts[i]->backward_s,
                      b_parts[i]->backward_s, false);
    }
}

/* Points of both shapes, merged in (tp, mbs) order (the reader sorts). */
static void compare_shape(compare_tally *t, const char *prefix,
                          const profile_shape *a, const profile_shape *b)
{
    int i = 0, j = 0;
    while (i < a->point_count || j < b->point_count) {
        const profile_point *pa = i < a->point_count ? &a->points[i] : NULL;
        const profile_point *pb = j < b->point_count ? &b->points[j] : NULL;
        int order = pa == NULL   ? 1
                    : pb == NULL ? -1
                    : pa->tp != pb->tp ? (pa->tp < pb->tp ? -1 : 1)
                                       : (pa->mbs > pb->mbs) -
                                             (pa->mbs < pb->mbs);
        char name[224];
        if (order == 0) {
            compare_point(t, prefix, pa, pb);
            i++, j++;
        } else {
            const profile_point *only = order < 0 ? pa : pb;
            snprintf(name, sizeof name, "%stp %d mbs %d (6 entries)", prefix,
                     only->tp, only->mbs);
            missing_entry(t, name, order < 0);
            if (order < 0)
                i++;
            else
                j++;
        }
    }
}

static int find_same_shape(const profile *p, const profile_shape *shape)
{
    model_shape key = profile_shape_model(shape);
    return profile_find_shape(p, &key);
}

/* "h1600 s1024 ", or with a layer that is not GPT-2's its tag too
 * ("h2048 s2048 rmsnorm swiglu rope kv 8/32 nobias "). */
static void shape_prefix(const profile_shape *shape, char *out, size_t size)
{
    model_shape layer = profile_shape_model(shape);
    char tag[96];
    model_architecture_tag(&layer, tag, sizeof tag);
    snprintf(out, size, "h%d s%d %s%s", shape->hidden, shape->seq, tag,
             tag[0] != '\0' ? " " : "");
}

static void compare_shapes(compare_tally *t, const profile *a,
                           const profile *b)
{
    for (int i = 0; i < a->shape_count; i++) {
        const profile_shape *shape = &a->shapes[i];
        char prefix[160];
        shape_prefix(shape, prefix, sizeof prefix);
        int k = find_same_shape(b, shape);
        if (k >= 0)
            compare_shape(t, prefix, shape, &b->shapes[k]);
        else
            missing_entry(t, prefix, true);
    }
    for (int k = 0; k < b->shape_count; k++)
        if (find_same_shape(a, &b->shapes[k]) < 0) {
            char prefix[160];
            shape_prefix(&b->shapes[k], prefix, sizeof prefix);
            missing_entry(t, prefix, false);
        }
}

static void compare_curve(compare_tally *t, const char *label,
                          const comm_curve *a, const comm_curve *b)
{
    int i = 0, j = 0;
    while (i < a->sample_count || j < b->sample_count) {
        const comm_sample *sa = i < a->sample_count ? &a->samples[i] : NULL;
        const comm_sample *sb = j < b->sample_count ? &b->samples[j] : NULL;
        int order = sa == NULL   ? 1
                    : sb == NULL ? -1
                    : sa->gpus != sb->gpus
                        ? (sa->gpus < sb->gpus ? -1 : 1)
                        : (sa->bytes > sb->bytes) - (sa->bytes < sb->bytes);
        const comm_sample *named = order <= 0 ? sa : sb;
        char size[32], name[96];
        pt_format_bytes(named->bytes, size, sizeof size);
        snprintf(name, sizeof name, "%s %d GPUs %s", label, named->gpus,
                 size);
        if (order == 0) {
            compare_entry(t, name, sa->time_s, sb->time_s, false);
            i++, j++;
        } else {
            missing_entry(t, name, order < 0);
            if (order < 0)
                i++;
            else
                j++;
        }
    }
}

int profile_compare(const char *path_a, const char *path_b,
                    double tolerance_percent)
{
    pt_error err = {{0}};
    profile a, b;
    if (profile_load_file(path_a, &a, &err) != 0) {
        cli_error("profile", err.message);
        return EXIT_BAD_INPUT;
    }
    if (profile_load_file(path_b, &b, &err) != 0) {
        cli_error("profile", err.message);
        profile_free(&a);
        return EXIT_BAD_INPUT;
    }
    printf("# A: %s (%s, %s)\n# B: %s (%s, %s)\n", path_a, a.gpu,
           profile_source_name(a.source), path_b, b.gpu,
           profile_source_name(b.source));
    printf("  %-40s %17s %17s %11s\n", "entry", "A", "B", "B vs A");
    /* a stack's mean layer is not a lone layer: say so, the entries
     * compared as they are */
    if (profile_layer_stack(&a) != profile_layer_stack(&b))
        printf("# layer entries: A's the mean layer of a stack of %d, B's "
               "of %d (provenance.runs.layer_stack)\n",
               profile_layer_stack(&a), profile_layer_stack(&b));
    compare_tally tally = {.tolerance_percent = tolerance_percent};
    compare_shapes(&tally, &a, &b);
    compare_entry(&tally, "optimizer per parameter",
                  a.optimizer_s_per_param, b.optimizer_s_per_param, true);
    compare_curve(&tally, "all-reduce", &a.allreduce, &b.allreduce);
    compare_curve(&tally, "send/recv", &a.sendrecv, &b.sendrecv);
    compare_curve(&tally, "reduce-scatter", &a.reduce_scatter,
                  &b.reduce_scatter);
    compare_curve(&tally, "all-gather", &a.all_gather, &b.all_gather);
    printf("# %d entries: %d differ by more than %g %%, %d in one profile "
           "only",
           tally.entries, tally.over, tolerance_percent, tally.missing);
    if (tally.worst[0] != '\0')
        printf("; largest difference %.2f %% (%s)", tally.worst_percent,
               tally.worst);
    printf("\n# %d times of %.1f ms or more: %d differ by more than %g %%, "
           "largest difference %.2f %%\n",
           tally.long_entries, LONG_ENTRY_S * 1e3, tally.long_over,
           tolerance_percent, tally.long_worst_percent);
    profile_free(&a);
    profile_free(&b);
    return tally.over == 0 && tally.missing == 0 ? EXIT_OK
                                                 : EXIT_FAILURE_RUN;
}
