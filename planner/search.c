/*
 * planner_search: scores every configuration of the search space (shape,
 * micro-batch size, node order, memory levers) with an exact partition
 * and a cheap step-time score, keeps the best few, and ranks those by
 * the simulated step time (docs/planner.md).
 *
 * Work is spread over threads one node order at a time; each worker keeps
 * its own best candidates and every candidate carries its place in the
 * enumeration (its rank), which breaks ties. The merged result is thus
 * the same for any number of threads. Workers memoise stage prices and
 * partitions (search_memo.c) and skip configurations whose score floor
 * (search_floor.c) cannot beat their worst kept candidate: such a
 * configuration could not have made the shortlist, so pruning changes
 * how much is scored, never what is kept.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Candidates the simulator ranks: at least this many, or twice `keep`. */
#define SHORTLIST_MINIMUM 32

/* The memory levers: none first; the others only when that does not fit. */
typedef struct memory_levers {
    bool distributed_optimizer;
    bool recompute;
} memory_levers;

static const memory_levers lever_sets[] = {
    {false, false}, {true, false}, {false, true}, {true, true}};
#define LEVER_SET_COUNT 4

/* A scored configuration that may go on to the simulator. */
typedef struct candidate {
    double score_s;        /* surrogate + per-step work, see step_tail_s */
    long long rank;        /* place in the enumeration, breaks ties */
    parallel_config config;
    int order_index;       /* into the search space */
    int partition[PT_MAX_STAGES];
} candidate;

/* The best candidates seen: slots plus their indices sorted best first. */
typedef struct candidate_set {
    int count, capacity;
    candidate *slots;
    int *sorted;           /* slot indices, best first */
} candidate_set;

/* The configuration that came closest to fitting, for the message shown
 * when nothing fits. */
typedef struct memory_miss {
    double ratio;          /* needed / usable at its worst stage */
    long long rank;
    parallel_config config;
    int stage;
    int type;              /* node type of that stage's smallest GPU */
    double needed_bytes, usable_bytes;
} memory_miss;

/* One thread's scratch memory and results. */
typedef struct search_worker {
    costmodel model;       /* shallow copy: notes it adds stay here */
    candidate_set best;
    memory_miss closest;
    long long scored, feasible, pruned;
    bool failed;
    pt_error err;
    search_memo memo;
    stage_facts *facts;          /* [max pp] */
    partition_stage *stages;     /* [max pp] */
    int *layers;                 /* [max pp] */
    /* the prices of every type for the last config asked (the per-step
       work needs them; pricing is not free) */
    parallel_config priced_config;
    bool priced[PLANNER_MAX_TYPES];
    type_costs prices[PLANNER_MAX_TYPES];
} search_worker;

/* What every worker shares. */
typedef struct search_run {
    costmodel *cm;
    const search_options *options;
    const search_space *space;
    search_worker *workers;
    int worker_count;
    int *visit;                       /* order indices, most promising
                                         shapes first */
    atomic_bool stop;                 /* a worker failed */
    atomic_llong configurations_done; /* for progress */
    long long configurations_total;
    int progress_percent;
} search_run;

/* ------------------------------------------------------- candidate set */

static bool ranks_before(double score_a, long long rank_a, double score_b,
                         long long rank_b)
{
    return score_a < score_b || (score_a == score_b && rank_a < rank_b);
}

static int candidate_set_open(candidate_set *set, int capacity)
{
    set->count = 0;
    set->capacity = capacity;
    set->slots = malloc((size_t)capacity * sizeof *set->slots);
    set->sorted = malloc((size_t)capacity * sizeof *set->sorted);
    return set->slots && set->sorted ? 0 : -1;
}

static void candidate_set_close(candidate_set *set)
{
    free(set->slots);
    free(set->sorted);
    memset(set, 0, sizeof *set);
}

static const candidate *candidate_at(const candidate_set *set, int position)
{
    return &set->slots[set->sorted[position]];
}

