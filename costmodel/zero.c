/*
 * DeepSpeed's ZeRO stages 2 and 3 and ZeRO-Offload in the cost model
 * (docs/cost-model.md, section 11): what they add to a stage's layer,
 * embedding and head times (the per-unit reduce-scatter of gradients
 * and all-gather of weights, on one stream beside the compute, as the
 * cuda executor runs them: hidden behind it as far as it goes, the
 * pass's first gathers and the last backward's reduces exposed, no
 * gather of a unit still held from the pass before), to its per-step
 * work, and what they take off its memory terms. Kept
 * apart from ZeRO-1 (memory.c, stage.c), which these build on: every
 * ZeRO stage >= 1 shards the optimizer state as ZeRO-1 does.
 */
#include <math.h>

#include "costmodel/internal.h"

/* A rank's units of parameters (they are gathered and reduced whole):
 * one transformer layer, the embeddings, the head. */
typedef struct zero_units {
    double layer, embedding, head;
} zero_units;

static zero_units units_of(const model_shape *m, const parallel_config *c)
{
    double t = c->tp, h = m->hidden;
    bool head_matrix = !m->tied_embeddings || c->pp > 1;
    double positions = m->positions == MODEL_POSITIONS_LEARNED ? m->seq : 0;
    return (zero_units){
        .layer = model_layer_parameters_per_rank(m, c->tp),
        .embedding = ((double)m->vocab + positions) * h / t,
        .head = (model_final_norm_parameter_count(m) +
                 (head_matrix ? (double)m->vocab * h : 0.0)) / t};
}

static bool sharding(const parallel_config *config)
{
    return parallel_zero_stage(config) >= 2 && config->dp > 1;
}

/* One unit's collective over the stage's dp group, of its fp32 buffer:
 * its gradients reduce-scattered, or (gather) its weights all-gathered
 * (fp32, which the cuda executor then converts to its bf16 copy). */
static double unit_collective_s(const costmodel *cm,
                                const parallel_config *config,
                                const stage_placement *place, double params,
                                bool gather)
{
    return gather ? costmodel_dp_gather_seconds(cm, config, place,
                                                params * 4.0)
                  : costmodel_dp_reduce_seconds(cm, config, place,
                                                params * 4.0, true);
}

/* Bytes the SMs move per parameter of a unit, on slices of one GPU where
 * the device exchange's kernels run in the rank's own slice (the cuda
 * executor, measured 2026-11-27 on an H100's 40-SM slices): a gather
 * copies the rank's part (read and write 4 / d each), receives the
 * others' (read and write 4 (d - 1) / d each) and converts the unit to
 * bf16 (read 4, write 2): 14 bytes; a reduce-scatter reads every
 * member's part of the unit (4) and writes the rank's sum (4 / d), then
 * adds it to the shard (read 8 / d, write 4 / d): 4 (1 + 4 / d). */
#define GATHER_KERNEL_BYTES 14.0
static double reduce_kernel_bytes(const parallel_config *config)
{
    return 4.0 * (1.0 + 4.0 / config->dp);
}

/* A unit's forward and backward with ZeRO-2's reduce on a stream of its
 * own: the last unit's reduce overlaps this one's compute, so the unit
 * takes the longer of the two; on slices of one GPU the reduce's
 * kernels take the unit's SMs (at the slice's streaming rate: the AdamW
 * step's per byte), so they add to its compute, and on whole GPUs of one
 * node NCCL's take them for the reduce's whole time (stage_placement's
 * dp_collectives_contend). The embeddings end the
 * first stage's backward: their reduce runs under what follows (the
 * next micro-batch's forward, which gathers nothing; after the last
 * one, the step's exposed reduce_s), not under their own backward
 * (`trailing`). */
static void reduce_unit_times(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *place, double params,
                              double s_per_byte, bool trailing,
                              double *backward_s)
{
    double reduce = unit_collective_s(cm, config, place, params, false);
    double reduce_kernels =
        place->slices_of_one_gpu
            ? params * reduce_kernel_bytes(config) * s_per_byte
        : place->dp_collectives_contend ? reduce
                                        : 0.0;
    *backward_s = fmax(*backward_s + reduce_kernels, trailing ? 0.0 : reduce);
}

