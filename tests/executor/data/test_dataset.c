/* The indexed-dataset reader and writer: round trips, hand-built files in
 * other dtypes, and every kind of corrupt file refused with a message that
 * names the file, the offset and the reason. */
#include "data_test_support.h"

#include <inttypes.h>

/* Writes PREFIX.idx and PREFIX.bin from raw bytes. */
static void write_dataset_files(void **state, const char *name,
                                const unsigned char *idx, size_t idx_size,
                                const void *bin, size_t bin_size, char *prefix,
                                size_t prefix_size)
{
    char path[600];
    scratch_path(state, name, prefix, prefix_size);
    snprintf(path, sizeof path, "%s.idx", prefix);
    write_bytes(path, idx, idx_size);
    snprintf(path, sizeof path, "%s.bin", prefix);
    write_bytes(path, bin, bin_size);
}

/* A valid uint16 dataset of 3 documents (lengths 2, 3, 1) by hand. */
static unsigned char *small_index(size_t *size)
{
    static const int32_t lengths[] = {2, 3, 1};
    static const int64_t documents[] = {0, 1, 2, 3};
    return hand_index(INDEXED_DTYPE_UINT16, 2, lengths, 3, documents, 4, size);
}

static const uint16_t small_bin[] = {10, 11, 20, 21, 22, 30};

/* Expects opening PREFIX to fail with all the given fragments. */
#define assert_open_fails(prefix, ...)                                       \
    do {                                                                     \
        indexed_dataset ds_;                                                 \
        pt_error err_ = {{0}};                                               \
        assert_int_equal(indexed_dataset_open(&ds_, (prefix), &err_), -1);   \
        assert_message_has(err_.message, __VA_ARGS__);                       \
    } while (0)

static void writer_round_trip_is_byte_exact(void **state)
{
    const uint32_t first[] = {1, 2, 3}, third[] = {65535, 0};
    const uint32_t *documents[] = {first, NULL, third};
    const uint64_t lengths[] = {3, 0, 2};
    char prefix[512], path[520];
    pt_error err = {{0}};
    scratch_path(state, "set", prefix, sizeof prefix);
    assert_int_equal(indexed_dataset_write(prefix, INDEXED_DTYPE_UINT16,
                                           documents, lengths, 3, &err), 0);

    /* Byte for byte what the format table prescribes. */
    const int32_t expected_lengths[] = {3, 0, 2};
    const int64_t expected_documents[] = {0, 1, 2, 3};
    size_t expected_size, idx_size, bin_size;
    unsigned char *expected = hand_index(INDEXED_DTYPE_UINT16, 2,
                                         expected_lengths, 3,
                                         expected_documents, 4, &expected_size);
    snprintf(path, sizeof path, "%s.idx", prefix);
    unsigned char *idx = read_bytes(path, &idx_size);
    assert_int_equal(idx_size, expected_size);
    assert_memory_equal(idx, expected, idx_size);
    snprintf(path, sizeof path, "%s.bin", prefix);
    unsigned char *bin = read_bytes(path, &bin_size);
    const unsigned char expected_bin[] = {1, 0, 2, 0, 3, 0, 0xff, 0xff, 0, 0};
    assert_int_equal(bin_size, sizeof expected_bin);
    assert_memory_equal(bin, expected_bin, bin_size);
    free(expected);
    free(idx);
    free(bin);

    indexed_dataset ds;
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    assert_int_equal(ds.dtype, INDEXED_DTYPE_UINT16);
    assert_int_equal(ds.sequence_count, 3);
    assert_int_equal(ds.document_count, 3);
    assert_int_equal(ds.total_tokens, 5);
    assert_false(ds.has_modes);
    uint32_t tokens[3];
    assert_int_equal(indexed_dataset_read_tokens(&ds, 2, 0, 2, tokens, &err),
                     0);
    assert_int_equal(tokens[0], 65535);
    assert_int_equal(tokens[1], 0);
    assert_int_equal(indexed_dataset_read_tokens(&ds, 0, 1, 2, tokens, &err),
                     0);
    assert_int_equal(tokens[0], 2);
    assert_int_equal(tokens[1], 3);
    assert_int_equal(indexed_dataset_document_length(&ds, 1), 0);
    indexed_dataset_close(&ds);
    /* Only the two published files remain: no temporaries. */
    assert_int_equal(count_entries(((scratch *)*state)->dir), 2);
}

