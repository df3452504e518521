/*
 * planner: searches the (tp, dp, pp, mbs, levers) and node orders of a
 * cluster, with the layer partition of each solved exactly, by a tree
 * search that cuts what provably cannot make the shortlist; ranks the
 * plans and writes plan.json.
 */
#ifndef PARTITA_PLANNER_H
#define PARTITA_PLANNER_H

#include "common/common.h"
#include "costmodel/costmodel.h"

/* --------------------------------------------------- partition problem */

/* One stage of the partition problem: time and memory linear in the
 * layers it gets (see costmodel_stage_terms). */
typedef struct partition_stage {
    double fixed_s;
    double per_layer_s;
    int max_layers;        /* memory cap; -1 when nothing fits */
} partition_stage;

/* Minimise the step-time surrogate
 *     sum_s T_s + (m - 1) x max_s T_s,   T_s = fixed_s + per_layer_s x l_s
 * over l_s >= 0 integer, sum l_s = layers, l_s <= max_layers.
 * Writes layers_out[pp] and the surrogate's value; returns 1 when solved,
 * 0 when no partition fits, -1 on error. */
typedef struct partition_problem {
    int pp;
    int layers;
    int microbatches;
    const partition_stage *stages;
} partition_problem;

/* The surrogate of a given partition. */
double partition_surrogate(const partition_problem *problem,
                           const int *layers);
/* T_s of a stage holding `layers` layers (every solver prices a stage
 * through this one expression, so their values compare exactly). */
double partition_stage_time(const partition_stage *stage, int layers);
/* Checks a problem (sizes, finite non-negative costs, caps >= -1); every
 * solver starts with it. 0 or -1. */
int partition_problem_check(const partition_problem *problem,
                            const int *layers_out, pt_error *err);

/* Exact, by dynamic programming over stages for each candidate bottleneck
 * time (a sliding-window minimum makes each pass linear in layers). */
int partition_solve_dp(const partition_problem *problem, int *layers_out,
                       double *value_out, pt_error *err);
/* Exact, the same problem as a GLPK integer program (the reference). */
int partition_solve_ilp(const partition_problem *problem, int *layers_out,
                        double *value_out, pt_error *err);
/* FASOP's greedy min-max heuristic, for comparison (not optimal). */
int partition_solve_fasop_greedy(const partition_problem *problem,
                                 int *layers_out, double *value_out,
                                 pt_error *err);
/* Tries every composition; for tests on small instances only. */
int partition_solve_brute_force(const partition_problem *problem,
                                int *layers_out, double *value_out,
                                pt_error *err);

typedef enum partition_solver {
    SOLVER_DP,
    SOLVER_ILP,
    SOLVER_FASOP_GREEDY
} partition_solver;

/* ----------------------------------------------------------------- search */

#define PLANNER_MAX_NODES PT_MAX_NODES
#define PLANNER_MAX_TYPES 16

typedef enum plan_objective { OBJECTIVE_TIME, OBJECTIVE_COST } plan_objective;

/* The levers of config for a message: "" with none, else
 * ", distributed optimizer", ", ZeRO-3, optimizer offload and full
 * recompute"... */
void planner_lever_text(const parallel_config *config, char *out,
                        size_t size);

/* When the search tries ZeRO-2, ZeRO-3 and optimizer offload (within
 * max_zero_stage and allow_offload). */
typedef enum zero_levers {
    ZERO_LEVERS_WHEN_NEEDED, /* only when no plan fits without them */
    ZERO_LEVERS_ALWAYS,      /* beside the others, for speed as for fit */
    ZERO_LEVERS_NEVER
} zero_levers;

/* The values a degree may take when a user fixes or limits it (`partita
 * plan --tp 2,4`); count 0: every value the search tries. */
#define SEARCH_MAX_CHOICES 16
typedef struct degree_choice {
    int count;
    int values[SEARCH_MAX_CHOICES];
} degree_choice;

/* Degrees a plan must have (docs/planner.md, "Constraints"): tp, pp and dp
 * among theirs; mbs among its values, which replace the powers of two up
 * to max_mbs. */