/* ZeRO-3's work on the units' stream for one unit (executor/cuda/
 * param_units.c and grad_units.c; docs/cost-model.md, section 11):
 * `gather` the stream's time for its weights (the rank's part copied,
 * 8 / d bytes a parameter, the transfer, the conversion to bf16, 6
 * bytes), `reduce` for its gradients (the transfer, then the add of the
 * rank's part into the shard, 12 / d bytes); the transfer is the
 * collective's price or, on slices of one GPU, the exchange kernel's
 * bytes at the streaming rate where that is longer (it runs inside the
 * paced transfer). `*_kernels`: the SM time they take from the compute
 * they run beside: on slices of one GPU the exchange's and the copies',
 * on whole GPUs of one node the copies' and the reduce's whole time (the
 * executor's compute waits on its units' reductions there) and of the
 * gather's transfer the share that products beside it lose where the
 * all-gather curve measured it (compute_lost), else the whole; else
 * none. */
typedef struct unit_stream {
    double gather, reduce, gather_kernels, reduce_kernels;
} unit_stream;

/* The share of a dp all-gather's time (`bytes`, the group inside one
 * node of a type with curves) that the compute beside it loses: the
 * profile's measured compute_lost, else all of it. */
static double gather_compute_lost(const costmodel *cm,
                                  const parallel_config *config,
                                  const stage_placement *place, double bytes)
{
    double lost;
    if (place->dp_curve_type < 0 ||
        !costmodel_curve_compute_lost(
            &cm->profiles[place->dp_curve_type].all_gather, config->dp,
            bytes, &lost))
        return 1.0;
    return fmin(1.0, lost);
}

static unit_stream unit_stream_of(const costmodel *cm,
                                  const parallel_config *config,
                                  const stage_placement *place,
                                  double params, double s_per_byte)
{
    double d = config->dp, byte_s = params * s_per_byte;
    double gather_transfer = unit_collective_s(cm, config, place, params,
                                               true);
    double reduce_transfer = unit_collective_s(cm, config, place, params,
                                               false);
    unit_stream u = {0};
    if (place->slices_of_one_gpu) {
        /* the exchange kernel: the rank's chunk into every other buffer
         * (4 bytes a parameter); every member's chunk read, the sum
         * written (4 + 4 / d) */
        gather_transfer = fmax(gather_transfer, 4.0 * byte_s);
        reduce_transfer = fmax(reduce_transfer, (4.0 + 4.0 / d) * byte_s);
        u.gather_kernels = GATHER_KERNEL_BYTES * byte_s;
        u.reduce_kernels = reduce_kernel_bytes(config) * byte_s;
    }
    u.gather = gather_transfer + (8.0 / d + 6.0) * byte_s;
    u.reduce = reduce_transfer + 12.0 / d * byte_s;
    if (place->dp_collectives_contend) {
        /* whole GPUs of one node: the copies hold the compute's SMs for
         * their whole time, NCCL's gather for the share measured */
        u.gather_kernels = u.gather - (1.0 - gather_compute_lost(
                                                 cm, config, place,
                                                 params * 4.0)) *
                                          gather_transfer;
        u.reduce_kernels = u.reduce;
    }
    return u;
}

/* Whether the head on the stage multiplies by the tied embedding, which
 * then sits in the embeddings' unit (a tied model at pp 1): a backward
 * gathers that unit first and keeps it to the end. */
static bool tied_head_here(const costmodel *cm, const parallel_config *config)
{
    return cm->model.tied_embeddings && config->pp == 1;
}

