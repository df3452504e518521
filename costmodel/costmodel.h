/*
 * costmodel: what a plan costs. Layer times come from the GPU profiles,
 * links from the cluster file; the pipeline is simulated as events (1F1B
 * or GPipe) so uneven partitions and mixed GPU types come out right.
 * docs/cost-model.md states every formula used here.
 */
#ifndef PARTITA_COSTMODEL_H
#define PARTITA_COSTMODEL_H

#include "common/common.h"

/* ----------------------------------------------------------- the context */

#define COSTMODEL_MAX_NOTES 16

/* The most steps (pp x micro-batches per iteration) of a schedule the
 * cost model simulates: its time and memory grow with them (gbs 1e8 took
 * 28 s and 4.8 GB; 2^18 steps take about 0.3 s, and 1.7 s and 170 MB
 * with the timeline, in the sanitizer build), and a real plan has far
 * fewer (GPT-3's gbs 1536 on pp 16 x dp 8, mbs 1: 3,072; pp 64 with 4,096
 * micro-batches is at the bound). A plan beyond it is refused, naming
 * it; the planner does not try such configurations. */
#define COSTMODEL_MAX_SCHEDULE_STEPS (1L << 18)

/* Whether the dp gradient reduction is priced bucket by bucket behind
 * the backward, with a stated hidden fraction (docs/cost-model.md, 7.1).
 * Off by default: the estimate then takes the closed form of the
 * executor's overlap (step_work's tail_fraction). */
typedef struct dp_overlap_options {
    bool enabled;
    double bucket_bytes;      /* gradient bytes per bucket (25 MiB) */
    double hidden_fraction;   /* share, 0..1, of what the buckets could
                                 hide behind the remaining backward that
                                 is hidden (1: all of it) */
} dp_overlap_options;

/* The defaults: off, 25 MiB buckets, fraction 1. */
dp_overlap_options dp_overlap_defaults(void);

/* The shape coverage notes of a node type as formatted (price.c): they
 * depend only on its profile and the model, every pricing of the type
 * adds them again, and formatting them is dear. */
#define COSTMODEL_COVERAGE_MEMO 8
typedef struct coverage_memo {
    const profile *profile; /* whose notes these are; NULL: none yet */
    int count;
    char text[2][256];
} coverage_memo;

/* A memo of the prices of node types by config (price.c), attached for
 * a while by costmodel_price_memo_attach. */
typedef struct price_memo price_memo;

/* Owns the profiles of a cluster's GPU types for one model. Built once;
 * afterwards an estimate writes it only to add a note it does not hold
 * yet. Threads may share one costmodel after costmodel_prepare (below),
 * or each use a shallow copy (profiles are only read; notes then stay in
 * the copy). */
typedef struct costmodel {
    model_shape model;
    const cluster *cluster;      /* borrowed */
    profile *profiles;           /* owned, one per cluster node type */
    /* owned, one per type; rest_loaded[t] when type t names a gpu_at_rest
     * (its slices with their neighbours at rest; section 12 of
     * docs/cost-model.md) and this is its profile */
    profile *rest_profiles;
    bool *rest_loaded;
    /* Things the user should know about the prices (a shape priced by the
     * efficiency model, a micro-batch far outside the measured grid...).
     * Filled by costmodel_open, costmodel_prepare and every pricing call
     * (type costs, stage terms, estimate), deduplicated; at most
     * COSTMODEL_MAX_NOTES, the last of which then says more were left out. */
    int note_count;
    char notes[COSTMODEL_MAX_NOTES][256];
    /* the first types' coverage notes, kept by costmodel_open's memset
       and the notes' own writes: a copy of the costmodel keeps them */
    coverage_memo coverage[COSTMODEL_COVERAGE_MEMO];
    /* NULL, or while attached (costmodel_price_memo_attach) the prices
       of its types by config */
    price_memo *price_memo;
    /* dp_overlap_defaults() after costmodel_open; callers may change it
     * before estimating. */
    dp_overlap_options dp_overlap;
} costmodel;

/* Loads the profile of every node type (see profile_find for the search
 * order; profile_dir may be NULL). */
int costmodel_open(costmodel *cm, const model_shape *model,
                   const cluster *cluster, const char *profile_dir,
                   pt_error *err);
void costmodel_close(costmodel *cm);

/* Keeps the prices of cm's node types by config from now until
 * costmodel_price_memo_detach, so that a search pricing the same types
 * at the same configs again and again prices each once: the same costs
 * and, in cm, the same notes (a price noted once is not noted again:
 * while attached, cm's notes must only grow). For one thread at a time,
 * and no copy of cm may be used while attached. -1 when out of memory
 * (nothing attached). */
int costmodel_price_memo_attach(costmodel *cm, pt_error *err);
void costmodel_price_memo_detach(costmodel *cm);

/* Like costmodel_open with profiles given in memory, one per cluster node
 * type (profiles[t] prices cluster->types[t]); they are deep-copied, the
 * caller keeps its own. For tests and for callers that loaded them. */
int costmodel_open_with_profiles(costmodel *cm, const model_shape *model,
                                 const cluster *cluster,
                                 const profile *profiles, pt_error *err);

/* Gives type t the profile of its slices with their neighbours at rest
 * (deep-copied), as costmodel_open does for a node's gpu_at_rest; for
 * tests and callers that loaded it. */
int costmodel_set_rest_profile(costmodel *cm, int type_index,
                               const profile *rest, pt_error *err);

/* Adds the notes every node type gets under config's tp, mbs and
 * precision. The only writes an estimate makes to cm are new notes, so
 * once the (tp, mbs, precision) combinations to be searched have been
 * prepared, threads may estimate with one shared cm. */
int costmodel_prepare(costmodel *cm, const parallel_config *config,
                      pt_error *err);

/* The least share of a dp reduction the step waits for, for the
 * planner's floors: 1 - hidden_fraction under the bucket-by-bucket model
 * (dp_overlap on); 0 under the default closed form, whose exposed part,
 * max(R x tail, R - B), can be as small as one bucket's share, which a
 * floor over fewer layers cannot bound from below. */
double costmodel_dp_overlap_floor_share(const costmodel *cm);

/* ----------------------------------------------------- per-GPU-type costs */

/* The ranks of a collective over nodes (defined with the collectives,
 * below). */
typedef struct comm_group comm_group;

/* Costs of one micro-batch on one GPU type at a given tp, with TP
 * communication of the layer included (from the profile, or added from the
 * node's intra-node link). Linear in the number of layers by design. */
