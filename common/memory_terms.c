/* The names of the memory terms (common.h, "memory terms") that the cuda
 * backend tallies, run.json records and the cost model estimates, so the
 * three spell them alike. */
#include "common/common.h"

#include <string.h>

static const char *const term_names[PT_MEMORY_TERM_COUNT] = {
    [PT_MEMORY_WEIGHTS] = "weights",
    [PT_MEMORY_WEIGHT_MIRROR] = "weight_mirror",
    [PT_MEMORY_GRADIENTS] = "gradients",
    [PT_MEMORY_OPTIMIZER] = "optimizer",
    [PT_MEMORY_ACTIVATIONS] = "activations",
    [PT_MEMORY_LOGITS] = "logits",
    [PT_MEMORY_SCRATCH] = "scratch",
    [PT_MEMORY_WORKSPACE] = "workspace",
    [PT_MEMORY_COMM] = "comm",
    [PT_MEMORY_ROUNDING] = "rounding",
    [PT_MEMORY_CONTEXT] = "context",
};

const char *pt_memory_term_name(pt_memory_term term)
{
    return (int)term >= 0 && term < PT_MEMORY_TERM_COUNT ? term_names[term]
                                                         : NULL;
}

int pt_memory_term_from_name(const char *name)
{
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        if (strcmp(term_names[t], name) == 0)
            return t;
    return -1;
}

double pt_memory_terms_total(const pt_memory_terms *terms, bool with_context)
{
    double total = 0.0;
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        if (with_context || t != PT_MEMORY_CONTEXT)
            total += terms->bytes[t];
    return total;
}