/* ZeRO-3's unit times in a pass that gathers every unit (the step's
 * first forward; costmodel_zero_pass_extra_s takes off what the units
 * held from the pass before save). The executor gathers the unit after
 * the one being computed on the units' stream, behind the reduce of the one
 * before it (backward); the gather of the pass's first unit waits for
 * everything before it. Unit k starts at S_k, and exactly
 *     S_(k+1) = S_k + max(c_k, R_(k-1) + G_(k+1)),
 *     S_0 = B + G_0,
 * c the compute (with the kernels of what runs beside it), G the next
 * unit's gather, R the last unit's reduce (backward only), B what the
 * units' stream still holds from the pass before (estimate: the
 * backlog, costmodel_zero_pass_extra_s). Each unit is priced as its own
 * term of that sum: a layer against a layer's gather (and reduce), the
 * pass's first unit with its own gather before it, the end units
 * against their neighbours. The lead of a pass that starts at a layer
 * (a stage without the embeddings, forward; without the head, backward)
 * is costmodel_zero_pass_extra_s's. */
static void gather_unit_times(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *place,
                              type_costs *costs)
{
    zero_units size = units_of(&cm->model, config);
    double s_per_byte = costs->stream_s_per_byte;
    unit_stream L = unit_stream_of(cm, config, place, size.layer, s_per_byte);
    unit_stream E = unit_stream_of(cm, config, place, size.embedding,
                                   s_per_byte);
    unit_stream H = unit_stream_of(cm, config, place, size.head, s_per_byte);
    bool tied = tied_head_here(cm, config);
    /* forward: embeddings, layers, head */
    double layer_f =
        fmax(costs->layer_forward_s + L.gather_kernels, L.gather);
    costs->embedding_forward_s =
        E.gather +
        fmax(costs->embedding_forward_s + L.gather_kernels, L.gather);
    costs->head_forward_s += H.gather_kernels + fmax(0.0, H.gather - layer_f);
    costs->layer_forward_s = layer_f;
    /* backward: (a tied head's embeddings,) head, layers, embeddings */
    double layer_b =
        fmax(costs->layer_backward_s + L.gather_kernels + L.reduce_kernels,
             L.reduce + L.gather);
    double head_lead = H.gather + (tied ? E.gather : 0.0);
    costs->head_backward_s =
        head_lead +
        fmax(costs->head_backward_s + L.gather_kernels, L.gather) +
        H.reduce_kernels + fmax(0.0, H.reduce + L.gather - layer_b);
    /* the embeddings' gather under the first layer's backward (a tied
     * head's: held since the pass began); their reduce is left to the
     * units' stream after the pass (the backlog and reduce_s) */
    if (!tied)
        costs->embedding_backward_s +=
            E.gather_kernels + fmax(0.0, L.reduce + E.gather - layer_b);
    costs->layer_backward_s = layer_b;
}

/* The SM time of one unit's reduce-scatter and add on slices of one GPU
 * (0 elsewhere). */
static double reduce_kernels_s(const parallel_config *config,
                               const stage_placement *place,
                               const type_costs *costs, double params)
{
    return place->slices_of_one_gpu ? params * reduce_kernel_bytes(config) *
                                          costs->stream_s_per_byte
                                    : 0.0;
}

void costmodel_zero_unit_costs(const costmodel *cm,
                               const parallel_config *config,
                               const stage_placement *place,
                               type_costs *costs)
{
    if (!sharding(config))
        return;
    if (parallel_zero_stage(config) >= 3) {
        gather_unit_times(cm, config, place, costs);
        return;
    }
    zero_units u = units_of(&cm->model, config);
    double s_per_byte = costs->stream_s_per_byte;
    reduce_unit_times(cm, config, place, u.layer, s_per_byte, false,
                      &costs->layer_backward_s);
    reduce_unit_times(cm, config, place, u.embedding, s_per_byte, true,
                      &costs->embedding_backward_s);
    reduce_unit_times(cm, config, place, u.head, s_per_byte, false,
                      &costs->head_backward_s);
}

/* Of a stage's m backwards, how many are followed by a forward and how
 * many by another backward on the same stage (the last is followed by
 * the step's end): 1F1B runs w = pp - s - 1 forwards ahead, then pairs,
 * then w backwards; GPipe all forwards, then all backwards. The
 * interleaved 1F1B is counted as the plain one. */