typedef struct type_costs {
    double embedding_forward_s, embedding_backward_s;
    double layer_forward_s, layer_backward_s; /* backward includes the
                                                 recompute forward */
    double head_forward_s, head_backward_s;
    double head_products_s;    /* the head matrix's input and weight
                                  gradient products, what the partita
                                  executor's fused head runs in the
                                  forward (costmodel_head_phases): part
                                  of head_backward_s, or of
                                  head_forward_s when head_timed_fused */
    bool head_timed_fused;     /* the head's times are a fused head's
                                  (profile points with head.fused) */
    double optimizer_s_per_param; /* the AdamW step's: the GPU's, or
                                     under offload the host's (zero.c) */
    /* the profile's host rates offload is priced at (0: not measured) */
    double host_adamw_s_per_param, host_copy_s_per_param;
    double stream_s_per_byte;  /* the GPU's streaming rate, what its
                                  memory-bound kernels take a byte: the
                                  profile's AdamW step over the bytes it
                                  moves (COSTMODEL_ADAMW_BYTES_PER_PARAM),
                                  offload or not */
    double memory_cap_bytes;   /* usable memory minus workspace */
    double tp_allreduce_s;     /* one of a layer's tensor-parallel
                                  all-reduces inside one node of this type
                                  (the layer times hold 2 forward and 2
                                  backward, 2 more with recompute) */
    double boundary_s;         /* one conversion at a stage's boundary in
                                  Partita's executor, a micro-batch's
                                  activation (or gradient) between the
                                  fp32 pipeline message and the bf16
                                  stream: 6 bytes an element at
                                  stream_s_per_byte; 0 for the other
                                  runtimes (costmodel_boundary_count) */
} type_costs;

/* How many boundary conversions (type_costs.boundary_s) stage s of a
 * pipeline of pp stages pays per micro-batch: forward, the received
 * message rounded into the stream (every stage but the first) and the
 * last stream widened for the next (every stage but the last); backward,
 * the received gradient rounded (every stage but the last) and the
 * stream gradient widened for the previous stage or the embedding (every
 * stage). The profiler times its parts without them (executor stage.h,
 * boundary_free). */
void costmodel_boundary_count(int s, int pp, int *forward, int *backward);

/* Forward plus backward seconds of one layer (recompute included) for a
 * tp group whose slowest GPU is priced by costs; a group that spans nodes
 * (span not NULL, span->nodes >= 2) does its all-reduces as NCCL does
 * over those nodes (nccl_allreduce: ring, tree or the hierarchy)
 * instead of inside one node. */
double costmodel_layer_pace_s(const costmodel *cm,
                              const parallel_config *config,
                              const type_costs *costs,
                              const comm_group *span);
/* Bytes of one stage boundary's activation (or its gradient), and of
 * one tensor-parallel all-reduce: b x s x h elements in the plan's
 * precision. */
double activation_message_bytes(const model_shape *model,
                                 const parallel_config *config);
/* The same pace when each of the layer's tp collectives takes across_s
 * in place of the in-node costs->tp_allreduce_s (the planner's floors). */
double costmodel_layer_pace_across_s(const parallel_config *config,
                                     const type_costs *costs,
                                     double across_s);
/* One of a layer's tp collectives (an all-reduce, or with sequence
 * parallelism its reduce-scatter and all-gather) of a group over nodes. */
double costmodel_tp_collective_across_s(const costmodel *cm,
                                        const parallel_config *config,
                                        const comm_group *span);

/* Prices a GPU type (index into cluster->types) for a config. May add a
 * note to cm (why it has to be non-const). */
int costmodel_type_costs(costmodel *cm, int type_index,
                         const parallel_config *config, type_costs *out,
                         pt_error *err);

/* Like costmodel_type_costs, from type t's profile at rest (its
 * rest_loaded must be true). */
int costmodel_type_costs_at_rest(const costmodel *cm, int type_index,
                                 const parallel_config *config,
                                 type_costs *out, pt_error *err);

/* How one part of the model was priced on a GPU type (the estimate lists
 * every part that was not measured). */
typedef enum price_method {
    PRICE_MEASURED,        /* a measured point of the model's shape */
    PRICE_MICROBATCH,      /* the shape's points at other micro-batches */
    PRICE_TP_SCALED,       /* the shape's points at another tp, scaled */
    PRICE_INTERPOLATED,    /* measured shapes on both sides */
    PRICE_EXTRAPOLATED,    /* measured shapes on one side */
    PRICE_ROOFLINE,        /* a derived profile's roofline */
    PRICE_EFFICIENCY       /* FLOPs at a fitted efficiency */
} price_method;

const char *price_method_name(price_method method);

typedef struct pricing_entry {
    char gpu[PT_NAME_MAX];
    const char *part;          /* "embedding", "layer", "head" */
    int tp, mbs;
    price_method method;
    char how[320];             /* from what, for people */
    double forward_s;          /* one micro-batch, computation only (no */
    double backward_s;         /* tp all-reduces, no recompute) */
} pricing_entry;

/* How the three parts of type type_index are priced under config
 * (embedding, layer, head); adds no note. */
int costmodel_pricing(const costmodel *cm, int type_index,
                      const parallel_config *config, pricing_entry out[3],
                      pt_error *err);

/* ------------------------------------------------------------- placement */

/* The nodes along a pipeline as placement reads them: slot i is one node
 * of type types[i] whose GPUs are starts[i] .. starts[i + 1] - 1, counted
 * from the pipeline's first GPU. Two GPUs share a node when they share a
 * slot. A lane may hold only the slots around the stages being placed
 * (the planner's search places a stage before it knows the whole order);
 * its first slot then starts at a GPU other than 0. Owned by the caller. */
typedef struct node_lane {
    int count;
    const int *types;    /* [count] */
    const int *starts;   /* [count + 1], increasing */
} node_lane;

/* How a plan's stages sit on the cluster: derived from tp, dp, pp and the
 * node order (rank = t + tp x (d + dp x s), ranks fill the nodes' GPUs in
 * order). A tensor-parallel group may span nodes; it then talks over the
 * slowest link between its nodes. */
