/*
 * Private to executor/comm: what its implementations (threads, MPI,
 * NCCL, host-staged) share. The public interface is executor/comm/comm.h.
 */
#ifndef PARTITA_EXECUTOR_COMM_INTERNAL_H
#define PARTITA_EXECUTOR_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "executor/comm/comm.h"

/* The head of a message in a rank's mailbox (the threads comm, the
 * device exchange): each implementation's message starts with it. */
typedef struct comm_envelope {
    struct comm_envelope *next;
    int source;
    int tag;
} comm_envelope;

/* One rank's mailbox, oldest message first; the owner locks it. */
typedef struct comm_mailbox {
    comm_envelope *head;
    comm_envelope *tail;
} comm_mailbox;

void comm_mailbox_append(comm_mailbox *box, comm_envelope *message);
/* Unlinks the oldest message of (source, tag), or returns NULL: messages
 * of one source and tag leave in the order they came, others wait. */
comm_envelope *comm_mailbox_take(comm_mailbox *box, int source, int tag);

/* The moment `seconds` from now on CLOCK_MONOTONIC (the clock the
 * implementations' condition variables wait on), as a timespec. */
struct timespec comm_deadline_after(double seconds);

/* Longest reason a failure keeps (longer ones are cut). */
#define COMM_FAILURE_REASON_MAX 600

/*
 * The first failure of a world: the rank that failed first and what it
 * reported. The first record wins and later ones are dropped, so every
 * rank's error names the same cause. Owned by the world's shared state;
 * not locked: implementations whose ranks are threads record and read it
 * under their own lock.
 */
typedef struct comm_failure {
    int rank;                               /* -1: no failure yet */
    char reason[COMM_FAILURE_REASON_MAX];
} comm_failure;

void comm_failure_init(comm_failure *failure);
/* Records (rank, reason) unless a failure was recorded before; true when
 * this one was the first. */
bool comm_failure_record(comm_failure *failure, int rank, const char *reason);
/* comm_failure_record for the worlds whose ranks are threads (the
 * threads comm, the device exchange, NCCL), under the world's lock held
 * by the caller: the first failure also sets `failed` (polls read it
 * without the lock; may be NULL) and wakes `changed` (the world's waits;
 * may be NULL). True when this one was the first. */
bool comm_failure_mark(comm_failure *failure, atomic_bool *failed,
                       pthread_cond_t *changed, int rank,
                       const char *reason);
/* The rank that failed first, or -1; its reason into reason (may be
 * NULL; "" when none failed). */
int comm_failure_get(const comm_failure *failure, char *reason,
                     size_t reason_size);
/* Fills err for an operation of `rank` cut short by the failure ("rank 2:
 * recv interrupted: rank 0 failed: ..." or, for the rank that failed,
 * "... this rank already failed: ..."); returns -1. */
int comm_failure_interrupted(const comm_failure *failure, int rank,
                             const char *operation, pt_error *err);

#endif
