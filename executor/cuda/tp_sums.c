/*
 * The tensor-parallel collectives of a cuda stage (declared in
 * cuda_stage.h), which passes.c calls between its kernels: the sums of
 * plain tensor parallelism and, under sequence parallelism, the two
 * halves of each (the reduce-scatter of a shard's rows and their
 * all-gather). On a comm with stream-ordered collectives (NCCL, the
 * device exchange) they are enqueued on the stage's stream, so nothing
 * waits on the host between a collective and the kernels around it;
 * else the comm is blocking and reads the buffer when it is called, so
 * the stream is drained first. A compute-only stage (the profiler's)
 * skips them all. Where PARTITA_CUDA_TP_OVERLAP asks, the backward's
 * sums (and the forward's: under =2 a product's first part's, under =3
 * each half micro-batch's) go on a stream of their own beside the
 * products that follow them (cuda_tp_overlap).
 */
#include "executor/comm/comm.h"
#include "executor/cuda/cuda_stage.h"

#include <stdlib.h>
#include <string.h>

#include "executor/cuda/cuda_check.h"

/* SMs a weight-gradient product leaves to the sum beside it by default
 * (PARTITA_CUDA_TP_SM_MARGIN) */
#define TP_SM_MARGIN 8

bool cuda_tp_on_stream(const model_stage *stage)
{
    return stage_spec_tp(&stage->spec) > 1 && !stage->tp_compute_only &&
           stage->tp_comm != NULL && comm_has_stream_ops(stage->tp_comm);
}

int cuda_sync_stage_stream(const model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    if (cuda_tp_on_stream(stage))
        return comm_wait_stream(stage->tp_comm, state->stream,
                                "the stage's kernels and tensor-parallel "
                                "sums",
                                err);
    CUDA_TRY(cudaStreamSynchronize(state->stream));
    return 0;
}

int cuda_tp_reduce(const model_stage *stage, float *data, size_t count,
                   comm_reduce_op op, pt_error *err)
{
    if (stage_spec_tp(&stage->spec) == 1 || stage->tp_compute_only)
        return 0;
    if (cuda_tp_on_stream(stage))
        return comm_all_reduce_on_stream(stage->tp_comm, stage->tp_group,
                                         stage_spec_tp(&stage->spec), data,
                                         count, COMM_FLOAT32, op,
                                         state_of(stage)->stream, err);
    CUDA_TRY(cudaStreamSynchronize(state_of(stage)->stream));
    if (op == COMM_MAX)
        return stage_tp_all_reduce_max(stage, data, count, err);
    return stage_tp_all_reduce_sum(stage, data, count, err);
}

int cuda_tp_sum_bf16(const model_stage *stage, pt_bf16 *data, size_t count,
                     pt_error *err)
{
    if (stage->tp_compute_only)
        return 0;
    return comm_all_reduce_on_stream(stage->tp_comm, stage->tp_group,
                                     stage_spec_tp(&stage->spec), data, count,
                                     COMM_BFLOAT16, COMM_SUM,
                                     state_of(stage)->stream, err);
}

