/* interop: what both exports share: the host list in the plan's node
 * order, the partition in Megatron-LM's terms, and the notes on what a
 * trainer cannot be told. */
#include "interop/interop.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *interop_target_name(interop_target target)
{
    return target == INTEROP_MEGATRON ? "megatron" : "deepspeed";
}

const char *interop_target_title(interop_target target)
{
    return target == INTEROP_MEGATRON ? "Megatron-LM" : "DeepSpeed";
}

int interop_target_from_name(const char *name)
{
    if (strcmp(name, "megatron") == 0)
        return INTEROP_MEGATRON;
    if (strcmp(name, "deepspeed") == 0)
        return INTEROP_DEEPSPEED;
    return -1;
}

/* "a10[3]" -> "a10-3": a name a shell and a hostfile take as it is. */
static void placeholder_host(const char *node, char *out, size_t size)
{
    size_t used = 0;
    for (const char *c = node; *c != '\0' && used + 1 < size; c++) {
        if (*c == ']')
            continue;
        bool plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                     (*c >= '0' && *c <= '9') || *c == '.' || *c == '-';
        out[used++] = plain ? *c : '-';
    }
    out[used] = '\0';
}

interop_host *interop_hosts(const plan *p, pt_error *err)
{
    interop_host *hosts = calloc((size_t)p->node_order_count + 1,
                                 sizeof *hosts);
    if (hosts == NULL) {
        pt_fail(err, "out of memory listing the plan's hosts");
        return NULL;
    }
    int rank = 0;
    for (int i = 0; i < p->node_order_count; i++) {
        int node = p->node_order[i];
        interop_host *host = &hosts[i];
        cluster_node_name(&p->cluster, node, host->node, sizeof host->node);
        placeholder_host(host->node, host->host, sizeof host->host);
        host->gpu = p->cluster.types[cluster_node_type(&p->cluster, node)].gpu;
        host->gpus = cluster_node_gpus(&p->cluster, node);
        host->first_rank = rank;
        rank += host->gpus;
    }
    return hosts;
}

void interop_stage_hosts(const plan *p, const interop_host *hosts, int stage,
                         int *first, int *last, char *nodes, size_t size)
{
    int first_rank = parallel_stage_first_rank(&p->config, stage);
    int last_rank = first_rank + parallel_ranks_per_stage(&p->config) - 1;
    int host = 0;
    while (hosts[host].first_rank + hosts[host].gpus <= first_rank)
        host++;
    int last_host = host;
    while (hosts[last_host].first_rank + hosts[last_host].gpus <= last_rank)
        last_host++;
    *first = host;
    *last = last_host;
    if (nodes == NULL)
        return;
    bool one_type = true;
    for (int h = host + 1; h <= last_host; h++)
        one_type = one_type && strcmp(hosts[h].gpu, hosts[host].gpu) == 0;
    snprintf(nodes, size, "%s%s%s, %s", hosts[host].node,
             host == last_host ? "" : "..",
             host == last_host ? "" : hosts[last_host].node,
             one_type ? hosts[host].gpu : "GPU types mixed");
}

/* ------------------------------------------------------------ partition */

/* Whether Megatron's split with the first and/or last stage's count given
 * (the other stages share the rest evenly, each at least one layer) is
 * the plan's partition. */
static bool first_last_matches(const int *layers, int pp, bool first,
                               bool last)
{
    if ((first && layers[0] <= 0) || (last && layers[pp - 1] <= 0))
        return false;
    int from = first ? 1 : 0, to = last ? pp - 1 : pp;
    for (int s = from; s < to; s++)
        if (layers[s] <= 0 || layers[s] != layers[from])
            return false;
    return true;
}

