/*
 * The data-parallel gradient reduction in buckets (executor/parallel/
 * parallel.h): cutting a stage's gradient buffer into buckets at tensor
 * boundaries, in the order the backward completes them, and summing one
 * bucket over the dp group, blocking or on a stream. The step
 * (parallel/step.c) reduces bucket after bucket; an overlapping launcher
 * (parallel/grad_overlap.c) enqueues each during the last backward.
 */
#include "executor/parallel/parallel.h"

#include <stdlib.h>
#include <string.h>

void pipeline_buckets_free(pipeline_buckets *buckets)
{
    free(buckets->buckets);
    memset(buckets, 0, sizeof *buckets);
}

/* Tensors in buffer order make the buffer without gaps: a bucket is then
 * one run of floats. */
static int check_contiguous(const model_stage *stage, pt_error *err)
{
    size_t next = 0;
    for (int t = 0; t < stage->tensor_count; t++) {
        if (stage->tensors[t].offset != next)
            return pt_fail(err, "gradient buckets: tensor %s starts at float "
                                "%zu, after a gap or overlap (expected %zu)",
                           stage->tensors[t].name, stage->tensors[t].offset,
                           next);
        next += stage->tensors[t].count;
    }
    if (next != stage->param_count)
        return pt_fail(err, "gradient buckets: the tensors hold %zu floats, "
                            "the buffer %zu",
                       next, stage->param_count);
    return 0;
}

int pipeline_grad_buckets(const model_stage *stage, size_t bucket_bytes,
                          pipeline_buckets *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (check_contiguous(stage, err) != 0)
        return -1;
    size_t cap = (bucket_bytes > 0 ? bucket_bytes
                                   : PIPELINE_GRAD_BUCKET_DEFAULT_BYTES) /
                 sizeof(float);
    if (cap == 0)
        cap = 1;
    out->buckets = malloc((size_t)(stage->tensor_count + 1) *
                          sizeof *out->buckets);
    if (out->buckets == NULL)
        return pt_fail(err, "gradient buckets: out of memory for %d",
                       stage->tensor_count);
    /* from the last tensor down: a bucket grows while it stays within
     * the cap (a larger tensor alone) */
    size_t end = stage->param_count, start = end;
    for (int t = stage->tensor_count - 1; t >= 0; t--) {
        const param_tensor *tensor = &stage->tensors[t];
        if (start < end && end - tensor->offset > cap) {
            out->buckets[out->count++] =
                (pipeline_bucket){.offset = start, .count = end - start};
            end = start;
        }
        start = tensor->offset;
    }
    if (start < end)
        out->buckets[out->count++] =
            (pipeline_bucket){.offset = start, .count = end - start};
    return 0;
}

/* A bucket's sum (all-reduce, or reduce-scatter over the chunks' element
 * offsets) enqueued on `stream`, in elements of `type`. */
static int reduce_on_stream(const comm *c, const int *group, int group_size,
                            void *data, comm_element type, size_t count,
                            const size_t *chunks, void *stream,
                            pt_error *err)
{
    return chunks == NULL
               ? comm_all_reduce_on_stream(c, group, group_size, data, count,
                                           type, COMM_SUM, stream, err)
               : comm_reduce_scatter_on_stream(c, group, group_size, data,
                                               chunks, type, stream, err);
}

/* The same blocking: fp32 through the blocking collectives; bf16 (llm.c's
 * recipe) on the stage's own stream, which the backward left idle, then
 * waited for under the comm's deadline: the blocking collectives carry
 * fp32 only. */
static int reduce_blocking(const comm *c, const int *group, int group_size,
                           model_stage *stage, void *data, size_t count,
                           const size_t *chunks, pt_error *err)
{
    if (!stage->grads_bf16)
        return chunks == NULL
                   ? comm_all_reduce_sum(c, group, group_size, data, count,
                                         err)
                   : comm_reduce_scatter_sum(c, group, group_size, data,
                                             chunks, err);
    if (!comm_has_stream_ops(c) || stage->stream == NULL)
        return pt_fail(err, "grad_precision bf16: the %s comm sums fp32 "
                            "only; bf16 gradients are reduced over NCCL or "
                            "the device exchange",
                       c->ops->name);
    if (reduce_on_stream(c, group, group_size, data, COMM_BFLOAT16, count,
                         chunks, stage->stream, err) != 0)
        return -1;
    return comm_wait_stream(c, stage->stream,
                            "the reduction of bf16 gradients", err);
}

/* The part of [bucket.offset, + bucket.count) in each member's run,
 * from the bucket's start (group_size + 1 offsets); NULL when out of
 * memory. */
static size_t *bucket_chunks(const size_t *run_offsets, int group_size,
                             pipeline_bucket bucket)
{
    size_t *chunks = malloc(((size_t)group_size + 1) * sizeof *chunks);
    if (chunks == NULL)
        return NULL;
    size_t end = bucket.offset + bucket.count;
    for (int i = 0; i <= group_size; i++) {
        size_t at = run_offsets[i];
        at = at < bucket.offset ? bucket.offset : at > end ? end : at;
        chunks[i] = at - bucket.offset;
    }
    return chunks;
}

int pipeline_reduce_bucket(const comm *c, const int *group, int group_size,
                           model_stage *stage, pipeline_bucket bucket,
                           const size_t *run_offsets, void *stream,
                           pt_error *err)
{
    /* llm.c's recipe: the buffer holds bf16 elements */
    size_t size = stage->grads_bf16 ? 2 : sizeof(float);
    void *data = (char *)stage->grads + bucket.offset * size;
    comm_element type = stage->grads_bf16 ? COMM_BFLOAT16 : COMM_FLOAT32;
    /* member i keeps the part of the bucket inside its run */
    size_t *chunks = NULL;
    if (run_offsets != NULL &&
        (chunks = bucket_chunks(run_offsets, group_size, bucket)) == NULL)
        return pt_fail(err, "gradient buckets: out of memory for a group "
                            "of %d",
                       group_size);
    int status =
        stream == NULL
            ? reduce_blocking(c, group, group_size, stage, data,
                              bucket.count, chunks, err)
            : reduce_on_stream(c, group, group_size, data, type,
                               bucket.count, chunks, stream, err);
    free(chunks);
    return status;
}