static void backward_successors(const parallel_config *config, int stage,
                                int microbatches, int *to_forward,
                                int *to_backward)
{
    int m = microbatches;
    if (m <= 1 || config->schedule == SCHEDULE_GPIPE) {
        *to_forward = 0;
        *to_backward = m > 1 ? m - 1 : 0;
        return;
    }
    int ahead = config->pp - stage - 1;
    if (ahead > m)
        ahead = m;
    *to_forward = m - ahead - 1 > 0 ? m - ahead - 1 : 0;
    *to_backward = m - 1 - *to_forward;
}

/* Passes of a stage's step by what comes before them (the executor keeps
 * what the pass before gathered: executor/cuda/unit_holds.c): the first
 * forward (after the optimizer step), forwards after a forward and after
 * a backward, backwards after a forward and after a backward. */
typedef struct pass_kinds {
    int m, forward_forward, backward_forward, forward_backward,
        backward_backward;
} pass_kinds;

static pass_kinds pass_kinds_of(const parallel_config *config, int stage)
{
    int m = parallel_microbatches(config), to_forward, to_backward;
    backward_successors(config, stage, m, &to_forward, &to_backward);
    pass_kinds k = {.m = m};
    if (m <= 0)
        return k;
    k.backward_forward = to_forward;
    k.forward_forward = m - 1 - to_forward;
    k.backward_backward = to_backward;
    k.forward_backward = m - to_backward;
    return k;
}

double costmodel_zero3_gathers(const model_shape *model,
                               const parallel_config *config, int stage,
                               int layers)
{
    if (parallel_zero_stage(config) < 3 ||
        !costmodel_zero_sharded_stage(model, config, stage))
        return 0.0;
    pass_kinds k = pass_kinds_of(config, stage);
    if (k.m <= 0)
        return 0.0;
    double ends = (stage == 0) + (stage == config->pp - 1);
    /* a pass the other way finds the two layers it starts with; one the
     * same way finds the last two, overwritten before it reaches them
     * but the middle one of three */
    double turned = layers > 2 ? layers - 2 : 0;
    double same = layers >= 4 ? layers : layers == 3 ? 2 : 0;
    return ends + layers +
           (k.forward_forward + k.backward_backward) * same +
           (k.backward_forward + k.forward_backward) * turned;
}

/* ZeRO-3's chain (gather_unit_times) for a stage's passes: the units'
 * stream work, a layer's terms, the compute of the units a held pass
 * starts with, and the backlog a backward leaves. */
typedef struct zero3_chain {
    unit_stream L, E, H;
    double layer_f, layer_b;          /* a layer's terms, all gathered */
    double held_b;                    /* a layer's backward, the next
                                         unit held: its reduces pace it
                                         (their buffers), as ZeRO-2's */
    double compute_f, compute_b;      /* a layer's compute alone */
    double embedding_f, head_b;       /* the ends' compute alone */
    double head_lead;                 /* a backward's gathers at its start */
    double head_b_term;               /* the head's backward term */
    double backlog;
} zero3_chain;

static zero3_chain chain_of(const costmodel *cm,
                            const parallel_config *config,
                            const stage_placement *place, int stage,
                            const type_costs *costs)
{
    zero_units size = units_of(&cm->model, config);
    double b = costs->stream_s_per_byte;
    zero3_chain c = {
        .L = unit_stream_of(cm, config, place, size.layer, b),
        .E = unit_stream_of(cm, config, place, size.embedding, b),
        .H = unit_stream_of(cm, config, place, size.head, b),
        .compute_f = costs->layer_forward_s,
        .compute_b = costs->layer_backward_s,
        .embedding_f = costs->embedding_forward_s,
        .head_b = costs->head_backward_s};
    c.layer_f = fmax(c.compute_f + c.L.gather_kernels, c.L.gather);
    c.layer_b = fmax(c.compute_b + c.L.gather_kernels + c.L.reduce_kernels,
                     c.L.reduce + c.L.gather);
    c.held_b = fmax(c.compute_b + c.L.reduce_kernels, c.L.reduce);
    c.head_lead =
        c.H.gather + (tied_head_here(cm, config) ? c.E.gather : 0.0);
    c.head_b_term = fmax(c.head_b + c.L.gather_kernels, c.L.gather) +
                    c.H.reduce_kernels +
                    fmax(0.0, c.H.reduce + c.L.gather - c.layer_b);
    /* what the backward's last unit's reduce (the embeddings' on the
     * first stage, the first layer's elsewhere), and what of the one
     * before it outlasts that unit's compute, leave on the units'
     * stream for the next pass's first gather */
    if (stage == 0)
        c.backlog = c.E.reduce +
                    fmax(0.0, c.L.reduce - costs->embedding_backward_s);
    else
        c.backlog = c.L.reduce + fmax(0.0, c.L.reduce - c.compute_b);
    return c;
}

