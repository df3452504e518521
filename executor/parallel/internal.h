/*
 * Private to executor/parallel: what one rank's step (parallel/step.c)
 * takes from the pipeline boundaries (parallel/boundary.c: the messages
 * between neighbouring stages, re-sharded between stages of different
 * degrees, and the samples of a replica's micro-batches) and from the
 * tied embedding between a first and a last stage of different degrees
 * (parallel/tied.c). The public interface is executor/parallel/parallel.h.
 */
#ifndef PARTITA_EXECUTOR_PARALLEL_INTERNAL_H
#define PARTITA_EXECUTOR_PARALLEL_INTERNAL_H

#include "executor/parallel/parallel.h"

/* One message of a boundary: `count` floats at `offset` of the rank's
 * buffer (its output or input gradient when sending, its input or
 * output gradient when receiving), to or from `peer`. */
typedef struct boundary_part {
    int peer;
    size_t offset;
    size_t count;
} boundary_part;

/*
 * What a rank exchanges with one neighbouring stage, the same parts both
 * ways (the activation one way, its gradient the other). Between stages
 * of the same degrees one part: the rank's whole message to or from its
 * twin (shard t of replica d), as a symmetric plan has it. Between
 * stages of different degrees one part for each rank of the neighbour
 * whose boundary rows (pipeline_boundary_rows) meet the rank's own, in
 * the neighbour's rank order; received parts are then gathered over the
 * rank's tp group when its stage runs tp > 1 without sequence
 * parallelism (every shard needs the whole activation).
 */
typedef struct pipeline_boundary {
    int count;                   /* 0: no neighbour there */
    boundary_part *parts;        /* owned */
    bool gather;
    int tp;                      /* the gather's group: tp ranks from */
    int tp_first;                /* tp_first, each holding the floats */
    size_t rows;                 /* rows x t / tp .. rows x (t + 1) / tp */
    size_t row_floats;           /* of the buffer (hidden) */
} pipeline_boundary;

/* The boundary of `rank` with stage `neighbour` (its previous or next,
 * or the chunk's under interleaving). held_offset, held_count: the
 * rank's symmetric message (its sequence-parallel rows, or the whole
 * activation); packed: its buffers hold only its sequence-parallel rows
 * (the cuda backend). */
int pipeline_boundary_open(pipeline_boundary *out,
                           const pipeline_layout *layout, int rank,
                           int neighbour, size_t held_offset,
                           size_t held_count, bool packed, pt_error *err);
void pipeline_boundary_close(pipeline_boundary *boundary);
/* Sends each part of data (the buffer's start) under tag. */
int pipeline_boundary_send(const comm *c, const pipeline_boundary *boundary,
                           int tag, const float *data, pt_error *err);
/* Receives each part into data under tag, then gathers when it must. */
int pipeline_boundary_recv(const comm *c, const pipeline_boundary *boundary,
                           int tag, float *data, pt_error *err);

/* The windows a replica of stage `stage` trains on, micro-batch after
 * micro-batch (pipeline_layout: position p of micro-batch j is window
 * (p / mbs) gbs / dp + j mbs + p % mbs, replica e takes positions
 * [e b_s, (e + 1) b_s)): a pointer into tokens when they lie there in
 * that order (the plan's dp), else a copy in *owned (freed by the
 * caller). NULL when out of memory. */
const uint32_t *pipeline_replica_tokens(const pipeline_layout *layout,
                                        int stage, int replica,
                                        const uint32_t *tokens,
                                        uint32_t **owned, pt_error *err);

/*
 * The tied embedding between a first and a last stage of different
 * degrees (parallel/tied.c): data holds this rank's shard of the tied
 * tensor (rows x hidden, its vocabulary rows), each stage's full-batch
 * gradient on every replica of it; afterwards every replica of both
 * stages holds the sum of the two. Replica d of each stage, for each d
 * both stages have, sums the vocabulary rows it shares with each shard
 * of replica d of the other (pipeline_tied_segment, in row order); the
 * stage of more replicas then gives replica 0's rows to its others.
 * bf16: the stage keeps its gradients in bf16 (through its stream, as
 * grad_sync.c's).
 */
int pipeline_tied_sum(const comm *c, const pipeline_layout *layout,
                      model_stage *stage, void *data, bool bf16,
                      pt_error *err);

#endif
