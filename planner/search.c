/*
 * planner_search: finds the best placements of every task (tp, dp, pp,
 * mbs, levers) by tree search (search_tree.c), keeps the best few by
 * score (the shortlist) and ranks those by the simulated step time
 * (docs/planner.md).
 *
 * Tasks are visited by their floor, lowest first, in batches of a fixed
 * size. Every task of a batch is searched on its own against the
 * shortlist as it stood when the batch began, then the batch's finds are
 * merged in task order. So what a task visits, and every count, depends
 * neither on the number of threads nor on their timing, and the
 * shortlist is exactly the one an exhaustive search would keep: a task
 * or subtree is cut only when a floor under its scores is above the
 * shortlist's worst, which the final shortlist's worst can only be
 * below.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Candidates the simulator ranks: at least this many, or twice `keep`. */
#define SHORTLIST_MINIMUM 32
/* At most this share of the node budget goes to one task. */
#define SEARCH_BUDGET_SHARES 8
/* Tasks searched between two merges (fixed: counts must not depend on
 * the number of threads). */
#define BATCH_TASKS 8

/* What every worker shares during a search. */
typedef struct search_run {
    costmodel *cm;
    const search_options *options;
    search_space *space;
    tree_worker **workers;
    int worker_count;
    int shortlist_size, max_pp;
    int *visit;                 /* task indices by floor, lowest first */
    /* the batch in flight */
    int batch[BATCH_TASKS];     /* task indices */
    shortlist *found;           /* [BATCH_TASKS] per task */
    tree_outcome *outcomes;     /* [BATCH_TASKS] */
    tree_limits limits;
    bool failed;
    pt_error first_error;
    int failed_worker;
} search_run;

static int largest_pp(const search_space *space)
{
    int largest = 1;
    for (int i = 0; i < space->task_count; i++)
        if (space->tasks[i].config.pp > largest)
            largest = space->tasks[i].config.pp;
    return largest;
}

/* ------------------------------------------------------------- workers */

static void workers_close(search_run *run)
{
    for (int i = 0; i < run->worker_count; i++)
        tree_worker_close(run->workers[i]);
    free(run->workers);
    run->workers = NULL;
    for (int i = 0; run->found != NULL && i < BATCH_TASKS; i++)
        shortlist_close(&run->found[i]);
    free(run->found);
    free(run->outcomes);
    run->found = NULL;
    run->outcomes = NULL;
    run->worker_count = 0;
}

static int workers_open(search_run *run, int count, pt_error *err)
{
    run->workers = calloc((size_t)count, sizeof *run->workers);
    run->found = calloc(BATCH_TASKS, sizeof *run->found);
    run->outcomes = calloc(BATCH_TASKS, sizeof *run->outcomes);
    if (!run->workers || !run->found || !run->outcomes)
        return pt_fail(err, "search: out of memory for %d workers", count);
    run->worker_count = count;
    for (int i = 0; i < count; i++)
        if (tree_worker_open(&run->workers[i], run->cm, run->max_pp,
                             run->options, err) != 0)
            return -1;
    for (int i = 0; i < BATCH_TASKS; i++)
        if (shortlist_open(&run->found[i], run->shortlist_size,
                           run->space->node_count, run->max_pp, err) != 0)
            return -1;
    return 0;
}

/* A worker's failure, kept for the caller (the first one wins). */
static void worker_failed(search_run *run, int worker, const pt_error *err)
{
    if (!run->failed || worker < run->failed_worker) {
        run->first_error = *err;
        run->failed_worker = worker;
    }
    run->failed = true;
}

/* ------------------------------------------------------------- floors */

typedef struct floor_job {
    search_run *run;
    double threshold_s;         /* INFINITY: the floors of the start */
    const int *tasks;           /* NULL: every task, else these */
    pt_error *errors;           /* [workers] */
    bool *failed;               /* [workers] */
} floor_job;

static void floor_of_task(void *context, int worker, int item)
{
    floor_job *job = context;
    if (job->failed[worker])
        return;
    search_task *task =
        &job->run->space->tasks[job->tasks ? job->tasks[item] : item];
    if (search_task_floor(job->run->workers[worker], task, job->threshold_s,
                          &task->floor_s, &job->errors[worker]) != 0)
        job->failed[worker] = true;
}

