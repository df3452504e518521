/* Errors, unit formatting, path helpers, counts from the environment
 * and the partition string. */
#include "test_support.h"

#include <limits.h>

static void test_fail_and_prefix(void **state)
{
    (void)state;
    pt_error err;
    assert_int_equal(pt_fail(&err, "nodes[%d].gpus: got %d", 1, 0), -1);
    assert_string_equal(err.message, "nodes[1].gpus: got 0");
    pt_error_prefix(&err, "%s", "clusters/bad.json");
    assert_string_equal(err.message, "clusters/bad.json: nodes[1].gpus: got 0");
    assert_int_equal(pt_fail(NULL, "ignored"), -1);
    pt_error_prefix(NULL, "ignored");
}

static void test_prefix_truncates_safely(void **state)
{
    (void)state;
    pt_error err;
    char long_text[2000];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    pt_fail(&err, "%s", long_text);
    assert_int_equal(strlen(err.message), sizeof err.message - 1);
    pt_error_prefix(&err, "file.json");
    assert_int_equal(strlen(err.message), sizeof err.message - 1);
    assert_memory_equal(err.message, "file.json: xxx", 14);
    pt_error_prefix(&err, "%s", long_text);
    assert_int_equal(strlen(err.message), sizeof err.message - 1);
}

static void test_format_seconds(void **state)
{
    (void)state;
    char text[32];
    pt_format_seconds(812e-6, text, sizeof text);
    assert_string_equal(text, "812 us");
    pt_format_seconds(14.2e-3, text, sizeof text);
    assert_string_equal(text, "14.2 ms");
    pt_format_seconds(3.4123, text, sizeof text);
    assert_string_equal(text, "3.41 s");
    pt_format_seconds(0.0, text, sizeof text);
    assert_string_equal(text, "0 s");
    pt_format_seconds(250e-9, text, sizeof text);
    assert_string_equal(text, "250 ns");
    /* Rounding up must move to the next unit, not print "1000 us". */
    pt_format_seconds(0.9999e-3, text, sizeof text);
    assert_string_equal(text, "1.00 ms");
    pt_format_seconds(4321.0, text, sizeof text);
    assert_string_equal(text, "4321 s");
    pt_format_seconds(-2.5e-3, text, sizeof text);
    assert_string_equal(text, "-2.50 ms");
}

static void test_format_bytes(void **state)
{
    (void)state;
    char text[32];
    pt_format_bytes(1.5 * PT_GIB, text, sizeof text);
    assert_string_equal(text, "1.50 GiB");
    pt_format_bytes(512.0 * 1024 * 1024, text, sizeof text);
    assert_string_equal(text, "512 MiB");
    pt_format_bytes(4096, text, sizeof text);
    assert_string_equal(text, "4.00 KiB");
    pt_format_bytes(12, text, sizeof text);
    assert_string_equal(text, "12 B");
    pt_format_bytes(1024.0 * 1024 - 1, text, sizeof text);
    assert_string_equal(text, "1.00 MiB");
    char tiny[4];
    pt_format_bytes(1.5 * PT_GIB, tiny, sizeof tiny);
    assert_string_equal(tiny, "1.5");
}

static void test_env_count(void **state)
{
    (void)state;
    const char *name = "PARTITA_TEST_ENV_COUNT";
    pt_error err = {{0}};
    long count = -1;
    unsetenv(name);
    assert_int_equal(pt_env_count(name, "SMs", 64, 8, &count, &err), 0);
    assert_int_equal(count, 8);
    setenv(name, "", 1);
    assert_int_equal(pt_env_count(name, "SMs", 64, 8, &count, &err), 0);
    assert_int_equal(count, 8);
    setenv(name, "0", 1);
    assert_int_equal(pt_env_count(name, "SMs", 64, 8, &count, &err), 0);
    assert_int_equal(count, 0);
    setenv(name, "64", 1);
    assert_int_equal(pt_env_count(name, "SMs", 64, 8, &count, &err), 0);
    assert_int_equal(count, 64);
    const char *bad[] = {"65", "-1", "8x", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(name, bad[i], 1);
        assert_int_equal(pt_env_count(name, "SMs", 64, 8, &count, &err), -1);
        assert_non_null(strstr(err.message, name));
        assert_non_null(strstr(err.message, "a count of SMs from 0 to 64"));
        assert_non_null(strstr(err.message, bad[i]));
    }
    unsetenv(name);
}

static void test_copy_string(void **state)
{
    (void)state;
    char small[4];
    pt_copy_string(small, sizeof small, "abcdef");
    assert_string_equal(small, "abc");
    pt_copy_string(small, sizeof small, NULL);
    assert_string_equal(small, "");
}

