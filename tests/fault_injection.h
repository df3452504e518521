/* Faults a test injects into the system calls the libraries make: a
 * test executable linked with -Wl,--wrap=read,--wrap=rename (meson:
 * fault_link_args in tests/meson.build) gets fault_injection.c's
 * wrappers, which pass every call through until a test arms a fault.
 * This reaches what no file on disk can cause: a read that fails in the
 * middle of a file (EIO, ENOMEM), or the second rename of a pair. */
#ifndef PARTITA_TESTS_FAULT_INJECTION_H
#define PARTITA_TESTS_FAULT_INJECTION_H

#include <stdbool.h>

/* The next `calls_before` reads succeed, then one fails with `error`;
 * the calls after it succeed again. -1 (the default) fails none. */
void fault_fail_read_after(long calls_before, int error);
/* The same for rename(2). */
void fault_fail_rename_after(long calls_before, int error);
/* No faults. */
void fault_clear(void);
/* Whether an armed read fault failed a read since it was armed. */
bool fault_read_fired(void);

#endif
