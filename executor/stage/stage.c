/*
 * A model stage, whatever its backend: its buffers, release, the
 * tensor-parallel sums a backend asks for, and the checked wrappers that
 * dispatch to the backend's table, so that a backend sees valid input
 * only. The layout of the parameters is stage/layout.c's; creating a
 * stage on a backend, stage/backends.c's.
 */
#include "executor/comm/comm.h"
#include "executor/stage/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float *model_stage_buffer(const model_stage *stage, stage_buffer which)
{
    switch (which) {
    case STAGE_PARAMS:
        return stage->params;
    case STAGE_GRADS:
        return stage->grads;
    case STAGE_ADAM_M:
        return stage->adam_m;
    case STAGE_ADAM_V:
        return stage->adam_v;
    }
    return NULL;
}

size_t model_stage_buffer_count(const model_stage *stage, stage_buffer which)
{
    if (which == STAGE_GRADS)
        return stage->grad_count;
    if (which == STAGE_PARAMS)
        return stage->params_count;
    return which == STAGE_ADAM_M || which == STAGE_ADAM_V
               ? stage->optimizer_count
               : stage->param_count;
}

/* --------------------------------------------------------------- stages */

void model_stage_destroy(model_stage *stage)
{
    stage_offload_close(stage);
    if (stage->backend != NULL)
        stage->backend->release(stage);
    free(stage->tensors);
    memset(stage, 0, sizeof *stage);
}

int model_stage_attach_tp(model_stage *stage, const struct comm *c,
                          const int *ranks, pt_error *err)
{
    int tp = stage_spec_tp(&stage->spec);
    stage->tp_comm = c;
    stage->tp_compute_only = c == NULL;
    if (c == NULL)
        return 0;
    for (int t = 0; t < tp; t++) {
        if (ranks[t] < 0 || ranks[t] >= c->size)
            return pt_fail(err, "tensor parallel: member %d of the group is "
                                "rank %d, not one of the %d",
                           t, ranks[t], c->size);
        stage->tp_group[t] = ranks[t];
    }
    if (stage->tp_group[stage->spec.tp_rank] != c->rank)
        return pt_fail(err, "tensor parallel: rank %d holds shard %d, but "
                            "the group names rank %d for it",
                       c->rank, stage->spec.tp_rank,
                       stage->tp_group[stage->spec.tp_rank]);
    return 0;
}

/* Whether a tensor-parallel collective has work: 0 when the stage is
 * unsplit or compute-only (nothing to sum), 1 when it has a comm, -1
 * (with the reason) when it lacks one. */
static int tp_collective_needed(const model_stage *stage, pt_error *err)
{
    int tp = stage_spec_tp(&stage->spec);
    if (tp == 1 || stage->tp_compute_only)
        return 0;
    if (stage->tp_comm == NULL)
        return pt_fail(err, "tensor parallel: shard %d of %d has no comm "
                            "(model_stage_attach_tp was not called)",
                       stage->spec.tp_rank, tp);
    return 1;
}

static int tp_all_reduce(const model_stage *stage, float *data, size_t count,
                         comm_reduce_op op, pt_error *err)
{
    int needed = tp_collective_needed(stage, err);
    if (needed <= 0)
        return needed;
    int tp = stage_spec_tp(&stage->spec);
    if (op == COMM_MAX)
        return comm_all_reduce_max(stage->tp_comm, stage->tp_group, tp, data,
                                   count, err);
    return comm_all_reduce_sum(stage->tp_comm, stage->tp_group, tp, data,
                               count, err);
}

int stage_tp_all_reduce_sum(const model_stage *stage, float *data,
                            size_t count, pt_error *err)
{
    return tp_all_reduce(stage, data, count, COMM_SUM, err);
}

int stage_tp_all_reduce_max(const model_stage *stage, float *data,
                            size_t count, pt_error *err)
{
    return tp_all_reduce(stage, data, count, COMM_MAX, err);
}

