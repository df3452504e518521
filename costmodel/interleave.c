/*
 * Megatron's interleaved 1F1B (virtual pipeline stages), priced
 * (docs/cost-model.md, "Interleaved 1F1B"): each of the pp ranks holds v
 * model chunks, chunk c of rank i being virtual stage c pp + i, and runs
 * Megatron's order of chunk forwards and backwards. The simulation is the
 * plain schedule's (schedule.c) over pp x v virtual stages that share one
 * compute stream and one pair of transfer lanes per rank; with v = 1 it
 * is the plain 1F1B, event for event.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

int interleave_warmup(int pp, int v, int stage, int microbatches)
{
    /* Megatron's get_forward_backward_func: the plain 1F1B for one chunk,
     * else its interleaved warm-up (common/plan.c, which exec shares) */
    return parallel_chunk_warmup(pp, v, stage, microbatches);
}

int costmodel_chunks_in_flight(const parallel_config *config, int stage,
                               int microbatches)
{
    int v = parallel_virtual_stages(config);
    long long held = interleave_warmup(config->pp, v, stage, microbatches) +
                     1LL;
    long long total = (long long)microbatches * v;
    return (int)(held < total ? held : total);
}

/* Working state of one simulation; arrival times are -1 until known.
 * Cells are indexed [virtual stage x m + micro-batch]. */
typedef struct chunk_sim {
    int pp, v, m;
    double *arrive_forward, *arrive_backward, *forward_end;
    double *stream_free, *lane_forward, *lane_backward; /* [pp] */
    int *forwards_done, *backwards_done, *warmup;      /* [pp] */
    timeline_event *events;
    int event_count;
} chunk_sim;

static void note_event(chunk_sim *st, int stage, int microbatch,
                       event_kind kind, double start, double end)
{
    if (st->events)
        st->events[st->event_count++] = (timeline_event){
            .rank = stage, .stage = stage, .microbatch = microbatch,
            .kind = kind, .start_s = start, .end_s = end};
}

/* The output of virtual stage q (rank q mod pp) travels on its rank's
 * lane to the rank of virtual stage `to`. */
static void hand_over(chunk_sim *st, int q, int to, int microbatch,
                      double ready, double duration, bool forward)
{
    int from = q % st->pp, receiver = to % st->pp;
    double *lane = forward ? &st->lane_forward[from]
                           : &st->lane_backward[from];
    double start = fmax(ready, *lane);
    *lane = start + duration;
    double *arrival = forward ? st->arrive_forward : st->arrive_backward;
    arrival[(size_t)to * st->m + microbatch] = *lane;
    note_event(st, from, microbatch, forward ? EVENT_SEND_FWD : EVENT_SEND_BWD,
               start, *lane);
    note_event(st, receiver, microbatch,
               forward ? EVENT_RECV_FWD : EVENT_RECV_BWD, start, *lane);
}

/* Whether rank s's next operation is a forward: the warm-up's, then one
 * forward and one backward in turn, then the cool-down's backwards. */
static bool next_is_forward(const chunk_sim *st, int s)
{
    int total = st->m * st->v, f = st->forwards_done[s];
    if (f >= total)
        return false;
    if (f < st->warmup[s])
        return true;
    return f - st->warmup[s] == st->backwards_done[s];
}

/* The duration of one chunk of rank s: its share of the layers, plus the
 * embedding (chunk 0 of rank 0) or the head (last chunk of the last). */
static double chunk_seconds(const interleave_stage *stage, int v,
                            bool forward, bool holds_ends)
{
    double layers = forward ? stage->layers_forward_s
                            : stage->layers_backward_s;
    double ends = forward ? stage->ends_forward_s : stage->ends_backward_s;
    return layers / v + (holds_ends ? ends : 0.0);
}

