/*
 * The pipeline schedule as a discrete-event simulation (docs/cost-model.md,
 * "Schedule"). Each stage runs its operations in the schedule's fixed
 * order on one compute stream; an operation starts when the stream is
 * free and its input has arrived. Activations and gradients travel on
 * transfer lanes of their own (one per stage and direction), in order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/internal.h"

/* The k-th operation of a stage: a forward or backward of micro-batch. */
typedef struct stage_op {
    bool forward;
    int microbatch;
} stage_op;

static stage_op op_at(schedule_kind kind, int pp, int stage, int microbatches,
                      int k)
{
    int m = microbatches;
    if (kind == SCHEDULE_GPIPE)
        return k < m ? (stage_op){true, k} : (stage_op){false, k - m};
    int warmup = pp - stage - 1 < m ? pp - stage - 1 : m;
    if (k < warmup)
        return (stage_op){true, k};
    int steady_end = warmup + 2 * (m - warmup);
    if (k < steady_end) {
        int j = (k - warmup) / 2;
        return (k - warmup) % 2 == 0 ? (stage_op){true, warmup + j}
                                     : (stage_op){false, j};
    }
    return (stage_op){false, m - warmup + (k - steady_end)};
}

/* Working state of one simulation; arrival times are -1 until known. */
typedef struct sim_state {
    int pp, microbatches;
    double *arrive_forward;   /* [pp x m]: input of F(s, i) available */
    double *arrive_backward;  /* [pp x m]: gradient for B(s, i) available */
    double *forward_end;      /* [pp x m] */
    double *stream_free;      /* [pp] */
    double *lane_forward_free, *lane_backward_free; /* [pp] */
    int *next_op;             /* [pp] */
    timeline_event *events;   /* NULL when not wanted */
    int event_count;
} sim_state;

static void record(sim_state *st, int stage, int microbatch, event_kind kind,
                   double start, double end)
{
    if (!st->events)
        return;
    st->events[st->event_count++] = (timeline_event){
        .rank = stage, .stage = stage, .microbatch = microbatch,
        .kind = kind, .start_s = start, .end_s = end};
}

/* Moves a finished operation's output to the neighbour stage. */
static void transfer(sim_state *st, int from, int to, int microbatch,
                     double ready, double duration, bool forward)
{
    double *lane = forward ? &st->lane_forward_free[from]
                           : &st->lane_backward_free[from];
    double start = ready > *lane ? ready : *lane;
    double end = start + duration;
    *lane = end;
    double *arrival = forward ? st->arrive_forward : st->arrive_backward;
    arrival[to * st->microbatches + microbatch] = end;
    record(st, from, microbatch, forward ? EVENT_SEND_FWD : EVENT_SEND_BWD,
           start, end);
    record(st, to, microbatch, forward ? EVENT_RECV_FWD : EVENT_RECV_BWD,
           start, end);
}

/* Runs stage s as far as its inputs allow; returns operations done. */
static int advance_stage(sim_state *st, schedule_kind kind,
                         const schedule_stage *stages, int s,
                         schedule_result *out)
{
    int m = st->microbatches, done = 0;
    while (st->next_op[s] < 2 * m) {
        stage_op op = op_at(kind, st->pp, s, m, st->next_op[s]);
        int slot = s * m + op.microbatch;
        double ready;
        if (op.forward)
            ready = s == 0 ? 0.0 : st->arrive_forward[slot];
        else
            ready = s == st->pp - 1 ? st->forward_end[slot]
                                    : st->arrive_backward[slot];
        if (ready < 0.0)
            break;
        double start = ready > st->stream_free[s] ? ready : st->stream_free[s];
        double duration = op.forward ? stages[s].forward_s
                                     : stages[s].backward_s;
        double end = start + duration;
        st->stream_free[s] = end;
        out->stage_busy_s[s] += duration;
        record(st, s, op.microbatch, op.forward ? EVENT_FWD : EVENT_BWD, start,
               end);
        if (op.forward) {
            st->forward_end[slot] = end;
            if (s < st->pp - 1)
                transfer(st, s, s + 1, op.microbatch, end,
                         stages[s].send_fwd_s, true);
        } else {
            out->stage_end_s[s] = end;
            if (s > 0)
                transfer(st, s, s - 1, op.microbatch, end,
                         stages[s].send_bwd_s, false);
        }
        st->next_op[s]++;
        done++;
    }
    return done;
}