typedef struct stage_placement {
    int slow_type;              /* type of the slowest GPU of the stage's
                                   slowest tp group; the stage runs at its
                                   pace */
    int small_type;             /* type with the least usable memory */
    bool tp_spans_nodes;        /* that slowest tp group crosses nodes */
    link_spec tp_link;          /* and this is its slowest link between
                                   nodes */
    int tp_nodes;               /* the nodes it spans (1: inside one) */
    link_spec tp_intra_link;    /* the slowest link inside those nodes */
    link_spec next_link;        /* towards stage s+1: the slowest between a
                                   GPU and the one S = dp x tp further
                                   (intra-node link of the stage's first
                                   node for the last stage) */
    link_spec dp_link;          /* slowest link of the dp rings */
    /* The dp group as NCCL sees it: dp_nodes nodes holding dp / dp_nodes
     * members each (1: one node; 0: spread unevenly, priced flat over
     * dp_link), dp_intra_link the slowest inside those nodes (dp_link is
     * then the slowest between them). */
    int dp_nodes;
    link_spec dp_intra_link;
    /* Node type whose profile's measured curves may price the transfer
     * (every GPU's send to stage s+1 stays inside a node of this type) or
     * the dp all-reduce (the stage sits in one node); -1: the links above
     * price it. */
    int next_curve_type;
    int dp_curve_type;
    /* Every GPU of the stage is a slice of one device (its node types'
     * `devices` entries name one index), as on the one-GPU emulation:
     * its dp sums are the device exchange's kernels on the ranks' own SMs
     * (docs/cost-model.md 7.1). */
    bool slices_of_one_gpu;
    /* Whole GPUs whose dp group sits in one node whose type's profile
     * prices the group's collectives from measured curves: NCCL's kernels
     * for the dp collectives that run beside the compute (the gradient
     * sums during the last backward; ZeRO-2/3's reduce-scatters and
     * gathers) run at the pace those curves show, SM-bound, and hold the
     * compute's SMs for their whole time, so the compute beside them
     * grows by that time: nothing of them is hidden. Measured on two
     * H200s over NVLink (docs/cost-model.md 7.1). Where a link's
     * bandwidth prices the transfer (no curve: across nodes, or a node
     * type measured without them), the kernels mostly wait on the link
     * and the overlap hides what it can, as before. */
    bool dp_collectives_contend;
} stage_placement;

/* Fills placement[pp]; fails when the node order does not hold exactly
 * tp x dp x pp GPUs, names a node twice or a node that does not exist. */
int costmodel_place(const costmodel *cm, const parallel_config *config,
                    const int *node_order, int node_count,
                    stage_placement *placement, pt_error *err);

/* The `devices` entry of GPU `gpu` of the lane (counted as the lane's
 * starts are), NULL when its node type lists none for it. */
const device_spec *costmodel_lane_device(const costmodel *cm,
                                         const node_lane *lane, long long gpu);

/* Places one stage from a lane holding at least the nodes over its GPUs
 * and, when next_known and the stage is not the last, over the next
 * stage's GPUs. Without the next stage (next_known false) the link towards
 * it is left infinitely fast (a send over it costs 0): the search bounds
 * it separately. */
int costmodel_place_stage(const costmodel *cm, const parallel_config *config,
                          const node_lane *lane, int stage, bool next_known,
                          stage_placement *out, pt_error *err);

/* The tied-embedding all-reduce between the first and the last stage:
 * the slowest link between a GPU of stage 0 and the one (pp-1) x S
 * further, and the node type whose curve prices it (-1: the link). The
 * lane must hold both stages' nodes. */
void costmodel_embedding_link(const costmodel *cm,
                              const parallel_config *config,
                              const node_lane *lane, link_spec *link,
                              int *curve_type);

/* Seconds of the tied-embedding all-reduce over that link (0 when the
 * model's embeddings are not tied or pp is 1). */
double costmodel_embedding_allreduce_s(const costmodel *cm,
                                       const parallel_config *config,
                                       link_spec link, int curve_type);

/* A stage's per-step work after its last backward, but the embedding
 * all-reduce: gradient all-reduce (or reduce-scatter and parameter
 * all-gather under ZeRO-1) over its dp link, and its optimizer step, for
 * `layers` transformer layers. `slow` prices the optimizer. The executor
 * sums the gradients in buckets of COSTMODEL_GRAD_BUCKET_BYTES during the
 * last micro-batch's backward (docs/cost-model.md, 7.1): tail_fraction is
 * the share of reduce_s that cannot start before the backward ends, the
 * last bucket's (the first stage's embedding, else one bucket). */
#define COSTMODEL_GRAD_BUCKET_BYTES (25.0 * 1024.0 * 1024.0)
typedef struct step_work {
    double reduce_s;       /* all-reduce, or reduce-scatter */
    double exposed_s;      /* of reduce_s, what the step waits for after
                              the last backward under cm->dp_overlap's
                              bucket-by-bucket model (reduce_s when it is
                              off; the estimate then takes tail_fraction's
                              closed form, the executor's default) */
    double gather_s;       /* ZeRO-1's parameter all-gather, else 0:
                              COSTMODEL_GATHER_BYTES_PER_PARAM a
                              parameter */
    double sum_kernels_s;  /* the SM time of the dp sums' kernels, which
                              the backward they overlap cannot hide:
                              slices_of_one_gpu, the device exchange's;
                              dp_collectives_contend, NCCL's, reduce_s
                              whole; else 0 */
    double norm_s;         /* the gradient-norm pass before the optimizer
                              step: the rank's square sum of the fp32
                              gradients it steps, at the streaming rate
                              of its AdamW step (docs/cost-model.md 7) */
    double optimizer_s;
    double tail_fraction;  /* of reduce_s, in 0..1 */
} step_work;

/* Bytes a parameter ZeRO-1's (and ZeRO-2's) all-gather of the updated
 * parameters moves: the executor gathers its fp32 master copy and
 * rebuilds the half-precision one from it. The planner's floors read it
 * too. */
#define COSTMODEL_GATHER_BYTES_PER_PARAM 4.0

void costmodel_step_work(const costmodel *cm, const parallel_config *config,
                         const stage_placement *placement, int stage,
                         int layers, const type_costs *slow,
                         step_work *out);

/* reduce_s + gather_s + optimizer_s of costmodel_step_work (the per-step
 * work the planner's scores count) at every layer count from 0 to
 * most_layers, into work_s[0 .. most_layers]: the same sums, without the
 * parts the scores do not read. */
void costmodel_step_work_sums(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *placement, int stage,
                              int most_layers, const type_costs *slow,
                              double *work_s);

/* ZeRO-Offload (docs/cost-model.md, section 11). Cluster files carry no
 * host link: a profile that measured its host's copies prices them
 * (`host_copy_s_per_param`), else every GPU is taken to reach its host at
 * PCIe 4.0 x16's usable 25 GB/s each way (an assumption); the executor's
 * host AdamW (stage/offload.c, up to 8 threads), where the profile did
 * not measure it, to step 1.08e9 parameters a second per GPU: calibrated
 * from the step it measured on the one-GPU suite's H200 machine (plan 22,
 * 2026-11-25: 441 ms of host step with the copies for 354.8M parameters,
 * less the copies at that link), 0.99e9 on an H100 machine's host
 * (2026-11-27). */