/* Runs rank s as far as its inputs allow; returns operations done. */
static int advance_rank(chunk_sim *st, const interleave_stage *stages, int s,
                        schedule_result *out)
{
    int pp = st->pp, v = st->v, last_q = pp * v - 1, done = 0;
    while (st->forwards_done[s] + st->backwards_done[s] < 2 * st->m * v) {
        bool forward = next_is_forward(st, s);
        int chunk, mb;
        parallel_chunk_unit(pp, v, forward ? st->forwards_done[s]
                                  : st->backwards_done[s],
                   forward, &chunk, &mb);
        int q = chunk * pp + s;
        size_t cell = (size_t)q * st->m + mb;
        double ready = forward ? (q == 0 ? 0.0 : st->arrive_forward[cell])
                               : (q == last_q ? st->forward_end[cell]
                                              : st->arrive_backward[cell]);
        if (ready < 0.0)
            break;
        bool ends = (q == 0 && s == 0) || q == last_q;
        double start = fmax(ready, st->stream_free[s]);
        double end = start + chunk_seconds(&stages[s], v, forward, ends);
        st->stream_free[s] = end;
        out->stage_busy_s[s] += end - start;
        note_event(st, s, mb, forward ? EVENT_FWD : EVENT_BWD, start, end);
        if (forward) {
            st->forward_end[cell] = end;
            if (q < last_q)
                hand_over(st, q, q + 1, mb, end, stages[s].send_fwd_s, true);
            st->forwards_done[s]++;
        } else {
            out->stage_end_s[s] = end;
            if (q > 0)
                hand_over(st, q, q - 1, mb, end, stages[s].send_bwd_s, false);
            st->backwards_done[s]++;
        }
        done++;
    }
    return done;
}

static int check_chunk_inputs(const interleave_stage *stages, int pp, int v,
                              int m, pt_error *err)
{
    if (pp < 1 || pp > PT_MAX_STAGES || v < 1 || m < 1)
        return pt_fail(err, "interleaved schedule: needs 1..%d stages, at "
                       "least one chunk and one micro-batch, got %d, %d, %d",
                       PT_MAX_STAGES, pp, v, m);
    if ((double)pp * v * m > COSTMODEL_MAX_SCHEDULE_STEPS)
        return pt_fail(err, "interleaved schedule: pp %d x %d chunks x %d "
                       "micro-batches is %.0f steps; the cost model "
                       "simulates at most %ld", pp, v, m,
                       (double)pp * v * m, COSTMODEL_MAX_SCHEDULE_STEPS);
    for (int s = 0; s < pp; s++) {
        const interleave_stage *x = &stages[s];
        double times[6] = {x->layers_forward_s, x->layers_backward_s,
                           x->ends_forward_s, x->ends_backward_s,
                           x->send_fwd_s, x->send_bwd_s};
        if (!schedule_times_valid(times, 6))
            return pt_fail(err, "interleaved schedule: stage %d has a "
                           "negative or non-finite time", s);
    }
    return 0;
}

static int chunk_sim_allocate(chunk_sim *st, int pp, int v, int m,
                              bool want_events, pt_error *err)
{
    size_t cells = (size_t)pp * v * m;
    *st = (chunk_sim){.pp = pp, .v = v, .m = m};
    double *block = malloc((3 * cells + 3 * (size_t)pp) * sizeof(double));
    int *counts = calloc(3 * (size_t)pp, sizeof(int));
    if (want_events)
        st->events = malloc((2 * cells + 4 * cells) * sizeof *st->events);
    if (!block || !counts || (want_events && !st->events)) {
        free(block);
        free(counts);
        free(st->events);
        return pt_fail(err, "interleaved schedule: out of memory");
    }
    for (size_t i = 0; i < 3 * cells; i++)
        block[i] = -1.0;
    st->arrive_forward = block;
    st->arrive_backward = block + cells;
    st->forward_end = block + 2 * cells;
    st->stream_free = block + 3 * cells;
    st->lane_forward = st->stream_free + pp;
    st->lane_backward = st->lane_forward + pp;
    for (int s = 0; s < 3 * pp; s++)
        st->stream_free[s] = 0.0;
    st->forwards_done = counts;
    st->backwards_done = counts + pp;
    st->warmup = counts + 2 * pp;
    for (int s = 0; s < pp; s++)
        st->warmup[s] = interleave_warmup(pp, v, s, m);
    return 0;
}

