/*
 * ZeRO-2/3's gradients on the cpu backend (cpu.h, "cpu_grad_units"): the
 * rank keeps fp32 gradients for its optimizer shard only, and a backward
 * writes into one buffer per unit kind (the embeddings, a layer, the
 * head), each handed on (the stage's grad_sink reduce-scatters it over
 * dp) and added into the shard as soon as the unit is complete, so the
 * gradient memory is the shard plus those buffers (docs/executor.md,
 * "ZeRO-2 and ZeRO-3"; docs/cost-model.md section 11).
 */
#include "executor/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

/* Tensors a layer has in the table of stage_parameter_layout. */
enum { LAYER_TENSORS = 12 };

size_t cpu_grad_units_layout(const stage_spec *spec,
                             const param_tensor *table, int tensor_count,
                             size_t param_count, cpu_grad_units *out)
{
    memset(out, 0, sizeof *out);
    int layers = spec->last_layer - spec->first_layer;
    int embedding = spec->has_embedding ? 2 : 0;
    int head = embedding + LAYER_TENSORS * layers;
    size_t head_first =
        head < tensor_count ? table[head].offset : param_count;
    size_t layers_first =
        embedding < tensor_count ? table[embedding].offset : param_count;
    out->first[CPU_UNIT_EMBEDDING] = 0;
    out->count[CPU_UNIT_EMBEDDING] = embedding > 0 ? layers_first : 0;
    out->first[CPU_UNIT_LAYER] = layers_first;
    out->count[CPU_UNIT_LAYER] =
        layers > 0 ? (head_first - layers_first) / (size_t)layers : 0;
    out->first[CPU_UNIT_HEAD] = head_first;
    out->count[CPU_UNIT_HEAD] = spec->has_head ? param_count - head_first : 0;
    return cpu_grad_units_bytes(out);
}

int cpu_grad_units_open(const model_stage *stage, cpu_grad_units *out)
{
    cpu_grad_units_layout(&stage->spec, stage->tensors, stage->tensor_count,
                          stage->param_count, out);
    for (int k = 0; k < CPU_UNIT_KINDS; k++) {
        /* one float more: never calloc(0) */
        out->buffer[k] = calloc(out->count[k] + 1, sizeof(float));
        if (out->buffer[k] == NULL) {
            cpu_grad_units_close(out);
            return -1;
        }
    }
    return 0;
}

void cpu_grad_units_close(cpu_grad_units *units)
{
    for (int k = 0; k < CPU_UNIT_KINDS; k++)
        free(units->buffer[k]);
    memset(units, 0, sizeof *units);
}

float *cpu_grad_units_place(const cpu_grad_units *units, size_t offset)
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

int cpu_grad_units_done(model_stage *stage, cpu_grad_units *units,
                        cpu_unit_kind kind, int layer, pt_error *err)
{
    size_t count = units->count[kind];
    if (count == 0)
        return 0;
    size_t first = units->first[kind] +
                   (kind == CPU_UNIT_LAYER ? (size_t)layer * count : 0);
    float *unit = units->buffer[kind];
    if (stage->grad_sink != NULL &&
        stage->grad_sink(stage, first, count, unit, stage->grad_sink_context,
                         err) != 0)
        return -1;
    size_t lo = first > stage->grad_first ? first : stage->grad_first;
    size_t end = stage->grad_first + stage->grad_count;
    size_t hi = first + count < end ? first + count : end;
    for (size_t i = lo; i < hi; i++)
        stage->grads[i - stage->grad_first] += unit[i - first];
    memset(unit, 0, count * sizeof(float));
    return 0;
}

void cpu_grad_units_zero(cpu_grad_units *units)
{
    for (int k = 0; k < CPU_UNIT_KINDS; k++)
        if (units->buffer[k] != NULL)
            memset(units->buffer[k], 0, units->count[k] * sizeof(float));
}

size_t cpu_grad_units_bytes(const cpu_grad_units *units)
{
    size_t floats = 0;
    for (int k = 0; k < CPU_UNIT_KINDS; k++)
        floats += units->count[k];
    return floats * sizeof(float);
}