#define COSTMODEL_HOST_LINK_BYTES_PER_S 25e9
#define COSTMODEL_CPU_ADAMW_PARAMS_PER_S 1.08e9
/* Seconds per parameter the rank updates: its fp32 gradient down and its
 * fp32 weight up over the host link, then the CPU's AdamW, each the
 * profile's measured figure (> 0) or the constant above. */
double costmodel_offload_s_per_param(const parallel_config *config,
                                     double host_adamw_s_per_param,
                                     double host_copy_s_per_param);
/* Each part alone, as priced: a profile's figure (0: none) or the constant */
double costmodel_offload_copy_s(double host_copy_s_per_param);
double costmodel_offload_adamw_s(double host_adamw_s_per_param);
/* Host bytes a rank of stage `stage` with `layers` layers holds under
 * offload (fp32 master weights and AdamW's two moments of its optimizer
 * shard); 0 without offload. */
double costmodel_offload_host_bytes(const model_shape *model,
                                    const parallel_config *config, int stage,
                                    int layers);

/* ZeRO-3's all-gathers of units (a layer, the embeddings, the head) in
 * one step of a rank of stage `stage` of `layers` layers, as the cuda
 * executor makes them (executor/cuda/unit_holds.c; docs/cost-model.md,
 * section 11): a unit its buffer still holds since the optimizer step is
 * not gathered again, so the step's first forward gathers every unit, a
 * pass after one the other way (a forward after a backward) all layers
 * but two (L - 2), a pass after one the same way all of them (L; 2 at
 * L = 3, none below), the embeddings and the head none after the first;
 * the schedule orders the passes (interleaved 1F1B counted as 1F1B). 0
 * below ZeRO-3, at dp 1, or on the tied embedding pair of a pipeline. */
double costmodel_zero3_gathers(const model_shape *model,
                               const parallel_config *config, int stage,
                               int layers);

/* -------------------------------------------------- linear stage terms */

/* Stage time and memory as linear functions of its transformer layer
 * count; what the partition solvers need. */
typedef struct stage_terms {
    double fixed_s;          /* fwd+bwd of embedding/head, p2p sends */
    double per_layer_s;      /* fwd+bwd of one layer (recompute included) */
    double fixed_bytes;      /* memory not proportional to layers */
    double per_layer_bytes;  /* weights, grads, optimizer state and
                                in-flight activations of one layer */
    double cap_bytes;        /* usable memory of the stage's smallest GPU */
    int max_layers;          /* largest layer count that fits; -1: none */
} stage_terms;

/* Whether stage `stage` of config, holding the head, runs it as the
 * partita executor's fused head (executor/cuda/buffers.c, plan_head):
 * the partita runtime at tp 1 with the gradients in the one buffer (not
 * ZeRO-2/3's shard and units, costmodel_zero_sharded_stage's). False on
 * a stage without the head. The memory model and the phases follow it. */
bool costmodel_head_fused(const model_shape *model,
                          const parallel_config *config, int stage);

/* The head's forward and backward times of one micro-batch on stage
 * `stage` as the executor runs them, from its type's costs: where the
 * stage fuses the head (costmodel_head_fused) and its times are an
 * unfused head's, the backward products (costs->head_products_s) move
 * from the backward into the forward; where it does not and they are a
 * fused head's (head_timed_fused), back from the forward into the
 * backward; the sum unchanged; 0 and 0 on a stage without the head. */
void costmodel_head_phases(const model_shape *model,
                           const parallel_config *config, int stage,
                           const type_costs *costs, double *forward_s,
                           double *backward_s);

/* A stage's device memory per GPU, term by term (common.h's
 * pt_memory_terms), as a linear function of its transformer layers:
 * fixed + layers x per_layer. The formulas mirror what the executor's
 * cuda backend allocates (docs/cost-model.md, "Memory per GPU"); the
 * context term is costmodel_context_bytes. */
typedef struct stage_memory {
    pt_memory_terms fixed;
    pt_memory_terms per_layer;
} stage_memory;

/* The context term of a GPU of type `type`: the profile's workspace_gib;
 * for a plan of one rank on a measured profile less its allowance for
 * NCCL's buffers and cuBLAS workspaces (no communicator is made, and the
 * cuBLASLt workspace is a term of its own). */
double costmodel_context_bytes(const costmodel *cm,
                               const parallel_config *config, int type);

/* The memory of stage `stage` of config (its largest rank: tensor-
 * parallel rank 0, ZeRO-1 shard 0), context_bytes for the context. */
void costmodel_stage_memory(const model_shape *model,
                            const parallel_config *config, int stage,
                            double context_bytes, stage_memory *out);
/* The terms of a stage of `layers` layers. */
void stage_memory_at(const stage_memory *memory, int layers,
                     pt_memory_terms *out);

/* Micro-batches whose activations stage `stage` holds at its peak (the
 * executor's activation slots): 1F1B min(pp - stage, m), GPipe m; 1 for
 * a plan of one rank, which trains one micro-batch at a time; under the
 * interleaved 1F1B the chunk micro-batches held at once
 * (costmodel_chunks_in_flight), fewer than the slots the executor gives
 * the chunks, each its own peak (parallel_chunk_slots, which the memory
 * terms count). */
int costmodel_microbatches_in_flight(const parallel_config *config, int stage,
                                     int microbatches);

int costmodel_stage_terms(costmodel *cm, const parallel_config *config,
                          const stage_placement *placement, int stage,
                          stage_terms *out, pt_error *err);
/* The same from the stage's own placement and the one before it
 * (previous NULL for stage 0): all a stage's terms depend on. */
int costmodel_stage_terms_between(costmodel *cm,
                                  const parallel_config *config,
                                  const stage_placement *previous,
                                  const stage_placement *self, int stage,
                                  stage_terms *out, pt_error *err);

/* The terms of every stage of a plan whose stages may run their own tp
 * and dp (stages[pp], NULL: none; docs/cost-model.md, section 15), on
 * the node order given: each at its own config, its sends across the
 * boundaries on either side (re-sharded where the degrees differ);
 * terms[pp]. What the asymmetric search's partitions are solved on. */
int costmodel_stage_terms_stages(costmodel *cm, const parallel_config *config,
                                 const stage_degrees *stages,
                                 const int *node_order, int node_count,
                                 stage_terms *terms, pt_error *err);
