/*
 * The MPI comm's operations, run as 3 processes by mpirun (test
 * executor_parallel_mpi_comm, through mpi_comm_check.sh): crossing sends,
 * an all-reduce over a group, the reduce-scatter and all-gather of ZeRO-1
 * with uneven chunks, the host all-reduce and the barrier. Each process
 * checks its own results and exits 1 with a message on the first wrong
 * one; plain C rather than cmocka, whose report three processes would
 * interleave.
 */
#include "executor/executor.h"

#include <stdio.h>
#include <stdlib.h>

static int failures;

static void expect(bool ok, int rank, const char *what, int index)
{
    if (ok)
        return;
    fprintf(stderr, "rank %d: %s wrong at %d\n", rank, what, index);
    failures++;
}

static int check_crossing_sends(const comm *c, pt_error *err)
{
    /* everyone sends to everyone before anyone receives */
    float out[4], in[4];
    for (int peer = 0; peer < c->size; peer++) {
        if (peer == c->rank)
            continue;
        for (int i = 0; i < 4; i++)
            out[i] = (float)(100 * c->rank + 10 * peer + i);
        if (comm_send(c, peer, 7, out, 4, err) != 0)
            return -1;
    }
    for (int peer = 0; peer < c->size; peer++) {
        if (peer == c->rank)
            continue;
        if (comm_recv(c, peer, 7, in, 4, err) != 0)
            return -1;
        for (int i = 0; i < 4; i++)
            expect(in[i] == (float)(100 * peer + 10 * c->rank + i), c->rank,
                   "crossing send", i);
    }
    return 0;
}

/* Group {2, 0} (not rank order): member i is group[i]. */
static int check_group_collectives(const comm *c, pt_error *err)
{
    const int group[] = {2, 0};
    if (c->rank == 1)
        return 0;
    int member = c->rank == 2 ? 0 : 1;
    float sum[5];
    for (int i = 0; i < 5; i++)
        sum[i] = (float)(c->rank + i);
    if (comm_all_reduce_sum(c, group, 2, sum, 5, err) != 0)
        return -1;
    for (int i = 0; i < 5; i++)
        expect(sum[i] == (float)(2 + 2 * i), c->rank, "group all-reduce", i);
    /* reduce-scatter: chunks [0, 2) and [2, 7) */
    const size_t offsets[] = {0, 2, 7};
    float data[7];
    for (int i = 0; i < 7; i++)
        data[i] = (float)((c->rank + 1) * (i + 1));
    if (c->ops->reduce_scatter(c, group, 2, data, offsets, err) != 0)
        return -1;
    for (size_t i = offsets[member]; i < offsets[member + 1]; i++)
        expect(data[i] == (float)(4 * (i + 1)), c->rank, "reduce-scatter",
               (int)i);
    /* all-gather: each member's chunk holds its number */
    for (size_t i = offsets[member]; i < offsets[member + 1]; i++)
        data[i] = (float)(10 + member);
    if (c->ops->all_gather(c, group, 2, data, offsets, err) != 0)
        return -1;
    for (int i = 0; i < 7; i++)
        expect(data[i] == (float)(i < 2 ? 10 : 11), c->rank, "all-gather",
               i);
    return 0;
}

static int check_world(const comm *c, pt_error *err)
{
    const int world[] = {0, 1, 2};
    double value = (double)c->rank + 0.5;
    if (comm_all_reduce_host(c, world, 3, &value, 1, err) != 0 ||
        comm_barrier(c, err) != 0)
        return -1;
    expect(value == 4.5, c->rank, "host all-reduce", 0);
    return 0;
}

int main(void)
{
    pt_error err = {{0}};
    comm_mpi *world = NULL;
    if (comm_mpi_create(30.0, &world, &err) != 0) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    comm c = comm_mpi_handle(world);
    int groups_members[] = {2, 0};
    int offsets[] = {0, 2};
    comm_groups groups = {.count = 1, .offsets = offsets,
                          .members = groups_members};
    int status = c.size == 3 ? 0 : -1;
    if (status != 0)
        fprintf(stderr, "run me as 3 processes, not %d\n", c.size);
    if (status == 0)
        status = comm_mpi_set_groups(world, &groups, &err);
    if (status == 0)
        status = check_crossing_sends(&c, &err);
    if (status == 0)
        status = check_group_collectives(&c, &err);
    if (status == 0)
        status = check_world(&c, &err);
    if (status != 0) {
        fprintf(stderr, "rank %d: %s\n", c.rank, err.message);
        comm_abort(&c, err.message);
    }
    int exit_status = status != 0 || failures > 0 ? 1 : 0;
    if (exit_status == 0 && c.rank == 0)
        printf("ok: mpi comm over 3 processes\n");
    comm_mpi_finish(world, exit_status);
    return exit_status;
}
