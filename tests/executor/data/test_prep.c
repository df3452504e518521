/* prep: text and JSON lines to .bin/.idx. Tokens read back equal the
 * document bytes plus the end-of-document token, the files match the
 * format byte for byte, and a failing run leaves no file behind. */
#include "data_test_support.h"

/* Opens PREFIX and checks that document d holds exactly text[d] + EOD. */
static void assert_documents(const char *prefix, const char *const *texts,
                             const size_t *sizes, int count)
{
    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    assert_int_equal(ds.dtype, INDEXED_DTYPE_UINT16);
    assert_int_equal(ds.document_count, (uint64_t)count);
    assert_int_equal(ds.sequence_count, (uint64_t)count);
    for (int d = 0; d < count; d++) {
        assert_int_equal(indexed_dataset_sequence_length(&ds, (uint64_t)d),
                         sizes[d] + 1);
        uint32_t *tokens = calloc(sizes[d] + 1, sizeof *tokens);
        assert_non_null(tokens);
        assert_int_equal(indexed_dataset_read_tokens(&ds, (uint64_t)d, 0,
                                                     sizes[d] + 1, tokens,
                                                     &err), 0);
        for (size_t i = 0; i < sizes[d]; i++)
            assert_int_equal(tokens[i], (unsigned char)texts[d][i]);
        assert_int_equal(tokens[sizes[d]], PREP_EOD_TOKEN);
        free(tokens);
    }
    indexed_dataset_close(&ds);
}

static void text_round_trip(void **state)
{
    char input[512], prefix[512];
    scratch_path(state, "in.txt", input, sizeof input);
    scratch_path(state, "out", prefix, sizeof prefix);
    /* Blank lines of spaces, tabs and CRLF separate documents too; leading
     * and repeated separators make no empty documents. */
    write_text(input, "\n\nHello world,\n  indented second line\n\n\n \t\n"
                      "Doc two\r\n\r\nlast, no newline");
    prep_stats stats;
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, prefix, &stats, &err),
                     0);
    const char *texts[] = {"Hello world,\n  indented second line", "Doc two",
                           "last, no newline"};
    const size_t sizes[] = {strlen(texts[0]), strlen(texts[1]),
                            strlen(texts[2])};
    assert_documents(prefix, texts, sizes, 3);
    assert_int_equal(stats.documents, 3);
    assert_int_equal(stats.text_bytes, sizes[0] + sizes[1] + sizes[2]);
    assert_int_equal(stats.tokens, stats.text_bytes + 3);
    assert_int_equal(stats.bin_bytes, 2 * stats.tokens);
    assert_int_equal(stats.idx_bytes, 34 + 12 * 3 + 8 * 4);
    size_t input_size;
    free(read_bytes(input, &input_size));
    assert_int_equal(stats.input_bytes, input_size);
}

static void jsonl_round_trip(void **state)
{
    char input[512], prefix[512];
    scratch_path(state, "in.jsonl", input, sizeof input);
    scratch_path(state, "out", prefix, sizeof prefix);
    write_text(input, "{\"text\": \"caf\\u00e9 \\\"quoted\\\"\\nline\", "
                      "\"id\": 1}\n"
                      "\n"
                      "{\"text\": \"\"}\n"
                      "{\"meta\": {}, \"text\": \"nul\\u0000inside\"}");
    prep_stats stats;
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_JSONL, prefix, &stats, &err),
                     0);
    const char *texts[] = {"caf\xc3\xa9 \"quoted\"\nline", "",
                           "nul\0inside"};
    const size_t sizes[] = {strlen(texts[0]), 0, 10};
    assert_documents(prefix, texts, sizes, 3);
    assert_int_equal(stats.documents, 3);
    assert_int_equal(stats.tokens, sizes[0] + 1 + 1 + 11);
}

/* The .idx prep writes is exactly the one the format table describes,
 * one sequence per document, document indices 0, 1, ..., S. */
