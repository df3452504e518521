/* Tables and lines that plan and estimate print. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

void print_notes(const costmodel *cm)
{
    for (int i = 0; i < cm->note_count; i++)
        printf("# note: %s\n", cm->notes[i]);
}

void print_tp_split_note(const plan *p)
{
    pt_error why = {{0}};
    if (plan_check_tp_split(p, &why) != 0)
        printf("# note: partita exec cannot run this plan: %s; it is "
               "priced all the same (docs/planner.md, \"Limits\")\n",
               why.message);
}

void print_pricing(const estimate *est)
{
    int measured = 0;
    for (int i = 0; i < est->pricing_count; i++) {
        const pricing_entry *entry = &est->pricing[i];
        if (entry->method == PRICE_MEASURED) {
            measured++;
            continue;
        }
        printf("# not measured: %s %s, tp %d, micro-batch %d: %.3f ms "
               "forward, %.3f ms backward: %s\n",
               entry->gpu, entry->part, entry->tp, entry->mbs,
               entry->forward_s * 1e3, entry->backward_s * 1e3, entry->how);
    }
    if (est->pricing_count > 0)
        printf("# %d of %d profile entries measured (embedding, layer and "
               "head of each GPU type pacing a stage)\n",
               measured, est->pricing_count);
}

void format_node_order(const cluster *c, const int *order, int count,
                       char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < count && used < size;) {
        int type = cluster_node_type(c, order[i]);
        int run = 1;
        while (i + run < count && cluster_node_type(c, order[i + run]) == type)
            run++;
        int written;
        if (run > 1)
            written = snprintf(out + used, size - used, "%s%sx%d",
                               used ? " " : "", c->types[type].name, run);
        else
            written = snprintf(out + used, size - used, "%s%s",
                               used ? " " : "", c->types[type].name);
        if (written < 0)
            break;
        used += (size_t)written;
        i += run;
    }
}

void format_memory_miss(const estimate *est, char *out, size_t size)
{
    const stage_estimate *stage = &est->stages[est->worst_stage];
    double need = stage->peak_memory_bytes / PT_GIB;
    double have = stage->memory_cap_bytes / PT_GIB;
    snprintf(out, size,
             "stage %d (%s, %d layers) needs %.2f GiB, has %.2f GiB: "
             "%.2f GiB over",
             est->worst_stage, stage->gpu, stage->layers, need, have,
             need - have);
}

void print_stage_table(const plan *p, const estimate *est)
{
    (void)p;
    printf("#\n");
    printf("# %5s  %-14s %6s  %12s %12s %11s %12s %11s %16s\n", "stage",
           "gpu", "layers", "forward", "backward", "send", "dp-allred",
           "optimizer", "memory/cap");
    printf("# %5s  %-14s %6s  %12s %12s %11s %12s %11s %16s\n", "", "",
           "", "(ms/mb)", "(ms/mb)", "(ms/mb)", "(ms/step)", "(ms/step)",
           "(GiB)");
    for (int s = 0; s < est->stage_count; s++) {
        const stage_estimate *stage = &est->stages[s];
        char memory[40];
        snprintf(memory, sizeof memory, "%.2f/%.2f%s",
                 stage->peak_memory_bytes / PT_GIB,
                 stage->memory_cap_bytes / PT_GIB,
                 stage->peak_memory_bytes > stage->memory_cap_bytes ? "!"
                                                                    : "");
        printf("  %5d  %-14s %6d  %12.3f %12.3f %11.3f %12.3f %11.3f %16s\n",
               s, stage->gpu, stage->layers, stage->forward_s * 1e3,
               stage->backward_s * 1e3, stage->send_s * 1e3,
               (stage->dp_allreduce_s + stage->embedding_allreduce_s) * 1e3,
               stage->optimizer_s * 1e3, memory);
    }
}

/* Each stage's peak memory per GPU term by term (docs/cost-model.md,
 * "Memory per GPU"), in GiB. */