/* What the first stage's forward saves where the embeddings are held
 * (every forward but the step's first): their gather at its start. What
 * the last stage's forward saves where the head is held: its gather's
 * exposed part and kernels, and the last layer's term against it. */
static double held_ends_forward_s(const zero3_chain *c, bool first,
                                  bool last)
{
    double saved = first ? c->E.gather : 0.0;
    if (last)
        saved += c->layer_f - c->compute_f + c->H.gather_kernels +
                 fmax(0.0, c->H.gather - c->layer_f);
    return saved;
}

/* A forward after a backward (its ends and first two layers held): the
 * all-gathered terms of those units and the backlog, which it was
 * priced with, less what it takes: their compute, and the third
 * layer's gather, queued at the second layer behind the first's compute
 * and behind the backlog. */
static double forward_after_backward_s(const zero3_chain *c, bool first,
                                       bool last)
{
    double lead = first ? c->embedding_f + c->compute_f : c->compute_f;
    double third = fmax(c->compute_f + c->L.gather_kernels,
                        fmax(0.0, c->backlog - lead) + c->L.gather);
    double priced = c->backlog + 2.0 * c->layer_f +
                    (first ? fmax(c->embedding_f + c->L.gather_kernels,
                                  c->L.gather)
                           : c->L.gather);
    double taken = lead + third;
    return held_ends_forward_s(c, first, false) + priced - taken +
           (last ? held_ends_forward_s(c, false, true) : 0.0);
}

/* A backward after a forward (the head, a tied head's embeddings and the
 * last two layers held): the head's term and those layers' (the
 * pass's lead at a layer elsewhere) less their compute and reduces, and
 * the third layer's gather behind the reduces of the two before it. */
static double backward_after_forward_s(const zero3_chain *c, bool last)
{
    double held_layer = c->held_b;
    if (!last)
        return c->L.gather + c->layer_b - held_layer;
    double head = c->head_b + c->H.reduce_kernels;
    double third = fmax(c->compute_b + c->L.gather_kernels +
                            c->L.reduce_kernels,
                        fmax(0.0, c->H.reduce - held_layer) + c->L.reduce +
                            c->L.gather);
    return c->head_lead + c->head_b_term - head + 2.0 * c->layer_b -
           held_layer - third;
}

/* A backward after a backward on the last stage (the head held, the
 * layers gathered again): the gathers at its start and the backlog
 * ahead of them, less the last layer's gather queued at the head behind
 * that backlog. */
static double backward_after_backward_s(const zero3_chain *c, bool last)
{
    if (!last)
        return 0.0;
    double head_first = fmax(c->head_b + c->L.gather_kernels, c->L.gather);
    double behind = fmax(c->head_b + c->L.gather_kernels,
                         c->backlog + c->L.gather);
    return c->head_lead + c->backlog + head_first - behind;
}

/* Every backward of a first stage whose head is not the tied one finds
 * the embeddings held: their gather under the first layer's backward,
 * and that layer's term against it. */
static double held_embeddings_backward_s(const costmodel *cm,
                                         const parallel_config *config,
                                         const zero3_chain *c, bool first)
{
    if (!first || tied_head_here(cm, config))
        return 0.0;
    return c->layer_b - c->held_b + c->E.gather_kernels +
           fmax(0.0, c->L.reduce + c->E.gather - c->layer_b);
}

