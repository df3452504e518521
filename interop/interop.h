/*
 * interop: a plan in the terms of the trainers most users keep, Megatron-LM
 * and DeepSpeed. Turns a plan into a Megatron-LM launch script
 * (megatron.c) or a DeepSpeed ds_config (deepspeed.c), and says in notes
 * what those trainers cannot be told (layout.c). docs/interop.md gives
 * every mapping and the versions it follows. Reading their logs back is
 * report/'s (report.h, "Training logs").
 */
#ifndef PARTITA_INTEROP_H
#define PARTITA_INTEROP_H

#include "common/common.h"

/* The trainers a plan can be exported to. */
typedef enum interop_target {
    INTEROP_MEGATRON,
    INTEROP_DEEPSPEED
} interop_target;

/* "megatron", "deepspeed"; the trainer's own name for messages. */
const char *interop_target_name(interop_target target);
const char *interop_target_title(interop_target target);
/* -1 when name is neither "megatron" nor "deepspeed". */
int interop_target_from_name(const char *name);

/* ---------------------------------------------------------------- hosts */

/* One node of the plan in pipeline order: the launch's host list, whose
 * order places the ranks (both trainers number ranks host by host in the
 * order they are given, as Partita does). */
typedef struct interop_host {
    char host[PT_NAME_MAX];  /* placeholder host name: "a10-3" */
    char node[PT_NAME_MAX];  /* the cluster's name of the node: "a10[3]" */
    const char *gpu;         /* its GPU type (borrowed from the plan) */
    int gpus;
    int first_rank;
} interop_host;

/* The plan's nodes in its node order (caller frees); NULL when out of
 * memory. */
interop_host *interop_hosts(const plan *p, pt_error *err);

/* The hosts that hold a stage's ranks: indices first to last of hosts.
 * Fills "a10[0], A10-FASOP" or "a100[0]..a100[11], A100-40GB" (or "GPU
 * types mixed") into nodes when it is not NULL. */
void interop_stage_hosts(const plan *p, const interop_host *hosts, int stage,
                         int *first, int *last, char *nodes, size_t size);

/* ------------------------------------------------------------ partition */

/* How a partition reaches Megatron-LM: its own even split (no flag), the
 * first and last stages' layer counts with the rest split evenly
 * (--decoder-first/last-pipeline-num-layers, Megatron-core 0.9 and later),
 * or a stage-by-stage layout (--pipeline-model-parallel-layout, 0.13 and
 * later). */
typedef enum megatron_split {
    MEGATRON_SPLIT_EVEN,
    MEGATRON_SPLIT_FIRST_LAST,
    MEGATRON_SPLIT_LAYOUT
} megatron_split;

typedef struct megatron_partition {
    megatron_split split;
    int first_layers;   /* FIRST_LAST: the flag's value, 0 = flag not given */
    int last_layers;
} megatron_partition;

/* The simplest form that gives exactly the plan's partition. */
megatron_partition interop_megatron_partition(const plan *p);

/* The layout of --pipeline-model-parallel-layout: "E|t*11|t*8|...|t*5|L"
 * (E the embedding, t a transformer layer, L the loss, | between
 * stages). Fails when size is too small. */
int interop_megatron_layout(const plan *p, char *out, size_t size,
                            pt_error *err);

/* "0,11,8,8": layers per stage, comma-separated (FASOP's --balance). */
void interop_balance_list(const plan *p, char *out, size_t size);

/* ---------------------------------------------------------------- notes */

#define INTEROP_MAX_NOTES 12
#define INTEROP_NOTE_MAX 480

/* What the plan asks that the trainer cannot be told, or must be told
 * with care: one sentence each. */
typedef struct interop_notes {
    int count;
    char text[INTEROP_MAX_NOTES][INTEROP_NOTE_MAX];
} interop_notes;

void interop_notes_of(const plan *p, interop_target target,
                      interop_notes *out);

/* ------------------------------------- stages of their own degrees */

/* 0 when every stage of p runs the plan's tp and dp; else -1 with err
 * naming the first stage that does not and saying that `target` runs one
 * tp and one dp for every stage (issue 36; symmetric.c). */
int interop_check_symmetric(const plan *p, interop_target target,
                            pt_error *err);

/* The nearest symmetric plan to p (docs/interop.md): the same stages,
 * layers per stage, node order and levers, at the one tp x dp (tp x dp x
 * pp = the plan's GPUs, tp splitting the model's heads, dp the global
 * batch) that the fewest stages change their tp for, then the fewest
 * their dp, then the smaller tp; mbs keeps each micro-batch's dp x mbs
 * samples when the new dp divides them, else 1. Read back through the
 * plan reader (plan_file names it in messages), so *out is checked as
 * any plan is; `said` tells what was chosen. -1 with err when no such
 * plan exists. */
int interop_nearest_symmetric(const plan *p, const char *plan_file,
                              plan *out, char *said, size_t said_size,
                              pt_error *err);

/* --------------------------------------------------------------- export */

/* The bash script that launches the plan under Megatron-LM (torchrun per
 * node, or one srun), with the notes in its header; plan_file names the
 * plan in comments. Fails (plan.tp named) when Megatron-LM cannot run the
 * plan at all. Caller frees. */
char *interop_megatron_script(const plan *p, const char *plan_file,
                              pt_error *err);

/* The ds_config of the plan, with a "partita" block DeepSpeed does not
 * read: the partition as PipelineModule boundaries, the hostfile, the
 * notes. NULL with err when out of memory. */
json_t *interop_deepspeed_config(const plan *p, const char *plan_file,
                                 pt_error *err);

#endif
