/*
 * plan_speed's two tables share this: the in-process search times
 * against FASOP (plan_speed.c) and issue 14's cases as whole `partita`
 * processes (plan_scale.c).
 */
#ifndef PARTITA_BENCH_PLAN_SPEED_H
#define PARTITA_BENCH_PLAN_SPEED_H

#include "planner/internal.h"

/* What the scale table runs. */
typedef struct scale_arguments {
    char partita[PT_PATH_MAX];  /* the binary built beside plan_speed */
    char root[PT_PATH_MAX];     /* the source tree (models, clusters) */
    int scale_runs;             /* runs of each command (median) */
    int random_clusters;        /* random 20-node clusters timed */
    bool with_exhaustive;       /* also time the 160-GPU case exhaustively */
} scale_arguments;

/* Prints the table; -1 with err when it cannot run. */
int scale_table(const scale_arguments *args, pt_error *err);

#endif
