/*
 * executor: trains a GPT-2-family model under a plan. This header is what
 * the command line uses (`partita exec`, `partita prep`): runs
 * (run_training, run_to_json, the MPI world of one process per rank) and
 * prep. The executor's wings each have their own header, for the code and
 * tests inside it (docs/architecture.md):
 *   executor/stage/stage.h        the model stage and the backend interface
 *   executor/cpu/cpu.h            the cpu backend (fp32 reference) and ops
 *   executor/cuda/cuda_backend.h  the cuda backend and the rank's device
 *   executor/comm/comm.h          communication between ranks
 *   executor/parallel/parallel.h  layouts, the pipeline step, launchers
 *   executor/data/data.h          datasets, samples, prep
 *   executor/run/run.h            runs, checkpoints, the run record
 *
 * Like every library of Partita, nothing here prints or exits: functions
 * that can fail return -1 and fill a pt_error.
 */
#ifndef PARTITA_EXECUTOR_H
#define PARTITA_EXECUTOR_H

#include "executor/data/data.h"
#include "executor/run/run.h"

#endif
