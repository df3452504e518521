/*
 * The training loop of a run: each iteration draws gbs samples, runs the
 * accumulated micro-batches of a one-stage run (or every rank's step of a
 * parallel one) and one optimizer step, timing each phase; after it, the
 * checkpoint that is due, the observer and the stop flag. A one-stage run
 * also reads the stop flag between micro-batches and abandons the
 * iteration in progress, so that a signal ends a long iteration in time.
 */
#include "executor/run/internal.h"

#include <stdlib.h>
#include <string.h>

static void set_event(run_event *event, int microbatch, const char *kind,
                      double start_s, double end_s)
{
    event->rank = 0;
    event->stage = 0;
    event->microbatch = microbatch;
    event->kind = kind;
    event->start_s = start_s;
    event->end_s = end_s;
}

static bool stop_raised(const run_options *options)
{
    return options->stop != NULL && *options->stop != 0;
}

/* What run_iteration_once returns when the stop flag abandoned the
 * iteration: nothing of it was applied. */
enum { ITERATION_ABANDONED = 1 };

/* The forwards and backwards of one iteration's micro-batches, with the
 * gradients averaged through loss_scale, as train_step does; each phase
 * timed from iteration_start (a step kept on the device: until its work
 * is queued, the device's times replacing these at its end:
 * device_phase_events). ITERATION_ABANDONED when the stop flag rose
 * before a micro-batch. */
static int accumulate_gradients(run_context *ctx, const run_result *out,
                                double iteration_start, run_event *events,
                                pt_error *err)
{
    size_t window = (size_t)ctx->shape.seq + 1;
    for (int m = 0; m < out->micro_batches; m++) {
        if (stop_raised(ctx->options)) {
            stage_step_abandon(&ctx->stage);
            return ITERATION_ABANDONED;
        }
        stage_io io = {
            .mbs = out->mbs,
            .tokens = ctx->tokens + (size_t)m * (size_t)out->mbs * window,
            .loss_scale = 1.0f / (float)out->micro_batches,
        };
        double forward_start = pt_monotonic_seconds();
        if (stage_step_forward(&ctx->stage, &io, err) != 0)
            return -1;
        double backward_start = pt_monotonic_seconds();
        if (stage_step_backward(&ctx->stage, &io, err) != 0)
            return -1;
        /* the next micro-batch's host work while the device runs these */
        if (m + 1 < out->micro_batches) {
            stage_io next = io;
            next.tokens += (size_t)out->mbs * window;
            if (stage_prepare_tokens(&ctx->stage, &next, err) != 0)
                return -1;
        }
        double backward_end = pt_monotonic_seconds();
        set_event(&events[2 * m], m, "fwd", forward_start - iteration_start,
                  backward_start - iteration_start);
        set_event(&events[2 * m + 1], m, "bwd",
                  backward_start - iteration_start,
                  backward_end - iteration_start);
    }
    return 0;
}

/* The gbs windows of the iteration after `record`'s drawn while the
 * device runs this one's update, and the first micro-batch's host work
 * done (stage_prepare_tokens); not after the last iteration, nor once
 * the stop flag is up. ctx->position is left as it is (next_position).
 * A failure here leaves the windows undrawn and is not this iteration's:
 * the next one draws them again and reports what fails then. */
static void draw_next_iteration(run_context *ctx, const run_result *out,
                                const run_iteration *record)
{
    ctx->next_ready = false;
    if (record->iteration >= out->last_iteration || stop_raised(ctx->options))
        return;
    size_t window = (size_t)ctx->shape.seq + 1;
    pt_error ignored;
    ctx->next_position = ctx->position;
    for (int sample = 0; sample < out->gbs; sample++)
        if (gpt_sampler_next(&ctx->sampler, &ctx->next_position,
                             ctx->next_tokens + (size_t)sample * window,
                             &ignored) != 0)
            return;
    ctx->next_ready = true;
    stage_io first = {.mbs = out->mbs, .tokens = ctx->next_tokens};
    (void)stage_prepare_tokens(&ctx->stage, &first, &ignored);
}

/* Global norm, clipping and AdamW: the "optimizer" event, which ends
 * with the step's one wait for the loss and the norm (the next
 * iteration's data drawn before it). */