typedef struct search_constraints {
    degree_choice tp, pp, dp, mbs;
} search_constraints;

/* Whether a degree may take value (always when unconstrained). */
bool degree_choice_allows(const degree_choice *choice, int value);

typedef struct search_options {
    int gbs;
    plan_objective objective;
    partition_solver solver;
    schedule_kind schedule;
    precision_kind precision;
    grad_precision_kind grad_precision; /* every plan's (issue 34) */
    bool deterministic;       /* every plan's "deterministic" (Megatron-
                                 LM's --deterministic-mode): the cuda
                                 backend's attention workspace differs */
    int max_mbs;              /* largest micro-batch tried (power of two) */
    bool allow_recompute;     /* also try full recompute */
    bool allow_distributed_optimizer;
    int max_zero_stage;       /* highest ZeRO stage tried, 1..3 (with
                                 allow_distributed_optimizer) */
    bool allow_offload;       /* also try optimizer offload */
    zero_levers zero_levers;  /* when ZeRO-2/3 and offload are tried */
    bool allow_sequence_parallel; /* also try it where tp > 1 */
    bool allow_interleave;        /* try interleaved 1F1B on the plans
                                     the simulator ranks */
    int keep;                 /* how many ranked plans to keep */
    int threads;              /* 0: one per core; never more */
    bool exhaustive;          /* visit and score every distinct node order
                                 of every task, cut nothing (the same
                                 plans, far slower: `--search exhaustive`) */
    long long max_tree_nodes; /* stop the search after about this many
                                 tree nodes and say how far from exact the
                                 best plan may be; 0: never */
    search_constraints constraints; /* degrees fixed or limited */
    /* progress: called now and then from the searching thread, may be
       NULL; done and total count tasks (tp, dp, pp, mbs, levers) in
       planner_search, sub-clusters in planner_pareto; scored counts the
       placements scored so far */
    void (*progress)(void *context, long long done, long long total,
                     long long scored);
    void *progress_context;
} search_options;

/* A ranked candidate. */
typedef struct ranked_plan {
    parallel_config config;
    int node_count;
    int node_order[PLANNER_MAX_NODES];
    int partition[PT_MAX_STAGES];
    double step_time_s;         /* simulated */
    double tokens_per_s;
    double tflops_per_gpu;
    double cost_per_step_usd;
    double peak_memory_gib_by_type[PLANNER_MAX_TYPES]; /* per cluster node type, 0 unused */
    /* each stage's own degrees (zeros: config's; only the asymmetric
       search gives a stage its own) */
    stage_degrees stages[PT_MAX_STAGES];
} ranked_plan;

typedef struct search_result {
    long long configurations_scored; /* complete placements scored */
    long long configurations_feasible;
    /* tasks and partial placements cut unscored because a floor under
       their score could not reach the plans kept */
    long long configurations_pruned;
    long long tree_nodes;            /* partial placements visited */
    long long tasks;                 /* (tp, dp, pp, mbs, levers) */
    /* false when max_tree_nodes stopped the search: then no placement
       scores below score_floor_s, and the best found scores best_score_s
       (the score is the ranking surrogate, see docs/planner.md) */
    bool exact;
    double best_score_s, score_floor_s;
    int plan_count;
    ranked_plan *plans;         /* owned, best first */
    /* when nothing fits: the closest miss, for the error message */
    char no_fit_reason[512];
    /* ZeRO-2/3 and offload were searched because nothing fit without
       them (ZERO_LEVERS_WHEN_NEEDED); the counts are that search's */
    bool zero_levers_searched;
    /* planner_search_asymmetric: the plans of stages of their own
       degrees whose partitions it solved, and the lowest score (the
       symmetric search's: surrogate and per-step work) among those that
       fit and score below the cutoff, the symmetric search's best score;
       INFINITY: none. exact false when max_tree_nodes stopped it: then
       no plan of its own degrees scores below asymmetric_floor_s. */
    long long asymmetric_scored;
    long long asymmetric_pruned; /* partial plans and tasks cut by a floor */
    long long asymmetric_nodes;  /* partial plans floored */
    long long asymmetric_alike;  /* partial plans given the floor of an
                                    alike one (its nodes in another
                                    order) instead */
    double asymmetric_best_score_s;
    double asymmetric_cutoff_s;
    bool asymmetric_exact;
    double asymmetric_floor_s;
} search_result;