/* Stage `stage`'s terms in such a plan (own: its config, as
 * parallel_stage_config gives it; its GPUs first.. first + tp x dp - 1 of
 * the lane) with its sends left out: what costmodel_stage_terms_stages
 * gives the stage less its sends (the same per-layer time and memory,
 * fixed time lower by the sends), whatever the stages around it. */
int costmodel_stage_terms_unsent(costmodel *cm, const parallel_config *own,
                                 const node_lane *lane, int stage,
                                 long long first, stage_terms *out,
                                 pt_error *err);
/* Stage `stage`'s terms, sends and all, once the stages beside it are
 * known: configs[stage - 1 .. stage + 1] and their first GPUs firsts[..]
 * (those that exist; configs[].pp the plan's), on a lane over them. The
 * same as costmodel_stage_terms_stages gives the stage in any plan that
 * has those three stages there. */
int costmodel_stage_terms_inner(costmodel *cm, const parallel_config *configs,
                                const long long *firsts, const node_lane *lane,
                                int stage, stage_terms *out, pt_error *err);

/* The per-step work the planner's score adds to a partition's surrogate
 * (docs/planner.md, "The score and the shortlist"), for stages of their
 * own degrees: stage `stage` of config `own` on GPUs first.. of the lane
 * with l = 0..most_layers layers into work_s[l]: its gradient reduction
 * (and ZeRO-1's gather) over its own dp group and its optimizer step,
 * whole (the score does not take the backward's overlap), the tied
 * embedding's all-reduce left out. */
int costmodel_stage_work_at(costmodel *cm, const parallel_config *own,
                            const node_lane *lane, int stage,
                            long long first, int most_layers, double *work_s,
                            pt_error *err);
/* One side of a pipeline boundary: the send (activations forward, or
 * their gradients back) from a stage of config `from` to the stage of
 * config `to` beside it, over `link` (or a type's curve when curve_type
 * >= 0), re-sharded where their degrees differ, the receiving tp group
 * gathering over `gather` (costmodel_stage_terms_stages prices each side
 * so; the planner floors sends with it). */
double costmodel_boundary_send_s(const costmodel *cm,
                                  const parallel_config *from,
                                  const parallel_config *to, int curve_type,
                                  link_spec link, link_spec gather);
/* The tied embedding's all-reduce between a first stage and a last one
 * that starts at GPU last_first (0 s without tied embeddings or with one
 * stage): the larger shard, of the smaller tp, over the link between
 * them. */
double costmodel_embedding_pair_s(const costmodel *cm,
                                  const parallel_config *first_stage,
                                  const parallel_config *last_stage,
                                  long long last_first, const node_lane *lane);
/* The largest per-step work of any stage of a plan whose stages may run
 * their own degrees (stages NULL: none), layers[pp] each: the work above,
 * the first and the last stage with the embedding's all-reduce. What the
 * symmetric search adds to a placement's surrogate. */
int costmodel_step_tail_stages(costmodel *cm, const parallel_config *config,
                               const stage_degrees *stages,
                               const int *node_order, int node_count,
                               const int *layers, double *tail_s,
                               pt_error *err);

/* -------------------------------------------------------------- estimate */

typedef enum event_kind {
    EVENT_FWD,
    EVENT_BWD,
    EVENT_SEND_FWD,
    EVENT_RECV_FWD,
    EVENT_SEND_BWD,
    EVENT_RECV_BWD,
    EVENT_TP_ALLREDUCE,
    EVENT_DP_ALLREDUCE,
    EVENT_EMBEDDING_ALLREDUCE,
    EVENT_OPTIMIZER,
    EVENT_KIND_COUNT
} event_kind;

const char *event_kind_name(event_kind kind);
/* -1 when the name is not a kind. */
int event_kind_from_name(const char *name);

/* One interval of work; times are seconds from the start of the
 * iteration (design.md's shared schema of estimates and runs). A measured
 * event is one rank's; an estimated one is its stage's, run alike by every
 * rank of the stage, and has rank -1. */
typedef struct timeline_event {
    int rank;                    /* -1: every rank of the stage */
    int stage, microbatch;       /* microbatch -1 for per-step work */
    event_kind kind;
    double start_s, end_s;
} timeline_event;

typedef struct stage_estimate {
    int layers;
    int tp, dp;                /* the stage's own degrees */
    int first_rank, ranks;     /* its ranks: first_rank .. + ranks - 1 */
    char gpu[PT_NAME_MAX];     /* the slowest GPU type of the stage */
    double forward_s;          /* one micro-batch */
    double backward_s;
    double send_s;             /* activation to the next stage */
    double send_bwd_s;         /* gradient to the previous stage */
    double dp_allreduce_s;     /* gradient sync once per step */
    double embedding_allreduce_s;
    double optimizer_s;
    /* its GPU type's type_costs host rates (offload; 0: not measured) */
    double host_adamw_s_per_param, host_copy_s_per_param;
    double peak_memory_bytes;  /* the sum of memory's terms */
    pt_memory_terms memory;    /* by term, at the stage's layers */
    double memory_cap_bytes;
} stage_estimate;

typedef struct estimate {
    double step_time_s;
    double tokens_per_s;
    double tflops_per_gpu;     /* model FLOPs (Megatron's formula) / time */
    double parameters;         /* the model's (model_parameter_count) */
    double bubble_fraction;    /* idle share of the slowest stage */
    double cost_per_step_usd;
    bool fits;                 /* every stage within its memory cap */
    int worst_stage;           /* stage most over its cap (when !fits) */
    int stage_count;
    stage_estimate *stages;    /* owned */
    /* The timeline, one copy per stage (owned; NULL unless events were
     * asked): stage 0's events sorted by start, then its per-step work,
     * then stage 1's...; each has rank -1 and stands for every rank of
     * its stage (parallel_stage_first_rank and the tp x dp after it). */
    int event_count;
    timeline_event *events;
    /* With events: how each part of each GPU type pacing a stage was
     * priced (costmodel_pricing; 3 entries a type, in type order; owned). */
    int pricing_count;
    pricing_entry *pricing;
} estimate;

/* Estimates a complete plan. With want_events the timeline (one copy per
 * stage) and the pricing entries are filled. Fails on an inconsistent plan; a plan that does not
 * fit is estimated all the same with fits = false. */
int costmodel_estimate(costmodel *cm, const parallel_config *config,
                       const int *node_order, int node_count,
                       const int *partition, bool want_events,
                       estimate *out, pt_error *err);