/* int32 tokens, a document made of two sequences, a token above 65535. */
static void hand_built_int32_dataset_reads(void **state)
{
    const int32_t lengths[] = {2, 1, 3};
    const int64_t documents[] = {0, 2, 3};
    const int32_t bin[] = {5, 100000, 7, 8, 9, 2147483647};
    size_t idx_size;
    unsigned char *idx = hand_index(INDEXED_DTYPE_INT32, 4, lengths, 3,
                                    documents, 3, &idx_size);
    unsigned char bin_bytes[sizeof bin];
    for (size_t i = 0; i < 6; i++)
        put_le(bin_bytes + 4 * i, (uint32_t)bin[i], 4);
    char prefix[512];
    write_dataset_files(state, "int32", idx, idx_size, bin_bytes,
                        sizeof bin_bytes, prefix, sizeof prefix);
    free(idx);

    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    assert_int_equal(ds.dtype, INDEXED_DTYPE_INT32);
    assert_int_equal(ds.item_bytes, 4);
    assert_int_equal(ds.document_count, 2);
    assert_int_equal(ds.total_tokens, 6);
    uint64_t first, end;
    indexed_dataset_document_sequences(&ds, 0, &first, &end);
    assert_int_equal(first, 0);
    assert_int_equal(end, 2);
    assert_int_equal(indexed_dataset_document_length(&ds, 0), 3);
    assert_int_equal(indexed_dataset_document_length(&ds, 1), 3);
    assert_int_equal(indexed_dataset_sequence_offset(&ds, 2), 12);
    uint32_t tokens[3];
    assert_int_equal(indexed_dataset_read_tokens(&ds, 0, 0, 2, tokens, &err),
                     0);
    assert_int_equal(tokens[1], 100000);
    assert_int_equal(indexed_dataset_read_tokens(&ds, 2, 0, 3, tokens, &err),
                     0);
    assert_int_equal(tokens[0], 8);
    assert_int_equal(tokens[2], 2147483647u);
    /* Past the end of a sequence is refused, not read. */
    assert_int_equal(indexed_dataset_read_tokens(&ds, 1, 0, 2, tokens, &err),
                     -1);
    assert_message_has(err.message, "past the end of sequence 1");
    assert_int_equal(indexed_dataset_read_tokens(&ds, 3, 0, 1, tokens, &err),
                     -1);
    assert_message_has(err.message, "sequence 3 does not exist");
    indexed_dataset_close(&ds);
}

