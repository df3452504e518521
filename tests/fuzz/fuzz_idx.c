/*
 * Fuzzes the Megatron .idx reader. Input layout: two bytes (little-endian)
 * give the size of PREFIX.bin, the rest is PREFIX.idx as written. The .bin
 * is filled with a fixed byte pattern whose signed values include negative
 * ones, so the token range checks run too. After a successful open every
 * accessor is called and every sequence read (up to a bound).
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "executor/data/data.h"

/* Tokens read at most per input, so a large dataset stays fast. */
enum { FUZZ_TOKEN_BUDGET = 1 << 14 };

static int write_bin(const char *path, size_t size)
{
    uint8_t *bytes = malloc(size > 0 ? size : 1);
    if (bytes == NULL)
        return -1;
    for (size_t i = 0; i < size; i++)
        bytes[i] = (uint8_t)(i * 37u + 11u);
    int status = fuzz_write_file(path, bytes, size);
    free(bytes);
    return status;
}

static void read_everything(const indexed_dataset *ds)
{
    uint32_t tokens[256];
    uint64_t budget = FUZZ_TOKEN_BUDGET;
    pt_error err;
    for (uint64_t d = 0; d < ds->document_count && budget > 0; d++) {
        uint64_t first = 0, end = 0;
        indexed_dataset_document_sequences(ds, d, &first, &end);
        if (first > end || end > ds->sequence_count)
            abort(); /* validated documents must lie inside the sequences */
        (void)indexed_dataset_document_length(ds, d);
    }
    for (uint64_t s = 0; s < ds->sequence_count && budget > 0; s++) {
        uint64_t length = indexed_dataset_sequence_length(ds, s);
        (void)indexed_dataset_sequence_offset(ds, s);
        uint64_t count = length < 256 ? length : 256;
        if (count > budget)
            count = budget;
        budget -= count;
        (void)indexed_dataset_read_tokens(ds, s, 0, count, tokens, &err);
        /* One past the end must be refused, not read. */
        if (indexed_dataset_read_tokens(ds, s, length, 1, tokens, &err) == 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const char *dir = fuzz_scratch_dir();
    if (dir == NULL)
        return 0;
    size_t bin_size = (size_t)data[0] | (size_t)data[1] << 8;
    char prefix[600], idx_path[640], bin_path[640];
    snprintf(prefix, sizeof prefix, "%s/data", dir);
    snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
    snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
    if (fuzz_write_file(idx_path, data + 2, size - 2) != 0 ||
        write_bin(bin_path, bin_size) != 0)
        return 0;
    indexed_dataset ds;
    pt_error err;
    if (indexed_dataset_open(&ds, prefix, &err) == 0) {
        read_everything(&ds);
        indexed_dataset_close(&ds);
    }
    return 0;
}
