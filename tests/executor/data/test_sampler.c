/* GPT samples: they cross document boundaries in a correct walk, cover
 * every token of an epoch, are deterministic per seed and differ across
 * seeds and epochs; positions survive encoding and refuse other data. */
#include "data_test_support.h"

/* Tokens say where they come from: document x 1000 + position. */
enum { TOKEN_STRIDE = 1000 };

static uint32_t token_document(uint32_t token) { return token / TOKEN_STRIDE; }
static uint32_t token_position(uint32_t token) { return token % TOKEN_STRIDE; }

/* Writes `count` documents of the given lengths (int32 tokens). */
static void write_labelled(void **state, const char *name,
                           const uint64_t *lengths, int count, char *prefix,
                           size_t prefix_size)
{
    uint32_t **documents = calloc((size_t)count, sizeof *documents);
    assert_non_null(documents);
    for (int d = 0; d < count; d++) {
        documents[d] = calloc(lengths[d] + 1, sizeof **documents);
        assert_non_null(documents[d]);
        for (uint64_t p = 0; p < lengths[d]; p++)
            documents[d][p] = (uint32_t)(d * TOKEN_STRIDE + (int)p);
    }
    scratch_path(state, name, prefix, prefix_size);
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_write(prefix, INDEXED_DTYPE_INT32,
                                           (const uint32_t *const *)documents,
                                           lengths, (uint64_t)count, &err), 0);
    for (int d = 0; d < count; d++)
        free(documents[d]);
    free(documents);
}

/* 12 documents, two of them empty: 5 + 7 + ... tokens. */
static const uint64_t mixed_lengths[] = {5, 7, 0, 13, 6, 9, 11, 0, 8, 4, 10,
                                         12};
enum { MIXED_DOCUMENTS = 12, MIXED_TOKENS = 85 };

static void open_mixed(void **state, indexed_dataset *ds)
{
    char prefix[512];
    write_labelled(state, "mixed", mixed_lengths, MIXED_DOCUMENTS, prefix,
                   sizeof prefix);
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(ds, prefix, &err), 0);
    assert_int_equal(ds->total_tokens, MIXED_TOKENS);
}

/* Every step inside a sample is either the next token of the same
 * document, or the end of one document followed by the start of another.
 * Returns how many boundaries the sample crosses. */
static int check_walk(const uint32_t *tokens, uint64_t count)
{
    int crossings = 0;
    for (uint64_t t = 1; t < count; t++) {
        uint32_t previous = tokens[t - 1], next = tokens[t];
        if (token_document(previous) == token_document(next) &&
            token_position(next) == token_position(previous) + 1)
            continue;
        assert_int_equal(token_position(previous) + 1,
                         mixed_lengths[token_document(previous)]);
        assert_int_equal(token_position(next), 0);
        assert_int_not_equal(token_document(previous), token_document(next));
        crossings++;
    }
    return crossings;
}

static void samples_cross_document_boundaries(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    gpt_sampler sampler;
    pt_error err = {{0}};
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 16, 7, 0, &err), 0);
    assert_int_equal(sampler.samples_per_epoch, (MIXED_TOKENS - 1) / 16);
    int crossings = 0;
    uint32_t tokens[17];
    for (uint64_t epoch = 0; epoch < 3; epoch++)
        for (uint64_t i = 0; i < sampler.samples_per_epoch; i++) {
            assert_int_equal(gpt_sampler_get(&sampler, epoch, i, tokens, &err),
                             0);
            crossings += check_walk(tokens, 17);
        }
    /* Documents are at most 13 tokens long: every 17-token sample crosses. */
    assert_true(crossings >= 3 * (int)sampler.samples_per_epoch);
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
}

/* Counts how often each (document, position) appears in an epoch. */
static void count_coverage(gpt_sampler *sampler, uint64_t epoch,
                           int coverage[][TOKEN_STRIDE])
{
    uint64_t width = sampler->seq + 1;
    uint32_t *tokens = calloc(width, sizeof *tokens);
    assert_non_null(tokens);
    pt_error err = {{0}};
    for (uint64_t i = 0; i < sampler->samples_per_epoch; i++) {
        assert_int_equal(gpt_sampler_get(sampler, epoch, i, tokens, &err), 0);
        for (uint64_t t = 0; t < width; t++)
            coverage[token_document(tokens[t])][token_position(tokens[t])]++;
    }
    free(tokens);
}

