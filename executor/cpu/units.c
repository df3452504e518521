/*
 * ZeRO-2/3's shards on the cpu backend (cpu.h, "cpu_units"): the rank
 * keeps fp32 gradients (ZeRO-2/3) and parameters (ZeRO-3) for its
 * optimizer shard only, and a pass uses one buffer per unit kind (the
 * embeddings, a layer, the head): a backward's gradients are handed on
 * (the stage's grad_sink reduce-scatters them over dp) and added into
 * the shard as soon as a unit is complete; a unit's weights are gathered
 * (the param_source) before its forward and backward. So the memory of
 * each is the shard plus those buffers (docs/executor.md, "ZeRO-2 and
 * ZeRO-3"; docs/cost-model.md section 11).
 */
#include "executor/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

size_t cpu_units_layout(const stage_spec *spec,
                             const param_tensor *table, int tensor_count,
                             size_t param_count, cpu_units *out)
{
    memset(out, 0, sizeof *out);
    stage_units units;
    stage_units_of(spec, table, tensor_count, param_count, &units);
    /* the kinds in stage.h's order */
    for (int k = 0; k < CPU_UNIT_KINDS; k++) {
        out->first[k] = units.first[k];
        out->count[k] = units.count[k];
    }
    return cpu_units_bytes(out);
}

int cpu_units_open(const model_stage *stage, cpu_units *out)
{
    cpu_units_layout(&stage->spec, stage->tensors, stage->tensor_count,
                          stage->param_count, out);
    for (int k = 0; k < CPU_UNIT_KINDS; k++) {
        /* one float more: never calloc(0) */
        out->buffer[k] = calloc(out->count[k] + 1, sizeof(float));
        if (out->buffer[k] == NULL) {
            cpu_units_close(out);
            return -1;
        }
    }
    return 0;
}

void cpu_units_close(cpu_units *units)
{
    for (int k = 0; k < CPU_UNIT_KINDS; k++)
        free(units->buffer[k]);
    memset(units, 0, sizeof *units);
}

float *cpu_units_place(const cpu_units *units, size_t offset)
{
    size_t layers_first = units->first[CPU_UNIT_LAYER];
    if (offset < layers_first)
        return units->buffer[CPU_UNIT_EMBEDDING] + offset;
    if (offset >= units->first[CPU_UNIT_HEAD])
        return units->buffer[CPU_UNIT_HEAD] +
               (offset - units->first[CPU_UNIT_HEAD]);
    /* every layer takes its turn in the one buffer */
    return units->buffer[CPU_UNIT_LAYER] +
           (offset - layers_first) % units->count[CPU_UNIT_LAYER];
}

/* One unit of a pass: where it starts in the parameter buffer, its
 * floats and buffer, and the part [lo, hi) of it in the rank's range
 * [range_first, range_first + range_count) (empty: lo = hi). */
typedef struct unit_span {
    size_t first, count, lo, hi;
    float *buffer;
} unit_span;

static unit_span span_of(const cpu_units *units, cpu_unit_kind kind,
                         int layer, size_t range_first, size_t range_count)
{
    unit_span u = {.count = units->count[kind],
                   .buffer = units->buffer[kind]};
    u.first = units->first[kind] +
              (kind == CPU_UNIT_LAYER ? (size_t)layer * u.count : 0);
    size_t end = range_first + range_count;
    u.lo = u.first > range_first ? u.first : range_first;
    u.hi = u.first + u.count < end ? u.first + u.count : end;
    if (u.hi < u.lo)
        u.hi = u.lo;
    return u;
}

int cpu_grad_units_done(model_stage *stage, cpu_units *units,
                        cpu_unit_kind kind, int layer, pt_error *err)
{
    unit_span u = span_of(units, kind, layer, stage->grad_first,
                          stage->grad_count);
    if (u.count == 0)
        return 0;
    if (stage->grad_sink != NULL &&
        stage->grad_sink(stage, u.first, u.count, u.buffer, NULL,
                         stage->grad_sink_context, err) != 0)
        return -1;
    for (size_t i = u.lo; i < u.hi; i++)
        stage->grads[i - stage->grad_first] += u.buffer[i - u.first];
    memset(u.buffer, 0, u.count * sizeof(float));
    return 0;
}

int cpu_param_units_fetch(model_stage *stage, cpu_units *units,
                          cpu_unit_kind kind, int layer, pt_error *err)
{
    unit_span u = span_of(units, kind, layer, stage->params_first,
                          stage->params_count);
    if (u.count == 0)
        return 0;
    memset(u.buffer, 0, u.count * sizeof(float));
    if (u.hi > u.lo)
        memcpy(u.buffer + (u.lo - u.first),
               stage->params + (u.lo - stage->params_first),
               (u.hi - u.lo) * sizeof(float));
    return stage->param_source != NULL
               ? stage->param_source(stage, u.first, u.count, u.buffer,
                                     NULL, stage->param_source_context,
                                     err)
               : 0;
}

void cpu_units_zero(cpu_units *units)
{
    for (int k = 0; k < CPU_UNIT_KINDS; k++)
        if (units->buffer[k] != NULL)
            memset(units->buffer[k], 0, units->count[k] * sizeof(float));
}

size_t cpu_units_bytes(const cpu_units *units)
{
    size_t floats = 0;
    for (int k = 0; k < CPU_UNIT_KINDS; k++)
        floats += units->count[k];
    return floats * sizeof(float);
}
