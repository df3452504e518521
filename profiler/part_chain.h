/*
 * The profiler's part chain: the embedding, the layer stage (one
 * transformer layer, or a stack of them: profiler_options.layer_stack) and
 * the head of a model, made as three stages of a pipeline (the embedding's
 * output feeds the layer stage, its output the head; the head's input
 * gradient feeds the layer stage's backward, its input gradient the
 * embedding's), so that every
 * part the profiler times sees realistic data. Owned by profiler.c, which
 * makes a chain per set of stages and per busy neighbour.
 */
#ifndef PARTITA_PROFILER_PART_CHAIN_H
#define PARTITA_PROFILER_PART_CHAIN_H

#include "profiler/profiler.h"

/* The parts, each a stage, and the calls of one run in the order they
 * are made. */
typedef enum chain_call {
    EMBEDDING_FORWARD,
    LAYER_FORWARD,
    HEAD_FORWARD,
    HEAD_BACKWARD,
    LAYER_BACKWARD,
    EMBEDDING_BACKWARD,
    CHAIN_CALLS
} chain_call;

typedef struct part_chain {
    model_stage embedding;
    model_stage layer;
    model_stage head;
    int made;                    /* stages made, in the order above */
    int capacity;                /* largest micro-batch */
    int layers;                  /* in the layer stage: layers 0..layers */
    const model_shape *shape;    /* what it was made of, for a remake */
    int tp;
    const profiler_options *options;
    uint32_t *tokens;            /* capacity x (seq + 1), host memory */
    float *embedding_values;     /* the embedding's parameters as drawn,
                                    host memory, for its remakes */
    /* What the executor's steps of the shallower whole model
     * (chain_exec_rounds) left once its layers were taken off, per round:
     * the embedding's and the head's forward and backward together, on
     * the device's clock; exec_rest_rounds 0 where none was timed so
     * (no executed rounds yet, or a tp shard timed on the host). */
    double exec_rest_forward[PROFILER_MAX_RUNS];
    double exec_rest_backward[PROFILER_MAX_RUNS];
    int exec_rest_rounds;
} part_chain;

/* Makes the three stages for micro-batches up to capacity, the layer
 * stage of `layers` layers (1 to shape->layers), with parameters from
 * o->seed, and fills each stage's input once (the previous part's output
 * at the capacity). On failure nothing is left. */
int chain_create(part_chain *chain, const model_shape *shape, int tp,
                 int capacity, int layers, const profiler_options *o,
                 pt_error *err);
void chain_destroy(part_chain *chain);

/* The embedding stage made again, in fresh memory (the new one is made
 * before the old one goes), with the same parameters (written from
 * chain->embedding_values); its input gradient
 * is the layer's, as before. On failure the old one stays. */
int chain_remake_embedding(part_chain *chain, pt_error *err);

/* One synchronous run of every call at micro-batch mbs, each timed on the
 * host clock into seconds[] (gradients zeroed first, untimed). */
int chain_run(part_chain *chain, int mbs, double seconds[CHAIN_CALLS],
              pt_error *err);

/* The stage of part 0 (embedding), 1 (layer) or 2 (head) and the io of
 * its calls at micro-batch mbs: the inputs the last run left in place. */
model_stage *chain_part_stage(part_chain *chain, int part, int mbs,
                              stage_io *io);

/* A part's calls queued `count` times back to back and waited for once:
 * seconds per call on the host clock. */
int chain_queued_seconds(part_chain *chain, int part, bool with_backward,
                         int mbs, int count, double *out, pt_error *err);

/* Part 1 (the layer stage) or 2 (the head) timed inside training steps
 * of the chain at micro-batch mbs (profiler_step.c; `--timing step`):
 * one step captured as a CUDA graph, replayed back to back for warm_s (0:
 * a second), then `rounds` times, each waited for: the part's forward and
 * its forward + backward, seconds per call, into forward[] and pair[].
 * The stages' defer_sync must be on. 1 when the step cannot be captured
 * (or no cuda build, or another part): nothing timed; -1 on a device
 * failure. */
int chain_step_rounds(part_chain *chain, int part, int mbs, double warm_s,
                      int rounds, double *forward, double *pair,
                      pt_error *err);

/* A whole model of `layers` layers (the chain's shape so cut) as one
 * stage at micro-batches up to mbs, the chain's tp, parameters drawn as
 * the chain's. */
int chain_make_whole_model(const part_chain *chain, int layers, int mbs,
                           model_stage *out, pt_error *err);

/* The layer timed inside the executor's own training steps
 * (profiler_exec.c; `--timing exec`): whole models of the chain's layers
 * and of half as many, each stepped through stage_step_* (two
 * micro-batches of mbs a step, the second timed on the device's clock)
 * for warm_s (0: a second), then `rounds` times (tp > 1: a compute-only
 * shard, timed on the host's clock around its waiting calls). Per round:
 * the layer's forward and forward + backward, the difference of the two
 * depths over the layers between them, into layer_forward[] and
 * layer_pair[]; where the steps were timed on the device (tp 1), what
 * the shallower model leaves beside its layers into chain->exec_rest_*
 * (the executed head, profiler.c). 1 when it cannot be (no cuda build,
 * a chain of one layer, a whole model that cannot be made beside the
 * chain): nothing timed; -1 on a failure. */
int chain_exec_rounds(part_chain *chain, int mbs, double warm_s, int rounds,
                      double *layer_forward, double *layer_pair,
                      pt_error *err);

/* Every stage's defer_sync: calls return once queued. */
void chain_set_deferred(part_chain *chain, bool on);

#endif