int interleave_simulate(const interleave_stage *stages, int pp, int v,
                        int microbatches, bool want_events,
                        schedule_result *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    chunk_sim st;
    if (check_chunk_inputs(stages, pp, v, microbatches, err) != 0 ||
        chunk_sim_allocate(&st, pp, v, microbatches, want_events, err) != 0)
        return -1;
    out->stage_end_s = calloc((size_t)pp, sizeof *out->stage_end_s);
    out->stage_busy_s = calloc((size_t)pp, sizeof *out->stage_busy_s);
    int rc = -1;
    if (!out->stage_end_s || !out->stage_busy_s) {
        pt_fail(err, "interleaved schedule: out of memory");
        goto done;
    }
    long long remaining = 2LL * pp * v * microbatches;
    int idle_sweeps = 0;
    for (bool downward = true; remaining > 0; downward = !downward) {
        int progress = 0;
        for (int i = 0; i < pp; i++)
            progress += advance_rank(&st, stages, downward ? i : pp - 1 - i,
                                     out);
        idle_sweeps = progress == 0 ? idle_sweeps + 1 : 0;
        if (idle_sweeps == 2) {
            pt_fail(err, "interleaved schedule: deadlock (an internal "
                    "error)");
            goto done;
        }
        remaining -= progress;
    }
    for (int s = 0; s < pp; s++)
        out->pipeline_end_s = fmax(out->pipeline_end_s, out->stage_end_s[s]);
    out->event_count = st.event_count;
    out->events = st.events;
    st.events = NULL;
    rc = 0;
done:
    free(st.arrive_forward);
    free(st.forwards_done);
    free(st.events);
    if (rc != 0)
        schedule_result_free(out);
    return rc;
}

/* The plain schedules' count, or the interleaved one's (above). */
int costmodel_microbatches_in_flight(const parallel_config *config, int stage,
                                     int microbatches)
{
    /* one rank trains micro-batch after micro-batch in one slot */
    if (config->tp * config->dp * config->pp == 1)
        return 1;
    if (config->schedule == SCHEDULE_GPIPE)
        return microbatches;
    if (parallel_virtual_stages(config) > 1)
        return costmodel_chunks_in_flight(config, stage, microbatches);
    int warm = config->pp - stage;
    return warm < microbatches ? warm : microbatches;
}

int costmodel_check_schedule_levers(const costmodel *cm,
                                    const parallel_config *config,
                                    const int *partition, pt_error *err)
{
    if (parallel_check_schedule_levers(config, cm->model.seq, err) != 0) {
        pt_error_prefix(err, "plan");
        return -1;
    }
    int v = parallel_virtual_stages(config);
    for (int s = 0; s < config->pp && v > 1; s++)
        if (partition[s] % v != 0)
            return pt_fail(err, "plan: partition: stage %d holds %d layers, "
                           "not a multiple of virtual_stages %d", s,
                           partition[s], v);
    return 0;
}

int costmodel_interleave_pipeline(const costmodel *cm,
                                  const parallel_config *config,
                                  const node_lane *lane,
                                  const stage_placement *placement,
                                  const type_costs *costs,
                                  const stage_estimate *stages,
                                  int microbatches, bool want_events,
                                  schedule_result *out, pt_error *err)
{
    int pp = config->pp;
    interleave_stage *ranks = calloc((size_t)pp, sizeof *ranks);
    if (!ranks)
        return pt_fail(err, "interleaved schedule: out of memory");
    /* the chunk boundary from the last rank back to the first joins GPU
     * x of the last stage to GPU x of the first: the tied embedding's
     * pair of GPUs */
    link_spec wrap_link;
    int wrap_curve;
    costmodel_embedding_link(cm, config, lane, &wrap_link, &wrap_curve);
    double wrap_s = costmodel_send_seconds(
        cm, costmodel_pipeline_message_bytes(&cm->model, config), wrap_curve,
        wrap_link);
    for (int s = 0; s < pp; s++) {
        const type_costs *slow = &costs[placement[s].slow_type];
        const stage_estimate *st = &stages[s];
        interleave_stage *r = &ranks[s];
        double head_forward, head_backward;
        costmodel_head_phases(&cm->model, config, s, slow, &head_forward,
                              &head_backward);
        r->ends_forward_s = s == 0 ? slow->embedding_forward_s
                                   : head_forward;
        r->ends_backward_s = s == 0 ? slow->embedding_backward_s
                                    : head_backward;
        if (s != 0 && s != pp - 1)
            r->ends_forward_s = r->ends_backward_s = 0.0;
        r->layers_forward_s = fmax(0.0, st->forward_s - r->ends_forward_s);
        r->layers_backward_s = fmax(0.0, st->backward_s - r->ends_backward_s);
        r->send_fwd_s = s < pp - 1 ? st->send_s : wrap_s;
        r->send_bwd_s = s > 0 ? st->send_bwd_s : wrap_s;
    }
    int rc = interleave_simulate(ranks, pp, config->virtual_stages,
                                 microbatches, want_events, out, err);
    free(ranks);
    return rc;
}
