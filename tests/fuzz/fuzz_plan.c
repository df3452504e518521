/* Fuzzes the plan reader (inline model and cluster, or references that
 * resolve into an empty directory) and the accessors of a loaded plan. */
#include "fuzz.h"

#include <stdlib.h>

#include "common/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    plan p;
    if (fuzz_load_plan(data, size, &p) != 0)
        return 0;
    int gpus = plan_gpu_count(&p);
    if (gpus != p.config.tp * p.config.dp * p.config.pp)
        abort(); /* the reader promises tp x dp x pp fills the nodes */
    for (int rank = 0; rank < gpus && rank < 256; rank++)
        if (plan_rank_node(&p, rank) < 0)
            abort();
    (void)plan_rank_node(&p, gpus);
    (void)parallel_microbatches(&p.config);
    char text[PT_MAX_STAGES * 12];
    partition_format(p.partition, p.config.pp, text, sizeof text);
    plan_free(&p);
    plan_free(&p); /* documented as safe to free again */
    return 0;
}
