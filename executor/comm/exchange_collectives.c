/*
 * The collectives of the device exchange (executor/comm/comm.h): each
 * group's rendezvous of the hosts, and the stream-ordered all-reduce,
 * reduce-scatter and all-gather on the members' device buffers, the host
 * all-reduce of doubles and the barrier. The failures and waits they use
 * are comm/exchange_waits.c's; the world and the messages, which call
 * these, comm/exchange.c's.
 *
 * A collective of member i of n, all enqueued on the caller's stream S:
 *   1. record ready[i] on S (its buffer is complete there); meet the
 *      others (host), exchanging buffers and events;
 *   2. S waits for every other member's ready event (on the device);
 *      stamp the GPU clock when paced;
 *   3. one kernel: chunk i of the result from chunk i of every member's
 *      buffer (sums in group order), written into chunk i of every
 *      member's buffer (all-reduce), of its own (reduce-scatter), or its
 *      own chunk i into every other buffer (all-gather); chunk i of a
 *      buffer is read and written by member i alone, so no two kernels
 *      touch the same bytes;
 *   4. when paced, spin until stamp + the link's time; record done[i];
 *      meet again; S waits for every other member's done event, so no
 *      member reuses its buffer while another still writes into it.
 * The host never waits for the GPU: it meets the other hosts, which run
 * ahead of their GPUs as it does. An event is recorded again only at the
 * group's next collective, which every member reaches after its waits on
 * the previous one were enqueued. No work on the GPU ever waits for a
 * host, so the GPU cannot hang on a failed rank.
 */
#include "executor/comm/device_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long a member spins on the host for the others before it sleeps
 * on the condition variable (their arrival is usually microseconds
 * away; waking from a sleep costs tens). */
#define RENDEZVOUS_SPIN_S 50e-6

/* ------------------------------------------------------------ channels */

/* "all-reduce over ranks 0, 2" (the first few). */
static void describe(const char *what, const int *group, int group_size,
                     char *out, size_t size)
{
    int used = snprintf(out, size, "%s over ranks", what);
    for (int i = 0; i < group_size && used > 0 && (size_t)used < size; i++)
        used += snprintf(out + used, size - (size_t)used, "%s%d",
                         i == 0 ? " " : ", ", group[i]);
}

static link_spec group_link(const comm_exchange *world, const int *group,
                            int group_size)
{
    link_spec slowest = {0.0, 0.0};
    bool any = false;
    for (int i = 0; world->links != NULL && i < group_size; i++)
        for (int j = 0; j < group_size; j++) {
            if (i == j)
                continue;
            link_spec l = world->links[group[i] * world->size + group[j]];
            if (!any || l.bandwidth_bytes_per_s <
                            slowest.bandwidth_bytes_per_s ||
                (l.bandwidth_bytes_per_s == slowest.bandwidth_bytes_per_s &&
                 l.latency_s > slowest.latency_s))
                slowest = l;
            any = true;
        }
    return slowest;
}

/* The channel of this group (members in this order), made on first use;
 * lock held. NULL when out of memory. */
static exchange_channel *channel_of(comm_exchange *world, const int *group,
                                    int group_size)
{
    for (exchange_channel *ch = world->channels; ch != NULL; ch = ch->next)
        if (ch->size == group_size &&
            memcmp(ch->members, group, (size_t)group_size * sizeof *group) ==
                0)
            return ch;
    exchange_channel *ch = calloc(1, sizeof *ch);
    if (ch == NULL)
        return NULL;
    ch->size = group_size;
    memcpy(ch->members, group, (size_t)group_size * sizeof *group);
    ch->link = group_link(world, group, group_size);
    atomic_init(&ch->generation, 0);
    ch->next = world->channels;
    world->channels = ch;
    return ch;
}

