/*
 * Private to the executor: the backends compiled into the library, for
 * backend_find. Not part of the public interface; executor/executor.h is.
 */
#ifndef PARTITA_EXECUTOR_BACKENDS_H
#define PARTITA_EXECUTOR_BACKENDS_H

#include "executor/executor.h"

/* The plain-C fp32 reference (model_cpu.c). */
extern const stage_backend cpu_stage_backend;

#endif