int cuda_tp_overlap_open(model_stage *stage, pt_error *err)
{
    cuda_tp_overlap *overlap = &state_of(stage)->tp_overlap;
    const char *on = getenv("PARTITA_CUDA_TP_OVERLAP");
    if (on != NULL && strcmp(on, "0") != 0 && strcmp(on, "1") != 0 &&
        strcmp(on, "2") != 0 && strcmp(on, "3") != 0)
        return pt_fail(err, "PARTITA_CUDA_TP_OVERLAP: expected 0 (off), 1 "
                            "(the backward's sums), 2 (and the forward's, "
                            "in two parts of a product's rows) or 3 (and "
                            "the forward in two halves of the "
                            "micro-batch), got \"%s\"",
                       on);
    long sm_margin = 0;
    if (pt_env_count("PARTITA_CUDA_TP_SM_MARGIN", "SMs", 1024, TP_SM_MARGIN,
                     &sm_margin, err) != 0)
        return -1;
    overlap->sm_margin = (int)sm_margin;
    long split = 0, wide = 0;
    if (pt_env_count("PARTITA_CUDA_TP_SPLIT", "percent", 90, 50, &split,
                     err) != 0 ||
        pt_env_count("PARTITA_CUDA_TP_SPLIT_WIDE", "flag", 1, 0, &wide,
                     err) != 0)
        return -1;
    if (split < 10)
        return pt_fail(err, "PARTITA_CUDA_TP_SPLIT: expected a percentage "
                            "of rows from 10 to 90, got %ld", split);
    overlap->split_percent = (int)split;
    overlap->split_wide_only = wide != 0;
    overlap->enabled = on != NULL && strcmp(on, "0") != 0 &&
                       stage_spec_tp(&stage->spec) > 1;
    overlap->forward = overlap->enabled && strcmp(on, "2") == 0;
    overlap->halves = overlap->enabled && strcmp(on, "3") == 0;
    overlap->active_half = -1;
    if (!overlap->enabled)
        return 0;
    for (int h = 0; h < 2; h++)
        CUDA_TRY(cudaEventCreateWithFlags(&overlap->half_done[h],
                                          cudaEventDisableTiming));
    if (cuda_rank_stream_create(&overlap->stream, err) != 0)
        return -1;
    CUDA_TRY(cudaEventCreateWithFlags(&overlap->fork,
                                      cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&overlap->join,
                                      cudaEventDisableTiming));
    return 0;
}

void cuda_tp_overlap_close(cuda_tp_overlap *overlap)
{
    if (overlap->stream != NULL) {
        cudaStreamSynchronize(overlap->stream);
        cudaStreamDestroy(overlap->stream);
    }
    if (overlap->fork != NULL)
        cudaEventDestroy(overlap->fork);
    if (overlap->join != NULL)
        cudaEventDestroy(overlap->join);
    for (int h = 0; h < 2; h++)
        if (overlap->half_done[h] != NULL)
            cudaEventDestroy(overlap->half_done[h]);
    cudaGetLastError();
    memset(overlap, 0, sizeof *overlap);
}

bool cuda_tp_overlapped(const model_stage *stage, const stage_dims *d)
{
    return state_of(stage)->tp_overlap.enabled && d->tp > 1 && !d->sp &&
           cuda_tp_on_stream(stage);
}

bool cuda_tp_overlapped_forward(const model_stage *stage,
                                const stage_dims *d)
{
    return state_of(stage)->tp_overlap.forward && cuda_tp_overlapped(stage, d);
}

bool cuda_tp_split_product(const model_stage *stage, const stage_dims *d,
                           int in, int out)
{
    /* the shard's input of the attention's projection is out / tp
     * wide, the MLP's (ffn_hidden about 4 x hidden) 2.7 to 4 times that */
    return cuda_tp_overlapped_forward(stage, d) &&
           (!state_of(stage)->tp_overlap.split_wide_only ||
            (long)in * d->tp >= 2L * out);
}

int cuda_tp_split_rows(const model_stage *stage, int rows)
{
    long first = (long)rows * state_of(stage)->tp_overlap.split_percent / 100;
    first -= first % 64;
    return first > 0 && first < rows ? (int)first : rows / 2;
}

/* The bf16 sum of `data` on the overlap's stream behind the stage's,
 * `done` recorded after it. */
static int sum_beside(model_stage *stage, pt_bf16 *data, size_t count,
                      cudaEvent_t done, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_tp_overlap *overlap = &state->tp_overlap;
    CUDA_TRY(cudaEventRecord(overlap->fork, state->stream));
    CUDA_TRY(cudaStreamWaitEvent(overlap->stream, overlap->fork, 0));
    /* on the group's lean communicator where the comm made one
     * (PARTITA_NCCL_LEAN_CTAS): fewer CTAs, more SMs for the product */
    if (comm_all_reduce_on_stream_lean(stage->tp_comm, stage->tp_group,
                                       stage_spec_tp(&stage->spec), data,
                                       count, COMM_BFLOAT16, COMM_SUM,
                                       overlap->stream, err) != 0)
        return -1;
    CUDA_TRY(cudaEventRecord(done, overlap->stream));
    return 0;
}

