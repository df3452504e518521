/*
 * The NCCL comm's argument checks, which need no GPU (built only when
 * NCCL is): a world of at least two ranks, one rank per existing device,
 * groups of at least two distinct ranks of the world; and comm_nccl_create
 * refuses before touching NCCL when a device is missing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "executor/parallel/parallel.h"

static void expect_refusal(int size, const int *devices, int device_count,
                           const comm_groups *groups, const char *part)
{
    pt_error err = {{0}};
    assert_int_equal(comm_nccl_check_arguments(size, devices, device_count,
                                               groups, &err),
                     -1);
    if (strstr(err.message, part) == NULL)
        fail_msg("\"%s\" not in \"%s\"", part, err.message);
}

static void worlds_and_devices(void **state)
{
    (void)state;
    static const int two[] = {0, 1};
    static const int shared[] = {1, 1};
    pt_error err = {{0}};
    assert_int_equal(comm_nccl_check_arguments(2, two, 2, NULL, &err), 0);
    expect_refusal(1, two, 2, NULL, "at least 2 ranks");
    expect_refusal(2, two, 1, NULL, "rank 1 is on cuda device 1, which "
                                    "does not exist (1 visible)");
    expect_refusal(2, shared, 2, NULL, "ranks 0 and 1 are both on cuda "
                                       "device 1");
}

static void groups(void **state)
{
    (void)state;
    static const int devices[] = {0, 1, 2, 3};
    int offsets[] = {0, 2, 4};
    int members[] = {0, 2, 1, 3};
    comm_groups good = {.count = 2, .offsets = offsets, .members = members};
    pt_error err = {{0}};
    assert_int_equal(comm_nccl_check_arguments(4, devices, 4, &good, &err),
                     0);
    int lonely_offsets[] = {0, 1};
    comm_groups lonely = {.count = 1, .offsets = lonely_offsets,
                          .members = members};
    expect_refusal(4, devices, 4, &lonely, "group 0 has 1 rank");
    int twice[] = {3, 3};
    comm_groups repeated = {.count = 1, .offsets = offsets,
                            .members = twice};
    expect_refusal(4, devices, 4, &repeated, "rank 3 appears twice");
    int outside[] = {0, 4};
    comm_groups stranger = {.count = 1, .offsets = offsets,
                            .members = outside};
    expect_refusal(4, devices, 4, &stranger, "rank 4 is not one of the 4");
}

/* Device 999 exists nowhere: refused before any NCCL call. */
static void create_refuses_a_missing_device(void **state)
{
    (void)state;
    static const int devices[] = {0, 999};
    comm_nccl *world = NULL;
    pt_error err = {{0}};
    assert_int_equal(comm_nccl_create(2, devices, NULL, 10.0, &world, &err),
                     -1);
    assert_null(world);
    /* device 999 here, or device 0 on a machine without GPUs */
    assert_non_null(strstr(err.message, "which does not exist"));
    assert_int_equal(comm_nccl_create(2, devices, NULL, 0.0, &world, &err),
                     -1);
    assert_non_null(strstr(err.message, "timeout"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(worlds_and_devices),
        cmocka_unit_test(groups),
        cmocka_unit_test(create_refuses_a_missing_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