static void every_integer_dtype_round_trips(void **state)
{
    const struct {
        int code;
        uint32_t largest;
    } cases[] = {
        {INDEXED_DTYPE_UINT8, 255},       {INDEXED_DTYPE_INT8, 127},
        {INDEXED_DTYPE_INT16, 32767},     {INDEXED_DTYPE_INT32, 2147483647u},
        {INDEXED_DTYPE_INT64, 4294967295u}, {INDEXED_DTYPE_UINT16, 65535},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const uint32_t document[] = {0, 1, cases[c].largest};
        const uint32_t *documents[] = {document};
        const uint64_t lengths[] = {3};
        char name[32], prefix[512];
        snprintf(name, sizeof name, "dtype%d", cases[c].code);
        scratch_path(state, name, prefix, sizeof prefix);
        pt_error err = {{0}};
        assert_int_equal(indexed_dataset_write(prefix, cases[c].code,
                                               documents, lengths, 1, &err),
                         0);
        indexed_dataset ds;
        assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
        assert_int_equal(ds.item_bytes, indexed_dtype_size(cases[c].code));
        uint32_t tokens[3];
        assert_int_equal(indexed_dataset_read_tokens(&ds, 0, 0, 3, tokens,
                                                     &err), 0);
        assert_memory_equal(tokens, document, sizeof tokens);
        indexed_dataset_close(&ds);

        /* One more than the largest value does not fit: nothing written. */
        if (cases[c].largest == UINT32_MAX)
            continue;
        const uint32_t too_big[] = {cases[c].largest + 1};
        const uint32_t *bad_documents[] = {too_big};
        const uint64_t bad_lengths[] = {1};
        char bad_prefix[512], path[520];
        snprintf(name, sizeof name, "dtype%d-bad", cases[c].code);
        scratch_path(state, name, bad_prefix, sizeof bad_prefix);
        assert_int_equal(indexed_dataset_write(bad_prefix, cases[c].code,
                                               bad_documents, bad_lengths, 1,
                                               &err), -1);
        assert_message_has(err.message, "does not fit",
                           indexed_dtype_name(cases[c].code));
        snprintf(path, sizeof path, "%s.bin", bad_prefix);
        assert_false(file_exists(path));
    }
    /* Two files per good dtype, nothing else (no temporaries). */
    assert_int_equal(count_entries(((scratch *)*state)->dir), 12);
}

static void negative_token_is_refused_on_read(void **state)
{
    const int32_t lengths[] = {2};
    const int64_t documents[] = {0, 1};
    size_t idx_size;
    unsigned char *idx = hand_index(INDEXED_DTYPE_INT32, 4, lengths, 1,
                                    documents, 2, &idx_size);
    unsigned char bin[8];
    put_le(bin, 3, 4);
    put_le(bin + 4, (uint32_t)-7, 4);
    char prefix[512];
    write_dataset_files(state, "neg", idx, idx_size, bin, sizeof bin, prefix,
                        sizeof prefix);
    free(idx);
    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    uint32_t tokens[2];
    assert_int_equal(indexed_dataset_read_tokens(&ds, 0, 0, 2, tokens, &err),
                     -1);
    assert_message_has(err.message, "neg.bin", "offset 4", "negative");
    indexed_dataset_close(&ds);
}

static void wrong_magic_is_refused(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    idx[0] = 'N';
    char prefix[512];
    write_dataset_files(state, "magic", idx, size, small_bin, sizeof small_bin,
                        prefix, sizeof prefix);
    free(idx);
    assert_open_fails(prefix, "magic.idx", "offset 0", "magic",
                      "not a Megatron indexed dataset");
}

