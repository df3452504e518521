/*
 * The default search against the exhaustive one, on random clusters: 1 to
 * 4 node types of 2, 4 or 8 GPUs with random GPUs (the derived A10, RTX
 * 3090, A100 and V100 profiles), links and node counts, random global
 * batches and models small enough that some plans run out of memory. On
 * every cluster both must keep the same shortlist, so they rank the same
 * plans: the same best step time, and the same ranking after it. The
 * thread count must change nothing either, counts included.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "fixtures.h"

#define CLUSTERS 200

/* A random cluster of 1 to 4 types, 2 to 8 nodes of 2, 4 or 8 GPUs, as
 * JSON text. */
static void random_cluster_text(random_source *r, int index, char *out,
                                size_t size)
{
    static const int sizes[] = {2, 4, 8};
    int types = 1 + pick(r, 4);
    random_cluster_json(r, "random", index, types, types + 1 + pick(r, 4),
                        sizes, 3, out, size);
}

/* A GPT of 4..16 layers, wide enough that memory binds now and then. */
static model_shape random_model(random_source *r)
{
    static const int hiddens[] = {1024, 2048, 4096, 6144};
    model_shape m = {.layers = 4 + pick(r, 13), .heads = 16, .seq = 2048,
                     .vocab = 50257, .tied_embeddings = true};
    m.hidden = hiddens[pick(r, 4)];
    m.ffn_hidden = 4 * m.hidden;
    snprintf(m.name, sizeof m.name, "random-%d", m.layers);
    return m;
}

static search_result search(costmodel *cm, const search_options *o)
{
    search_result result;
    pt_error err = {{0}};
    if (planner_search(cm, o, &result, &err) != 0)
        fail_msg("%s", err.message);
    return result;
}

static void expect_same_ranking(const search_result *a,
                                const search_result *b, int cluster_index)
{
    if (a->plan_count != b->plan_count)
        fail_msg("cluster %d: %d plans against %d", cluster_index,
                 a->plan_count, b->plan_count);
    for (int i = 0; i < a->plan_count; i++)
        if (a->plans[i].step_time_s != b->plans[i].step_time_s)
            fail_msg("cluster %d: plan %d steps %.9g s against %.9g s",
                     cluster_index, i + 1, a->plans[i].step_time_s,
                     b->plans[i].step_time_s);
}

static void test_default_search_is_exact(void **state)
{
    (void)state;
    random_source r = {0x9e3779b97f4a7c15ULL};
    char profiles[PT_PATH_MAX];
    profile_root(profiles, sizeof profiles);
    long long scored_default = 0, scored_exhaustive = 0;
    int with_plans = 0, multi_type = 0;
    for (int i = 0; i < CLUSTERS; i++) {
        char text[4096];
        random_cluster_text(&r, i, text, sizeof text);
        cluster c;
        costmodel cm;
        model_shape m = random_model(&r);
        open_random_case(text, &m, profiles, &c, &cm);
        search_options o;
        search_options_default(&o);
        static const int batches[] = {16, 32, 64, 128};
        o.gbs = batches[pick(&r, 4)];
        o.max_mbs = 4;
        o.keep = 4;
        o.threads = 2;
        /* every lever set, ZeRO-2/3 and offload among them; sequence
         * parallelism (a task of its own beside each tp task) on every
         * fourth cluster, which keeps the exhaustive runs' time near
         * what it was before those tasks (50 clusters with them) */
        o.zero_levers = ZERO_LEVERS_ALWAYS;
        o.allow_sequence_parallel = i % 4 == 0;
        search_result fast = search(&cm, &o);
        o.exhaustive = true;
        search_result all = search(&cm, &o);
        expect_same_ranking(&fast, &all, i);
        assert_int_equal(fast.exact, true);
        o.exhaustive = false;
        o.threads = 1;
        search_result one = search(&cm, &o);
        expect_same_ranking(&fast, &one, i);
        assert_int_equal(one.configurations_scored,
                         fast.configurations_scored);
        assert_int_equal(one.configurations_pruned,
                         fast.configurations_pruned);
        scored_default += fast.configurations_scored;
        scored_exhaustive += all.configurations_scored;
        with_plans += fast.plan_count > 0;
        multi_type += c.type_count > 1;
        search_result_free(&fast);
        search_result_free(&all);
        search_result_free(&one);
        costmodel_close(&cm);
        cluster_free(&c);
    }
    print_message("%d clusters (%d of several types, %d with a plan): the "
                  "default search scored %lld placements, the exhaustive "
                  "one %lld; same rankings\n", CLUSTERS, multi_type,
                  with_plans, scored_default, scored_exhaustive);
    assert_true(with_plans >= CLUSTERS / 2);
    assert_true(multi_type >= CLUSTERS / 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_search_is_exact),
    };
    return cmocka_run_group_tests_name("search_property", tests, NULL, NULL);
}