/* What a pass's price holds beyond its layers' terms, the most it may
 * save (the stage terms are linear in the layers and their fixed part
 * may not fall below ZeRO-1's; a stage of fewer than two layers saves
 * exactly this, gathering nothing after its first pass): its start (the
 * embeddings' term's gathers, a layer's lead, the head's backward term's
 * gathers), the head's gather in a forward, the embeddings' in a
 * backward, and after a backward the backlog. */
static double forward_ends_s(const zero3_chain *c, bool first, bool last,
                             bool after_backward)
{
    double start = first ? c->E.gather +
                               fmax(c->embedding_f + c->L.gather_kernels,
                                    c->L.gather) -
                               c->embedding_f
                         : c->L.gather;
    double head = last ? c->H.gather_kernels +
                             fmax(0.0, c->H.gather - c->layer_f)
                       : 0.0;
    return start + head + (after_backward ? c->backlog : 0.0);
}

static double backward_ends_s(const costmodel *cm,
                              const parallel_config *config,
                              const zero3_chain *c, bool first, bool last,
                              bool after_backward)
{
    double start = last ? c->head_lead + c->head_b_term - c->head_b -
                              c->H.reduce_kernels
                        : c->L.gather;
    double embeddings = first && !tied_head_here(cm, config)
                            ? c->E.gather_kernels +
                                  fmax(0.0, c->L.reduce + c->E.gather -
                                                c->layer_b)
                            : 0.0;
    return start + embeddings + (after_backward ? c->backlog : 0.0);
}

void costmodel_zero_pass_extra_s(const costmodel *cm,
                                 const parallel_config *config,
                                 const stage_placement *place, int stage,
                                 const type_costs *costs, double *forward_s,
                                 double *backward_s)
{
    *forward_s = *backward_s = 0.0;
    if (!sharding(config) || parallel_zero_stage(config) < 3)
        return;
    zero3_chain c = chain_of(cm, config, place, stage, costs);
    bool first = stage == 0, last = stage == config->pp - 1;
    /* all gathered: a pass that starts at a layer waits for that layer's
     * gather, and a pass after a backward for the backlog first */
    if (!first)
        *forward_s += c.L.gather;
    if (!last)
        *backward_s += c.L.gather;
    pass_kinds k = pass_kinds_of(config, stage);
    if (k.m <= 0)
        return;
    *forward_s += c.backlog * k.backward_forward / k.m;
    *backward_s += c.backlog * k.backward_backward / k.m;
    /* what the units the executor holds from the pass before save, by
     * the kind of pass */
    double embeddings = held_embeddings_backward_s(cm, config, &c, first);
    double forward_forward = fmin(held_ends_forward_s(&c, first, last),
                                  forward_ends_s(&c, first, last, false));
    double backward_forward =
        fmin(forward_after_backward_s(&c, first, last),
             forward_ends_s(&c, first, last, true));
    double forward_backward =
        fmin(backward_after_forward_s(&c, last) + embeddings,
             backward_ends_s(cm, config, &c, first, last, false));
    double backward_backward =
        fmin(backward_after_backward_s(&c, last) + embeddings,
             backward_ends_s(cm, config, &c, first, last, true));
    *forward_s -= (k.forward_forward * forward_forward +
                   k.backward_forward * backward_forward) / k.m;
    *backward_s -= (k.forward_backward * forward_backward +
                    k.backward_backward * backward_backward) / k.m;
}