/* Keeps the candidate when it is among the capacity best so far. */
static void candidate_offer(candidate_set *set, double score_s,
                            long long rank, const parallel_config *config,
                            int order_index, const int *partition)
{
    int slot;
    if (set->count < set->capacity) {
        slot = set->count++;
    } else {
        const candidate *worst = candidate_at(set, set->count - 1);
        if (!ranks_before(score_s, rank, worst->score_s, worst->rank))
            return;
        slot = set->sorted[set->count - 1];
    }
    candidate *entry = &set->slots[slot];
    entry->score_s = score_s;
    entry->rank = rank;
    entry->config = *config;
    entry->order_index = order_index;
    memcpy(entry->partition, partition, (size_t)config->pp * sizeof(int));
    int position = set->count - 1;
    while (position > 0) {
        const candidate *before = candidate_at(set, position - 1);
        if (!ranks_before(score_s, rank, before->score_s, before->rank))
            break;
        set->sorted[position] = set->sorted[position - 1];
        position--;
    }
    set->sorted[position] = slot;
}

/* ------------------------------------------------------------- scoring */

static bool same_config(const parallel_config *a, const parallel_config *b)
{
    return a->gbs == b->gbs && a->mbs == b->mbs && a->tp == b->tp &&
           a->dp == b->dp && a->pp == b->pp && a->schedule == b->schedule &&
           a->precision == b->precision && a->recompute == b->recompute &&
           a->distributed_optimizer == b->distributed_optimizer;
}

static const type_costs *type_prices(search_worker *w,
                                     const parallel_config *config, int type,
                                     pt_error *err)
{
    if (!same_config(config, &w->priced_config)) {
        w->priced_config = *config;
        memset(w->priced, 0, sizeof w->priced);
    }
    if (!w->priced[type]) {
        if (costmodel_type_costs(&w->model, type, config, &w->prices[type],
                                 err) != 0)
            return NULL;
        w->priced[type] = true;
    }
    return &w->prices[type];
}

/* The per-step work after the pipeline (gradient reduction over dp,
 * tied-embedding all-reduce, optimizer step) of the stage that needs the
 * most, as if every stage began it when the pipeline ends. Only used to
 * choose what the simulator ranks, which schedules this work exactly. */
static int step_tail_s(search_worker *w, const parallel_config *config,
                       const int *order, double *out, pt_error *err)
{
    const model_shape *model = &w->model.model;
    double embedding_s = 0.0;
    if (model->tied_embeddings && config->pp > 1) {
        /* the nodes holding the first GPU of the first and last stage */
        int last_stage_gpu = (config->pp - 1) * config->dp * config->tp;
        int node = 0;
        while (w->memo.node_start[node + 1] <= last_stage_gpu)
            node++;
        double bytes = (double)model->vocab * model->hidden / config->tp * 4.0;
        embedding_s = allreduce_time(
            bytes, 2, cluster_link(w->model.cluster, order[0], order[node]));
    }
    double worst = 0.0;
    for (int s = 0; s < config->pp; s++) {
        const stage_facts *facts = &w->facts[s];
        const type_costs *prices = type_prices(w, config, facts->slow_type,
                                               err);
        if (prices == NULL)
            return -1;
        double params =
            stage_parameters_per_gpu(model, config, s, w->layers[s]);
        double gradient_bytes = params * 4.0; /* fp32 main gradients */
        double reduce_s = 0.0;
        if (config->dp > 1 && config->distributed_optimizer)
            reduce_s = reduce_scatter_time(gradient_bytes, config->dp,
                                           facts->dp_link) +
                       reduce_scatter_time(
                           params * precision_bytes(config->precision),
                           config->dp, facts->dp_link);
        else if (config->dp > 1)
            reduce_s = allreduce_time(gradient_bytes, config->dp,
                                      facts->dp_link);
        double held = config->distributed_optimizer ? params / config->dp
                                                    : params;
        double tail = reduce_s + held * prices->optimizer_s_per_param;
        if (s == 0 || s == config->pp - 1)
            tail += embedding_s;
        if (tail > worst)
            worst = tail;
    }
    *out = worst;
    return 0;
}

/* How far a configuration that does not fit is from fitting: layers go
 * one by one to the stage whose memory share grows least; the worst
 * stage's needed / usable memory is the answer. */
