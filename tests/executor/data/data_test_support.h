/* Helpers shared by the tests of the executor's data half: a scratch
 * directory per test, whole-file reads and writes, a hand encoder of the
 * .idx layout written from the format description (independent of the
 * library's own writer), and message checks. */
#ifndef PARTITA_DATA_TEST_SUPPORT_H
#define PARTITA_DATA_TEST_SUPPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/scratch_tree.h"
#include "executor/data/data.h"

/* A private directory for one test; removed with everything in it. */
typedef struct scratch {
    char dir[256];
} scratch;

static inline int scratch_open(void **state)
{
    scratch *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -1;
    snprintf(s->dir, sizeof s->dir, "/tmp/partita-data-test-XXXXXX");
    if (mkdtemp(s->dir) == NULL) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static inline int scratch_close(void **state)
{
    scratch *s = *state;
    remove_scratch_tree(s->dir);
    free(s);
    return 0;
}

/* dir/name into out. */
static inline void scratch_path(void **state, const char *name, char *out,
                                size_t size)
{
    scratch *s = *state;
    int length = snprintf(out, size, "%s/%s", s->dir, name);
    assert_true(length > 0 && (size_t)length < size);
}

static inline void write_bytes(const char *path, const void *data,
                               size_t size)
{
    FILE *file = fopen(path, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite(data, 1, size, file), size);
    assert_int_equal(fclose(file), 0);
}

static inline void write_text(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

/* The whole file, malloc'd (caller frees) with a NUL after its end; *size
 * gets its length. */
static inline unsigned char *read_bytes(const char *path, size_t *size)
{
    FILE *file = fopen(path, "rb");
    assert_non_null(file);
    assert_int_equal(fseek(file, 0, SEEK_END), 0);
    long length = ftell(file);
    assert_true(length >= 0);
    rewind(file);
    unsigned char *data = malloc((size_t)length + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)length, file), (size_t)length);
    fclose(file);
    data[length] = 0;  /* lets a text file be searched as a string */
    *size = (size_t)length;
    return data;
}

static inline bool file_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* Entries in a directory other than . and .. (to find stray files). */
static inline int count_entries(const char *dir)
{
    int count = count_scratch_entries(dir, 0);
    assert_true(count >= 0);
    return count;
}

/* Fails the test unless message contains every one of the fragments. */
#define assert_message_has(message, ...)                                     \
    do {                                                                     \
        const char *fragments_[] = {__VA_ARGS__};                            \
        for (size_t i_ = 0; i_ < sizeof fragments_ / sizeof *fragments_;    \
             i_++)                                                           \
            if (strstr((message), fragments_[i_]) == NULL)                   \
                fail_msg("message \"%s\" lacks \"%s\"", (message),           \
                         fragments_[i_]);                                    \
    } while (0)

/* A test run inside its own scratch directory. */
#define SCRATCH_TEST(f)                                                      \
    cmocka_unit_test_setup_teardown(f, scratch_open, scratch_close)

/* ---------------------------------------------------- .idx by hand */

static inline void put_le(unsigned char *at, uint64_t value, int width)
{
    for (int i = 0; i < width; i++)
        at[i] = (unsigned char)(value >> (8 * i));
}

/* Builds an .idx from the table in the format description: magic,
 * version, dtype, S, D, int32 lengths, int64 pointers (running sum of
 * lengths x item size), int64 document indices. Returns malloc'd bytes. */
static inline unsigned char *hand_index(int dtype, int item_bytes,
                                        const int32_t *lengths, uint64_t s,
                                        const int64_t *doc_index, uint64_t d,
                                        size_t *size)
{
    *size = 34 + 12 * s + 8 * d;
    unsigned char *idx = calloc(1, *size);
    assert_non_null(idx);
    memcpy(idx, "MMIDIDX\0\0", 9);
    put_le(idx + 9, 1, 8);
    idx[17] = (unsigned char)dtype;
    put_le(idx + 18, s, 8);
    put_le(idx + 26, d, 8);
    int64_t pointer = 0;
    for (uint64_t i = 0; i < s; i++) {
        put_le(idx + 34 + 4 * i, (uint32_t)lengths[i], 4);
        put_le(idx + 34 + 4 * s + 8 * i, (uint64_t)pointer, 8);
        pointer += (int64_t)lengths[i] * item_bytes;
    }
    for (uint64_t j = 0; j < d; j++)
        put_le(idx + 34 + 12 * s + 8 * j, (uint64_t)doc_index[j], 8);
    return idx;
}

#endif
