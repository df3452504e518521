/* Fuzzes the cost model: every plan that loads (see fuzz_plan.c) is
 * estimated with the bundled profiles, timeline included. Catches
 * crashes on plans that are valid but odd (one layer, many stages,
 * partitions with empty stages, huge micro-batch counts). */
#include "fuzz.h"

#include <math.h>
#include <stdlib.h>

#include "common/common.h"
#include "costmodel/costmodel.h"

#ifndef FUZZ_PROFILE_DIR
#error "FUZZ_PROFILE_DIR must name the bundled profiles directory"
#endif

/* Pipeline work simulated at most (stages x micro-batches): larger plans
 * are valid but only slow, and a slow input stalls a campaign. */
enum { FUZZ_PIPELINE_SLOTS = 1 << 16, FUZZ_RANK_LIMIT = 4096 };

static void estimate_plan(const plan *p)
{
    long long slots = (long long)p->config.pp *
                      parallel_microbatches(&p->config);
    if (slots > FUZZ_PIPELINE_SLOTS || plan_gpu_count(p) > FUZZ_RANK_LIMIT)
        return;
    costmodel cm;
    pt_error err;
    if (costmodel_open(&cm, &p->model, &p->cluster, FUZZ_PROFILE_DIR,
                       &err) != 0)
        return;
    estimate result;
    bool want_events = plan_gpu_count(p) <= 64;
    if (costmodel_prepare(&cm, &p->config, &err) == 0 &&
        costmodel_estimate(&cm, &p->config, p->node_order,
                           p->node_order_count, p->partition, want_events,
                           &result, &err) == 0) {
        if (isnan(result.step_time_s) || result.step_time_s < 0 ||
            result.stage_count != p->config.pp)
            abort(); /* an estimate must be a time, stage by stage */
        estimate_free(&result);
    }
    costmodel_close(&cm);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    plan p;
    if (fuzz_load_plan(data, size, &p) != 0)
        return 0;
    estimate_plan(&p);
    plan_free(&p);
    return 0;
}