static void note_memory_miss(search_worker *w, const parallel_config *config,
                             long long rank)
{
    int pp = config->pp;
    int *counts = w->layers;
    for (int s = 0; s < pp; s++)
        counts[s] = 0;
    for (int layer = 0; layer < w->model.model.layers; layer++) {
        int chosen = 0;
        double lowest = INFINITY;
        for (int s = 0; s < pp; s++) {
            const stage_terms *t = &w->facts[s].terms;
            double share = (t->fixed_bytes + t->per_layer_bytes *
                                                 (counts[s] + 1)) /
                           t->cap_bytes;
            if (share < lowest) {
                lowest = share;
                chosen = s;
            }
        }
        counts[chosen]++;
    }
    memory_miss miss = {0.0, rank, *config, 0, 0, 0.0, 0.0};
    for (int s = 0; s < pp; s++) {
        const stage_terms *t = &w->facts[s].terms;
        double needed = t->fixed_bytes + t->per_layer_bytes * counts[s];
        double ratio = needed / t->cap_bytes;
        if (s == 0 || ratio > miss.ratio) {
            miss.ratio = ratio;
            miss.stage = s;
            miss.type = w->facts[s].small_type;
            miss.needed_bytes = needed;
            miss.usable_bytes = t->cap_bytes;
        }
    }
    if (isnan(miss.ratio))
        miss.ratio = INFINITY;
    if (ranks_before(miss.ratio, miss.rank, w->closest.ratio,
                     w->closest.rank))
        w->closest = miss;
}

/* Places, prices, partitions and scores one configuration: 1 when it
 * fits, 0 when not, -1 on error. */
static int score_configuration(search_worker *w, const search_run *run,
                               const parallel_config *config,
                               int order_index, long long rank)
{
    const int *order = search_space_order(run->space, order_index);
    if (search_stage_facts(&w->model, &w->memo, config, order,
                           run->space->node_count, w->facts, &w->err) != 0)
        return -1;
    for (int s = 0; s < config->pp; s++)
        w->stages[s] = (partition_stage){w->facts[s].terms.fixed_s,
                                         w->facts[s].terms.per_layer_s,
                                         w->facts[s].terms.max_layers};
    partition_problem problem = {config->pp, w->model.model.layers,
                                 parallel_microbatches(config), w->stages};
    double surrogate_s = 0.0;
    int status = search_solve_partition(&w->memo, run->options->solver,
                                        &problem, w->layers, &surrogate_s,
                                        &w->err);
    w->scored++;
    if (status <= 0) {
        if (status == 0)
            note_memory_miss(w, config, rank);
        return status;
    }
    w->feasible++;
    double tail_s = 0.0;
    if (step_tail_s(w, config, order, &tail_s, &w->err) != 0)
        return -1;
    candidate_offer(&w->best, surrogate_s + tail_s, rank, config, order_index,
                    w->layers);
    return 1;
}

static bool lever_allowed(const search_options *options,
                          const memory_levers *levers, int dp)
{
    if (levers->distributed_optimizer &&
        (!options->allow_distributed_optimizer || dp < 2))
        return false;
    return !levers->recompute || options->allow_recompute;
}

/* Every micro-batch size and lever of one node order. */
/* Whether a configuration whose score cannot go below floor_s can still
 * make the worker's shortlist (and so the merged one). */
static bool could_make_shortlist(const search_worker *w, double floor_s)
{
    if (w->best.count < w->best.capacity)
        return true;
    return floor_s <= candidate_at(&w->best, w->best.count - 1)->score_s;
}

static void search_order(void *context, int worker_index, int position)
{
    search_run *run = context;
    search_worker *w = &run->workers[worker_index];
    int order_index = run->visit[position];
    if (w->failed || atomic_load(&run->stop))
        return;
    const search_options *options = run->options;
    const search_shape *shape =
        &run->space->shapes[run->space->order_shape[order_index]];
    for (int i = 0; i < shape->mbs_count; i++) {
        atomic_fetch_add(&run->configurations_done, 1);
        if (!options->exhaustive &&
            !could_make_shortlist(w, shape->score_floor_s[i])) {
            w->pruned++;
            continue;
        }
        parallel_config config = {options->gbs, shape->mbs[i], shape->tp,
                                  shape->dp, shape->pp, options->schedule,
                                  options->precision, false, false};
        for (int lever = 0; lever < LEVER_SET_COUNT; lever++) {
            if (!lever_allowed(options, &lever_sets[lever], shape->dp))
                continue;
            config.distributed_optimizer =
                lever_sets[lever].distributed_optimizer;
            config.recompute = lever_sets[lever].recompute;
            long long rank = ((long long)order_index * SEARCH_MAX_MBS_VALUES +
                              i) * LEVER_SET_COUNT + lever;
            int status = score_configuration(w, run, &config, order_index,
                                             rank);
            if (status < 0) {
                w->failed = true;
                atomic_store(&run->stop, true);
                return;
            }
            if (lever == 0 && status == 1)
                break; /* fits as it is: no lever needed */
        }
    }
}

