/*
 * The entry point every fuzz harness defines. Built two ways from the same
 * source: with clang's libFuzzer (tests/fuzz/run_campaigns.sh), and with
 * replay_main.c as a plain program that feeds saved inputs to it (the
 * `fuzz-replay` test suite of `make test`).
 */
#ifndef PARTITA_TESTS_FUZZ_H
#define PARTITA_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A private, empty directory made once per process (mkdtemp under
 * $TMPDIR or /tmp) for harnesses that need files; NULL if it cannot be
 * made. Removed at exit. */
const char *fuzz_scratch_dir(void);

/* Writes size bytes of data to path (created or truncated); 0, or -1
 * when the file cannot be written whole. */
int fuzz_write_file(const char *path, const void *data, size_t size);

struct plan;
/* Parses data as plan JSON (file named <scratch>/plan.json, so relative
 * references resolve into the empty scratch directory; absolute ones and
 * ".." are refused before reading). 0 when the plan loaded: free it with
 * plan_free. */
int fuzz_load_plan(const uint8_t *data, size_t size, struct plan *out);

#endif
