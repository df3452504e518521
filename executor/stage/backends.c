/*
 * The backends built into this binary and the creation of a stage on
 * one: backend_find hands out a backend's table (cpu always, cuda when
 * meson found nvcc), model_stage_create lays a stage out and has its
 * backend allocate it. The backends' own files call the stage's helpers
 * (stage.c, layout.c) but nothing here, so no call goes round in a
 * circle.
 */
#ifdef PARTITA_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#endif
#include "executor/cpu/cpu.h"
#include "executor/stage/stage.h"

#include <stdlib.h>
#include <string.h>

const char *backend_name(backend_kind kind)
{
    return kind == BACKEND_CUDA ? "cuda" : "cpu";
}

int backend_parse(const char *text, backend_kind *out, pt_error *err)
{
    if (strcmp(text, "cpu") == 0) {
        *out = BACKEND_CPU;
        return 0;
    }
    if (strcmp(text, "cuda") == 0) {
        *out = BACKEND_CUDA;
        return 0;
    }
    return pt_fail(err, "unknown backend \"%s\" (expected \"cpu\" or "
                        "\"cuda\")",
                   text);
}

const stage_backend *backend_find(backend_kind kind, pt_error *err)
{
    if (kind == BACKEND_CPU)
        return &cpu_stage_backend;
#ifdef PARTITA_HAVE_CUDA
    if (kind == BACKEND_CUDA)
        return cuda_stage_backend();
#endif
    pt_fail(err, "the %s backend is not built in this binary (meson "
                 "option cuda, needs nvcc)",
            backend_name(kind));
    return NULL;
}

/* The parameters this stage's optimizer steps: all, or its ZeRO-1
 * shard (stage_spec.optimizer_shards). */
static int set_optimizer_range(model_stage *stage, pt_error *err)
{
    int shards = stage->spec.optimizer_shards > 1
                     ? stage->spec.optimizer_shards
                     : 1;
    int shard = shards > 1 ? stage->spec.optimizer_shard : 0;
    if (shard < 0 || shard >= shards)
        return pt_fail(err, "model stage: optimizer shard %d of %d does not "
                            "exist",
                       stage->spec.optimizer_shard, shards);
    stage_optimizer_range(stage->param_count, shards, shard,
                          &stage->optimizer_first, &stage->optimizer_count);
    return 0;
}

int model_stage_create(model_stage *out, const model_shape *shape,
                       const stage_spec *spec, backend_kind kind,
                       int mbs_capacity, int slot_count, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (mbs_capacity < 1 || slot_count < 1)
        return pt_fail(err, "model stage: micro-batch capacity (%d) and "
                            "activation slots (%d) must be >= 1",
                       mbs_capacity, slot_count);
    const stage_backend *backend = backend_find(kind, err);
    if (backend == NULL)
        return -1;
    size_t floats = 0;
    int count = stage_parameter_layout(shape, spec, NULL, &floats, err);
    if (count < 0)
        return -1;
    out->shape = *shape;
    out->spec = *spec;
    out->mbs_capacity = mbs_capacity;
    out->slot_count = slot_count;
    out->tensor_count = count;
    out->param_count = floats;
    if (set_optimizer_range(out, err) != 0)
        return -1;
    /* whole gradients and parameters; a backend honouring
     * spec.shard_gradients / shard_parameters narrows them to the
     * optimizer's range in its allocate */
    out->grad_first = 0;
    out->grad_count = floats;
    out->params_first = 0;
    out->params_count = floats;
    /* calloc(0) may return NULL: keep one entry so NULL means failure. */
    out->tensors = calloc((size_t)count + 1, sizeof *out->tensors);
    if (out->tensors == NULL)
        return pt_fail(err, "model stage: out of memory for %d tensors",
                       count);
    stage_parameter_layout(shape, spec, out->tensors, NULL, err);
    out->backend = backend;
    if (backend->allocate(out, err) != 0 ||
        (spec->offload_optimizer && stage_offload_open(out, err) != 0)) {
        model_stage_destroy(out);
        return -1;
    }
    return 0;
}