static void report_progress(void *context, long long finished_items)
{
    (void)finished_items;
    search_run *run = context;
    long long done = atomic_load(&run->configurations_done);
    int percent = run->configurations_total > 0
                      ? (int)(100 * done / run->configurations_total)
                      : 100;
    if (percent == run->progress_percent)
        return;
    run->progress_percent = percent;
    run->options->progress(run->options->progress_context, done,
                           run->configurations_total);
}

/* ------------------------------------------------------------- workers */

static int workers_open(search_run *run, int count, int shortlist,
                        int max_pp, pt_error *err)
{
    run->workers = calloc((size_t)count, sizeof *run->workers);
    if (run->workers == NULL)
        return pt_fail(err, "search: out of memory for %d workers", count);
    run->worker_count = count;
    for (int i = 0; i < count; i++) {
        search_worker *w = &run->workers[i];
        w->model = *run->cm;
        w->closest.ratio = INFINITY;
        w->closest.rank = -1;
        if (search_memo_open(&w->memo, max_pp, run->space->node_count,
                             err) != 0)
            return -1;
        w->facts = malloc((size_t)max_pp * sizeof *w->facts);
        w->stages = malloc((size_t)max_pp * sizeof *w->stages);
        w->layers = malloc((size_t)max_pp * sizeof *w->layers);
        if (candidate_set_open(&w->best, shortlist) != 0 || !w->facts ||
            !w->stages || !w->layers)
            return pt_fail(err, "search: out of memory for the workers");
    }
    return 0;
}

static void workers_close(search_run *run)
{
    for (int i = 0; i < run->worker_count; i++) {
        search_worker *w = &run->workers[i];
        candidate_set_close(&w->best);
        search_memo_close(&w->memo);
        free(w->facts);
        free(w->stages);
        free(w->layers);
    }
    free(run->workers);
    run->workers = NULL;
    run->worker_count = 0;
}

/* Prices every type once per (tp, mbs, recompute) before the workers
 * start, so every note the prices raise lands in cm in a fixed order; the
 * workers' copies of cm then only read notes that exist already. */
static int collect_price_notes(costmodel *cm, const search_options *options,
                               const search_space *space, pt_error *err)
{
    for (int s = 0; s < space->shape_count; s++) {
        const search_shape *shape = &space->shapes[s];
        if (s > 0 && shape->tp == space->shapes[s - 1].tp)
            continue; /* shapes come grouped by tp, mbs sets nest */
        for (int i = 0; i < SEARCH_MAX_MBS_VALUES; i++) {
            int mbs = 1 << i;
            if (mbs > options->max_mbs)
                break;
            for (int recompute = 0; recompute < 2; recompute++) {
                parallel_config config = {options->gbs, mbs, shape->tp, 1, 1,
                                          options->schedule,
                                          options->precision, recompute, false};
                for (int t = 0; t < cm->cluster->type_count; t++) {
                    type_costs costs;
                    if (cm->cluster->types[t].count > 0 &&
                        costmodel_type_costs(cm, t, &config, &costs, err) != 0)
                        return -1;
                }
            }
        }
    }
    return 0;
}

/* Notes a worker's copy gained after all (should there be any). */
static void merge_notes(costmodel *cm, const search_run *run)
{
    for (int i = 0; i < run->worker_count; i++) {
        const costmodel *copy = &run->workers[i].model;
        for (int n = 0; n < copy->note_count; n++) {
            bool known = false;
            for (int k = 0; k < cm->note_count && !known; k++)
                known = strcmp(cm->notes[k], copy->notes[n]) == 0;
            if (!known && cm->note_count < COSTMODEL_MAX_NOTES)
                pt_copy_string(cm->notes[cm->note_count++],
                               sizeof cm->notes[0], copy->notes[n]);
        }
    }
}