void print_memory_table(const estimate *est)
{
    static const char *const headers[PT_MEMORY_TERM_COUNT] = {
        "weights", "mirror",  "grads",  "optim", "activ",  "logits",
        "scratch", "cublas",  "comm",   "round", "context"};
    printf("#\n# memory per GPU by term (GiB): fp32 weights, half-precision "
           "mirror, main gradients (their bytes as the runtime line says), "
           "AdamW state, activations kept, logits, backward scratch, "
           "cuBLASLt workspace, comm buffers, allocator rounding, CUDA "
           "context\n");
    printf("# %5s", "stage");
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        printf(" %8s", headers[t]);
    printf(" %8s\n", "total");
    for (int s = 0; s < est->stage_count; s++) {
        const stage_estimate *stage = &est->stages[s];
        printf("  %5d", s);
        for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
            printf(" %8.3f", stage->memory.bytes[t] / PT_GIB);
        printf(" %8.3f\n", stage->peak_memory_bytes / PT_GIB);
    }
}

/* The stages' own degrees, when a stage has its own (issue 36): each
 * stage's tp x dp and its replicas' micro-batch, in samples. */
static void print_own_degrees(const plan *p)
{
    if (plan_first_asymmetric_stage(p) < 0)
        return;
    printf("# stages of their own degrees (tp x dp, samples a replica's "
           "micro-batch):");
    for (int s = 0; s < p->config.pp; s++) {
        parallel_config own = parallel_stage_config(&p->config, p->stages, s);
        printf("%s %d x %d (%d)", s > 0 ? "," : "", own.tp, own.dp,
               own.mbs);
    }
    printf("\n");
}

/* The host rates each GPU type pacing a stage prices offload at: its
 * profile's where it measured them, else the cost model's constants. The
 * CPU's AdamW is the host's, not the GPU's (the H200 machine's leases ran
 * plan 22's host step 17 % apart), so the line names whose it is. */
static void print_host_rates(const estimate *est)
{
    for (int s = 0; s < est->stage_count; s++) {
        const stage_estimate *st = &est->stages[s];
        bool seen = false;
        for (int t = 0; t < s && !seen; t++)
            seen = strcmp(est->stages[t].gpu, st->gpu) == 0;
        if (seen)
            continue;
        /* the rates as the cost model prices them (zero.c) */
        double copy_s = costmodel_offload_copy_s(st->host_copy_s_per_param);
        double adamw_s =
            costmodel_offload_adamw_s(st->host_adamw_s_per_param);
        printf("# offload on %s: host link %.0f GB/s each way (%s), CPU "
               "AdamW %.2e parameters/s per GPU (%s)\n",
               st->gpu, 8.0 / copy_s / 1e9,
               st->host_copy_s_per_param > 0.0 ? "measured by its profile"
                                               : "assumed",
               1.0 / adamw_s,
               st->host_adamw_s_per_param > 0.0
                   ? "measured on its profile's host"
                   : "calibrated on a GPU machine's host");
    }
}

/* DeepSpeed's levers of a plan, when it has any: the ZeRO stage, the
 * offload's host memory and rates (print_host_rates), and what exec does
 * not realise yet. */
static void print_zero_levers(const plan *p, const estimate *est)
{
    const parallel_config *config = &p->config;
    if (parallel_zero_stage(config) < 2 && !config->offload_optimizer)
        return;
    /* the host memory of the GPU that needs the most */
    double host = 0.0;
    for (int s = 0; s < est->stage_count; s++) {
        double bytes = costmodel_offload_host_bytes(
            &p->model, config, s, est->stages[s].layers);
        host = bytes > host ? bytes : host;
    }
    if (config->offload_optimizer) {
        printf("# ZeRO stage %d, optimizer offload on (host memory %.2f GiB "
               "per GPU)\n",
               parallel_zero_stage(config), host / PT_GIB);
        print_host_rates(est);
    } else
        printf("# ZeRO stage %d, optimizer offload off\n",
               parallel_zero_stage(config));
    if (parallel_zero_stage(config) >= 2 && config->dp > 1)
        printf("# ZeRO-%d's memory below is the shards and unit buffers "
               "partita exec's cuda backend holds (whole buffers on a "
               "pipeline's tied embedding pair; docs/cost-model.md, "
               "section 11)\n",
               parallel_zero_stage(config));
}