bool schedule_times_valid(const double *times, int count)
{
    for (int i = 0; i < count; i++)
        if (!(times[i] >= 0.0) || !isfinite(times[i]))
            return false;
    return true;
}

static int check_inputs(const schedule_stage *stages, int pp,
                        int microbatches, pt_error *err)
{
    if (pp <= 0 || pp > PT_MAX_STAGES || microbatches <= 0)
        return pt_fail(err, "schedule: needs 1..%d stages and at least one "
                       "micro-batch, got %d stages, %d micro-batches",
                       PT_MAX_STAGES, pp, microbatches);
    for (int s = 0; s < pp; s++) {
        const schedule_stage *st = &stages[s];
        double times[4] = {st->forward_s, st->backward_s, st->send_fwd_s,
                           st->send_bwd_s};
        if (!schedule_times_valid(times, 4))
            return pt_fail(err, "schedule: stage %d has a negative or "
                           "non-finite time", s);
    }
    return 0;
}

/* One block holds every array of the simulation. */
static int allocate_state(sim_state *st, int pp, int m, bool want_events,
                          pt_error *err)
{
    size_t cells = (size_t)pp * (size_t)m;
    memset(st, 0, sizeof *st);
    st->pp = pp;
    st->microbatches = m;
    double *block = malloc((3 * cells + 3 * (size_t)pp) * sizeof(double) +
                           (size_t)pp * sizeof(int));
    if (!block)
        return pt_fail(err, "schedule: out of memory");
    st->arrive_forward = block;
    st->arrive_backward = block + cells;
    st->forward_end = block + 2 * cells;
    st->stream_free = block + 3 * cells;
    st->lane_forward_free = st->stream_free + pp;
    st->lane_backward_free = st->lane_forward_free + pp;
    st->next_op = (int *)(st->lane_backward_free + pp);
    for (size_t i = 0; i < 3 * cells; i++)
        block[i] = -1.0;
    for (int s = 0; s < pp; s++) {
        st->stream_free[s] = st->lane_forward_free[s] = 0.0;
        st->lane_backward_free[s] = 0.0;
        st->next_op[s] = 0;
    }
    if (want_events) {
        size_t events = 2 * cells + 4 * (size_t)(pp - 1) * (size_t)m;
        st->events = malloc(events * sizeof *st->events);
        if (!st->events) {
            free(block);
            return pt_fail(err, "schedule: out of memory for events");
        }
    }
    return 0;
}

int schedule_simulate(schedule_kind kind, const schedule_stage *stages,
                      int pp, int microbatches, bool want_events,
                      schedule_result *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (check_inputs(stages, pp, microbatches, err) != 0)
        return -1;
    sim_state st;
    if (allocate_state(&st, pp, microbatches, want_events, err) != 0)
        return -1;
    out->stage_end_s = calloc((size_t)pp, sizeof *out->stage_end_s);
    out->stage_busy_s = calloc((size_t)pp, sizeof *out->stage_busy_s);
    if (!out->stage_end_s || !out->stage_busy_s) {
        free(st.arrive_forward);
        free(st.events);
        schedule_result_free(out);
        return pt_fail(err, "schedule: out of memory");
    }
    /* forwards flow down the pipeline and backwards up it: alternate the
       sweep direction so that each sweep carries a wave through */
    long long remaining = 2LL * pp * microbatches;
    int idle_sweeps = 0;
    for (bool downward = true; remaining > 0; downward = !downward) {
        int progress = 0;
        for (int i = 0; i < pp; i++)
            progress += advance_stage(&st, kind, stages,
                                      downward ? i : pp - 1 - i, out);
        idle_sweeps = progress == 0 ? idle_sweeps + 1 : 0;
        if (idle_sweeps == 2) {
            free(st.arrive_forward);
            free(st.events);
            schedule_result_free(out);
            return pt_fail(err, "schedule: deadlock (an internal error)");
        }
        remaining -= progress;
    }
    for (int s = 0; s < pp; s++)
        if (out->stage_end_s[s] > out->pipeline_end_s)
            out->pipeline_end_s = out->stage_end_s[s];
    out->event_count = st.event_count;
    out->events = st.events;
    free(st.arrive_forward);
    return 0;
}

void schedule_result_free(schedule_result *r)
{
    if (!r)
        return;
    free(r->stage_end_s);
    free(r->stage_busy_s);
    free(r->events);
    memset(r, 0, sizeof *r);
}
