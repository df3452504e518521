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

int pipeline_reduce_bucket(const comm *c, const int *group, int group_size,
                           float *grads, pipeline_bucket bucket,
                           const size_t *run_offsets, void *stream,
                           pt_error *err)
{
    float *data = grads + bucket.offset;
    if (run_offsets == NULL)
        return stream == NULL
                   ? comm_all_reduce_sum(c, group, group_size, data,
                                         bucket.count, err)
                   : comm_all_reduce_on_stream(c, group, group_size, data,
                                               bucket.count, COMM_FLOAT32,
                                               COMM_SUM, stream, err);
    /* member i keeps the part of the bucket inside its run */
    size_t *chunks = malloc(((size_t)group_size + 1) * sizeof *chunks);
    if (chunks == NULL)
        return pt_fail(err, "gradient buckets: out of memory for a group "
                            "of %d",
                       group_size);
    size_t end = bucket.offset + bucket.count;
    for (int i = 0; i <= group_size; i++) {
        size_t at = run_offsets[i];
        at = at < bucket.offset ? bucket.offset : at > end ? end : at;
        chunks[i] = at - bucket.offset;
    }
    int status =
        stream == NULL
            ? comm_reduce_scatter_sum(c, group, group_size, data, chunks, err)
            : comm_reduce_scatter_on_stream(c, group, group_size, data,
                                            chunks, COMM_FLOAT32, stream,
                                            err);
    free(chunks);
    return status;
}