static void wrong_version_is_refused(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    put_le(idx + 9, 2, 8);
    char prefix[512];
    write_dataset_files(state, "version", idx, size, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    free(idx);
    assert_open_fails(prefix, "version.idx", "offset 9 (version)", "2",
                      "only version 1");
}

static void non_integer_dtypes_are_refused(void **state)
{
    const int codes[] = {0, INDEXED_DTYPE_FLOAT64, INDEXED_DTYPE_FLOAT32, 9};
    const char *names[] = {"unknown", "float64", "float32", "unknown"};
    for (int c = 0; c < 4; c++) {
        size_t size;
        unsigned char *idx = small_index(&size);
        idx[17] = (unsigned char)codes[c];
        char prefix[512];
        write_dataset_files(state, "dtype", idx, size, small_bin,
                            sizeof small_bin, prefix, sizeof prefix);
        free(idx);
        assert_open_fails(prefix, "dtype.idx", "offset 17 (dtype)", names[c],
                          "integer tokens");
    }
}

static void truncated_index_is_refused(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    char prefix[512];
    write_dataset_files(state, "short", idx, size - 1, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    free(idx);
    assert_open_fails(prefix, "short.idx", "3 sequences and 4 document "
                      "indices need 102 bytes", "truncated");
}

/* Every proper prefix of a valid .idx fails cleanly with the file named:
 * no read past the end (ASan would catch it), no crash. */
static void every_prefix_truncation_is_refused(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    char prefix[512];
    for (size_t length = 0; length < size; length++) {
        write_dataset_files(state, "prefix", idx, length, small_bin,
                            sizeof small_bin, prefix, sizeof prefix);
        assert_open_fails(prefix, "prefix.idx", "offset");
    }
    write_dataset_files(state, "prefix", idx, size, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    indexed_dataset_close(&ds);
    free(idx);
}

static void lengths_overrunning_the_bin_are_refused(void **state)
{
    const int32_t lengths[] = {2, 3, 4};  /* 9 tokens, the .bin holds 6 */
    const int64_t documents[] = {0, 1, 2, 3};
    size_t size;
    unsigned char *idx = hand_index(INDEXED_DTYPE_UINT16, 2, lengths, 3,
                                    documents, 4, &size);
    char prefix[512];
    write_dataset_files(state, "overrun", idx, size, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    free(idx);
    /* The third length sits at 34 + 4 x 2. */
    assert_open_fails(prefix, "overrun.idx", "offset 42 (length of sequence 2)",
                      "overrun.bin has only 12 bytes", "overrun the .bin");
}

static void bin_longer_than_described_is_refused(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    const uint16_t longer[] = {10, 11, 20, 21, 22, 30, 40};
    char prefix[512];
    write_dataset_files(state, "long", idx, size, longer, sizeof longer,
                        prefix, sizeof prefix);
    free(idx);
    assert_open_fails(prefix, "long.bin: 14 bytes", "describes 12 bytes");
}

static void inconsistent_pointer_is_refused(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    put_le(idx + 34 + 12 + 8, 6, 8);  /* pointer of sequence 1: 4 -> 6 */
    char prefix[512];
    write_dataset_files(state, "pointer", idx, size, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    free(idx);
    assert_open_fails(prefix, "pointer.idx", "offset 54 (pointer of sequence "
                      "1): 6, expected 4");
}

static void negative_length_is_refused(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    put_le(idx + 34, (uint32_t)-1, 4);
    char prefix[512];
    write_dataset_files(state, "negative", idx, size, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    free(idx);
    assert_open_fails(prefix, "negative.idx",
                      "offset 34 (length of sequence 0)", "-1 is negative");
}

static void non_monotone_document_index_is_refused(void **state)
{
    const int32_t lengths[] = {2, 3, 1};
    const int64_t documents[] = {0, 2, 1, 3};
    size_t size;
    unsigned char *idx = hand_index(INDEXED_DTYPE_UINT16, 2, lengths, 3,
                                    documents, 4, &size);
    char prefix[512];
    write_dataset_files(state, "order", idx, size, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    free(idx);
    /* Document index 2 sits at 34 + 12 x 3 + 8 x 2 = 86. */
    assert_open_fails(prefix, "order.idx", "offset 86 (document index 2)",
                      "must never decrease");
}

static void document_index_ends_must_match(void **state)
{
    const int32_t lengths[] = {2, 3, 1};
    const int64_t not_from_zero[] = {1, 2, 3};
    const int64_t short_of_count[] = {0, 1, 2};
    const int64_t past_count[] = {0, 4, 3};
    const int64_t *cases[] = {not_from_zero, short_of_count, past_count};
    const char *reasons[] = {"offset 70 (document index 0): 1, must be 0",
                             "offset 86 (document index 2): 2, the last entry "
                             "must equal the sequence count 3",
                             "offset 78 (document index 1): 4 is past the "
                             "sequence count"};
    for (int c = 0; c < 3; c++) {
        size_t size;
        unsigned char *idx = hand_index(INDEXED_DTYPE_UINT16, 2, lengths, 3,
                                        cases[c], 3, &size);
        char prefix[512];
        write_dataset_files(state, "ends", idx, size, small_bin,
                            sizeof small_bin, prefix, sizeof prefix);
        free(idx);
        assert_open_fails(prefix, "ends.idx", reasons[c]);
    }
}

/* The multimodal int8[S] tail is accepted; any other tail is not. */
static void trailing_bytes_only_as_sequence_modes(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    unsigned char *longer = calloc(1, size + 4);
    assert_non_null(longer);
    memcpy(longer, idx, size);
    char prefix[512];
    write_dataset_files(state, "modes", longer, size + 3, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    assert_true(ds.has_modes);
    indexed_dataset_close(&ds);
    write_dataset_files(state, "modes", longer, size + 4, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    assert_open_fails(prefix, "modes.idx", "offset 102", "4 bytes follow");
    free(idx);
    free(longer);
}

static void missing_bin_is_named(void **state)
{
    size_t size;
    unsigned char *idx = small_index(&size);
    char prefix[512], path[520];
    write_dataset_files(state, "nobin", idx, size, small_bin,
                        sizeof small_bin, prefix, sizeof prefix);
    free(idx);
    snprintf(path, sizeof path, "%s.bin", prefix);
    assert_int_equal(unlink(path), 0);
    assert_open_fails(prefix, "nobin.bin", "cannot open");
    scratch_path(state, "absent", prefix, sizeof prefix);
    assert_open_fails(prefix, "absent.idx", "cannot open");
}

static void empty_dataset_opens(void **state)
{
    char prefix[512];
    pt_error err = {{0}};
    scratch_path(state, "empty", prefix, sizeof prefix);
    assert_int_equal(indexed_dataset_write(prefix, INDEXED_DTYPE_UINT16, NULL,
                                           NULL, 0, &err), 0);
    indexed_dataset ds;
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    assert_int_equal(ds.sequence_count, 0);
    assert_int_equal(ds.document_count, 0);
    assert_int_equal(ds.total_tokens, 0);
    assert_null(ds.bin_map);
    indexed_dataset_close(&ds);
}

static void writer_abort_leaves_nothing(void **state)
{
    char prefix[512];
    pt_error err = {{0}};
    scratch_path(state, "aborted", prefix, sizeof prefix);
    indexed_writer writer;
    assert_int_equal(indexed_writer_begin(&writer, prefix, INDEXED_DTYPE_UINT16,
                                          &err), 0);
    const uint32_t tokens[] = {1, 2, 3};
    assert_int_equal(indexed_writer_add_document(&writer, tokens, 3, &err), 0);
    indexed_writer_abort(&writer);
    indexed_writer_abort(&writer);  /* twice is harmless */
    assert_int_equal(count_entries(((scratch *)*state)->dir), 0);
    assert_int_equal(indexed_writer_commit(&writer, &err), -1);
    assert_int_equal(indexed_writer_begin(&writer, prefix,
                                          INDEXED_DTYPE_FLOAT32, &err), -1);
    assert_message_has(err.message, "float32", "cannot hold token ids");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        SCRATCH_TEST(writer_round_trip_is_byte_exact),
        SCRATCH_TEST(hand_built_int32_dataset_reads),
        SCRATCH_TEST(every_integer_dtype_round_trips),
        SCRATCH_TEST(negative_token_is_refused_on_read),
        SCRATCH_TEST(wrong_magic_is_refused),
        SCRATCH_TEST(wrong_version_is_refused),
        SCRATCH_TEST(non_integer_dtypes_are_refused),
        SCRATCH_TEST(truncated_index_is_refused),
        SCRATCH_TEST(every_prefix_truncation_is_refused),
        SCRATCH_TEST(lengths_overrunning_the_bin_are_refused),
        SCRATCH_TEST(bin_longer_than_described_is_refused),
        SCRATCH_TEST(inconsistent_pointer_is_refused),
        SCRATCH_TEST(negative_length_is_refused),
        SCRATCH_TEST(non_monotone_document_index_is_refused),
        SCRATCH_TEST(document_index_ends_must_match),
        SCRATCH_TEST(trailing_bytes_only_as_sequence_modes),
        SCRATCH_TEST(missing_bin_is_named),
        SCRATCH_TEST(empty_dataset_opens),
        SCRATCH_TEST(writer_abort_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