/* ------------------------------------------------------------- ranking */

/* The shortlist and what the simulator made of each entry. */
typedef struct ranking {
    search_run *run;
    candidate_set shortlist;
    ranked_plan *plans;     /* [shortlist count] */
    bool *usable;           /* [shortlist count] */
} ranking;

/* Which node types hold GPUs of each stage (bit t for type t). */
static void stage_types_held(const cluster *c, const int *order,
                             int node_count, const parallel_config *config,
                             unsigned *masks)
{
    int stage_gpus = config->dp * config->tp;
    for (int s = 0; s < config->pp; s++)
        masks[s] = 0;
    int position = 0;
    for (int i = 0; i < node_count; i++) {
        int type = cluster_node_type(c, order[i]);
        int gpus = c->types[type].gpus;
        int last = (position + gpus - 1) / stage_gpus;
        for (int s = position / stage_gpus; s <= last && s < config->pp; s++)
            masks[s] |= 1u << type;
        position += gpus;
    }
}

static double cluster_price_per_hour(const cluster *c)
{
    double price = 0.0;
    for (int t = 0; t < c->type_count; t++)
        price += c->types[t].count * c->types[t].price_per_hour;
    return price;
}

static void fill_ranked_plan(const search_run *run, const candidate *chosen,
                             const estimate *est, ranked_plan *out)
{
    const cluster *c = run->cm->cluster;
    const int *order = search_space_order(run->space, chosen->order_index);
    memset(out, 0, sizeof *out);
    out->config = chosen->config;
    out->node_count = run->space->node_count;
    memcpy(out->node_order, order, (size_t)out->node_count * sizeof(int));
    memcpy(out->partition, chosen->partition,
           (size_t)chosen->config.pp * sizeof(int));
    out->step_time_s = est->step_time_s;
    out->tokens_per_s = est->tokens_per_s;
    out->tflops_per_gpu = est->tflops_per_gpu;
    out->cost_per_step_usd = est->step_time_s / 3600.0 *
                             cluster_price_per_hour(c);
    unsigned masks[PT_MAX_STAGES];
    stage_types_held(c, order, out->node_count, &chosen->config, masks);
    for (int s = 0; s < est->stage_count; s++) {
        double gib = est->stages[s].peak_memory_bytes / PT_GIB;
        for (int t = 0; t < c->type_count; t++)
            if ((masks[s] & (1u << t)) && gib > out->peak_memory_gib_by_type[t])
                out->peak_memory_gib_by_type[t] = gib;
    }
}

static void simulate_candidate(void *context, int worker_index, int position)
{
    ranking *rank = context;
    search_run *run = rank->run;
    search_worker *w = &run->workers[worker_index];
    if (w->failed)
        return;
    const candidate *chosen = candidate_at(&rank->shortlist, position);
    estimate est;
    memset(&est, 0, sizeof est);
    if (costmodel_estimate(&w->model, &chosen->config,
                           search_space_order(run->space, chosen->order_index),
                           run->space->node_count, chosen->partition, false,
                           &est, &w->err) != 0) {
        w->failed = true;
        return;
    }
    rank->usable[position] = est.fits;
    if (est.fits)
        fill_ranked_plan(run, chosen, &est, &rank->plans[position]);
    estimate_free(&est);
}

/* Sort key of a simulated plan. */
typedef struct ranked_key {
    double objective;
    long long rank;
    int position;
} ranked_key;

static int compare_keys(const void *a, const void *b)
{
    const ranked_key *x = a, *y = b;
    if (ranks_before(x->objective, x->rank, y->objective, y->rank))
        return -1;
    return ranks_before(y->objective, y->rank, x->objective, x->rank) ? 1 : 0;
}