static void prep_output_matches_the_format(void **state)
{
    char input[512], prefix[512], path[520];
    scratch_path(state, "in.txt", input, sizeof input);
    scratch_path(state, "out", prefix, sizeof prefix);
    write_text(input, "ab\n\ncde\n\nf\n");
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, prefix, NULL, &err), 0);
    const int32_t lengths[] = {3, 4, 2};
    const int64_t documents[] = {0, 1, 2, 3};
    size_t expected_size, idx_size, bin_size;
    unsigned char *expected = hand_index(INDEXED_DTYPE_UINT16, 2, lengths, 3,
                                         documents, 4, &expected_size);
    snprintf(path, sizeof path, "%s.idx", prefix);
    unsigned char *idx = read_bytes(path, &idx_size);
    assert_int_equal(idx_size, expected_size);
    assert_memory_equal(idx, expected, idx_size);
    snprintf(path, sizeof path, "%s.bin", prefix);
    unsigned char *bin = read_bytes(path, &bin_size);
    const unsigned char expected_bin[] = {'a', 0, 'b', 0, 0, 1,   'c', 0, 'd',
                                          0,   'e', 0, 0, 1, 'f', 0,   0, 1};
    assert_int_equal(bin_size, sizeof expected_bin);
    assert_memory_equal(bin, expected_bin, bin_size);
    free(expected);
    free(idx);
    free(bin);
}

/* Runs prep expecting failure; the scratch directory must then hold only
 * the files it held before (no output, no temporary). */
static void assert_prep_fails_cleanly(void **state, const char *input,
                                      prep_format format, const char *prefix)
{
    int before = count_entries(((scratch *)*state)->dir);
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, format, prefix, NULL, &err), -1);
    assert_int_equal(count_entries(((scratch *)*state)->dir), before);
    print_message("refused as expected: %s\n", err.message);
}

static void missing_input_leaves_no_files(void **state)
{
    char input[512], prefix[512];
    scratch_path(state, "absent.txt", input, sizeof input);
    scratch_path(state, "out", prefix, sizeof prefix);
    assert_prep_fails_cleanly(state, input, PREP_FORMAT_TEXT, prefix);
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, prefix, NULL, &err), -1);
    assert_message_has(err.message, "absent.txt", "cannot open");
    assert_int_equal(count_entries(((scratch *)*state)->dir), 0);
}

static void bad_json_line_is_named_and_leaves_no_files(void **state)
{
    const struct {
        const char *content;
        const char *reason;
    } cases[] = {
        {"{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"body\": \"c\"}\n",
         "in.jsonl:3: the object has no \"text\" field"},
        {"{\"text\": \"a\"}\n\n{\"text\": 5}\n", "in.jsonl:3: \"text\" must "
                                                 "be a string"},
        {"{\"text\": \"a\"}\n[\"text\"]\n", "in.jsonl:2: not a JSON object"},
        {"{\"text\": \"a\"\n", "in.jsonl:1: invalid JSON near byte"},
    };
    char input[512], prefix[512];
    scratch_path(state, "in.jsonl", input, sizeof input);
    scratch_path(state, "out", prefix, sizeof prefix);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        write_text(input, cases[c].content);
        assert_prep_fails_cleanly(state, input, PREP_FORMAT_JSONL, prefix);
        pt_error err = {{0}};
        assert_int_equal(prep_run(input, PREP_FORMAT_JSONL, prefix, NULL, &err),
                         -1);
        assert_message_has(err.message, cases[c].reason);
        assert_int_equal(count_entries(((scratch *)*state)->dir), 1);
    }
}

/* A failing run does not disturb the output of an earlier good one. */
static void failing_prep_keeps_the_previous_output(void **state)
{
    char input[512], prefix[512], path[520];
    scratch_path(state, "in.jsonl", input, sizeof input);
    scratch_path(state, "out", prefix, sizeof prefix);
    write_text(input, "{\"text\": \"first run\"}\n");
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_JSONL, prefix, NULL, &err), 0);
    size_t before_size, after_size;
    snprintf(path, sizeof path, "%s.bin", prefix);
    unsigned char *before = read_bytes(path, &before_size);
    write_text(input, "{\"text\": \"second run\"}\n{\"txt\": 1}\n");
    assert_prep_fails_cleanly(state, input, PREP_FORMAT_JSONL, prefix);
    unsigned char *after = read_bytes(path, &after_size);
    assert_int_equal(before_size, after_size);
    assert_memory_equal(before, after, before_size);
    free(before);
    free(after);
    const char *texts[] = {"first run"};
    const size_t sizes[] = {9};
    assert_documents(prefix, texts, sizes, 1);
}

static void empty_input_is_refused(void **state)
{
    char input[512], prefix[512];
    scratch_path(state, "blank.txt", input, sizeof input);
    scratch_path(state, "out", prefix, sizeof prefix);
    write_text(input, "\n  \n\t\n");
    assert_prep_fails_cleanly(state, input, PREP_FORMAT_TEXT, prefix);
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_JSONL, prefix, NULL, &err),
                     -1);
    assert_message_has(err.message, "blank.txt", "no documents");
}