/* costmodel_estimate of a plan whose stages may run their own tp and dp
 * (stages[pp], plan.json's "stages"; NULL or every stage at config's
 * degrees: costmodel_estimate): each stage priced at its own config
 * (parallel_stage_config), its dp reduction over its own group, and the
 * boundaries between stages of different degrees re-sharded
 * (docs/cost-model.md, "Stages of their own degrees"). */
int costmodel_estimate_stages(costmodel *cm, const parallel_config *config,
                              const stage_degrees *stages,
                              const int *node_order, int node_count,
                              const int *partition, bool want_events,
                              estimate *out, pt_error *err);
void estimate_free(estimate *e);

/* How estimate_to_json writes the timeline (0: once per stage, compact). */
enum {
    ESTIMATE_JSON_PER_RANK = 1,      /* one lane per rank */
    ESTIMATE_JSON_FULL_TIMELINE = 2  /* every event, none elided */
};

/* The "estimate" section of plan.json (docs/formats.md): the figures, one
 * object per stage with its rank range and, when est has events, the
 * timeline: one lane per stage holding its events once, or with
 * ESTIMATE_JSON_PER_RANK one lane per rank (copies of its stage's); each
 * kind of event its first and last few with a count of those between,
 * or with ESTIMATE_JSON_FULL_TIMELINE all of them. NULL with err set
 * when out of memory. */
json_t *estimate_to_json(const estimate *est, const parallel_config *config,
                         unsigned flags, pt_error *err);

/* Parameters held by one GPU of a stage with `layers` transformer layers
 * (the stage's parameters / tp): stage 0 holds the embeddings, the last
 * stage the final norm and the head (a tied head is a copy when pp > 1). */
double stage_parameters_per_gpu(const model_shape *model,
                                const parallel_config *config, int stage,
                                int layers);

/* Megatron's FLOPs of one iteration (anchors.md): 72 B s l h^2 (1 + s/6h +
 * V/12lh), or the 96 form with full recompute, for a GPT-2 layer; other
 * layers count their own matrices (model_layer_forward_flops,
 * docs/cost-model.md, "Llama-family layers"). */
double model_flops_per_iteration(const model_shape *model, int gbs,
                                 bool recompute);

/* ------------------------------------------------------------- schedule */

/* Per-stage, per-micro-batch inputs of the schedule simulator. */
typedef struct schedule_stage {
    double forward_s, backward_s;
    double send_fwd_s;  /* activation to stage s+1 */
    double send_bwd_s;  /* gradient to stage s-1 */
} schedule_stage;

typedef struct schedule_result {
    double pipeline_end_s;      /* last backward of any stage ends */
    double *stage_end_s;        /* owned, [pp]: stage's last backward */
    double *stage_busy_s;       /* owned, [pp]: compute time of the stage */
    int event_count;
    timeline_event *events;     /* owned; rank = stage here, the
                                   estimate sets -1 (every rank of it) */
} schedule_result;

/* Simulates one iteration's pipeline: dependencies between stages, one
 * compute stream per stage, transfers on their own stream. */
int schedule_simulate(schedule_kind kind, const schedule_stage *stages,
                      int pp, int microbatches, bool want_events,
                      schedule_result *out, pt_error *err);
void schedule_result_free(schedule_result *r);

/* ---------------------------------- sequence parallelism (sequence.c) */

/* Rows of the sequence each tp rank holds outside the tensor-parallel
 * matmuls: tp under sequence parallelism, else 1. */
double costmodel_sequence_shards(const parallel_config *config);
/* Bytes of one pipeline message (activation or its gradient): b s h e,
 * divided by costmodel_sequence_shards. */
double costmodel_pipeline_message_bytes(const model_shape *model,
                                        const parallel_config *config);
/* One of a layer's tp collectives under sequence parallelism, from the
 * prices of one reduce-scatter and one all-gather of the whole buffer:
 * the row-parallel matmul's reduce-scatter and the next column-parallel
 * one's all-gather. */
double costmodel_sequence_tp_comm_s(double reduce_scatter_s,
                                    double all_gather_s);

/* ------------------------------------- interleaved 1F1B (interleave.c) */

/* One rank of an interleaved pipeline, one micro-batch: its layers'
 * times (the v chunks share them equally: each chunk holds L_i / v of
 * the rank's layers), the embedding (rank 0, chunk 0) or head (last
 * rank, last chunk) and its sends: to rank i + 1 (the last rank: to rank
 * 0, its chunk's successor) and to rank i - 1 (rank 0: to the last). */
typedef struct interleave_stage {
    double layers_forward_s, layers_backward_s;
    double ends_forward_s, ends_backward_s;
    double send_fwd_s, send_bwd_s;
} interleave_stage;

/* Chunk forwards a rank runs before its first chunk backward: Megatron's
 * 2 (pp - i - 1) + (v - 1) pp, the plain 1F1B's pp - i - 1 for v = 1;
 * at most v x micro-batches. */
int interleave_warmup(int pp, int v, int stage, int microbatches);
/* Chunk micro-batches rank `stage` holds at its peak: warm-up + 1, at
 * most v x micro-batches (the plain 1F1B's min(pp - i, m) for v = 1). */
int costmodel_chunks_in_flight(const parallel_config *config, int stage,
                               int microbatches);
/* Fails, naming the field, when config's interleaving or sequence
 * parallelism cannot run (parallel_check_schedule_levers) or a stage's
 * layers are not a multiple of virtual_stages. */
int costmodel_check_schedule_levers(const costmodel *cm,
                                    const parallel_config *config,
                                    const int *partition, pt_error *err);
/* Simulates Megatron's interleaved 1F1B of pp ranks with v chunks each
 * (docs/cost-model.md, "Interleaved 1F1B"): schedule_simulate's model
 * over pp x v virtual stages; events carry the rank as their stage. */
int interleave_simulate(const interleave_stage *stages, int pp, int v,
                        int microbatches, bool want_events,
                        schedule_result *out, pt_error *err);

/* ------------------------------------------- roofline: prices any shape */

/* What a roofline runs on: one GPU, or an SM-limited share of one (a
 * green context). Peak and bandwidth are the whole GPU's spec figures. */
typedef struct roofline_device {
    double peak_flops;             /* dense half-precision tensor FLOP/s */
    double bandwidth_bytes_per_s;  /* memory bandwidth */
    int sms;                       /* SMs of the whole GPU */
    int sms_used;                  /* SMs the work runs on, 1..sms */
} roofline_device;

/* Forward and backward seconds of the model's three parts, one
 * micro-batch on one GPU of the tp group. */
typedef struct model_part_costs {
    part_cost embedding, layer, head;
} model_part_costs;