int cuda_tp_sum_bf16_beside(model_stage *stage, pt_bf16 *data, size_t count,
                            pt_error *err)
{
    return sum_beside(stage, data, count, state_of(stage)->tp_overlap.join,
                      err);
}

bool cuda_tp_forward_halves(const model_stage *stage, const stage_dims *d)
{
    const cuda_stage_state *state = state_of(stage);
    return state->tp_overlap.halves && cuda_tp_overlapped(stage, d) &&
           d->B % 2 == 0 && !stage->spec.recompute_layers &&
           !state->llama_layer && state->residual_in_norm;
}

int cuda_tp_sum_half(model_stage *stage, pt_bf16 *data, size_t count,
                     int half, pt_error *err)
{
    cuda_tp_overlap *overlap = &state_of(stage)->tp_overlap;
    overlap->half_pending[half] = true;
    return sum_beside(stage, data, count, overlap->half_done[half], err);
}

int cuda_tp_wait_half(model_stage *stage, int half, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    cuda_tp_overlap *overlap = &state->tp_overlap;
    if (!overlap->half_pending[half])
        return 0;
    overlap->half_pending[half] = false;
    CUDA_TRY(cudaStreamWaitEvent(state->stream, overlap->half_done[half], 0));
    return 0;
}

int cuda_tp_join_beside(model_stage *stage, pt_error *err)
{
    cuda_stage_state *state = state_of(stage);
    CUDA_TRY(cudaStreamWaitEvent(state->stream, state->tp_overlap.join, 0));
    return 0;
}

int cuda_tp_beside_sm_count(const model_stage *stage)
{
    int margin = state_of(stage)->tp_overlap.sm_margin;
    int sms = cuda_rank_sm_count();
    return margin > 0 && margin < sms ? sms - margin : 0;
}

/* One half of an all-reduce over the sequence shards' rows of an N x C
 * buffer: the reduce-scatter (gather false) or the all-gather. */
static int tp_rows(const model_stage *stage, void *data, comm_element type,
                   const stage_dims *d, bool gather, pt_error *err)
{
    if (stage->tp_compute_only)
        return 0;
    if (cuda_tp_on_stream(stage)) {
        size_t offsets[PT_MAX_TP + 1];
        for (int t = 0; t <= d->tp; t++)
            offsets[t] = (size_t)t * (size_t)d->R * (size_t)d->C;
        cudaStream_t stream = state_of(stage)->stream;
        return gather ? comm_all_gather_on_stream(stage->tp_comm,
                                                  stage->tp_group, d->tp,
                                                  data, offsets, type,
                                                  stream, err)
                      : comm_reduce_scatter_on_stream(
                            stage->tp_comm, stage->tp_group, d->tp, data,
                            offsets, type, stream, err);
    }
    if (!gather && type != COMM_FLOAT32)
        return pt_fail(err, "cuda backend: a blocking comm reduce-scatters "
                            "fp32 rows only");
    CUDA_TRY(cudaStreamSynchronize(state_of(stage)->stream));
    if (!gather)
        return stage_tp_reduce_scatter_rows(stage, data, (size_t)d->N,
                                            (size_t)d->C, err);
    /* a gather moves bits: bf16 rows go as pairs in floats (C is even) */
    size_t columns = type == COMM_BFLOAT16 ? (size_t)d->C / 2 : (size_t)d->C;
    return stage_tp_all_gather_rows(stage, data, (size_t)d->N, columns, err);
}

int cuda_tp_scatter_rows(const model_stage *stage, void *data,
                         comm_element type, const stage_dims *d,
                         pt_error *err)
{
    return tp_rows(stage, data, type, d, false, err);
}

int cuda_tp_gather_rows(const model_stage *stage, void *data,
                        comm_element type, const stage_dims *d,
                        pt_error *err)
{
    return tp_rows(stage, data, type, d, true, err);
}