/* The channel and this rank's index in it, with its events made. */
static int join_channel(const comm *c, const int *group, int group_size,
                        const char *operation, bool events,
                        exchange_channel **out, int *index, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    if (group_size > COMM_EXCHANGE_MAX_RANKS)
        return pt_fail(err, "rank %d: %s: %d members, the exchange joins at "
                            "most %d",
                       c->rank, operation, group_size,
                       COMM_EXCHANGE_MAX_RANKS);
    pthread_mutex_lock(&world->lock);
    exchange_channel *ch = channel_of(world, group, group_size);
    pthread_mutex_unlock(&world->lock);
    if (ch == NULL)
        return pt_fail(err, "rank %d: %s: out of memory", c->rank, operation);
    int me = 0;
    while (group[me] != c->rank)
        me++;
    if (events && ch->ready[me] == NULL &&
        (EXCHANGE_CUDA(cudaEventCreateWithFlags(&ch->ready[me],
                                                cudaEventDisableTiming)) !=
             0 ||
         EXCHANGE_CUDA(cudaEventCreateWithFlags(&ch->done[me],
                                                cudaEventDisableTiming)) !=
             0))
        return -1;
    *out = ch;
    *index = me;
    return 0;
}

void exchange_close_channels(comm_exchange *world, int rank)
{
    pthread_mutex_lock(&world->lock);
    for (exchange_channel *ch = world->channels; ch != NULL; ch = ch->next)
        for (int i = 0; i < ch->size; i++) {
            if (ch->members[i] != rank)
                continue;
            if (ch->ready[i] != NULL)
                cudaEventDestroy(ch->ready[i]);
            if (ch->done[i] != NULL)
                cudaEventDestroy(ch->done[i]);
            ch->ready[i] = ch->done[i] = NULL;
        }
    pthread_mutex_unlock(&world->lock);
}

void exchange_free_channels(comm_exchange *world)
{
    while (world->channels != NULL) {
        exchange_channel *next = world->channels->next;
        free(world->channels);
        world->channels = next;
    }
}

/* --------------------------------------------------------- rendezvous */

/* Posts `mine` and waits until every member of the channel has posted
 * for this generation; `all` gets every member's post, in group order. */
static int rendezvous(const comm *c, exchange_channel *ch, int index,
                      exchange_post mine, exchange_post *all,
                      const char *operation, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    struct timespec deadline = exchange_deadline(world);
    pthread_mutex_lock(&world->lock);
    long generation = atomic_load(&ch->generation);
    ch->posts[generation & 1][index] = mine;
    if (++ch->arrived == ch->size) {
        ch->arrived = 0;
        atomic_store(&ch->generation, generation + 1);
        pthread_cond_broadcast(&world->changed);
    } else {
        pthread_mutex_unlock(&world->lock);
        double until = pt_monotonic_seconds() + RENDEZVOUS_SPIN_S;
        while (atomic_load(&ch->generation) == generation &&
               !atomic_load(&world->failed) &&
               pt_monotonic_seconds() < until)
            ;
        pthread_mutex_lock(&world->lock);
    }
    while (atomic_load(&ch->generation) == generation) {
        if (atomic_load(&world->failed)) {
            pthread_mutex_unlock(&world->lock);
            return exchange_interrupted(c, operation, err);
        }
        if (exchange_wait_change(c, &deadline, operation, err) != 0) {
            pthread_mutex_unlock(&world->lock);
            return -1;
        }
    }
    memcpy(all, ch->posts[generation & 1], (size_t)ch->size * sizeof *all);
    pthread_mutex_unlock(&world->lock);
    return 0;
}

/* The stream waits for every other member's event of a rendezvous. */
static int wait_others(const comm *c, cudaStream_t stream,
                       const exchange_post *all, int size, int index,
                       const char *operation, pt_error *err)
{
    for (int j = 0; j < size; j++)
        if (j != index && all[j].event != NULL &&
            EXCHANGE_CUDA(cudaStreamWaitEvent(stream, all[j].event, 0)) != 0)
            return -1;
    return 0;
}

/* ---------------------------------------------------------- collectives */

typedef enum collective_kind {
    ALL_REDUCE,
    REDUCE_SCATTER,
    ALL_GATHER,
} collective_kind;

/* One collective as enqueued by one member. */
typedef struct collective_call {
    collective_kind kind;
    const int *group;
    int group_size;
    void *data;
    size_t count;                /* elements of the whole buffer */
    const size_t *offsets;       /* chunks of the chunked ones */
    bool bf16;
    bool max;
    cudaStream_t stream;
    const char *what;
} collective_call;

/* Member `index`'s chunk: the caller's for the chunked collectives, else
 * an even split in runs of 64 elements (16-byte aligned for both types). */