/* The device a profile's times were taken on (or a derived profile
 * prices): efficiency.peak_tflops, memory_bandwidth_GBps, sms, sm_limit.
 * Fails naming the profile and the missing figure. */
int roofline_device_of(const profile *p, roofline_device *out,
                       pt_error *err);

/* What one tp rank computes of a micro-batch: mbs sequences at
 * tensor-parallel degree tp, activations of element_bytes bytes, and
 * attention fused (flash) or unfused (the s x s scores written, softmax
 * and dropout over them: Megatron-LM before flash attention).
 * main_grad_bytes: the element of the weight gradients the backward's
 * weight-gradient GEMMs accumulate into (read and written every
 * micro-batch; 0 counts them as written once in element_bytes).
 * fused_classifier: the head's softmax and cross-entropy run fused with
 * the start of the backward, as Partita's executor does (two passes
 * over the logits in the forward, none in the backward); otherwise
 * Megatron-LM's vocab-parallel cross-entropy (an fp32 softmax written
 * in the forward and read in the backward). regrouped_qkv: a layer that
 * is not GPT-2's moves its whole q, k, v product into the heads' order
 * in one pass (turning q and k on the way with rotary positions), as
 * Partita's executor does; otherwise only rotary positions cost a pass,
 * over q and k (Megatron-LM's fused kernel; views elsewhere). */
typedef struct roofline_shard {
    int tp, mbs;
    double element_bytes;
    bool unfused_attention;
    double main_grad_bytes;
    bool fused_classifier;
    bool regrouped_qkv;
} roofline_shard;

/* Computation only (no tensor-parallel communication) of one micro-batch
 * of `shape` as `shard` says: every kernel of the embedding, one
 * transformer layer and the head, forward and backward, as
 * max(FLOPs / rate, bytes / bandwidth) + overhead (docs/profiles.md). */
void roofline_part_costs(const roofline_params *params,
                         const roofline_device *device,
                         const model_shape *shape, roofline_shard shard,
                         model_part_costs *out);

/* The attention core's share (Q K^T, softmax, dropout, P V; or the
 * flash kernel) of one layer's forward time on the roofline: what
 * Megatron's selective recompute adds to the backward. */
double roofline_attention_share(const roofline_params *params,
                                const roofline_device *device,
                                const model_shape *shape,
                                roofline_shard shard);

/* The head's backward products' share (the head matrix's input and
 * weight gradients, not the final norm's backward) of the head's
 * backward time on the roofline: what the partita executor's fused head
 * runs in the forward (costmodel_head_phases). */
double roofline_head_products_share(const roofline_params *params,
                                    const roofline_device *device,
                                    const model_shape *shape,
                                    roofline_shard shard);
/* The same products' share of a fused head's forward on the roofline
 * (the forward's kernels and the backward's two GEMMs): how much of a
 * head timed fused (profile points with head.fused) the unfused head's
 * backward gets back. */
double roofline_head_fused_products_share(const roofline_params *params,
                                          const roofline_device *device,
                                          const model_shape *shape,
                                          roofline_shard shard);

/* One time of a source profile, as the fit sees it. part: 0 embedding,
 * 1 layer, 2 head. */
typedef struct roofline_observation {
    int shape_index, tp, mbs, part;
    bool backward;
    double measured_s;
    double predicted_s;    /* under the params given to the call */
} roofline_observation;

/* The times of `source` a fit uses, each with its prediction under
 * params (allocated into *out, count in *count; free() it). Times that
 * hold tensor-parallel communication (tp > 1 in a profile whose
 * layer_times_include_tp_comm) and backward times the reader filled in
 * from backward_over_forward are left out and counted in *left_out. */
int roofline_observations(const roofline_params *params,
                          const profile *source,
                          roofline_observation **out, int *count,
                          int *left_out, pt_error *err);

#define ROOFLINE_MAX_SOURCES 16

/* How well the fitted parameters reproduce one source (or all). */
typedef struct roofline_fit_error {
    char gpu[PT_NAME_MAX];
    int points;            /* times fitted */
    int left_out;          /* times not fitted (see roofline_observations) */
    double rms_log_error;  /* root mean square of ln(predicted / measured) */
    double max_error;      /* largest |predicted / measured - 1| */
} roofline_fit_error;

typedef struct roofline_fit_result {
    roofline_params params;   /* rounded to 4 significant digits, as written */
    roofline_fit_error all;   /* over every source; errors use params */
    int source_count;
    roofline_fit_error sources[ROOFLINE_MAX_SOURCES];
} roofline_fit_result;

/* Fits the roofline's parameters by least squares in log-time over every
 * usable time of the sources (each with its own device; see
 * roofline_device_of), with a weak pull towards prior values so that a
 * parameter no source pins down stays sensible. */
int roofline_fit(const profile *sources, int source_count,
                 roofline_fit_result *out, pt_error *err);

/* ------------------------------- calibrated on training runs (calibrate.c) */

/* A training run measured on a cluster of one GPU type: the plan it ran
 * (model, cluster, degrees, levers, runtime; borrowed) and its measured
 * step time. */
typedef struct calibration_run {
    char id[64];
    const plan *plan;
    double measured_s;
} calibration_run;

/* Estimates and measurements of a set of runs, side by side. Errors are
 * fractions (0.05 = 5 %), signed as estimated / measured - 1. */
typedef struct calibration_summary {
    int run_count;
    int within_10_percent;
    double mean_abs_error, median_abs_error, rms_log_error;
    double worst_error;
} calibration_summary;

/* Fails, naming the run, when a node type of its cluster is not prof's
 * GPU or its measured time is not a positive number. */
int calibration_check_run(const calibration_run *run, const profile *prof,
                          pt_error *err);
/* Estimates every run with prof pricing each of its node types:
 * estimated_s[i] the step time, fits[i] (may be NULL) whether it fits in
 * memory. Fails on the first run that cannot be estimated, naming it. */
int calibration_estimate(const calibration_run *runs, int count,
                         const profile *prof, double *estimated_s,
                         bool *fits, pt_error *err);
void calibration_summarise(const calibration_run *runs, int count,
                           const double *estimated_s,
                           calibration_summary *out);
/* Fits the roofline of base (a derived profile) to the runs: GEMM
 * efficiency and half-work size, attention and bandwidth efficiency and
 * kernel overhead, by least squares in log step time with a pull towards
 * base's own values; *out is base's roofline with them, rounded to 4
 * significant digits. */
int calibration_fit(const calibration_run *runs, int count,
                    const profile *base, roofline_params *out, pt_error *err);

/* -------------------------------------------- derived profiles (specs) */