/* Simulates the shortlist and keeps the `keep` best by the objective. */
static int rank_shortlist(ranking *rank, int threads, search_result *out,
                          pt_error *err)
{
    search_run *run = rank->run;
    int count = rank->shortlist.count;
    rank->plans = calloc((size_t)count + 1, sizeof *rank->plans);
    rank->usable = calloc((size_t)count + 1, sizeof *rank->usable);
    ranked_key *keys = calloc((size_t)count + 1, sizeof *keys);
    if (!rank->plans || !rank->usable || !keys) {
        free(keys);
        return pt_fail(err, "search: out of memory for the ranking");
    }
    if (parallel_for(threads, count, simulate_candidate, rank, NULL, err) != 0)
        goto failed;
    for (int i = 0; i < run->worker_count; i++) {
        if (run->workers[i].failed) {
            *err = run->workers[i].err;
            goto failed;
        }
    }
    int usable = 0;
    for (int p = 0; p < count; p++) {
        if (!rank->usable[p])
            continue;
        const ranked_plan *plan = &rank->plans[p];
        keys[usable++] = (ranked_key){
            run->options->objective == OBJECTIVE_COST ? plan->cost_per_step_usd
                                                      : plan->step_time_s,
            candidate_at(&rank->shortlist, p)->rank, p};
    }
    qsort(keys, (size_t)usable, sizeof *keys, compare_keys);
    int kept = usable < run->options->keep ? usable : run->options->keep;
    out->plans = calloc((size_t)kept + 1, sizeof *out->plans);
    if (out->plans == NULL) {
        pt_fail(err, "search: out of memory for the plans");
        goto failed;
    }
    for (int i = 0; i < kept; i++)
        out->plans[i] = rank->plans[keys[i].position];
    out->plan_count = kept;
    free(keys);
    return 0;
failed:
    free(keys);
    return -1;
}

/* ------------------------------------------------------------- results */

static void merge_results(search_run *run, candidate_set *shortlist,
                          memory_miss *closest, search_result *out)
{
    closest->ratio = INFINITY;
    closest->rank = -1;
    for (int i = 0; i < run->worker_count; i++) {
        const search_worker *w = &run->workers[i];
        out->configurations_scored += w->scored;
        out->configurations_feasible += w->feasible;
        out->configurations_pruned += w->pruned;
        for (int p = 0; p < w->best.count; p++) {
            const candidate *c = candidate_at(&w->best, p);
            candidate_offer(shortlist, c->score_s, c->rank, &c->config,
                            c->order_index, c->partition);
        }
        if (ranks_before(w->closest.ratio, w->closest.rank, closest->ratio,
                         closest->rank))
            *closest = w->closest;
    }
}

static void describe_miss(const costmodel *cm, const memory_miss *miss,
                          char *out, size_t size)
{
    const parallel_config *c = &miss->config;
    const char *levers = c->distributed_optimizer && c->recompute
                             ? ", distributed optimizer and full recompute"
                         : c->distributed_optimizer ? ", distributed optimizer"
                         : c->recompute             ? ", full recompute"
                                                    : "";
    const node_type *type = &cm->cluster->types[miss->type];
    snprintf(out, size, "the closest configuration (tp %d, dp %d, pp %d, "
             "mbs %d%s) needs %.2f GiB per GPU on stage %d (%s, node type "
             "%s) where %.2f GiB are usable", c->tp, c->dp, c->pp, c->mbs,
             levers, miss->needed_bytes / PT_GIB, miss->stage, type->gpu,
             type->name, miss->usable_bytes / PT_GIB);
}

static int check_options(const costmodel *cm, const search_options *options,
                         search_result *out, pt_error *err)
{
    if (out == NULL || options == NULL || cm == NULL || cm->cluster == NULL)
        return pt_fail(err, "search: no cost model, options or result");
    if (options->gbs < 1)
        return pt_fail(err, "search: gbs must be a positive number of "
                       "sequences, got %d", options->gbs);
    if (options->max_mbs < 1)
        return pt_fail(err, "search: max_mbs must be >= 1, got %d",
                       options->max_mbs);
    if (options->keep < 1)
        return pt_fail(err, "search: keep must be >= 1, got %d",
                       options->keep);
    if (options->threads < 0)
        return pt_fail(err, "search: threads must be >= 0, got %d",
                       options->threads);
    if (cm->model.layers < 1)
        return pt_fail(err, "search: model %s has no layers", cm->model.name);
    return 0;
}