static void chunk_of(const collective_call *call, int index, size_t *first,
                     size_t *count)
{
    if (call->offsets != NULL) {
        *first = call->offsets[index];
        *count = call->offsets[index + 1] - *first;
        return;
    }
    size_t n = (size_t)call->group_size;
    size_t per = (call->count + n - 1) / n;
    per = (per + 63) / 64 * 64;
    size_t lo = per * (size_t)index, hi = lo + per;
    lo = lo < call->count ? lo : call->count;
    hi = hi < call->count ? hi : call->count;
    *first = lo;
    *count = hi - lo;
}

/* Step 3 of the file's comment: the kernel of member `index`. */
static cuda_exchange_step step_of(const collective_call *call, int index,
                                  const exchange_post *all)
{
    cuda_exchange_step step = {.bf16 = call->bf16, .max = call->max};
    chunk_of(call, index, &step.first, &step.count);
    int n = call->group_size;
    if (call->kind == ALL_GATHER) {
        step.inputs[step.input_count++] = all[index].data;
        for (int j = 0; j < n; j++)
            if (j != index)
                step.outputs[step.output_count++] = all[j].data;
        return step;
    }
    for (int j = 0; j < n; j++)
        step.inputs[step.input_count++] = all[j].data;
    if (call->kind == REDUCE_SCATTER)
        step.outputs[step.output_count++] = all[index].data;
    else
        for (int j = 0; j < n; j++)
            step.outputs[step.output_count++] = all[j].data;
    return step;
}

/* What the emulated link adds to this collective. */
static double paced_seconds(const collective_call *call,
                            const exchange_channel *ch)
{
    double bytes = (double)call->count * (call->bf16 ? 2.0 : 4.0);
    comm_pattern pattern = call->kind == ALL_REDUCE
                               ? COMM_PATTERN_ALL_REDUCE
                               : COMM_PATTERN_HALF_ALL_REDUCE;
    return comm_emulated_seconds(pattern, bytes, call->group_size, ch->link);
}

/* Steps 2 to 4 between the two rendezvous. */
static int enqueue_exchange(const comm *c, const collective_call *call,
                            const exchange_channel *ch, int index,
                            const exchange_post *all, const char *operation,
                            pt_error *err)
{
    exchange_rank *r = &exchange_world(c)->ranks[c->rank];
    if (wait_others(c, call->stream, all, call->group_size, index,
                    operation, err) != 0)
        return -1;
    double seconds = paced_seconds(call, ch);
    uint64_t *stamp = seconds > 0.0 ? exchange_next_stamp(r) : NULL;
    cuda_exchange_step step = step_of(call, index, all);
    if ((stamp != NULL &&
         EXCHANGE_CUDA(cuda_exchange_stamp(stamp, call->stream)) != 0) ||
        EXCHANGE_CUDA(cuda_exchange_reduce(&step, call->stream)) != 0 ||
        (stamp != NULL &&
         EXCHANGE_CUDA(cuda_exchange_pace(stamp,
                                          exchange_pace_nanoseconds(seconds),
                                          call->stream)) != 0))
        return -1;
    return 0;
}

static int run_collective(const comm *c, const collective_call *call,
                          pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    char operation[160];
    describe(call->what, call->group, call->group_size, operation,
             sizeof operation);
    if (atomic_load(&world->failed))
        return exchange_interrupted(c, operation, err);
    if (!world->ranks[c->rank].open)
        return pt_fail(err, "rank %d: %s: the rank's exchange is not open",
                       c->rank, operation);
    exchange_channel *ch = NULL;
    int index = 0;
    if (join_channel(c, call->group, call->group_size, operation, true, &ch,
                     &index, err) != 0 ||
        EXCHANGE_CUDA(cudaEventRecord(ch->ready[index], call->stream)) != 0)
        return -1;
    exchange_post all[COMM_EXCHANGE_MAX_RANKS];
    exchange_post ready = {.data = call->data, .event = ch->ready[index]};
    if (rendezvous(c, ch, index, ready, all, operation, err) != 0 ||
        enqueue_exchange(c, call, ch, index, all, operation, err) != 0 ||
        EXCHANGE_CUDA(cudaEventRecord(ch->done[index], call->stream)) != 0)
        return -1;
    exchange_post done = {.event = ch->done[index]};
    if (rendezvous(c, ch, index, done, all, operation, err) != 0)
        return -1;
    return wait_others(c, call->stream, all, call->group_size, index,
                       operation, err);
}