static int compare_floors(const void *a, const void *b, void *context)
{
    const search_task *tasks = context;
    const search_task *x = &tasks[*(const int *)a], *y = &tasks[*(const int *)b];
    if (x->floor_s != y->floor_s)
        return x->floor_s < y->floor_s ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Floors every task and sorts the visit order by them. */
static int floor_tasks(search_run *run, int threads, pt_error *err)
{
    int workers = run->worker_count;
    floor_job job = {run, INFINITY, NULL,
                     calloc((size_t)workers, sizeof(pt_error)),
                     calloc((size_t)workers, sizeof(bool))};
    run->visit = malloc(((size_t)run->space->task_count + 1) * sizeof(int));
    int rc = 0;
    if (!job.errors || !job.failed || !run->visit)
        rc = pt_fail(err, "search: out of memory for the task floors");
    if (rc == 0)
        rc = parallel_for(threads, run->space->task_count, floor_of_task,
                          &job, err);
    for (int i = 0; rc == 0 && i < workers; i++)
        if (job.failed[i]) {
            *err = job.errors[i];
            rc = -1;
        }
    for (int i = 0; rc == 0 && i < run->space->task_count; i++)
        run->visit[i] = i;
    if (rc == 0)
        qsort_r(run->visit, (size_t)run->space->task_count, sizeof(int),
                compare_floors, run->space->tasks);
    free(job.errors);
    free(job.failed);
    return rc;
}

/* ------------------------------------------------------------- batches */

static void search_batch_task(void *context, int worker, int item)
{
    search_run *run = context;
    const search_task *task = &run->space->tasks[run->batch[item]];
    shortlist_clear(&run->found[item]);
    pt_error err;
    tree_worker *w = run->workers[worker];
    if (search_tree_run(w, task, &run->limits, &run->found[item],
                        &run->outcomes[item], &err) != 0)
        worker_failed(run, worker, &err);
    search_memo_trim(tree_worker_memo(w), SEARCH_MEMO_BYTES);
}

/* What the batches add up to. */
typedef struct search_totals {
    long long scored, feasible, pruned, nodes, tasks_done;
    double open_floor_s;        /* floor of what was left unsearched */
} search_totals;

static void add_outcome(search_totals *totals, const tree_outcome *outcome)
{
    totals->scored += outcome->scored;
    totals->feasible += outcome->feasible;
    totals->pruned += outcome->pruned;
    totals->nodes += outcome->nodes;
    if (outcome->stopped)
        totals->open_floor_s = fmin(totals->open_floor_s,
                                    outcome->open_floor_s);
}

/* When the node budget stops the search before the tasks from `next` on:
 * their floors, sharpened by capacity tables for the current threshold,
 * bound what was left unsearched (only those below the best score
 * matter). */
static int refine_open_floor(search_run *run, int threads, int next,
                             const shortlist *best, search_totals *totals,
                             pt_error *err)
{
    double best_score = best->count > 0 ? shortlist_at(best, 0)->score_s
                                        : INFINITY;
    int count = 0;
    while (next + count < run->space->task_count &&
           run->space->tasks[run->visit[next + count]].floor_s < best_score)
        count++;
    if (count == 0) {
        if (next < run->space->task_count)
            totals->open_floor_s =
                fmin(totals->open_floor_s,
                     run->space->tasks[run->visit[next]].floor_s);
        return 0;
    }
    int workers = run->worker_count;
    floor_job job = {run, shortlist_threshold(best), run->visit + next,
                     calloc((size_t)workers, sizeof(pt_error)),
                     calloc((size_t)workers, sizeof(bool))};
    int rc = 0;
    if (!job.errors || !job.failed)
        rc = pt_fail(err, "search: out of memory for the task floors");
    if (rc == 0)
        rc = parallel_for(threads, count, floor_of_task, &job, err);
    for (int i = 0; rc == 0 && i < workers; i++)
        if (job.failed[i]) {
            *err = job.errors[i];
            rc = -1;
        }
    for (int i = 0; rc == 0 && i < count; i++)
        totals->open_floor_s =
            fmin(totals->open_floor_s,
                 run->space->tasks[run->visit[next + i]].floor_s);
    free(job.errors);
    free(job.failed);
    return rc;
}

/* Searches the tasks in visit order, batch by batch, merging each batch's
 * finds into `best`. */
static int search_tasks(search_run *run, int threads, shortlist *best,
                        search_totals *totals, pt_error *err)
{
    const search_options *options = run->options;
    int count = run->space->task_count;
    int *batch = run->batch;
    for (int next = 0; next < count;) {
        double threshold = options->exhaustive ? INFINITY
                                               : shortlist_threshold(best);
        long long budget_left = options->max_tree_nodes > 0
                                    ? options->max_tree_nodes - totals->nodes
                                    : 0;
        /* small batches first: the lowest floors are searched alone and
           give the rest a threshold (sizes fixed, not by thread count) */
        int batch_size = next < 2 ? 1 : next < 4 ? 2 : next < 8 ? 4
                                                         : BATCH_TASKS;
        int size = 0;
        while (next < count && size < batch_size) {
            const search_task *task = &run->space->tasks[run->visit[next]];
            if (task->floor_s > threshold) {
                /* floors only rise along the visit order */
                totals->pruned += count - next;
                next = count;
                break;
            }
            if (options->max_tree_nodes > 0 && budget_left <= 0) {
                if (refine_open_floor(run, threads, next, best, totals,
                                      err) != 0)
                    return -1;
                next = count;
                break;
            }
            batch[size++] = run->visit[next++];
        }
        if (size == 0)
            break;
        /* no task takes more than an eighth of the budget, so that the
           next lowest floors get searched too */
        long long share = budget_left / size;
        if (options->max_tree_nodes > 0 &&
            share > options->max_tree_nodes / SEARCH_BUDGET_SHARES)
            share = options->max_tree_nodes / SEARCH_BUDGET_SHARES;
        run->limits = (tree_limits){options->exhaustive, threshold,
                                    budget_left > 0 ? share : 0, NULL, NULL};
        if (parallel_for(threads, size, search_batch_task, run, err) != 0)
            return -1;
        if (run->failed) {
            *err = run->first_error;
            return -1;
        }
        for (int i = 0; i < size; i++) {
            add_outcome(totals, &run->outcomes[i]);
            for (int k = 0; k < run->found[i].count; k++)
                shortlist_offer(best, shortlist_at(&run->found[i], k));
        }
        totals->tasks_done = next;
        if (options->progress && next < count)
            options->progress(options->progress_context, next, count,
                              totals->scored);
    }
    if (options->progress)
        options->progress(options->progress_context, count, count,
                          totals->scored);
    return 0;
}

/* Prices every type once per (tp, mbs, recompute) before the workers
 * start, so every note the prices raise lands in cm in a fixed order; the
 * workers' copies of cm then only read notes that exist already. */
static int collect_price_notes(costmodel *cm, const search_space *space,
                               pt_error *err)
{
    for (int i = 0; i < space->task_count; i++) {
        const parallel_config *config = &space->tasks[i].config;
        if (i > 0) {
            const parallel_config *before = &space->tasks[i - 1].config;
            if (before->tp == config->tp && before->mbs == config->mbs &&
                before->recompute == config->recompute)
                continue;
        }
        for (int t = 0; t < cm->cluster->type_count; t++) {
            type_costs costs;
            if (cm->cluster->types[t].count > 0 &&
                costmodel_type_costs(cm, t, config, &costs, err) != 0)
                return -1;
        }
    }
    return 0;
}

/* Notes a worker's copy gained after all (should there be any). */
static void merge_notes(costmodel *cm, const search_run *run)
{
    for (int i = 0; i < run->worker_count; i++) {
        const costmodel *copy = tree_worker_costmodel(run->workers[i]);
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

/* What the simulator made of a shortlisted placement: a ranked_plan is
 * written only for the `keep` best (each has room for the most stages
 * and nodes of any plan, pages a ranked plan for every entry would
 * touch for nothing). */
typedef struct simulated_plan {
    parallel_config config;     /* as the interleaving left it */
    simulated_figures figures;
} simulated_plan;

/* The shortlist and what the simulator made of each entry. */
typedef struct ranking {
    search_run *run;
    const shortlist *list;
    simulated_plan *plans;  /* [list count] */
    int *partitions;        /* [list count x max pp] */
    bool *usable;           /* [list count] */
    int **orders;           /* [workers] node-order scratch */
} ranking;

/* The node instances of a sequence of node types (each type's nodes in
 * their file order). */
static void nodes_of_types(const cluster *c, const unsigned char *types,
                           int count, int *order)
{
    int first[PLANNER_MAX_TYPES], used[PLANNER_MAX_TYPES] = {0};
    for (int t = 0, node = 0; t < c->type_count; t++) {
        first[t] = node;
        node += c->types[t].count;
    }
    for (int i = 0; i < count; i++)
        order[i] = first[types[i]] + used[types[i]]++;
}

static double cluster_price_per_hour(const cluster *c)
{
    double price = 0.0;
    for (int t = 0; t < c->type_count; t++)
        price += c->types[t].count * c->types[t].price_per_hour;
    return price;
}

/* Peak memory per node type: the highest stage peak among the stages
 * that type's GPUs serve. */
static void peak_memory_by_type(const cluster *c, const int *order,
                                int node_count, const parallel_config *config,
                                const estimate *est, simulated_figures *out)
{
    long long stage_gpus = (long long)config->dp * config->tp, position = 0;
    for (int i = 0; i < node_count; i++) {
        int type = cluster_node_type(c, order[i]);
        long long end = position + c->types[type].gpus;
        for (long long s = position / stage_gpus;
             s <= (end - 1) / stage_gpus && s < est->stage_count; s++) {
            double gib = est->stages[s].peak_memory_bytes / PT_GIB;
            if (gib > out->peak_memory_gib_by_type[type])
                out->peak_memory_gib_by_type[type] = gib;
        }
        position = end;
    }
}

static void simulate_candidate(void *context, int worker, int position)
{
    ranking *rank = context;
    search_run *run = rank->run;
    const candidate *chosen = shortlist_at(rank->list, position);
    const search_task *task = &run->space->tasks[chosen->task];
    int *order = rank->orders[worker];
    costmodel *cm = tree_worker_costmodel(run->workers[worker]);
    nodes_of_types(cm->cluster, chosen->node_types, chosen->node_count,
                   order);
    estimate est;
    pt_error err;
    parallel_config config = task->config;
    int *partition = rank->partitions + (size_t)position * run->max_pp;
    memcpy(partition, chosen->partition,
           (size_t)config.pp * sizeof *partition);
    if (costmodel_estimate(cm, &config, order, chosen->node_count, partition,
                           false, &est, &err) != 0 ||
        search_try_interleave(cm, run->options, &config, order,
                              chosen->node_count, partition, &est,
                              &err) != 0) {
        worker_failed(run, worker, &err);
        return;
    }
    rank->usable[position] = est.fits;
    simulated_plan *out = &rank->plans[position];
    memset(out, 0, sizeof *out);
    out->config = config;
    out->figures.step_time_s = est.step_time_s;
    out->figures.tokens_per_s = est.tokens_per_s;
    out->figures.tflops_per_gpu = est.tflops_per_gpu;
    out->figures.cost_per_step_usd = est.step_time_s / 3600.0 *
                             cluster_price_per_hour(cm->cluster);
    peak_memory_by_type(cm->cluster, order, chosen->node_count,
                        &task->config, &est, &out->figures);
    estimate_free(&est);
}

/* Sort key of a simulated plan: the objective, then shortlist place. */
typedef struct ranked_key {
    double objective;
    int position;
} ranked_key;

static int compare_keys(const void *a, const void *b)
{
    const ranked_key *x = a, *y = b;
    if (x->objective != y->objective)
        return x->objective < y->objective ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

/* The ranked plan of the shortlist's entry at `position`, simulated
 * (out zeroed: each stage's degrees are the config's). */
static void ranked_of(const ranking *rank, int position, ranked_plan *out)
{
    const candidate *chosen = shortlist_at(rank->list, position);
    const simulated_plan *sim = &rank->plans[position];
    const cluster *c = rank->run->cm->cluster;
    out->config = sim->config;
    out->node_count = chosen->node_count;
    nodes_of_types(c, chosen->node_types, chosen->node_count,
                   out->node_order);
    memcpy(out->partition,
           rank->partitions + (size_t)position * rank->run->max_pp,
           (size_t)sim->config.pp * sizeof(int));
    ranked_take_figures(out, &sim->figures);
}

/* Simulates the shortlist and keeps the `keep` best by the objective. */
static int rank_shortlist(search_run *run, const shortlist *list,
                          int threads, search_result *out, pt_error *err)
{
    int count = list->count;
    ranking rank = {run, list,
                    calloc((size_t)count + 1, sizeof(simulated_plan)),
                    malloc(((size_t)count + 1) * (size_t)run->max_pp *
                           sizeof(int)),
                    calloc((size_t)count + 1, sizeof(bool)),
                    calloc((size_t)run->worker_count, sizeof(int *))};
    ranked_key *keys = calloc((size_t)count + 1, sizeof *keys);
    int rc = 0;
    if (!rank.plans || !rank.partitions || !rank.usable || !rank.orders ||
        !keys)
        rc = pt_fail(err, "search: out of memory for the ranking");
    for (int i = 0; rc == 0 && i < run->worker_count; i++) {
        rank.orders[i] = malloc(((size_t)run->space->node_count + 1) *
                                sizeof(int));
        if (rank.orders[i] == NULL)
            rc = pt_fail(err, "search: out of memory for the ranking");
    }
    if (rc == 0)
        rc = parallel_for(threads, count, simulate_candidate, &rank, err);
    if (rc == 0 && run->failed) {
        *err = run->first_error;
        rc = -1;
    }
    int usable = 0;
    for (int p = 0; rc == 0 && p < count; p++) {
        if (!rank.usable[p])
            continue;
        const simulated_figures *plan = &rank.plans[p].figures;
        keys[usable++] = (ranked_key){
            run->options->objective == OBJECTIVE_COST ? plan->cost_per_step_usd
                                                      : plan->step_time_s,
            p};
    }
    if (rc == 0) {
        qsort(keys, (size_t)usable, sizeof *keys, compare_keys);
        int kept = usable < run->options->keep ? usable : run->options->keep;
        out->plans = calloc((size_t)kept + 1, sizeof *out->plans);
        if (out->plans == NULL)
            rc = pt_fail(err, "search: out of memory for the plans");
        for (int i = 0; rc == 0 && i < kept; i++)
            ranked_of(&rank, keys[i].position, &out->plans[i]);
        out->plan_count = rc == 0 ? kept : 0;
    }
    for (int i = 0; rank.orders && i < run->worker_count; i++)
        free(rank.orders[i]);
    free(rank.orders);
    free(rank.plans);
    free(rank.partitions);
    free(rank.usable);
    free(keys);
    return rc;
}

/* ------------------------------------------------------------- results */

/* When nothing fits: the task that comes closest, as a message. */
static int describe_closest_miss(search_run *run, search_result *out,
                                 pt_error *err)
{
    bound_tables *tables;
    if (bound_tables_open(&tables, run->max_pp,
                          run->cm->cluster->type_count, err) != 0)
        return -1;
    memory_miss closest = {INFINITY, 0, 0, 0.0, 0.0};
    const parallel_config *config = NULL;
    for (int i = 0; i < run->space->task_count; i++) {
        const parallel_config *c = &run->space->tasks[i].config;
        if (bound_tables_fill(tables, run->cm, c, err) != 0) {
            bound_tables_close(tables);
            return -1;
        }
        memory_miss miss;
        bound_memory_miss(tables, &miss);
        if (miss.ratio < closest.ratio) {
            closest = miss;
            config = c;
        }
    }
    bound_tables_close(tables);
    if (config == NULL)
        return 0;
    char levers[96];
    planner_lever_text(config, levers, sizeof levers);
    const node_type *type = &run->cm->cluster->types[closest.type];
    snprintf(out->no_fit_reason, sizeof out->no_fit_reason,
             "the closest configuration (tp %d, dp %d, pp %d, mbs %d%s%s) "
             "needs %.2f GiB per GPU on stage %d (%s, node type %s) where "
             "%.2f GiB are usable", config->tp, config->dp, config->pp,
             config->mbs, levers,
             config->sequence_parallel ? ", sequence parallel" : "",
             closest.needed_bytes / PT_GIB,
             closest.stage, type->gpu, type->name,
             closest.usable_bytes / PT_GIB);
    return 0;
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
    if (options->max_tree_nodes < 0)
        return pt_fail(err, "search: max_tree_nodes must be >= 0, got %lld",
                       options->max_tree_nodes);
    if (cm->model.layers < 1)
        return pt_fail(err, "search: model %s has no layers", cm->model.name);
    return 0;
}

/* Searches, then simulates and ranks the shortlist. */
static int run_search(search_run *run, int threads, search_result *out,
                      pt_error *err)
{
    shortlist best;
    if (shortlist_open(&best, run->shortlist_size, run->space->node_count,
                       run->max_pp, err) != 0)
        return -1;
    search_totals totals = {0};
    totals.open_floor_s = INFINITY;
    int rc = floor_tasks(run, threads, err);
    if (rc == 0)
        rc = search_tasks(run, threads, &best, &totals, err);
    if (rc == 0) {
        out->configurations_scored = totals.scored;
        out->configurations_feasible = totals.feasible;
        out->configurations_pruned = totals.pruned;
        out->tree_nodes = totals.nodes;
        out->best_score_s = best.count > 0 ? shortlist_at(&best, 0)->score_s
                                           : INFINITY;
        out->score_floor_s = fmin(out->best_score_s, totals.open_floor_s);
        out->exact = !(totals.open_floor_s < out->best_score_s);
        rc = rank_shortlist(run, &best, threads, out, err);
    }
    if (rc == 0 && out->plan_count == 0)
        rc = describe_closest_miss(run, out, err);
    shortlist_close(&best);
    return rc;
}

static int search_once(costmodel *cm, const search_options *options,
                       search_result *out, pt_error *err)
{
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (check_options(cm, options, out, err) != 0)
        return -1;
    search_space space;
    if (search_space_build(cm->cluster, &cm->model, options, &space,
                           err) != 0)
        return -1;
    out->tasks = space.task_count;
    out->exact = true;
    if (space.task_count == 0) {
        if (space.too_many_steps > 0)
            snprintf(out->no_fit_reason, sizeof out->no_fit_reason,
                     "every (tp, dp, pp, mbs) that fills the cluster's %d "
                     "GPUs has more than %ld steps of pp x micro-batches "
                     "with gbs %d, the most the cost model simulates (mbs "
                     "1..%d; a larger --max-mbs or a smaller gbs helps)",
                     cluster_gpu_count(cm->cluster),
                     COSTMODEL_MAX_SCHEDULE_STEPS, options->gbs,
                     options->max_mbs);
        else
            snprintf(out->no_fit_reason, sizeof out->no_fit_reason,
                     "no (tp, dp, pp, mbs) fills the cluster's %d GPUs with "
                     "gbs %d a multiple of dp x mbs (mbs 1..%d)",
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
    run.max_pp = largest_pp(&space);
    run.shortlist_size = 2 * options->keep > SHORTLIST_MINIMUM
                             ? 2 * options->keep
                             : SHORTLIST_MINIMUM;
    int threads = search_thread_count(options->threads);
    int status = collect_price_notes(cm, &space, err);
    if (status == 0)
        status = workers_open(&run, threads, err);
    if (status == 0)
        status = run_search(&run, threads, out, err);
    if (status == 0)
        merge_notes(cm, &run);
    else
        search_result_free(out);
    workers_close(&run);
    free(run.visit);
    search_space_free(&space);
    return status;
}

/* ZeRO-2/3 and offload are priced from closed forms no GPU run has
 * checked yet (docs/cost-model.md, section 11): by default they are
 * searched only when no plan fits without them. */
int planner_search(costmodel *cm, const search_options *options,
                   search_result *out, pt_error *err)
{
    if (options == NULL || options->zero_levers == ZERO_LEVERS_ALWAYS)
        return search_once(cm, options, out, err);
    search_options without = *options;
    if (without.max_zero_stage > 1)
        without.max_zero_stage = 1;
    without.allow_offload = false;
    if (search_once(cm, &without, out, err) != 0)
        return -1;
    if (options->zero_levers == ZERO_LEVERS_NEVER || out->plan_count > 0 ||
        (options->max_zero_stage <= 1 && !options->allow_offload))
        return 0;
    search_result_free(out);
    if (search_once(cm, options, out, err) != 0)
        return -1;
    out->zero_levers_searched = true;
    return 0;
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
    options->max_zero_stage = 3;
    options->allow_offload = true;
    options->zero_levers = ZERO_LEVERS_WHEN_NEEDED;
    options->allow_sequence_parallel = true;
    options->allow_interleave = true;
    options->keep = 10;
    options->threads = 0;
    options->max_tree_nodes = SEARCH_DEFAULT_TREE_NODES;
}
