/*
 * The cuda backend's embedding plan (executor/cuda/cuda_ops.h), which is
 * host code and so runs without a GPU: the rows of every token of a
 * shard's range grouped in ascending token order, rows in row order,
 * against a plain scan of every token; the scratch left zeroed so the
 * next build, of another range, starts clean.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_ops.h"

/* The plan a plain scan gives: for each token of the range in order, its
 * rows in order. */
static void expect_plan(const embedding_plan *plan, const uint32_t *tokens,
                        int N, int first, int count)
{
    int group = 0, place = 0;
    for (int v = 0; v < count; v++) {
        int start = place;
        for (int n = 0; n < N; n++)
            if ((long)tokens[n] - first == v) {
                assert_true(group < plan->unique_tokens);
                assert_int_equal(plan->rows[place], n);
                place++;
            }
        if (place == start)
            continue;
        assert_int_equal(plan->tokens[group], (uint32_t)v);
        assert_int_equal(plan->starts[group], start);
        group++;
    }
    assert_int_equal(plan->unique_tokens, group);
    assert_int_equal(plan->starts[group], place);
}

static bool all_zero(const unsigned char *bytes, size_t size)
{
    for (size_t i = 0; i < size; i++)
        if (bytes[i] != 0)
            return false;
    return true;
}

static void test_plans_match_a_plain_scan(void **state)
{
    (void)state;
    enum { N = 777, V = 1000 };
    uint32_t tokens[N];
    uint64_t random = 12345;
    for (int n = 0; n < N; n++) {
        random = random * 6364136223846793005ull + 1442695040888963407ull;
        /* a few tokens often (repeats), the rest anywhere */
        tokens[n] = (uint32_t)((random >> 33) % (n % 3 == 0 ? 7 : V));
    }
    int starts[N + 1], rows[N];
    uint32_t group_tokens[N];
    embedding_plan plan = {.starts = starts, .rows = rows,
                           .tokens = group_tokens};
    size_t scratch_bytes = embedding_plan_scratch_bytes(V);
    unsigned char *scratch = calloc(1, scratch_bytes);
    assert_non_null(scratch);
    /* the whole vocabulary, then the shards of tp 2 and 3, then again */
    const int ranges[][2] = {{0, V}, {0, 500}, {500, 500}, {0, 334},
                             {334, 333}, {667, 333}, {0, V}, {3, 64}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        embedding_plan_build_range(&plan, tokens, N, ranges[r][0],
                                   ranges[r][1], scratch);
        expect_plan(&plan, tokens, N, ranges[r][0], ranges[r][1]);
        assert_true(all_zero(scratch, scratch_bytes));
    }
    embedding_plan_build(&plan, tokens, N, V, scratch);
    expect_plan(&plan, tokens, N, 0, V);
    free(scratch);
}

static void test_no_rows_in_range(void **state)
{
    (void)state;
    uint32_t tokens[3] = {1, 2, 3};
    int starts[4], rows[3];
    uint32_t group_tokens[3];
    embedding_plan plan = {.starts = starts, .rows = rows,
                           .tokens = group_tokens};
    void *scratch = calloc(1, embedding_plan_scratch_bytes(10));
    embedding_plan_build_range(&plan, tokens, 3, 5, 10, scratch);
    assert_int_equal(plan.unique_tokens, 0);
    assert_int_equal(plan.starts[0], 0);
    free(scratch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plans_match_a_plain_scan),
        cmocka_unit_test(test_no_rows_in_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