/* Tree nodes a search visits at most by default: about 10 s on a 2-core
 * machine, after which it reports how far from exact its best plan may
 * be (docs/planner.md). */
#define SEARCH_DEFAULT_TREE_NODES 40000000LL

/* gbs 64, time, DP, 1F1B, bf16, mbs up to 16, both levers allowed, keep
 * 10, one thread per core, SEARCH_DEFAULT_TREE_NODES. */
void search_options_default(search_options *options);
/* 0 when the search ran, whether or not a plan fits (plan_count 0 and
 * no_fit_reason then), -1 on error. The plans and every count in the
 * result depend neither on the number of threads nor on the run
 * (docs/planner.md). */
int planner_search(costmodel *cm, const search_options *options,
                   search_result *out, pt_error *err);
void search_result_free(search_result *r);

/* planner_search, then every plan whose stages run their own tp and dp
 * (issue 36; docs/planner.md, "Stages of their own degrees"), ranked
 * together: the symmetric search's best score is the asymmetric search's
 * cutoff, so the result never loses to planner_search. The asymmetric
 * plans are searched exactly by branch and bound: every plan of pp >= 2
 * stages over any node order, each stage consecutive GPUs of it with its
 * own (tp, dp) (tp a power of two up to 8 splitting the model's heads),
 * one micro-batch of B samples (each stage's dp dividing B, B dividing
 * gbs, B / dp at most max_mbs), no memory levers, stages not all alike;
 * each partition solved exactly for the surrogate (partition_solve_dp)
 * and scored as the symmetric search scores a placement (surrogate plus
 * the largest per-step work); of those that score below the cutoff, the
 * best max(32, 2 keep) are simulated. max_tree_nodes stops it as it
 * stops planner_search (a partial plan floored counting as 200 tree
 * nodes), with a proved floor. */
int planner_search_asymmetric(costmodel *cm, const search_options *options,
                              search_result *out, pt_error *err);

/* Whether the constraints leave cluster c any (tp, dp, pp, mbs) to plan:
 * 0 when they do, or when they are empty, or when c has none even without
 * them (planner_search says why then); -1 when they rule out every one,
 * with a message that begins with the options at fault ("--tp 16: ..."
 * or "--tp 8 --pp 3: ...") and says why. */
int planner_check_constraints(const cluster *c, const model_shape *model,
                              const search_options *options, pt_error *err);

/* ----------------------------------------------------------------- pareto */

typedef struct pareto_point {
    int type_counts[PLANNER_MAX_TYPES];        /* nodes of each cluster type used */
    ranked_plan plan;
} pareto_point;

typedef struct pareto_result {
    long long configurations_scored;
    long long configurations_pruned;
    int subclusters_searched;
    int point_count;
    pareto_point *points;       /* owned, the front, by step time */
} pareto_result;

/* Searches every sub-cluster of the pool (0..count nodes of each type, at
 * least one GPU) and keeps the front of step time against $ per step.
 * A point's plan numbers nodes within its sub-cluster: the pool's types
 * in order, type_counts[t] nodes of type t. */
int planner_pareto(const model_shape *model, const cluster *pool,
                   const char *profile_dir, const search_options *options,
                   pareto_result *out, pt_error *err);
void pareto_result_free(pareto_result *r);

/* ------------------------------------------------------------- plan.json */

/* Turns a ranked plan into a plan over the cluster (copies the cluster);
 * the origins (may be NULL) say where model and cluster were read from
 * and become the plan's "origin". common/plan.c writes it. */
int plan_from_ranked(const ranked_plan *ranked, const model_shape *model,
                     const cluster *cluster, const char *model_origin,
                     const char *cluster_origin, plan *out, pt_error *err);

#endif