void stage_sequence_rows(const stage_spec *spec, size_t rows, size_t *first,
                         size_t *count)
{
    int tp = stage_spec_tp(spec);
    *first = 0;
    *count = rows;
    if (!spec->sequence_parallel || tp == 1)
        return;
    *count = rows / (size_t)tp;
    *first = (size_t)spec->tp_rank * *count;
}

/* One half of an all-reduce over the shards' rows: the reduce-scatter
 * (gather false) or the all-gather. */
static int tp_rows(const model_stage *stage, float *data, size_t rows,
                   size_t cols, bool gather, pt_error *err)
{
    int needed = tp_collective_needed(stage, err);
    if (needed <= 0)
        return needed;
    int tp = stage_spec_tp(&stage->spec);
    size_t offsets[PT_MAX_TP + 1];
    for (int t = 0; t <= tp; t++)
        offsets[t] = (size_t)t * (rows / (size_t)tp) * cols;
    return gather ? comm_all_gather(stage->tp_comm, stage->tp_group, tp,
                                    data, offsets, err)
                  : comm_reduce_scatter_sum(stage->tp_comm, stage->tp_group,
                                            tp, data, offsets, err);
}

int stage_tp_reduce_scatter_rows(const model_stage *stage, float *data,
                                 size_t rows, size_t cols, pt_error *err)
{
    return tp_rows(stage, data, rows, cols, false, err);
}

int stage_tp_all_gather_rows(const model_stage *stage, float *data,
                             size_t rows, size_t cols, pt_error *err)
{
    return tp_rows(stage, data, rows, cols, true, err);
}

const param_tensor *model_stage_find_tensor(const model_stage *stage,
                                            const char *name)
{
    for (int i = 0; i < stage->tensor_count; i++)
        if (strcmp(stage->tensors[i].name, name) == 0)
            return &stage->tensors[i];
    return NULL;
}

static bool moments(stage_buffer which)
{
    return which == STAGE_ADAM_M || which == STAGE_ADAM_V;
}

int model_stage_read(const model_stage *stage, stage_buffer which,
                     float *host, pt_error *err)
{
    if (stage->offload != NULL && moments(which))
        return stage_offload_copy(stage, which, host, true, err);
    return stage->backend->copy_to_host(stage, which, host, err);
}

int model_stage_write(model_stage *stage, stage_buffer which,
                      const float *host, pt_error *err)
{
    if (stage->offload != NULL && moments(which))
        return stage_offload_copy(stage, which, (float *)host, false, err);
    if (which == STAGE_PARAMS)
        stage_offload_params_written(stage);
    return stage->backend->copy_from_host(stage, which, host, err);
}

static int check_range(const model_stage *stage, stage_buffer which,
                       size_t first, size_t count, pt_error *err)
{
    if (which != STAGE_PARAMS && which != STAGE_GRADS)
        return pt_fail(err, "model stage: ranges are of params or grads, "
                            "not buffer %d",
                       (int)which);
    /* either may be the optimizer's range only (ZeRO-2/3) */
    size_t lo = which == STAGE_GRADS ? stage->grad_first
                                     : stage->params_first;
    size_t floats = model_stage_buffer_count(stage, which);
    if (first < lo || first - lo > floats || count > floats - (first - lo))
        return pt_fail(err, "model stage: floats [%zu, %zu) are outside "
                            "the [%zu, %zu) of the buffer",
                       first, first + count, lo, lo + floats);
    if (stage->backend->copy_range == NULL ||
        stage->backend->zero_range == NULL)
        return pt_fail(err, "the %s backend moves no part of a buffer",
                       stage->backend->name);
    return 0;
}

int model_stage_read_range(model_stage *stage, stage_buffer which,
                           size_t first, size_t count, float *host,
                           pt_error *err)
{
    if (check_range(stage, which, first, count, err) != 0)
        return -1;
    return count == 0 ? 0
                      : stage->backend->copy_range(stage, which, first, count,
                                                   host, true, err);
}