static int optimizer_step(run_context *ctx, const run_result *out,
                          run_iteration *record, pt_error *err)
{
    const train_config *train = &ctx->options->train;
    float learning_rate = (float)lr_schedule_at(&train->schedule,
                                                ctx->stage.optimizer_steps);
    stage_step_totals totals;
    if (stage_step_apply(&ctx->stage, train, learning_rate, err) != 0)
        return -1;
    draw_next_iteration(ctx, out, record);
    if (stage_step_end(&ctx->stage, &totals, err) != 0)
        return -1;
    double mean_loss = totals.loss_sum / out->micro_batches;
    if (!totals.applied)
        return pt_fail(err, "iteration %ld: the loss (%g) or the gradient "
                            "norm (%g) is not finite; the step was not "
                            "applied",
                       record->iteration, mean_loss, totals.grad_norm);
    record->loss = (float)mean_loss;
    record->grad_norm = (float)totals.grad_norm;
    record->learning_rate = learning_rate;
    return 0;
}

/* A step kept on the device: its phases' events from the device's marks
 * (the host's clock saw only their queueing), counted from begin_s, the
 * iteration's clock as the step began: the device was idle then (the
 * last step ended with its wait), so that is its mark 0. Event e
 * (forward m at 2m, backward m at 2m + 1, the optimizer at 2M) lies
 * between marks e and e + 1. */
static int device_phase_events(run_context *ctx, const run_result *out,
                               double begin_s, run_event *events,
                               pt_error *err)
{
    if (!ctx->stage.step.marked)
        return 0;
    double previous = 0.0;
    for (int mark = 1; mark <= 2 * out->micro_batches + 1; mark++) {
        double seconds = 0.0;
        if (stage_step_mark_seconds(&ctx->stage, mark, &seconds, err) != 0)
            return -1;
        events[mark - 1].start_s = begin_s + previous;
        events[mark - 1].end_s = begin_s + seconds;
        previous = seconds;
    }
    return 0;
}

/* One step of every rank on the global batch already in ctx->tokens;
 * the ranks' events, shifted to count from the iteration's start (the
 * runtime counts from its own, just after sampling), go to events rank
 * after rank. */
static int parallel_step(run_context *ctx, double start, run_event *events,
                         int *event_count, run_iteration *record,
                         pt_error *err)
{
    double step_start = pt_monotonic_seconds();
    step_result result;
    if (pipeline_threads_step(ctx->launcher, &ctx->options->train,
                              ctx->tokens, &result, err) != 0) {
        pt_error_prefix(err, "iteration %ld", record->iteration);
        return -1;
    }
    double end = pt_monotonic_seconds();
    double shift = step_start - start;
    int count = 0;
    for (int rank = run_local_first(ctx); rank < run_local_end(ctx); rank++) {
        const pipeline_events *rank_events = &ctx->launcher->events[rank];
        for (int i = 0; i < rank_events->count &&
                        count < ctx->events_per_iteration;
             i++) {
            events[count] = rank_events->events[i];
            events[count].start_s += shift;
            events[count].end_s += shift;
            count++;
        }
    }
    *event_count = count;
    record->loss = result.loss;
    record->grad_norm = result.grad_norm;
    record->learning_rate = result.learning_rate;
    record->step_time_s = end - start;
    return 0;
}

/* One iteration: gbs samples from the data position, the accumulated
 * micro-batches (one stage) or every rank's step (parallel), one
 * optimizer step. */
static int run_iteration_once(run_context *ctx, const run_result *out,
                              run_event *events, int *event_count,
                              run_iteration *record, pt_error *err)
{
    size_t window = (size_t)ctx->shape.seq + 1;
    double start = pt_monotonic_seconds();
    if (ctx->next_ready) { /* drawn during the last step */
        uint32_t *drawn = ctx->next_tokens;
        ctx->next_tokens = ctx->tokens;
        ctx->tokens = drawn;
        ctx->position = ctx->next_position;
        ctx->next_ready = false;
    } else {
        for (int sample = 0; sample < out->gbs; sample++)
            if (gpt_sampler_next(&ctx->sampler, &ctx->position,
                                 ctx->tokens + (size_t)sample * window,
                                 err) != 0)
                return -1;
    }
    if (ctx->parallel)
        return parallel_step(ctx, start, events, event_count, record, err);
    *event_count = 2 * out->micro_batches + 1;
    double begin = pt_monotonic_seconds();
    if (stage_step_begin(&ctx->stage, err) != 0)
        return -1;
    int accumulated = accumulate_gradients(ctx, out, start, events, err);
    if (accumulated != 0)
        return accumulated;
    double optimizer_start = pt_monotonic_seconds();
    if (optimizer_step(ctx, out, record, err) != 0)
        return -1;
    double end = pt_monotonic_seconds();
    set_event(&events[2 * out->micro_batches], -1, "optimizer",
              optimizer_start - start, end - start);
    if (device_phase_events(ctx, out, begin - start, events, err) != 0)
        return -1;
    record->step_time_s = end - start;
    return 0;
}