bool costmodel_zero_step_work(const costmodel *cm,
                              const parallel_config *config,
                              const stage_placement *place, int stage,
                              const type_costs *slow, step_work *out)
{
    if (!sharding(config))
        return false;
    /* the unit the backward completes last: the embedding on the first
     * stage, else a layer or (a stage of no layers) the head, whichever
     * is smaller, so the figure does not depend on the layer count */
    zero_units u = units_of(&cm->model, config);
    double last_unit = stage == 0 ? u.embedding
                       : stage == config->pp - 1 ? fmin(u.layer, u.head)
                                                 : u.layer;
    /* its transfer and, on slices, its kernels (behind the backward's
     * last kernels on the units' stream) */
    out->reduce_s = unit_collective_s(cm, config, place, last_unit, false) +
                    reduce_kernels_s(config, place, slow, last_unit);
    out->exposed_s = out->reduce_s;
    out->tail_fraction = 1.0;
    /* ZeRO-2 gathers the updated parameters once, as ZeRO-1; ZeRO-3
     * keeps them sharded until the next forward gathers them */
    if (parallel_zero_stage(config) >= 3)
        out->gather_s = 0.0;
    return true;
}

double costmodel_offload_copy_s(double host_copy_s_per_param)
{
    /* the fp32 gradients down and the fp32 weights back up (the cuda
     * executor keeps fp32 weights on the device: stage/offload.c) */
    return host_copy_s_per_param > 0.0 ? host_copy_s_per_param
                                       : 8.0 / COSTMODEL_HOST_LINK_BYTES_PER_S;
}

double costmodel_offload_adamw_s(double host_adamw_s_per_param)
{
    return host_adamw_s_per_param > 0.0
               ? host_adamw_s_per_param
               : 1.0 / COSTMODEL_CPU_ADAMW_PARAMS_PER_S;
}

double costmodel_offload_s_per_param(const parallel_config *config,
                                     double host_adamw_s_per_param,
                                     double host_copy_s_per_param)
{
    (void)config;
    return costmodel_offload_copy_s(host_copy_s_per_param) +
           costmodel_offload_adamw_s(host_adamw_s_per_param);
}

bool costmodel_zero_sharded_stage(const model_shape *model,
                                  const parallel_config *config, int stage)
{
    bool tied_pair = model->tied_embeddings && config->pp > 1 &&
                     (stage == 0 || stage == config->pp - 1);
    return sharding(config) && !tied_pair;
}

void costmodel_zero_memory(const model_shape *model,
                           const parallel_config *config, int stage,
                           const zero_unit_sizes *u, pt_memory_terms *fixed,
                           pt_memory_terms *per_layer)
{
    /* offload: the moments left the device in memory.c already; the
     * fp32 weights stay as the backend's working copy (DeepSpeed keeps
     * half-precision ones only: docs/cost-model.md, section 11) */
    if (!costmodel_zero_sharded_stage(model, config, stage))
        return;
    double d = config->dp;
    double ends = u->embedding + u->head;
    /* the unit buffers: two layers (the one the pass computes, the one
     * reduced or gathered), the head, the embeddings */
    double units = u->embedding + 2.0 * u->layer + u->head;
    /* the shard: runs of 64 floats, the first shards the fullest */
    double shard_fixed = ends / d + 64.0 + 1.0;
    /* gradients: the shard, and the units with the head's padding */
    fixed->bytes[PT_MEMORY_GRADIENTS] =
        4.0 * shard_fixed + 4.0 * (units + u->head_pad + 1.0);
    per_layer->bytes[PT_MEMORY_GRADIENTS] = 4.0 * u->layer / d;
    if (parallel_zero_stage(config) < 3)
        return;
    /* ZeRO-3: the fp32 weights likewise (their units gathered whole), no
     * mirror of every parameter but the units' bf16 copies, and the
     * units' conversion tables for the table of every parameter */
    fixed->bytes[PT_MEMORY_WEIGHTS] = 4.0 * shard_fixed + 4.0 * (units + 1.0);
    per_layer->bytes[PT_MEMORY_WEIGHTS] = 4.0 * u->layer / d;
    fixed->bytes[PT_MEMORY_WEIGHT_MIRROR] =
        precision_bytes(config->precision) * (units + u->head_pad + 1.0);
    per_layer->bytes[PT_MEMORY_WEIGHT_MIRROR] = 0.0;
    fixed->bytes[PT_MEMORY_OPTIMIZER] += u->unit_tables - u->every_table_fixed;
    per_layer->bytes[PT_MEMORY_OPTIMIZER] -= u->every_table_layer;
}
