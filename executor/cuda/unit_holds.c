/*
 * Which of a ZeRO-3 pass's units the cuda backend all-gathers
 * (unit_holds.h): a unit its buffer still holds, gathered since the
 * parameters last changed, is not gathered again. Plain C, so that the
 * tests run the rule without a GPU; param_units.c makes the gathers.
 */
#include "executor/cuda/unit_holds.h"

#include <string.h>

bool unit_pass_at(const unit_pass_shape *shape, bool backward, int index,
                  stage_unit_kind *kind, int *layer)
{
    bool first = backward ? shape->has_head : shape->has_embedding;
    bool last = backward ? shape->has_embedding : shape->has_head;
    *layer = 0;
    if (first && index-- == 0) {
        *kind = backward ? STAGE_UNIT_HEAD : STAGE_UNIT_EMBEDDING;
        return true;
    }
    if (index < shape->layers) {
        *kind = STAGE_UNIT_LAYER;
        *layer = backward ? shape->layers - 1 - index : index;
        return true;
    }
    if (last && index == shape->layers) {
        *kind = backward ? STAGE_UNIT_EMBEDDING : STAGE_UNIT_HEAD;
        return true;
    }
    return false;
}

int unit_pass_index(const unit_pass_shape *shape, bool backward,
                    stage_unit_kind kind, int layer)
{
    int before = backward ? shape->has_head : shape->has_embedding;
    if (kind == STAGE_UNIT_LAYER)
        return before + (backward ? shape->layers - 1 - layer : layer);
    bool leads = backward ? kind == STAGE_UNIT_HEAD
                          : kind == STAGE_UNIT_EMBEDDING;
    return leads ? 0 : before + shape->layers;
}

/* A unit's name (never 0). */
static long unit_name(stage_unit_kind kind, int layer)
{
    return (long)kind * 1000000L + layer + 1;
}

bool unit_holds_claim(unit_holds *holds, stage_unit_kind kind, int layer)
{
    int b = unit_buffer_of(kind, layer);
    long name = unit_name(kind, layer);
    if (holds->held[b] == name)
        return false;
    holds->held[b] = name;
    holds->gathers++;
    return true;
}

void unit_holds_forget(unit_holds *holds)
{
    memset(holds->held, 0, sizeof holds->held);
}

int unit_holds_pass(unit_holds *holds, const unit_pass_shape *shape,
                    bool backward)
{
    long before = holds->gathers;
    stage_unit_kind kind;
    int layer;
    /* the start: a backward's tied head reads the embeddings first */
    if (backward && shape->tied_head)
        unit_holds_claim(holds, STAGE_UNIT_EMBEDDING, 0);
    for (int i = 0; unit_pass_at(shape, backward, i, &kind, &layer); i++) {
        unit_holds_claim(holds, kind, layer);
        stage_unit_kind next_kind;
        int next_layer;
        if (unit_pass_at(shape, backward, i + 1, &next_kind, &next_layer))
            unit_holds_claim(holds, next_kind, next_layer);
    }
    return (int)(holds->gathers - before);
}