/* Saves after `iteration` unless that was already done. */
static int save_once(run_context *ctx, run_result *out, long iteration,
                     pt_error *err)
{
    if (ctx->options->save_dir == NULL ||
        out->last_checkpoint_iteration == iteration)
        return 0;
    if (run_save_checkpoint(ctx, iteration, out->seed, err) != 0)
        return -1;
    out->last_checkpoint_iteration = iteration;
    return 0;
}

/* After an iteration: the interval's or the last checkpoint, the
 * observer, and the stop flag, which may also be raised while saving or
 * by the observer (a checkpoint is then written for this iteration too).
 * *stopping tells the caller to end the run. */
static int after_iteration(run_context *ctx, run_result *out, long iteration,
                           bool *stopping, pt_error *err)
{
    const run_options *options = ctx->options;
    bool last = iteration == out->last_iteration;
    *stopping = stop_raised(options);
    if (ctx->processes && run_agree_stop(ctx, stopping, err) != 0)
        return -1;
    bool due = last || *stopping ||
               (options->save_interval > 0 &&
                iteration % options->save_interval == 0);
    if (due && save_once(ctx, out, iteration, err) != 0)
        return -1;
    if (options->observer != NULL)
        options->observer(out, options->observer_data);
    if (!ctx->processes && !*stopping && stop_raised(options)) {
        *stopping = true;
        if (save_once(ctx, out, iteration, err) != 0)
            return -1;
    }
    return 0;
}

/* Room for one more iteration record; the array grows by doubling, so a
 * run asked for a billion iterations and stopped early holds only what it
 * ran. */
static int reserve_iteration(run_context *ctx, run_result *out,
                             pt_error *err)
{
    if (out->iteration_count < ctx->iteration_capacity)
        return 0;
    long capacity = ctx->iteration_capacity > 0
                        ? 2 * ctx->iteration_capacity
                        : 64;
    run_iteration *grown =
        realloc(out->iterations, (size_t)capacity * sizeof *grown);
    if (grown == NULL)
        return pt_fail(err, "out of memory for %ld iteration records",
                       capacity);
    out->iterations = grown;
    ctx->iteration_capacity = capacity;
    return 0;
}

/* The stop flag abandoned `iteration` before its optimizer step: the
 * state is the previous iteration's, and so is the data position once
 * restored; saved as such (unless no iteration of this run finished, when
 * the checkpoint resumed from is still the last). */
static int abandon_iteration(run_context *ctx, run_result *out,
                             long iteration, const data_position *before,
                             pt_error *err)
{
    ctx->position = *before;
    ctx->next_ready = false;
    out->interrupted_iteration = iteration;
    out->stopped = true;
    if (iteration - 1 < out->first_iteration)
        return 0;
    return save_once(ctx, out, iteration - 1, err);
}

/* Iterations up to the last one, or until the stop flag is raised. */
int run_train_iterations(run_context *ctx, run_result *out, pt_error *err)
{
    for (long iteration = out->first_iteration;
         iteration <= out->last_iteration; iteration++) {
        if (reserve_iteration(ctx, out, err) != 0)
            return -1;
        long index = out->iteration_count;
        run_event *events =
            ctx->event_ring + (size_t)(index % ctx->event_window) *
                                  (size_t)ctx->events_per_iteration;
        run_iteration *record = &out->iterations[index];
        memset(record, 0, sizeof *record);
        record->iteration = iteration;
        data_position before = ctx->position;
        int status = run_iteration_once(
            ctx, out, events, &ctx->ring_counts[index % ctx->event_window],
            record, err);
        if (status == ITERATION_ABANDONED)
            return abandon_iteration(ctx, out, iteration, &before, err);
        if (status != 0)
            return -1;
        out->iteration_count++;
        bool stopping = false;
        if (after_iteration(ctx, out, iteration, &stopping, err) != 0)
            return -1;
        if (stopping && iteration < out->last_iteration) {
            out->stopped = true;
            break;
        }
    }
    return 0;
}