/* A line for the plan's interleaving and sequence parallelism, only when
 * it uses one (older plans' output is unchanged). */
static void print_schedule_levers(const parallel_config *config)
{
    int v = parallel_virtual_stages(config);
    if (v == 1 && !config->sequence_parallel)
        return;
    printf("# virtual stages %d a rank (interleaved 1F1B %s), sequence "
           "parallel %s\n",
           v, v > 1 ? "on" : "off", config->sequence_parallel ? "on" : "off");
}

void print_model_line(const model_shape *m)
{
    char layer[160] = "GPT-2 layer";
    if (!model_is_gpt(m)) {
        char rope[48] = "";
        if (m->positions == MODEL_POSITIONS_ROPE)
            snprintf(rope, sizeof rope, " (base %.0f)", m->rope_base);
        snprintf(layer, sizeof layer, "%s, %s, %s positions%s, %d of %d "
                 "heads for keys and values, %s",
                 model_norm_name(m->norm), model_mlp_name(m->mlp),
                 model_positions_name(m->positions), rope,
                 model_kv_heads(m), m->heads,
                 m->bias == MODEL_BIAS_ALL    ? "biases"
                 : m->bias == MODEL_BIAS_QKV ? "biases on q, k, v only"
                                             : "no biases");
    }
    printf("# model %s: %.0f parameters (%.2f billion), %s, %s head\n",
           m->name, model_parameter_count(m),
           model_parameter_count(m) / 1e9, layer,
           m->tied_embeddings ? "tied" : "untied");
}

void print_estimate_summary(const plan *p, const estimate *est)
{
    const parallel_config *config = &p->config;
    char partition[PT_MAX_STAGES * 6];
    partition_format(p->partition, config->pp, partition, sizeof partition);
    char order[512];
    format_node_order(&p->cluster, p->node_order, p->node_order_count, order,
                      sizeof order);
    char step[32];
    pt_format_seconds(est->step_time_s, step, sizeof step);
    printf("# model %s, cluster %s, %d GPUs\n", p->model.name,
           p->cluster.name, plan_gpu_count(p));
    print_model_line(&p->model);
    printf("# gbs %d, mbs %d, tp %d, dp %d, pp %d, %d micro-batches, "
           "schedule %s, precision %s, recompute %s, distributed optimizer "
           "%s\n",
           config->gbs, config->mbs, config->tp, config->dp, config->pp,
           parallel_microbatches(config), schedule_name(config->schedule),
           precision_name(config->precision),
           config->recompute ? "full" : "none",
           config->distributed_optimizer ? "on" : "off");
    print_own_degrees(p);
    print_zero_levers(p, est);
    print_schedule_levers(config);
    printf("# priced for the %s runtime: %s attention, residual stream in "
           "%d-byte elements, main gradients in %d-byte elements, the dp "
           "reduction %s the last backward (docs/cost-model.md, \"The "
           "runtime\")\n",
           config->runtime == RUNTIME_PARTITA    ? "Partita"
           : config->runtime == RUNTIME_MEGATRON ? "Megatron-LM"
                                                 : "DeepSpeed",
           attention_name(parallel_attention(config)),
           parallel_residual_bytes(config), parallel_gradient_bytes(config),
           parallel_overlaps_grad_reduce(config) ? "overlapping" : "after");
    if (config->deterministic)
        printf("# deterministic: cuDNN's deterministic attention backward, "
               "its workspace priced; its time is the profiles' layer "
               "entries', whichever backward they timed (docs/cost-model.md, "
               "\"Deterministic plans\")\n");
    printf("# partition %s, node order %s\n", partition, order);
    print_stage_table(p, est);
    print_memory_table(est);
    printf("#\n");
    printf("# step time %s | %.0f tokens/s | %.1f TFLOP/s per GPU | "
           "bubble %.1f %% | $%.4f per step\n",
           step, est->tokens_per_s, est->tflops_per_gpu,
           est->bubble_fraction * 100.0, est->cost_per_step_usd);
}
