/*
 * ZeRO-3's unit buffers on the cuda backend and which gathered unit each
 * still holds (unit_holds.c; docs/executor.md, "ZeRO-2 and ZeRO-3"): the
 * rule that decides which of a pass's units are all-gathered, kept apart
 * from the CUDA calls so that it runs without a GPU (plain C, built with
 * or without CUDA): the cmocka tests replay passes and steps through it,
 * and the cost model's count of gathers is held to it.
 *
 * A unit's gathered weights stay valid in its buffer until the
 * parameters change (the optimizer step, any write of them) or the
 * buffer is given to another unit: a pass gathers only the units its
 * buffers do not hold. Every rank of a dp group runs the same passes and
 * writes its parameters at the same points, so each rank's rule alone
 * keeps the group's collectives in step.
 */
#ifndef PARTITA_EXECUTOR_CUDA_UNIT_HOLDS_H
#define PARTITA_EXECUTOR_CUDA_UNIT_HOLDS_H

#include <stdbool.h>

#include "executor/stage/stage.h"

/* The units' buffers (of the gradients' block and of the parameters'):
 * the layers alternate between two, so that one is reduced (or
 * gathered) while the pass computes the other. */
enum {
    GRAD_UNIT_LAYER_A,
    GRAD_UNIT_LAYER_B,
    GRAD_UNIT_HEAD,
    GRAD_UNIT_EMBEDDING,
    GRAD_UNIT_BUFFERS
};

/* The buffer of unit (kind, layer). */
static inline int unit_buffer_of(stage_unit_kind kind, int layer)
{
    switch (kind) {
    case STAGE_UNIT_EMBEDDING:
        return GRAD_UNIT_EMBEDDING;
    case STAGE_UNIT_HEAD:
        return GRAD_UNIT_HEAD;
    default:
        return layer % 2 == 0 ? GRAD_UNIT_LAYER_A : GRAD_UNIT_LAYER_B;
    }
}

/* What orders a stage's passes over its units: a forward computes the
 * embeddings, the layers, the head; a backward the other way, and
 * where the head multiplies by the tied token embedding (tied_head) a
 * backward first needs the embeddings' unit. */
typedef struct unit_pass_shape {
    bool has_embedding, has_head, tied_head;
    int layers;
} unit_pass_shape;

/* Unit `index` of a pass in the order it computes them; false past the
 * end. */
bool unit_pass_at(const unit_pass_shape *shape, bool backward, int index,
                  stage_unit_kind *kind, int *layer);
/* Where unit (kind, layer) comes in its pass's order. */
int unit_pass_index(const unit_pass_shape *shape, bool backward,
                    stage_unit_kind kind, int layer);

/* Which unit each buffer holds with the parameters as they are now, and
 * the gathers asked so far. Zeroed: nothing held. */
typedef struct unit_holds {
    long held[GRAD_UNIT_BUFFERS]; /* a unit's name (never 0); 0: none */
    long gathers;
} unit_holds;

/* Whether unit (kind, layer) must be gathered into its buffer: not when
 * the buffer holds it still; else the buffer is marked as holding it
 * and the gather counted. */
bool unit_holds_claim(unit_holds *holds, stage_unit_kind kind, int layer);
/* The parameters changed (or a gather failed): no buffer holds a unit. */
void unit_holds_forget(unit_holds *holds);
/* The claims of one pass in the order the cuda backend makes them
 * (param_units.c: the pass's start, then at each unit the unit and the
 * next one); returns the gathers among them. */
int unit_holds_pass(unit_holds *holds, const unit_pass_shape *shape,
                    bool backward);

#endif