megatron_partition interop_megatron_partition(const plan *p)
{
    int pp = p->config.pp;
    const int *layers = p->partition;
    megatron_partition out = {MEGATRON_SPLIT_EVEN, 0, 0};
    bool even = true;
    for (int s = 1; s < pp; s++)
        even = even && layers[s] == layers[0];
    if (pp == 1 || even)
        return out;
    /* fewest flags first: first only, last only, both */
    const bool tries[3][2] = {{true, false}, {false, true}, {true, true}};
    for (int i = 0; i < 3; i++) {
        if (!first_last_matches(layers, pp, tries[i][0], tries[i][1]))
            continue;
        out.split = MEGATRON_SPLIT_FIRST_LAST;
        out.first_layers = tries[i][0] ? layers[0] : 0;
        out.last_layers = tries[i][1] ? layers[pp - 1] : 0;
        return out;
    }
    out.split = MEGATRON_SPLIT_LAYOUT;
    return out;
}

/* Appends formatted text at *used; false when it did not fit. */
static bool append(char *out, size_t size, size_t *used, const char *format,
                   ...) __attribute__((format(printf, 4, 5)));
static bool append(char *out, size_t size, size_t *used, const char *format,
                   ...)
{
    if (*used >= size)
        return false;
    va_list args;
    va_start(args, format);
    int written = vsnprintf(out + *used, size - *used, format, args);
    va_end(args);
    if (written < 0 || (size_t)written >= size - *used)
        return false;
    *used += (size_t)written;
    return true;
}

int interop_megatron_layout(const plan *p, char *out, size_t size,
                            pt_error *err)
{
    int pp = p->config.pp, v = parallel_virtual_stages(&p->config);
    size_t used = 0;
    bool fits = size > 0;
    if (fits)
        out[0] = '\0';
    /* interleaved: the pp x v virtual stages in order, chunk c of rank i
     * being stage c pp + i with L_i / v layers (Megatron reads v off the
     * layout's length) */
    for (int q = 0; q < pp * v && fits; q++) {
        int layers = p->partition[q % pp] / v;
        fits = append(out, size, &used, "%s%s", q > 0 ? "|" : "",
                      q == 0 ? "E" : "");
        if (fits && layers == 1)
            fits = append(out, size, &used, "t");
        else if (fits && layers > 1)
            fits = append(out, size, &used, "t*%d", layers);
        if (fits && q == pp * v - 1)
            fits = append(out, size, &used, "L");
    }
    return fits ? 0 : pt_fail(err, "the pipeline layout of %d stages is "
                                   "too long", pp);
}

void interop_balance_list(const plan *p, char *out, size_t size)
{
    size_t used = 0;
    if (size > 0)
        out[0] = '\0';
    for (int s = 0; s < p->config.pp; s++)
        if (!append(out, size, &used, "%s%d", s > 0 ? "," : "",
                    p->partition[s]))
            break;
}

/* ---------------------------------------------------------------- notes */

static void add_note(interop_notes *notes, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
static void add_note(interop_notes *notes, const char *format, ...)
{
    if (notes->count >= INTEROP_MAX_NOTES)
        return;
    va_list args;
    va_start(args, format);
    vsnprintf(notes->text[notes->count++], INTEROP_NOTE_MAX, format, args);
    va_end(args);
}

/* The GPU type of a rank's node. */
static const char *rank_gpu(const plan *p, int rank)
{
    int node = plan_rank_node(p, rank);
    return p->cluster.types[cluster_node_type(&p->cluster, node)].gpu;
}

/* The GPU types of the plan's nodes, "A100-FASOP, A10-FASOP"; their
 * number. */
static int gpu_types_used(const plan *p, char *out, size_t size)
{
    int count = 0;
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < p->node_order_count; i++) {
        const char *gpu =
            p->cluster.types[cluster_node_type(&p->cluster, p->node_order[i])]
                .gpu;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = strcmp(gpu, p->cluster.types[cluster_node_type(
                                   &p->cluster, p->node_order[j])]
                                   .gpu) == 0;
        if (!seen) {
            append(out, size, &used, "%s%s", count ? ", " : "", gpu);
            count++;
        }
    }
    return count;
}

/* Stages whose ranks sit on GPUs of more than one type, "3, 5"; their
 * number. */