static void every_token_of_an_epoch_is_covered(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    /* 84 = 85 - 1 is a multiple of 12, 14, 21 and 42: the samples tile the
     * epoch exactly, every token appears, and only the n - 1 tokens where
     * one sample's target meets the next one's input appear twice. */
    const uint64_t seqs[] = {12, 14, 21, 42, 84};
    for (size_t c = 0; c < sizeof seqs / sizeof *seqs; c++) {
        gpt_sampler sampler;
        pt_error err = {{0}};
        assert_int_equal(gpt_sampler_init(&sampler, &ds, seqs[c], 99, 0, &err),
                         0);
        uint64_t samples = sampler.samples_per_epoch;
        assert_int_equal(samples * seqs[c], MIXED_TOKENS - 1);
        for (uint64_t epoch = 0; epoch < 2; epoch++) {
            static int coverage[MIXED_DOCUMENTS][TOKEN_STRIDE];
            memset(coverage, 0, sizeof coverage);
            count_coverage(&sampler, epoch, coverage);
            uint64_t twice = 0;
            for (int d = 0; d < MIXED_DOCUMENTS; d++)
                for (uint64_t p = 0; p < mixed_lengths[d]; p++) {
                    assert_in_range(coverage[d][p], 1, 2);
                    twice += coverage[d][p] == 2;
                }
            assert_int_equal(twice, samples - 1);
        }
        gpt_sampler_free(&sampler);
    }
    indexed_dataset_close(&ds);
}

/* With a remainder, exactly the last (T - 1) mod seq tokens of the
 * epoch's stream are left out. */
static void remainder_of_an_epoch_is_left_out(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    gpt_sampler sampler;
    pt_error err = {{0}};
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 10, 5, 0, &err), 0);
    assert_int_equal(sampler.samples_per_epoch, 8);
    static int coverage[MIXED_DOCUMENTS][TOKEN_STRIDE];
    memset(coverage, 0, sizeof coverage);
    count_coverage(&sampler, 0, coverage);
    int missing = 0;
    for (int d = 0; d < MIXED_DOCUMENTS; d++)
        for (uint64_t p = 0; p < mixed_lengths[d]; p++)
            missing += coverage[d][p] == 0;
    assert_int_equal(missing, (MIXED_TOKENS - 1) % 10);
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
}

/* All samples of an epoch, concatenated, into out. */
static void epoch_samples(gpt_sampler *sampler, uint64_t epoch, uint32_t *out)
{
    pt_error err = {{0}};
    for (uint64_t i = 0; i < sampler->samples_per_epoch; i++)
        assert_int_equal(gpt_sampler_get(sampler, epoch, i,
                                          out + i * (sampler->seq + 1), &err),
                         0);
}

static void samples_are_deterministic_per_seed(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    gpt_sampler first, second, other_seed;
    pt_error err = {{0}};
    assert_int_equal(gpt_sampler_init(&first, &ds, 8, 1234, 0, &err), 0);
    assert_int_equal(gpt_sampler_init(&second, &ds, 8, 1234, 0, &err), 0);
    assert_int_equal(gpt_sampler_init(&other_seed, &ds, 8, 1235, 0, &err), 0);
    enum { EPOCH_TOKENS = 10 * 9 };
    assert_int_equal(first.samples_per_epoch, 10);
    uint32_t a[EPOCH_TOKENS], b[EPOCH_TOKENS], c[EPOCH_TOKENS];
    uint32_t next_epoch[EPOCH_TOKENS];
    /* Visit epochs in a different order: the cache must not matter. */
    epoch_samples(&first, 0, a);
    epoch_samples(&first, 1, next_epoch);
    epoch_samples(&second, 1, b);
    assert_memory_equal(next_epoch, b, sizeof b);
    epoch_samples(&second, 0, b);
    assert_memory_equal(a, b, sizeof a);
    epoch_samples(&other_seed, 0, c);
    assert_memory_not_equal(a, c, sizeof a);
    assert_memory_not_equal(a, next_epoch, sizeof a);

    /* Across many seeds, the first sample does not always start the same
     * way: the orders really are shuffled. */
    uint32_t first_tokens[20];
    for (uint64_t seed = 0; seed < 20; seed++) {
        gpt_sampler sampler;
        assert_int_equal(gpt_sampler_init(&sampler, &ds, 8, seed, 0, &err), 0);
        uint32_t tokens[9];
        assert_int_equal(gpt_sampler_get(&sampler, 0, 0, tokens, &err), 0);
        first_tokens[seed] = tokens[0];
        gpt_sampler_free(&sampler);
    }
    int distinct = 0;
    for (int i = 0; i < 20; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen = seen || first_tokens[j] == first_tokens[i];
        distinct += !seen;
    }
    assert_true(distinct >= 5);
    gpt_sampler_free(&first);
    gpt_sampler_free(&second);
    gpt_sampler_free(&other_seed);
    indexed_dataset_close(&ds);
}