static void missing_output_directory_is_refused(void **state)
{
    char input[512], prefix[512];
    scratch_path(state, "in.txt", input, sizeof input);
    scratch_path(state, "no/such/dir/out", prefix, sizeof prefix);
    write_text(input, "text\n");
    assert_prep_fails_cleanly(state, input, PREP_FORMAT_TEXT, prefix);
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, prefix, NULL, &err), -1);
    assert_message_has(err.message, "no/such/dir/out.bin", "temporary file");
}

/* issue 18, item 15: "dir/" or a folder as the prefix would write the
 * hidden files dir/.bin and dir/.idx; refused, nothing written. */
static void folder_prefix_is_refused(void **state)
{
    char input[512], folder[512], slash[520];
    scratch_path(state, "in.txt", input, sizeof input);
    write_text(input, "text\n");
    scratch_path(state, "data", folder, sizeof folder);
    assert_int_equal(mkdir(folder, 0755), 0);
    snprintf(slash, sizeof slash, "%s/", folder);
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, slash, NULL, &err), -1);
    assert_message_has(err.message, "ends in '/'", "hidden files");
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, folder, NULL, &err), -1);
    assert_message_has(err.message, "data: the output prefix is a folder",
                       "data/corpus");
    assert_int_equal(count_entries(folder), 0);
}

/* The bundled corpus preps, reads back byte for byte and feeds samples. */
static void bundled_corpus_preps(void **state)
{
    const char *root = getenv("PARTITA_SOURCE");
    if (root == NULL)
        fail_msg("PARTITA_SOURCE is not set: run the tests with meson test");
    char input[512], prefix[512];
    snprintf(input, sizeof input, "%s/data/corpus.txt", root);
    scratch_path(state, "corpus", prefix, sizeof prefix);
    prep_stats stats;
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, prefix, &stats, &err),
                     0);
    size_t corpus_size;
    unsigned char *corpus = read_bytes(input, &corpus_size);
    assert_int_equal(stats.input_bytes, corpus_size);
    assert_true(corpus_size >= 100 * 1024 && corpus_size <= 500 * 1024);
    assert_true(stats.documents > 100);
    assert_int_equal(stats.tokens, stats.text_bytes + stats.documents);

    indexed_dataset ds;
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    assert_int_equal(ds.total_tokens, stats.tokens);
    /* The first document runs from the first non-empty line to the first
     * empty line after it. */
    const char *text = (const char *)corpus;
    size_t start = strspn(text, "\n");
    const char *first_break = strstr(text + start, "\n\n");
    assert_non_null(first_break);
    size_t first_size = (size_t)(first_break - (text + start));
    assert_int_equal(indexed_dataset_sequence_length(&ds, 0), first_size + 1);
    uint32_t *tokens = calloc(first_size + 1, sizeof *tokens);
    assert_non_null(tokens);
    assert_int_equal(indexed_dataset_read_tokens(&ds, 0, 0, first_size + 1,
                                                 tokens, &err), 0);
    for (size_t i = 0; i < first_size; i++)
        assert_int_equal(tokens[i], corpus[start + i]);
    assert_int_equal(tokens[first_size], PREP_EOD_TOKEN);
    free(tokens);
    free(corpus);

    gpt_sampler sampler;
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 1024, 1, PREP_VOCAB_SIZE,
                                      &err), 0);
    assert_int_equal(sampler.samples_per_epoch, (stats.tokens - 1) / 1024);
    uint32_t sample[1025];
    data_position position = {0, 0};
    for (int step = 0; step < 8; step++)
        assert_int_equal(gpt_sampler_next(&sampler, &position, sample, &err),
                         0);
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        SCRATCH_TEST(text_round_trip),
        SCRATCH_TEST(jsonl_round_trip),
        SCRATCH_TEST(prep_output_matches_the_format),
        SCRATCH_TEST(missing_input_leaves_no_files),
        SCRATCH_TEST(bad_json_line_is_named_and_leaves_no_files),
        SCRATCH_TEST(failing_prep_keeps_the_previous_output),
        SCRATCH_TEST(empty_input_is_refused),
        SCRATCH_TEST(missing_output_directory_is_refused),
        SCRATCH_TEST(folder_prefix_is_refused),
        SCRATCH_TEST(bundled_corpus_preps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