static int mixed_stages(const plan *p, char *out, size_t size)
{
    int per_stage = parallel_ranks_per_stage(&p->config);
    int count = 0;
    size_t used = 0;
    out[0] = '\0';
    for (int s = 0; s < p->config.pp; s++) {
        int first = parallel_stage_first_rank(&p->config, s);
        bool mixed = false;
        for (int r = first + 1; r < first + per_stage && !mixed; r++)
            mixed = strcmp(rank_gpu(p, r), rank_gpu(p, first)) != 0;
        if (mixed)
            append(out, size, &used, "%s%d", count++ ? ", " : "", s);
    }
    return count;
}

/* Whether some tensor-parallel group holds ranks of two nodes. */
static bool tp_spans_nodes(const plan *p)
{
    int tp = p->config.tp;
    for (int first = 0; first < plan_gpu_count(p); first += tp)
        if (plan_rank_node(p, first) != plan_rank_node(p, first + tp - 1))
            return true;
    return false;
}

/* Whether a node type of the plan slices its GPUs (an SM or memory cap,
 * or two ranks on one device), which neither trainer can do. */
static const char *sliced_node_type(const plan *p)
{
    for (int i = 0; i < p->node_order_count; i++) {
        const node_type *type =
            &p->cluster.types[cluster_node_type(&p->cluster, p->node_order[i])];
        for (int d = 0; d < type->device_count; d++) {
            bool shared = false;
            for (int e = 0; e < d; e++)
                shared = shared ||
                         type->devices[e].index == type->devices[d].index;
            if (type->devices[d].sm_limit > 0 ||
                type->devices[d].memory_limit_gib > 0 || shared)
                return type->name;
        }
    }
    return NULL;
}

/* Notes of the cluster: GPU types, stages over two types, tp groups over
 * two nodes, sliced GPUs. */
static void placement_notes(const plan *p, const char *title,
                            interop_notes *out)
{
    char list[256];
    if (gpu_types_used(p, list, sizeof list) > 1)
        add_note(out,
                 "the plan mixes GPU types (%s): %s is not told which GPU a "
                 "rank has; each stage reaches the GPUs the plan chose only "
                 "through the host order, so keep the hosts in this order, "
                 "each with the GPU type the plan gives its node",
                 list, title);
    if (mixed_stages(p, list, sizeof list) > 0)
        add_note(out,
                 "stage(s) %s hold GPUs of more than one type: as in the "
                 "estimate, such a stage runs at its slowest GPU's pace; %s "
                 "cannot give its faster GPUs more of the work",
                 list, title);
    if (p->config.tp > 1 && tp_spans_nodes(p))
        add_note(out,
                 "tensor-parallel groups of %d span nodes: %s numbers "
                 "tensor ranks first, as Partita does, so each group's "
                 "all-reduces cross the inter-node link, as the estimate "
                 "priced them",
                 p->config.tp, title);
    const char *sliced = sliced_node_type(p);
    if (sliced != NULL)
        add_note(out,
                 "node type %s slices its GPUs (an SM or memory cap, or "
                 "ranks sharing a device): %s runs on whole GPUs and cannot "
                 "be told so; the estimate prices the slices",
                 sliced, title);
    if (p->config.schedule == SCHEDULE_GPIPE && p->config.pp > 1)
        add_note(out,
                 "schedule gpipe cannot be expressed: %s runs its 1F1B "
                 "schedule, which keeps fewer micro-batches in flight than "
                 "the GPipe the estimate priced",
                 title);
}

