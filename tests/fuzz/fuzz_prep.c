/*
 * Fuzzes `partita prep` (executor/data/prep.c) whole: the first byte
 * picks the format (bit 0: plain text or JSON lines) and a read(2) to
 * fail (bits 1-2: none, or the 1st, 2nd or 3rd call, failed with ENOMEM
 * by tests/fault_injection.c, as getline's failure was taken for the end
 * of the file); the rest is written as <scratch>/in.txt and prepped to
 * <scratch>/out. A refusal leaves no output and no temporary file; a
 * failed read is always a refusal; an accepted input gives a dataset
 * that opens with the documents prep counted.
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor/data/data.h"
#include "tests/fault_injection.h"

/* Entries of dir beside in.txt (outputs, temporaries). */
static int entries_beside_input(const char *dir)
{
    DIR *listing = opendir(dir);
    if (listing == NULL)
        abort();
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL)
        if (strcmp(entry->d_name, ".") != 0 &&
            strcmp(entry->d_name, "..") != 0 &&
            strcmp(entry->d_name, "in.txt") != 0)
            count++;
    closedir(listing);
    return count;
}

/* The dataset prep wrote must hold what it counted. */
static void check_dataset(const char *prefix, const prep_stats *stats)
{
    indexed_dataset ds;
    pt_error err;
    if (indexed_dataset_open(&ds, prefix, &err) != 0)
        abort();
    if (ds.document_count != stats->documents ||
        ds.total_tokens != stats->tokens || stats->documents == 0)
        abort();
    indexed_dataset_close(&ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch_dir();
    if (dir == NULL || size == 0)
        return 0;
    prep_format format = data[0] & 1 ? PREP_FORMAT_JSONL : PREP_FORMAT_TEXT;
    int failing_read = (data[0] >> 1) & 3;
    char input[600], prefix[600], path[620];
    snprintf(input, sizeof input, "%s/in.txt", dir);
    snprintf(prefix, sizeof prefix, "%s/out", dir);
    if (fuzz_write_file(input, data + 1, size - 1) != 0)
        return 0;
    if (failing_read > 0)
        fault_fail_read_after(failing_read - 1, ENOMEM);
    prep_stats stats;
    pt_error err;
    int status = prep_run(input, format, prefix, &stats, &err);
    bool read_failed = fault_read_fired();
    fault_clear();
    if (status != 0) {
        if (entries_beside_input(dir) != 0 ||
            strncmp(err.message, input, strlen(input)) != 0)
            abort();
        return 0;
    }
    if (read_failed)
        abort();  /* a failed read taken for the end of the input */
    check_dataset(prefix, &stats);
    snprintf(path, sizeof path, "%s.bin", prefix);
    unlink(path);
    snprintf(path, sizeof path, "%s.idx", prefix);
    unlink(path);
    return 0;
}