int exchange_all_reduce_on_stream(const comm *c, const int *group,
                                  int group_size, void *data, size_t count,
                                  comm_element type, comm_reduce_op op,
                                  void *stream, pt_error *err)
{
    collective_call call = {
        .kind = ALL_REDUCE, .group = group, .group_size = group_size,
        .data = data, .count = count, .bf16 = type == COMM_BFLOAT16,
        .max = op == COMM_MAX, .stream = (cudaStream_t)stream,
        .what = op == COMM_MAX ? "all-reduce (max)" : "all-reduce",
    };
    return run_collective(c, &call, err);
}

int exchange_reduce_scatter_on_stream(const comm *c, const int *group,
                                      int group_size, void *data,
                                      const size_t *chunk_offsets,
                                      comm_element type, void *stream,
                                      pt_error *err)
{
    collective_call call = {
        .kind = REDUCE_SCATTER, .group = group, .group_size = group_size,
        .data = data, .count = chunk_offsets[group_size],
        .offsets = chunk_offsets, .bf16 = type == COMM_BFLOAT16,
        .stream = (cudaStream_t)stream,
        .what = "reduce-scatter",
    };
    return run_collective(c, &call, err);
}

int exchange_all_gather_on_stream(const comm *c, const int *group,
                                  int group_size, void *data,
                                  const size_t *chunk_offsets,
                                  comm_element type, void *stream,
                                  pt_error *err)
{
    collective_call call = {
        .kind = ALL_GATHER, .group = group, .group_size = group_size,
        .data = data, .count = chunk_offsets[group_size],
        .offsets = chunk_offsets, .bf16 = type == COMM_BFLOAT16,
        .stream = (cudaStream_t)stream,
        .what = "all-gather",
    };
    return run_collective(c, &call, err);
}

/* ----------------------------------------------------- host collectives */

/* The sum of a few host doubles: every member reads the others' arrays
 * and sums in group order (the threads comm's order, so the same bits),
 * then meets again so nobody changes its array while another reads. */
int exchange_all_reduce_host(const comm *c, const int *group, int group_size,
                             double *data, size_t count, pt_error *err)
{
    char operation[160];
    describe("all-reduce of host values", group, group_size, operation,
             sizeof operation);
    if (atomic_load(&exchange_world(c)->failed))
        return exchange_interrupted(c, operation, err);
    exchange_channel *ch = NULL;
    int index = 0;
    double *sum = malloc((count + 1) * sizeof *sum);
    if (sum == NULL)
        return pt_fail(err, "rank %d: %s: out of memory", c->rank, operation);
    exchange_post all[COMM_EXCHANGE_MAX_RANKS];
    exchange_post mine = {.data = data};
    int status = join_channel(c, group, group_size, operation, false, &ch,
                              &index, err) != 0 ||
                         rendezvous(c, ch, index, mine, all, operation,
                                    err) != 0
                     ? -1
                     : 0;
    for (size_t k = 0; status == 0 && k < count; k++) {
        sum[k] = ((const double *)all[0].data)[k];
        for (int j = 1; j < group_size; j++)
            sum[k] += ((const double *)all[j].data)[k];
    }
    if (status == 0)
        status = rendezvous(c, ch, index, mine, all, operation, err);
    if (status == 0)
        memcpy(data, sum, count * sizeof *data);
    free(sum);
    return status;
}

int exchange_barrier(const comm *c, pt_error *err)
{
    comm_exchange *world = exchange_world(c);
    int everyone[COMM_EXCHANGE_MAX_RANKS];
    for (int rank = 0; rank < world->size; rank++)
        everyone[rank] = rank;
    if (atomic_load(&world->failed))
        return exchange_interrupted(c, "barrier", err);
    exchange_channel *ch = NULL;
    int index = 0;
    exchange_post all[COMM_EXCHANGE_MAX_RANKS];
    exchange_post none = {0};
    return join_channel(c, everyone, world->size, "barrier", false, &ch,
                        &index, err) != 0 ||
                   rendezvous(c, ch, index, none, all, "barrier", err) != 0
               ? -1
               : 0;
}