/* Samples are visited in a shuffled order: taken by index, they do not
 * chain one into the next as consecutive cuts of the stream would. */
static void sample_order_is_shuffled(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    gpt_sampler sampler;
    pt_error err = {{0}};
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 4, 11, 0, &err), 0);
    assert_int_equal(sampler.samples_per_epoch, 21);
    uint32_t previous[5], current[5];
    int chained = 0;
    assert_int_equal(gpt_sampler_get(&sampler, 0, 0, previous, &err), 0);
    for (uint64_t i = 1; i < sampler.samples_per_epoch; i++) {
        assert_int_equal(gpt_sampler_get(&sampler, 0, i, current, &err), 0);
        chained += previous[4] == current[0];
        memcpy(previous, current, sizeof current);
    }
    assert_true(chained < 10);
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
}

/* Documents of several sequences (Megatron with sentence splitting): the
 * walk goes through the sequences of a document in order. */
static void documents_of_several_sequences_are_walked(void **state)
{
    const int32_t lengths[] = {3, 2, 4, 1, 5};
    const int64_t documents[] = {0, 2, 3, 5};  /* {0,1} {2} {3,4} */
    size_t idx_size;
    unsigned char *idx = hand_index(INDEXED_DTYPE_UINT16, 2, lengths, 5,
                                    documents, 4, &idx_size);
    /* Document d, position p -> 100 d + p. */
    const uint16_t bin[] = {0,   1,   2,   3,   4,   100, 101, 102,
                            103, 200, 201, 202, 203, 204, 205};
    char prefix[512], path[520];
    scratch_path(state, "sentences", prefix, sizeof prefix);
    snprintf(path, sizeof path, "%s.idx", prefix);
    write_bytes(path, idx, idx_size);
    snprintf(path, sizeof path, "%s.bin", prefix);
    write_bytes(path, bin, sizeof bin);
    free(idx);
    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    gpt_sampler sampler;
    /* One sample of all 15 tokens: the three documents in some order. */
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 14, 3, 0, &err), 0);
    assert_int_equal(sampler.samples_per_epoch, 1);
    uint32_t tokens[15];
    assert_int_equal(gpt_sampler_get(&sampler, 0, 0, tokens, &err), 0);
    const uint32_t sizes[] = {5, 4, 6};
    for (int at = 0; at < 15;) {
        uint32_t document = tokens[at] / 100;
        assert_int_equal(tokens[at] % 100, 0);
        for (uint32_t p = 0; p < sizes[document]; p++)
            assert_int_equal(tokens[at + (int)p], 100 * document + p);
        at += (int)sizes[document];
    }
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
}