int model_stage_write_range(model_stage *stage, stage_buffer which,
                            size_t first, size_t count, const float *host,
                            pt_error *err)
{
    if (check_range(stage, which, first, count, err) != 0)
        return -1;
    return count == 0 ? 0
                      : stage->backend->copy_range(stage, which, first, count,
                                                   (float *)host, false, err);
}

int model_stage_zero_range(model_stage *stage, stage_buffer which,
                           size_t first, size_t count, pt_error *err)
{
    if (check_range(stage, which, first, count, err) != 0)
        return -1;
    return count == 0 ? 0
                      : stage->backend->zero_range(stage, which, first, count,
                                                   err);
}

/* ------------------------------------------------- forward and backward */

/* The micro-batch's tokens, where the stage reads them: inputs for the
 * embedding, targets for the head (only those rows need be valid). */
static int check_tokens(const model_stage *stage, const stage_io *io,
                        pt_error *err)
{
    bool needs_tokens = stage->spec.has_embedding || stage->spec.has_head;
    if (!needs_tokens)
        return 0;
    if (io->tokens == NULL)
        return pt_fail(err, "stage: tokens are required by a stage with the "
                            "embedding or the head");
    size_t window = (size_t)stage->shape.seq + 1;
    for (int b = 0; b < io->mbs; b++) {
        for (size_t t = 0; t < window; t++) {
            bool read = (t < window - 1 && stage->spec.has_embedding) ||
                        (t > 0 && stage->spec.has_head);
            uint32_t token = io->tokens[b * window + t];
            if (read && token >= (uint32_t)stage->shape.vocab)
                return pt_fail(err, "stage: token %u at sequence %d, "
                                    "position %zu is outside the "
                                    "vocabulary of %d",
                               token, b, t, stage->shape.vocab);
        }
    }
    return 0;
}

static int check_mbs(const model_stage *stage, const stage_io *io,
                     pt_error *err)
{
    if (io->mbs < 1 || io->mbs > stage->mbs_capacity)
        return pt_fail(err, "stage: micro-batch of %d sequences, capacity "
                            "is %d",
                       io->mbs, stage->mbs_capacity);
    return 0;
}

static int check_io(const model_stage *stage, int slot, const stage_io *io,
                    bool forward, pt_error *err)
{
    if (slot < 0 || slot >= stage->slot_count)
        return pt_fail(err, "stage: activation slot %d does not exist (%d "
                            "slots)",
                       slot, stage->slot_count);
    if (check_mbs(stage, io, err) != 0)
        return -1;
    if ((stage->spec.has_embedding || stage->spec.has_head) &&
        io->tokens == NULL)
        return check_tokens(stage, io, err); /* says they are required */
    if (forward && !stage->spec.has_embedding && io->input == NULL)
        return pt_fail(err, "stage: forward of a stage without the "
                            "embedding needs an input activation");
    if (!forward && !stage->spec.has_head && io->output_grad == NULL)
        return pt_fail(err, "stage: backward of a stage without the head "
                            "needs the output gradient");
    /* checked already by stage_prepare_tokens */
    bool prepared = forward && io->tokens != NULL &&
                    io->tokens == stage->prepared_tokens &&
                    io->mbs == stage->prepared_mbs;
    return prepared ? 0 : check_tokens(stage, io, err);
}

int stage_forward(model_stage *stage, int slot, const stage_io *io,
                  float *mean_loss, pt_error *err)
{
    if (check_io(stage, slot, io, true, err) != 0)
        return -1;
    float loss = 0.0f;
    int status = stage->backend->forward(stage, slot, io, &loss, err);
    stage->prepared_tokens = NULL;
    if (status != 0)
        return -1;
    if (mean_loss != NULL)
        *mean_loss = loss;
    return 0;
}

int stage_prepare_tokens(model_stage *stage, const stage_io *io,
                         pt_error *err)
{
    stage->prepared_tokens = NULL;
    if (check_mbs(stage, io, err) != 0 || check_tokens(stage, io, err) != 0)
        return -1;
    if (stage->backend->prepare_tokens != NULL && io->tokens != NULL &&
        stage->backend->prepare_tokens(stage, io, err) != 0)
        return -1;
    stage->prepared_tokens = io->tokens;
    stage->prepared_mbs = io->mbs;
    return 0;
}