/* One row of profiles/specs.json (from shared/reference/gpu-specs.md). */
typedef struct gpu_spec {
    char gpu[PT_NAME_MAX];         /* the profile name it derives */
    char row[PT_NAME_MAX];         /* the row of gpu-specs.md */
    double tensor_tflops;          /* dense half-precision tensor peak */
    double fp32_tflops;            /* plain FP32; 0: not given */
    double tf32_tflops;            /* dense TF32 tensor; 0: none */
    char tensor_precision[8];      /* "bf16" or "fp16" (V100: no bf16) */
    double memory_GB;              /* nameplate */
    double usable_memory_gib;
    char usable_memory_from[256];  /* where the usable figure comes from */
    double memory_bandwidth_GBps;
    int sms;
    char link[128];                /* GPU-GPU link, as the data sheet says */
} gpu_spec;

typedef struct gpu_spec_table {
    char source[256];              /* what the figures are cited from */
    int count;
    gpu_spec *specs;               /* owned */
} gpu_spec_table;

int gpu_spec_table_load(const char *path, gpu_spec_table *out,
                        pt_error *err);
void gpu_spec_table_free(gpu_spec_table *table);
/* The row named gpu; NULL when there is none. */
const gpu_spec *gpu_spec_find(const gpu_spec_table *table, const char *gpu);

/* Completes a source profile for the fit: a profile without the spec
 * figures (a measured one may carry none) takes peak, bandwidth and SMs
 * from the row named like its GPU (the same name, or the longest row name
 * it starts with followed by '-': "H200-40SM" -> "H200"); a profile
 * without efficiency.sm_limit takes provenance.sm_limit, then
 * provenance.sms_used, then a "-<n>SM" suffix of its name. `said` (may be
 * empty) tells what was taken. Fails when no row matches. */
int gpu_spec_complete_source(const gpu_spec_table *table, profile *p,
                             char *said, size_t said_size, pt_error *err);

/* What a derived profile is made from; the strings go to its provenance. */
typedef struct derive_request {
    const gpu_spec *spec;
    const char *spec_file;             /* as given, e.g. profiles/specs.json */
    const char *spec_source;           /* the table's citation */
    const profile *sources;            /* fitted on */
    const char *const *source_files;   /* [source_count], as given */
    int source_count;
    const char *command;               /* the command line that made it */
    const char *date;                  /* YYYY-MM-DD */
} derive_request;

/* The derived profile (docs/formats.md, source "derived") of spec with
 * the fitted roofline; NULL with err filled on failure. The caller owns
 * the JSON. */
json_t *derive_profile_json(const derive_request *request,
                            const roofline_fit_result *fit, pt_error *err);

/* ---------------------------------------------------------- collectives */

/* Communication of `bytes` priced from the measured curve ("sendrecv"
 * for 2 GPUs, "allreduce" for `members` GPUs) of node type curve_type's
 * profile when it has samples for that GPU count, else from the link's
 * closed form (collectives.c). curve_type -1: the GPUs are not all inside
 * one node of one type, so the link prices it. A reduce-scatter and an
 * all-gather (bytes: the whole tensor) from their own curves,
 * "reducescatter" and "allgather", where the profile holds them; else a
 * reduce-scatter is half of the curve's all-reduce and an all-gather is
 * priced as the reduce-scatter. */
double costmodel_send_seconds(const costmodel *cm, double bytes,
                              int curve_type, link_spec link);
double costmodel_allreduce_seconds(const costmodel *cm, double bytes,
                                   int members, int curve_type,
                                   link_spec link);
double costmodel_reduce_scatter_seconds(const costmodel *cm, double bytes,
                                        int members, int curve_type,
                                        link_spec link);
double costmodel_all_gather_seconds(const costmodel *cm, double bytes,
                                    int members, int curve_type,
                                    link_spec link);


/* Ring all-reduce of `bytes` over `members` ranks on one link: 2(n-1)
 * steps, 2(n-1)/n of the buffer through the link. */
double allreduce_time(double bytes, int members, link_spec link);
/* NCCL's double binary tree all-reduce on one link: 2 ceil(log2 n)
 * steps (tree_allreduce_steps), twice the buffer through the link. */
double tree_allreduce_time(double bytes, int members, link_spec link);
int tree_allreduce_steps(int members);
/* Reduce-scatter or all-gather (half the traffic of an all-reduce). */
double reduce_scatter_time(double bytes, int members, link_spec link);
/* One point-to-point transfer. */
double p2p_time(double bytes, link_spec link);

/* The ranks of a collective as the placement sees them: `members` ranks
 * on `nodes` nodes, members / nodes on each when that divides (else the
 * group is priced flat over its slowest link); intra links the ranks of
 * a node, inter the nodes (each rank's own rail: concurrent rings of a
 * node do not share it). nodes <= 1: one node, intra alone. */
struct comm_group {
    int members;
    int nodes;
    link_spec intra;
    link_spec inter;
};

typedef enum allreduce_algorithm {
    ALLREDUCE_RING,
    ALLREDUCE_TREE,
    ALLREDUCE_HIERARCHICAL_RING,   /* ring between the nodes */
    ALLREDUCE_HIERARCHICAL_TREE    /* tree between the nodes */
} allreduce_algorithm;

const char *allreduce_algorithm_name(allreduce_algorithm algorithm);

/* A collective's time and the algorithm that gives it. */
typedef struct comm_price {
    double seconds;
    allreduce_algorithm algorithm;
} comm_price;

/* All-reduce of `bytes` as NCCL would run it over the group: inside one
 * node a ring; over nodes the fastest of a ring and a tree through every
 * rank (over the slowest link) and, when the group is spread evenly, the
 * hierarchy: reduce-scatter inside each node, all-reduce of the node's
 * 1/g shard between the nodes (ring or tree), all-gather inside. */
comm_price nccl_allreduce(double bytes, const comm_group *group);
/* Reduce-scatter (or all-gather) likewise: flat ring, or inside each
 * node then between the nodes, whichever is faster. */
double nccl_reduce_scatter(double bytes, const comm_group *group);
/* nccl-tests' bus bandwidth of an all-reduce: bytes / seconds x 2(n-1)/n
 * (bytes per second; 0 when it cannot be said). */
double allreduce_bus_bandwidth(double bytes, int members, double seconds);
/* A lower bound of nccl_allreduce for any placement of `members` ranks
 * with at most most_per_node on a node, links no faster than these
 * bandwidths and no latency (the planner's floors). */
double allreduce_floor_time(double bytes, int members, int most_per_node,
                            double intra_bandwidth, double inter_bandwidth);

#endif