static int largest_pp(const search_space *space)
{
    int largest = 1;
    for (int s = 0; s < space->shape_count; s++)
        if (space->shapes[s].pp > largest)
            largest = space->shapes[s].pp;
    return largest;
}

static long long configurations_in(const search_space *space)
{
    long long total = 0;
    for (int s = 0; s < space->shape_count; s++)
        total += (long long)space->shapes[s].order_count *
                 space->shapes[s].mbs_count;
    return total;
}

/* Scores the whole space, then simulates and ranks the shortlist. */
static int run_search(search_run *run, int threads, search_result *out,
                      pt_error *err)
{
    const search_options *options = run->options;
    int shortlist_size = 2 * options->keep > SHORTLIST_MINIMUM
                             ? 2 * options->keep
                             : SHORTLIST_MINIMUM;
    if (workers_open(run, threads, shortlist_size, largest_pp(run->space),
                     err) != 0)
        return -1;
    if (parallel_for(threads, run->space->order_count, search_order, run,
                     options->progress ? report_progress : NULL, err) != 0)
        return -1;
    for (int i = 0; i < run->worker_count; i++) {
        if (run->workers[i].failed) {
            *err = run->workers[i].err;
            return -1;
        }
    }
    ranking rank = {run, {0, 0, NULL, NULL}, NULL, NULL};
    memory_miss closest;
    memset(&closest, 0, sizeof closest);
    if (candidate_set_open(&rank.shortlist, shortlist_size) != 0)
        return pt_fail(err, "search: out of memory for the shortlist");
    merge_results(run, &rank.shortlist, &closest, out);
    int status = rank_shortlist(&rank, threads, out, err);
    if (status == 0 && out->plan_count == 0 && isfinite(closest.ratio))
        describe_miss(run->cm, &closest, out->no_fit_reason,
                      sizeof out->no_fit_reason);
    candidate_set_close(&rank.shortlist);
    free(rank.plans);
    free(rank.usable);
    return status;
}

int planner_search(costmodel *cm, const search_options *options,
                   search_result *out, pt_error *err)
{
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (check_options(cm, options, out, err) != 0)
        return -1;
    search_space space;
    if (search_space_build(cm->cluster, cm->model.layers, options, &space,
                           err) != 0)
        return -1;
    if (space.order_count == 0) {
        snprintf(out->no_fit_reason, sizeof out->no_fit_reason,
                 "no (tp, dp, pp, mbs) fills the cluster's %d GPUs with gbs "
                 "%d a multiple of dp x mbs (mbs 1..%d)",
                 cluster_gpu_count(cm->cluster), options->gbs,
                 options->max_mbs);
        search_space_free(&space);
        return 0;
    }
    search_run run;
    memset(&run, 0, sizeof run);
    run.cm = cm;
    run.options = options;
    run.space = &space;
    run.configurations_total = configurations_in(&space);
    run.progress_percent = -1;
    int status = collect_price_notes(cm, options, &space, err);
    if (status == 0)
        status = search_score_floors(cm, options, &space, err);
    if (status == 0)
        status = search_visit_order(&space, &run.visit, err);
    if (status == 0)
        status = run_search(&run, search_thread_count(options->threads), out,
                            err);
    if (status == 0) {
        merge_notes(cm, &run);
        if (options->progress)
            options->progress(options->progress_context,
                              run.configurations_total,
                              run.configurations_total);
    } else {
        search_result_free(out);
    }
    workers_close(&run);
    free(run.visit);
    search_space_free(&space);
    return status;
}

void search_result_free(search_result *r)
{
    if (r == NULL)
        return;
    free(r->plans);
    r->plans = NULL;
    r->plan_count = 0;
}

void search_options_default(search_options *options)
{
    memset(options, 0, sizeof *options);
    options->gbs = 64;
    options->objective = OBJECTIVE_TIME;
    options->solver = SOLVER_DP;
    options->schedule = SCHEDULE_1F1B;
    options->precision = PRECISION_BF16;
    options->max_mbs = 16;
    options->allow_recompute = true;
    options->allow_distributed_optimizer = true;
    options->keep = 10;
    options->threads = 0;
}