static void test_directory_and_resolve(void **state)
{
    (void)state;
    char text[PT_PATH_MAX];
    pt_directory_of("clusters/hetero.json", text, sizeof text);
    assert_string_equal(text, "clusters");
    pt_directory_of("hetero.json", text, sizeof text);
    assert_string_equal(text, ".");
    pt_directory_of("/hetero.json", text, sizeof text);
    assert_string_equal(text, "/");
    pt_directory_of("/a/b/c.json", text, sizeof text);
    assert_string_equal(text, "/a/b");

    pt_resolve_path("docs/examples", "../../models/x.json", text, sizeof text);
    assert_string_equal(text, "docs/examples/../../models/x.json");
    pt_resolve_path("docs/", "x.json", text, sizeof text);
    assert_string_equal(text, "docs/x.json");
    pt_resolve_path(".", "x.json", text, sizeof text);
    assert_string_equal(text, "x.json");
    pt_resolve_path("docs", "/abs/x.json", text, sizeof text);
    assert_string_equal(text, "/abs/x.json");
}

static void test_partition_parse_valid(void **state)
{
    (void)state;
    int layers[PT_MAX_STAGES];
    int count = -1;
    pt_error err;
    assert_int_equal(partition_parse("0-11-8-8", layers, PT_MAX_STAGES,
                                     &count, &err), 0);
    assert_int_equal(count, 4);
    assert_int_equal(layers[0], 0);
    assert_int_equal(layers[1], 11);
    assert_int_equal(layers[3], 8);
    assert_int_equal(partition_parse("48", layers, PT_MAX_STAGES, &count,
                                     &err), 0);
    assert_int_equal(count, 1);
    assert_int_equal(layers[0], 48);
    assert_int_equal(partition_parse("2147483647", layers, 1, &count, &err),
                     0);
    assert_int_equal(layers[0], INT_MAX);
}

static void expect_partition_error(const char *text, int max_stages,
                                   const char *expected)
{
    int layers[8];
    int count = -1;
    pt_error err = {""};
    assert_int_equal(partition_parse(text, layers, max_stages, &count, &err),
                     -1);
    assert_int_equal(count, 0);
    EXPECT_MESSAGE(&err, "partition \"", expected);
}

static void test_partition_parse_invalid(void **state)
{
    (void)state;
    expect_partition_error("", 8, "empty");
    expect_partition_error("1--2", 8, "character 3");
    expect_partition_error("-1", 8, "character 1");
    expect_partition_error("1-a", 8, "character 3");
    expect_partition_error(" 1", 8, "character 1");
    expect_partition_error("1 ", 8, "unexpected ' '");
    expect_partition_error("1-", 8, "found the end");
    expect_partition_error("+1", 8, "character 1");
    expect_partition_error("1.5", 8, "unexpected '.'");
    /* stages count from 0, as in plan.json (issue 18, item 13) */
    expect_partition_error("2147483648", 8, "stage 0 (counted from 0) has "
                                            "more than 2147483647 layers");
    expect_partition_error("1-99999999999999999999999", 8, "stage 1 (counted");
    expect_partition_error("1-2-3", 2, "more than 2 stages");
}

static void test_partition_format_and_even(void **state)
{
    (void)state;
    int layers[] = {0, 11, 8, 8, 8, 8, 5, 0};
    char text[64];
    partition_format(layers, 8, text, sizeof text);
    assert_string_equal(text, "0-11-8-8-8-8-5-0");
    char small[6];
    partition_format(layers, 8, small, sizeof small);
    assert_string_equal(small, "0-11-");

    int even[8];
    partition_even(48, 5, even);
    int expected[] = {10, 10, 10, 9, 9};
    assert_memory_equal(even, expected, sizeof expected);
    partition_even(3, 5, even);
    int few[] = {1, 1, 1, 0, 0};
    assert_memory_equal(even, few, sizeof few);

    /* Round trip through the parser. */
    int parsed[PT_MAX_STAGES], count = 0;
    assert_int_equal(partition_parse(text, parsed, PT_MAX_STAGES, &count,
                                     NULL), 0);
    assert_int_equal(count, 8);
    assert_memory_equal(parsed, layers, sizeof layers);
}

static void test_enum_names(void **state)
{
    (void)state;
    assert_string_equal(schedule_name(SCHEDULE_1F1B), "1f1b");
    assert_string_equal(schedule_name(SCHEDULE_GPIPE), "gpipe");
    assert_string_equal(precision_name(PRECISION_BF16), "bf16");
    assert_string_equal(precision_name(PRECISION_FP16), "fp16");
    assert_string_equal(precision_name(PRECISION_FP32), "fp32");
    assert_int_equal(precision_bytes(PRECISION_BF16), 2);
    assert_int_equal(precision_bytes(PRECISION_FP32), 4);
    assert_string_equal(profile_source_name(PROFILE_PUBLISHED), "published");
    parallel_config config = {.gbs = 64, .mbs = 2, .dp = 4};
    assert_int_equal(parallel_microbatches(&config), 8);
    config.dp = 0;
    assert_int_equal(parallel_microbatches(&config), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fail_and_prefix),
        cmocka_unit_test(test_prefix_truncates_safely),
        cmocka_unit_test(test_format_seconds),
        cmocka_unit_test(test_format_bytes),
        cmocka_unit_test(test_env_count),
        cmocka_unit_test(test_copy_string),
        cmocka_unit_test(test_directory_and_resolve),
        cmocka_unit_test(test_partition_parse_valid),
        cmocka_unit_test(test_partition_parse_invalid),
        cmocka_unit_test(test_partition_format_and_even),
        cmocka_unit_test(test_enum_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