static void megatron_notes(const plan *p, interop_notes *out)
{
    if (!model_is_gpt(&p->model))
        add_note(out,
                 "vocabulary %d is the tokenizer's: give Megatron-LM the "
                 "model's own (--tokenizer-type HuggingFaceTokenizer "
                 "--tokenizer-model PATH in ARGS); a GPT-2 BPE would "
                 "size the embedding and head otherwise",
                 p->model.vocab);
    int multiple = 128 * p->config.tp;
    int padded = (p->model.vocab + multiple - 1) / multiple * multiple;
    if (padded != p->model.vocab)
        add_note(out,
                 "Megatron-LM pads the vocabulary to a multiple of 128 x tp: "
                 "%d becomes %d, a larger embedding and head than the "
                 "estimate's",
                 p->model.vocab, padded);
    if (interop_megatron_partition(p).split == MEGATRON_SPLIT_LAYOUT) {
        char balance[PT_MAX_STAGES * 6];
        interop_balance_list(p, balance, sizeof balance);
        add_note(out,
                 "the partition needs --pipeline-model-parallel-layout "
                 "(Megatron-core 0.13 and later); older versions take no "
                 "per-stage list: apply %s by hand (FASOP's --balance)",
                 balance);
    }
}

static void deepspeed_notes(const plan *p, interop_notes *out)
{
    if (!model_is_gpt(&p->model))
        add_note(out,
                 "the model's layer (partita.architecture) is the "
                 "training script's: Megatron-DeepSpeed builds it from "
                 "partita.megatron_deepspeed_args%s",
                 p->model.bias == MODEL_BIAS_QKV
                     ? "; it has no flag for biases on q, k and v alone, "
                       "so the model's few q, k, v biases are left out"
                     : "");
    if (p->config.pp > 1)
        add_note(out,
                 "DeepSpeed takes no layer list: build the PipelineModule "
                 "with the boundaries in partita.pipeline.parts "
                 "(docs/interop.md shows how); its partition_method "
                 "'uniform' or 'parameters' would cut elsewhere");
    if (p->config.tp > 1)
        add_note(out,
                 "tp %d is not a ds_config setting: the model must be "
                 "tensor-parallel itself (Megatron-DeepSpeed's "
                 "--tensor-model-parallel-size %d, with the topology "
                 "PipeModelDataParallelTopology(num_pp=%d, num_mp=%d, "
                 "num_dp=%d))",
                 p->config.tp, p->config.tp, p->config.pp, p->config.tp,
                 p->config.dp);
    if (parallel_virtual_stages(&p->config) > 1)
        add_note(out,
                 "virtual_stages %d: DeepSpeed's pipeline engine runs the "
                 "plain 1F1B only, so the step keeps the plain bubble "
                 "(partita estimate of the plan with virtual_stages 1 "
                 "prices it); export --to megatron runs the interleaved "
                 "schedule", p->config.virtual_stages);
    if (p->config.sequence_parallel)
        add_note(out,
                 "sequence_parallel: Megatron-DeepSpeed's --sequence-parallel "
                 "with its tp (DeepSpeed's own Ulysses sequence parallelism "
                 "shards attention heads instead and is another plan)");
    if (p->config.recompute && p->config.pp == 1)
        add_note(out,
                 "full recompute without a pipeline is the model's own "
                 "(torch.utils.checkpoint or deepspeed.checkpointing around "
                 "each layer): ds_config has no switch for it");
    if (p->config.selective_recompute)
        add_note(out,
                 "recompute selective: Megatron-DeepSpeed's "
                 "--recompute-granularity selective (DeepSpeed's own "
                 "activation checkpointing is per layer only): ds_config "
                 "has no switch for it");
    if (parallel_zero_stage(&p->config) >= 2 && p->config.pp > 1)
        add_note(out,
                 "DeepSpeed's pipeline engine runs ZeRO stage 1 at most: "
                 "zero_optimization.stage %d with pp %d stops it at "
                 "start-up (run the stages without PipelineModule, or a "
                 "plan of pp 1)",
                 parallel_zero_stage(&p->config), p->config.pp);
}

void interop_notes_of(const plan *p, interop_target target,
                      interop_notes *out)
{
    memset(out, 0, sizeof *out);
    placement_notes(p, interop_target_title(target), out);
    if (target == INTEROP_MEGATRON)
        megatron_notes(p, out);
    else
        deepspeed_notes(p, out);
}