static void positions_advance_and_round_trip(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    gpt_sampler sampler, other;
    pt_error err = {{0}};
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 21, 8, 0, &err), 0);
    assert_int_equal(sampler.samples_per_epoch, 4);
    data_position position = {0, 0};
    uint32_t tokens[22], expected[22];
    for (int step = 0; step < 5; step++)
        assert_int_equal(gpt_sampler_next(&sampler, &position, tokens, &err),
                         0);
    assert_int_equal(position.epoch, 1);
    assert_int_equal(position.index, 1);
    assert_int_equal(gpt_sampler_get(&sampler, 0, 3, expected, &err), 0);
    assert_int_equal(gpt_sampler_get(&sampler, 1, 0, tokens, &err), 0);
    assert_memory_not_equal(tokens, expected, sizeof tokens);

    unsigned char saved[DATA_POSITION_BYTES];
    gpt_sampler_encode_position(&sampler, &position, saved);
    data_position restored = {0, 0};
    assert_int_equal(gpt_sampler_decode_position(&sampler, saved, sizeof saved,
                                                 &restored, &err), 0);
    assert_int_equal(restored.epoch, 1);
    assert_int_equal(restored.index, 1);

    /* Another seed, another seq, a damaged or short blob: refused. */
    assert_int_equal(gpt_sampler_init(&other, &ds, 21, 9, 0, &err), 0);
    assert_int_equal(gpt_sampler_decode_position(&other, saved, sizeof saved,
                                                 &restored, &err), -1);
    assert_message_has(err.message, "seed 8", "has 9");
    gpt_sampler_free(&other);
    assert_int_equal(gpt_sampler_init(&other, &ds, 12, 8, 0, &err), 0);
    assert_int_equal(gpt_sampler_decode_position(&other, saved, sizeof saved,
                                                 &restored, &err), -1);
    assert_message_has(err.message, "seq 21");
    gpt_sampler_free(&other);
    assert_int_equal(gpt_sampler_decode_position(&sampler, saved, 40,
                                                 &restored, &err), -1);
    assert_message_has(err.message, "40 bytes, expected 56");
    saved[0] = 'X';
    assert_int_equal(gpt_sampler_decode_position(&sampler, saved, sizeof saved,
                                                 &restored, &err), -1);
    assert_message_has(err.message, "PTDPOS01");
    saved[0] = 'P';
    put_le(saved + 16, 4, 8);  /* index 4 of a 4-sample epoch */
    assert_int_equal(gpt_sampler_decode_position(&sampler, saved, sizeof saved,
                                                 &restored, &err), -1);
    assert_message_has(err.message, "sample 4 is past the 4 samples");
    assert_int_equal(gpt_sampler_get(&sampler, 0, 4, tokens, &err), -1);
    assert_message_has(err.message, "sample 4 does not exist");
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
}

static void tokens_outside_the_vocabulary_are_refused(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    gpt_sampler sampler;
    pt_error err = {{0}};
    /* Document 1's tokens are 1000.., document 11's reach 11011. */
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 84, 1, 1000, &err), 0);
    uint32_t tokens[85];
    assert_int_equal(gpt_sampler_get(&sampler, 0, 0, tokens, &err), -1);
    assert_message_has(err.message, "mixed.bin", "offset",
                       "not below the vocabulary size 1000");
    gpt_sampler_free(&sampler);
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 84, 1, 12000, &err), 0);
    assert_int_equal(gpt_sampler_get(&sampler, 0, 0, tokens, &err), 0);
    gpt_sampler_free(&sampler);
    indexed_dataset_close(&ds);
}

static void too_little_data_is_refused(void **state)
{
    indexed_dataset ds;
    open_mixed(state, &ds);
    gpt_sampler sampler;
    pt_error err = {{0}};
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 85, 1, 0, &err), -1);
    assert_message_has(err.message, "mixed.idx", "85 tokens", "86 tokens");
    assert_int_equal(gpt_sampler_init(&sampler, &ds, 0, 1, 0, &err), -1);
    assert_message_has(err.message, "at least 1 token");
    indexed_dataset_close(&ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        SCRATCH_TEST(samples_cross_document_boundaries),
        SCRATCH_TEST(every_token_of_an_epoch_is_covered),
        SCRATCH_TEST(remainder_of_an_epoch_is_left_out),
        SCRATCH_TEST(samples_are_deterministic_per_seed),
        SCRATCH_TEST(sample_order_is_shuffled),
        SCRATCH_TEST(documents_of_several_sequences_are_walked),
        SCRATCH_TEST(positions_advance_and_round_trip),
        SCRATCH_TEST(tokens_outside_the_vocabulary_are_refused),
        SCRATCH_TEST(too_little_data_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
