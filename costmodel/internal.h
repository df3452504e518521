/*
 * costmodel's private declarations, shared between its source files.
 * Nothing here is part of the public interface (costmodel.h).
 */
#ifndef PARTITA_COSTMODEL_INTERNAL_H
#define PARTITA_COSTMODEL_INTERNAL_H

#include "costmodel/costmodel.h"

/* Adds a note to cm unless the same text is already there; when the list
 * is full the last slot says that further notes were left out. Writes cm
 * only when the note is new. */
void costmodel_add_note(costmodel *cm, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
/* The same with the note's text as it is (no formatting: a note kept
 * and added again and again, price.c's coverage notes). */
void costmodel_add_note_text(costmodel *cm, const char *text);

/* The costs of a placed stage's slowest type and of its type with the
 * least memory (costmodel_type_costs of each, priced once when they are
 * one type: its notes are the same). */
int costmodel_slow_and_small_costs(costmodel *cm, const stage_placement *place,
                                   const parallel_config *config,
                                   type_costs *slow, type_costs *small,
                                   pt_error *err);

/* The memory totals of costmodel_stage_memory (fixed and per layer, the
 * context in) from cm's price memo while one is attached: found (true)
 * or kept. */
bool costmodel_memory_memo_find(const costmodel *cm,
                                const parallel_config *config, int stage,
                                double context_bytes, double *fixed_bytes,
                                double *per_layer_bytes);
void costmodel_memory_memo_keep(const costmodel *cm,
                                const parallel_config *config, int stage,
                                double context_bytes, double fixed_bytes,
                                double per_layer_bytes);

/* Prices a GPU type like costmodel_type_costs; notes go to note_target
 * when it is not NULL (NULL: price silently, cm is only read). */
int costmodel_price_type(const costmodel *cm, int type_index,
                         const parallel_config *config,
                         costmodel *note_target, type_costs *out,
                         pt_error *err);

/* Notes that the profile of a type does not hold the model's layer shape
 * (so the efficiency model prices it); nothing when it does. */
void costmodel_note_shape_coverage(costmodel *cm, int type_index);

/* Checks the degrees of config (positive, pp within PT_MAX_STAGES). */
int costmodel_check_degrees(const parallel_config *config, pt_error *err);

/* The lane of a whole node order (types and GPU starts of its nodes, in
 * *storage, which the caller frees). */
int costmodel_lane_open(const cluster *c, const int *node_order,
                        int node_count, node_lane *lane, int **storage,
                        pt_error *err);

/* Checks a node order and places every stage of config on it; also
 * returns the order's lane (its storage in *storage, freed by the caller,
 * NULL on failure). */
int costmodel_place_order(const costmodel *cm, const parallel_config *config,
                          const int *node_order, int node_count,
                          stage_placement *placement, node_lane *lane,
                          int **storage, pt_error *err);

/* The slower of two links: lower bandwidth, on a tie higher latency. */
link_spec slower_link(link_spec a, link_spec b);

/* Stage terms from already priced types (slow: the stage's pace, small:
 * its memory cap); previous is stage - 1's placement (NULL for stage 0),
 * whose link prices the gradient sent back. */
void costmodel_terms_from_costs(const costmodel *cm,
                                const parallel_config *config,
                                const stage_placement *previous,
                                const stage_placement *self, int stage,
                                const type_costs *slow,
                                const type_costs *small, stage_terms *out);

/* costmodel_terms_from_costs with the stage's sends given: sends_s, its
 * forward and backward sends per micro-batch together. */
void costmodel_terms_with_sends(const costmodel *cm,
                                const parallel_config *config,
                                const stage_placement *self, int stage,
                                const type_costs *slow,
                                const type_costs *small, double sends_s,
                                stage_terms *out);

/* Micro-batches per iteration, gbs / (dp x mbs); -1 (err filled) when
 * gbs is not a positive multiple of dp x mbs. */
int costmodel_microbatch_count(const parallel_config *config, pt_error *err);

/* shares[s] (s < pp; stage s holds GPUs firsts[s] .. firsts[s + 1] - 1):
 * for a stage whose every GPU is a slice of a GPU
 * (a devices entry with an sm_limit), the neighbours' busy share of its
 * busiest GPU: the other slices of that GPU in the plan, weighted by
 * their SMs, each busy duty[its stage] of the time (1 for the stage's
 * own other ranks, which compute with it); -1 for other stages
 * (neighbours.c, docs/cost-model.md section 12). */
/* The note of an estimate that priced slices between rest and busy: added
 * when a profile at rest is loaded, so that estimates (which planner
 * threads run on one shared cm) find it there and write nothing. */
#define COSTMODEL_REST_NOTE                                                  \
    "stages on slices of one GPU priced between their profile at rest and " \
    "beside busy neighbours by the neighbours' busy share "                 \
    "(docs/cost-model.md, section 12)"

void costmodel_neighbour_shares(const costmodel *cm,
                                const parallel_config *config,
                                const long long *firsts,
                                const node_lane *lane, const double *duty,
                                double *shares);

/* Send times of a stage per micro-batch: its activation to stage + 1 and
 * its gradient to stage - 1 (0 where there is no such stage). */
void costmodel_stage_sends(const costmodel *cm, const parallel_config *config,
                           const stage_placement *previous,
                           const stage_placement *self, int stage,
                           double *send_forward_s, double *send_backward_s);


/* ------------------------------------- stages of their own degrees */

/* A stage and its neighbours, for its sends: the configs of stage - 1,
 * the stage and stage + 1 (before / after may be anything where there
 * is no such stage) and the placements of stage - 1, the stage and
 * stage + 1 (previous NULL for the first stage, next NULL where no
 * boundary needs it: a symmetric plan's). */
typedef struct stage_neighbours {
    const parallel_config *before, *own, *after;
    const stage_placement *previous, *self, *next;
} stage_neighbours;

/* costmodel_stage_sends for a stage whose neighbours may run other
 * degrees: a boundary between stages of the same tp and dp as in a
 * symmetric plan, any other one re-sharded (costmodel_reshard_seconds,
 * its gather over the receiving stage's intra-node link). */
void costmodel_boundary_sends(const costmodel *cm, const stage_neighbours *n,
                              int stage, double *send_forward_s,
                              double *send_backward_s);

/* Seconds of one micro-batch's re-sharding between a stage of config
 * `from` and the next (or, for the gradient, the previous) of config
 * `to`, whose tp or dp differ, over `link` (curve_type: as
 * costmodel_send_seconds): with A the micro-batch's activation (dp x
 * mbs samples, costmodel_pipeline_message_bytes of one replica times
 * its dp), every receiving GPU takes A / (dp_to tp_to), every sending
 * GPU gives A / (dp_from tp_from); the larger in k = ceil(the larger
 * GPU count over the smaller) messages; then the receiving tp group
 * all-gathers its replica's A / dp_to over `gather` (not under
 * sequence parallelism, where each rank keeps its shard):
 *   k x send(max(A / (d_to t_to), A / (d_from t_from)) / k)
 *   + [t_to > 1, no sequence parallelism] RS(A / d_to, t_to, gather). */
double costmodel_reshard_seconds(const costmodel *cm,
                                 const parallel_config *from,
                                 const parallel_config *to, int curve_type,
                                 link_spec link, link_spec gather);

/* Each stage's config (parallel_stage_config) and first GPU: firsts[s],
 * firsts[pp] all of them; fails naming the stage whose degrees cannot
 * run (tp against the model's heads, dp against the micro-batch,
 * sequence parallelism, interleaving). A symmetric plan's messages are
 * those they always were. */
int costmodel_stage_configs(const costmodel *cm,
                            const parallel_config *config,
                            const stage_degrees *stages,
                            parallel_config *configs, long long *firsts,
                            pt_error *err);
/* Bytes of pp configs at the head of a block that holds other arrays
 * after them: rounded up so that what follows is aligned for any type. */
size_t costmodel_stage_configs_bytes(int pp);

/* Places stage `stage` of config `own` on GPUs [first, first + its tp x
 * dp), with its link towards the next stage of config `next` (NULL: the
 * last stage), which starts right after it: GPU x to x + tp x dp when
 * both split alike, else the slowest between any GPU of one and any of
 * the other. */
int costmodel_place_stage_at(const costmodel *cm,
                             const parallel_config *own,
                             const parallel_config *next,
                             const node_lane *lane, int stage,
                             long long first, stage_placement *out,
                             pt_error *err);
/* The stages of a plan of their own degrees: configs[pp] and firsts[pp
 * + 1] from costmodel_stage_configs. */
typedef struct stage_layout {
    int pp;
    const parallel_config *configs;
    const long long *firsts;
} stage_layout;

/* costmodel_place_order for stages of their own configs. */
int costmodel_place_order_stages(const costmodel *cm,
                                 const stage_layout *stages,
                                 const int *node_order, int node_count,
                                 stage_placement *placement, node_lane *lane,
                                 int **storage, pt_error *err);
/* costmodel_embedding_link between a first stage and a last one that
 * starts at GPU last_first: GPU x and x + last_first when both split
 * alike, else the slowest between any GPU of one and any of the other. */
void costmodel_embedding_link_at(const costmodel *cm,
                                 const parallel_config *first_stage,
                                 const parallel_config *last_stage,
                                 long long last_first,
                                 const node_lane *lane, link_spec *link,
                                 int *curve_type);

/* Whether every one of count times is finite and not negative (the
 * simulators' inputs). */
bool schedule_times_valid(const double *times, int count);

/* The interleaved pipeline of an estimate (interleave.c): each stage's
 * priced times split into its layers and its embedding or head, its sends
 * (the wrap-around ones, last rank to first, over the link between them)
 * and the simulation. */
int costmodel_interleave_pipeline(const costmodel *cm,
                                  const parallel_config *config,
                                  const node_lane *lane,
                                  const stage_placement *placement,
                                  const type_costs *costs,
                                  const stage_estimate *stages,
                                  int microbatches, bool want_events,
                                  schedule_result *out, pt_error *err);

/* Forward FLOPs of one transformer layer for b sequences (whole layer,
 * not divided by tp). */
double layer_forward_flops(double hidden, double ffn_hidden, double seq,
                           double microbatch);
/* The same of a model's layer, its architecture counted (GQA's narrower
 * key/value products, SwiGLU's third matrix); layer_forward_flops for a
 * GPT-2 layer, bit for bit. */
double model_layer_forward_flops(const model_shape *model, double microbatch);

/* ------------------------------------------------------------ lookup.c */

/* The three parts of the model priced for one micro-batch; head_fused:
 * the head's times are a fused head's (from profile points timed so,
 * profile_point.head_fused), its backward products in the forward. */
typedef struct part_times {
    part_cost embedding, layer, head;
    bool head_fused;
} part_times;

/* A fused head's times as the unfused head's: fused_share (the products'
 * share of the fused forward) of the forward back in the backward. */
part_cost lookup_head_unfused(part_cost head, double fused_share);

/* A shape's ffn_hidden (4 x hidden when it says 0). */
int profile_shape_ffn(const profile_shape *shape);
/* The vocabulary rows one tp rank's head computes: its V / tp share
 * rounded up to 128. Partita's executor pads each shard's logits so;
 * Megatron-LM pads the whole vocabulary to a multiple of 128 x tp
 * (--make-vocab-size-divisible-by 128), which gives every rank the same
 * count (ceil(ceil(V / t) / 128) = ceil(V / 128 t)). */
double padded_vocab_shard(int vocab, int tp);

/* The model's shape in the profile (same hidden, ffn_hidden, seq, vocab;
 * heads are not part of the key), with a usable point; NULL: none. */
const profile_shape *lookup_held_shape(const profile *prof,
                                       const model_shape *model);

/* The measured micro-batches around mbs at one tp: lower is the largest
 * <= mbs, upper the smallest >= mbs (NULL when none). */
typedef struct mbs_neighbours {
    const profile_point *lower, *upper;
    int grid_min, grid_max;
} mbs_neighbours;

/* How a shape's times were looked up: the tp whose points were used
 * (scaled by tp_used / tp when it is not the plan's), the micro-batches
 * around the plan's, and whether it lay between two of them. */
typedef struct lookup_path {
    int tp_used;
    mbs_neighbours near;
    bool between;
} lookup_path;

/* Times of one micro-batch at config's tp from a shape's points
 * (docs/cost-model.md 1.1, 1.2); path (may be NULL) says how. Where a
 * head timed fused meets one timed unfused (points of merged profiles),
 * both are taken unfused (lookup_head_unfused with fused_share). */
part_times lookup_shape_times(const profile *prof, const profile_shape *shape,
                              const parallel_config *config,
                              double fused_share, lookup_path *path);

/* Two measured shapes around a shape the profile does not hold (same
 * vocabulary and ffn_hidden / hidden): a below and b above its layer
 * work, or, one_side, the nearest (a, within a factor 2) and the next
 * beyond it (b, NULL when there is none). */
typedef struct shape_neighbours {
    const profile_shape *a, *b;
    bool one_side;
} shape_neighbours;

/* False when the profile has no neighbours for the model's shape. tp:
 * neighbours measured at it are preferred. */
bool lookup_shape_neighbours(const profile *prof, const model_shape *model,
                             int tp, shape_neighbours *out);

/* The model's times interpolated from the neighbours' (each looked up at
 * config's tp and micro-batch): every part and direction a power law of
 * its work through the two points (linear with one). */
part_times lookup_neighbour_times(const profile *prof,
                                  const model_shape *model,
                                  const shape_neighbours *near,
                                  const parallel_config *config,
                                  double fused_share);

/* The backward of a stage's last micro-batch as the dp overlap sees it:
 * the head's backward first (last stage), then the layers', then the
 * embedding's (first stage); the gradient bytes each part completes. The
 * fixed parameters' gradients are complete after the head's backward,
 * or, on the first stage, after the embedding's. */
typedef struct dp_backward {
    bool first;
    int layers;
    double head_s, layer_s, embedding_s;
    double fixed_bytes, layer_bytes;
} dp_backward;

/* ZeRO-2/3 (zero.c, docs/cost-model.md, section 11). The per-unit
 * communication folded into a type's layer, embedding and head times
 * for a stage placed at `place`; no change below ZeRO-2 or at dp 1. */
void costmodel_zero_unit_costs(const costmodel *cm,
                               const parallel_config *config,
                               const stage_placement *place,
                               type_costs *costs);
/* ZeRO-3's time per micro-batch of stage `stage` beyond its units'
 * (zero.c; 0 below ZeRO-3 or at dp 1): the gather of the layer a pass
 * starts at (a forward without the embeddings, a backward without the
 * head), and the reduce the last backward left on the units' stream,
 * which the next pass's first gather waits behind, shared out over the
 * forwards and backwards that follow a backward in the schedule; less
 * what the units the executor still holds from the pass before save
 * against those all-gathered terms (costmodel_zero3_gathers' rule), by
 * the kind of pass, never more than a pass's price holds beyond its
 * layers' terms (so the stage terms' fixed part stays at least
 * ZeRO-1's). May be negative. `costs`: the type's before
 * costmodel_zero_unit_costs. */
void costmodel_zero_pass_extra_s(const costmodel *cm,
                                 const parallel_config *config,
                                 const stage_placement *place, int stage,
                                 const type_costs *costs, double *forward_s,
                                 double *backward_s);
/* The per-step reduction under ZeRO-2/3 (only the last unit's reduce-
 * scatter is left after the backward, with its kernels on slices at
 * slow's streaming rate; ZeRO-3 gathers nothing after the optimizer).
 * Returns false, changing nothing, below ZeRO-2 or at dp 1. */
bool costmodel_zero_step_work(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *place, int stage,
                              const type_costs *slow, step_work *out);
/* Bytes the AdamW step moves per parameter (executor/cuda/optimizer.cu
 * reads parameter, gradient and both moments in fp32 and writes
 * parameter, moments and the bf16 mirror): the profile's optimizer time
 * over them is the GPU's streaming rate as measured (a slice's beside its
 * neighbours, when its profile was taken so), which stage.c and zero.c
 * price memory-bound kernels at. */
#define COSTMODEL_ADAMW_BYTES_PER_PARAM 30.0

/* What memory.c knows of a rank's ZeRO units, exactly as the cuda
 * executor lays them out (its shard's tensors): floats of one layer, of
 * the embeddings (first stage; else 0) and of the head (last stage), the
 * head's padding rows (head_pad floats), and the bytes of the chunk
 * tables: of every parameter (fixed part and per layer) and of the
 * units' (ZeRO-3 converts each gathered unit through them). */
typedef struct zero_unit_sizes {
    double layer, embedding, head, head_pad;
    double every_table_fixed, every_table_layer, unit_tables;
} zero_unit_sizes;

/* Whether the cuda executor holds the stage's gradients (and under
 * ZeRO-3 its parameters) as its shard and units: ZeRO >= 2 at dp > 1,
 * but on the tied embedding's pair of a pipeline (whole buffers). */
bool costmodel_zero_sharded_stage(const model_shape *model,
                                  const parallel_config *config, int stage);
/* ZeRO-2/3's changes to a stage's memory terms, applied to the ZeRO-1
 * terms memory.c computed (which leaves offload's moments out). */
void costmodel_zero_memory(const model_shape *model,
                           const parallel_config *config, int stage,
                           const zero_unit_sizes *units,
                           pt_memory_terms *fixed, pt_memory_terms *per_layer);

/* The dp reduction of `bytes` gradient bytes of a placed stage: an
 * all-reduce, or with scatter a reduce-scatter (dp_reduce.c). */
double costmodel_dp_reduce_seconds(const costmodel *cm,
                                   const parallel_config *config,
                                   const stage_placement *place,
                                   double bytes, bool scatter);
/* The dp all-gather of `bytes` (the whole tensor) of a placed stage
 * (ZeRO's parameters; dp_reduce.c). */
double costmodel_dp_gather_seconds(const costmodel *cm,
                                   const parallel_config *config,
                                   const stage_placement *place,
                                   double bytes);

/* Seconds of the reduction (reduce_s when it does not overlap) that the
 * step waits for after the last backward, under cm->dp_overlap. */
double costmodel_dp_exposed_seconds(const costmodel *cm,
                                    const parallel_config *config,
                                    const stage_placement *place,
                                    const dp_backward *backward,
                                    double reduce_s);

/* ------------------------------------------------------- comm_price.c */

/* Time of one measured communication curve at (gpus, bytes): piecewise
 * linear between samples, the last slope beyond them, the smallest
 * sample's below them. False when the curve has no sample for that
 * group size. */
bool costmodel_curve_time(const comm_curve *curve, int gpus, double bytes,
                          double *out);
/* The share of a collective's time that products beside it lose, from
 * the curve's sample of that group size measured beside products
 * (compute_lost) nearest in bytes (by ratio). False when none is. */
bool costmodel_curve_compute_lost(const comm_curve *curve, int gpus,
                                  double bytes, double *out);

/* ----------------------------------------------------- least_squares.c */

#define LSQ_MAX_PARAMS 8

/* A least-squares problem: residuals(context, u, r) fills r[0..
 * residual_count) for the coordinates u[0..param_count). */
typedef struct lsq_problem {
    int param_count, residual_count;
    void (*residuals)(const void *context, const double *u, double *r);
    const void *context;
    int max_iterations;
} lsq_problem;

/* Levenberg-Marquardt from u (updated in place) with a central-difference
 * Jacobian; returns the final sum of squares, NAN with err filled when
 * the problem is malformed or memory runs out. */
double lsq_minimise(const lsq_problem *problem, double *u, pt_error *err);

/* The roofline's parameters on the fit's unbounded coordinates (logit of
 * the efficiencies, log of the sizes and times; ROOFLINE_PARAM_COUNT of
 * them, in roofline_params' order) and back. */
#define ROOFLINE_PARAM_COUNT 6
roofline_params roofline_params_from_vector(const double *u);
void roofline_vector_from_params(const roofline_params *p, double *u);
/* 4 significant digits of each parameter: what a profile file says. */
roofline_params roofline_rounded(const roofline_params *p);

#endif