int stage_backward(model_stage *stage, int slot, const stage_io *io,
                   pt_error *err)
{
    if (check_io(stage, slot, io, false, err) != 0)
        return -1;
    return stage->backend->backward(stage, slot, io, err);
}

int stage_synchronize(model_stage *stage, pt_error *err)
{
    if (stage->backend->synchronize == NULL)
        return 0;
    return stage->backend->synchronize(stage, err);
}

float *stage_input_buffer(model_stage *stage, int slot)
{
    if (slot < 0 || slot >= stage->slot_count)
        return NULL;
    return stage->backend->input_buffer(stage, slot);
}

const float *stage_output(const model_stage *stage, int slot)
{
    if (slot < 0 || slot >= stage->slot_count)
        return NULL;
    return stage->backend->output(stage, slot);
}

const float *stage_input_grad(const model_stage *stage)
{
    return stage->backend->input_grad(stage);
}

float *stage_output_grad_buffer(model_stage *stage)
{
    if (stage->spec.has_head)
        return NULL;
    return stage->backend->output_grad_buffer(stage);
}

int stage_zero_grads(model_stage *stage, pt_error *err)
{
    return stage->backend->zero_grads(stage, err);
}

int stage_grad_square_sum(const model_stage *stage, double *out,
                          pt_error *err)
{
    return stage->backend->grad_square_sum(stage, out, err);
}

int stage_grad_norm_share(const model_stage *stage, double *out,
                          pt_error *err)
{
    bool excludes = false;
    for (int i = 0; i < stage->tensor_count; i++)
        excludes = excludes || stage->tensors[i].tied_copy ||
                   (stage->tensors[i].replicated && stage->spec.tp_rank > 0);
    if (!excludes)
        return stage_grad_square_sum(stage, out, err);
    if (stage->backend->grad_square_sums == NULL)
        return pt_fail(err, "the %s backend cannot sum gradients per tensor",
                       stage->backend->name);
    double *sums = calloc((size_t)stage->tensor_count, sizeof *sums);
    if (sums == NULL)
        return pt_fail(err, "out of memory for %d tensor norms",
                       stage->tensor_count);
    int status = stage->backend->grad_square_sums(stage, sums, err);
    double total = 0.0;
    for (int i = 0; i < stage->tensor_count && status == 0; i++) {
        const param_tensor *t = &stage->tensors[i];
        if (!t->tied_copy && !(t->replicated && stage->spec.tp_rank > 0))
            total += sums[i];
    }
    free(sums);
    *out = total;
    return status;
}

int stage_adamw_check(const adamw_config *config, pt_error *err)
{
    if (!(config->beta1 >= 0.0f && config->beta1 < 1.0f) ||
        !(config->beta2 >= 0.0f && config->beta2 < 1.0f) ||
        !(config->eps > 0.0f) || !(config->weight_decay >= 0.0f))
        return pt_fail(err, "adamw: need 0 <= beta1, beta2 < 1, eps > 0 and "
                            "weight_decay >= 0 (got %g, %g, %g, %g)",
                       config->beta1, config->beta2, config->eps,
                       config->weight_decay);
    return 0;
}

int stage_adamw_step(model_stage *stage, const adamw_config *config,
                     float learning_rate, float grad_scale, pt_error *err)
{
    if (stage_adamw_check(config, err) != 0)
        return -1;
    stage->optimizer_steps++;
    int status = stage->offload != NULL
                     ? stage_offload_step(stage, config, learning_rate,
                                          grad_scale, err)
                     : stage->backend->adamw_step(stage, config,
                                                  learning_rate, grad_scale,
                                                  err);
    if (status != 0) {
        stage->optimizer_steps--;
        return -1;
    }
    return 0;
}

int stage_params_changed(model_stage *stage, pt_error *err)
{
    if (stage->backend->params_changed == NULL)
        return 0;
    return stage->backend->params_changed(stage, err);
}
