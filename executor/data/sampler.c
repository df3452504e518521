/*
 * GPT training samples from an indexed dataset, in the manner of Megatron's
 * GPT dataset: shuffled documents laid end to end, cut into overlapping
 * samples of seq + 1 tokens, visited in a shuffled order; both orders are
 * drawn anew for every epoch from (seed, epoch).
 */
#include "executor/data/data.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ rng */

/* SplitMix64 (Steele, Lea, Flood 2014): tiny, full period, and its output
 * is the same on every platform, which is what reproducible shuffles
 * need. */
typedef struct splitmix {
    uint64_t state;
} splitmix;

static uint64_t splitmix_next(splitmix *rng)
{
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Independent streams per (seed, epoch, purpose): each input is folded in
 * through a full mixing step. */
enum stream_purpose { STREAM_DOCUMENTS = 1, STREAM_SAMPLES = 2 };

static splitmix stream_for(uint64_t seed, uint64_t epoch,
                           enum stream_purpose purpose)
{
    splitmix rng = {seed};
    rng.state = splitmix_next(&rng) ^ epoch;
    rng.state = splitmix_next(&rng) ^ (uint64_t)purpose;
    return rng;
}

/* Uniform in [0, bound): rejects the low values that would make the modulo
 * favour small results. */
static uint64_t splitmix_below(splitmix *rng, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = splitmix_next(rng);
        if (r >= threshold)
            return r % bound;
    }
}

/* Fisher-Yates over 0..count-1. */
static void shuffled_identity(uint64_t *out, uint64_t count, splitmix *rng)
{
    for (uint64_t i = 0; i < count; i++)
        out[i] = i;
    for (uint64_t i = count; i > 1; i--) {
        uint64_t j = splitmix_below(rng, i);
        uint64_t held = out[i - 1];
        out[i - 1] = out[j];
        out[j] = held;
    }
}

/* -------------------------------------------------------------- sampler */

int gpt_sampler_init(gpt_sampler *s, const indexed_dataset *ds, uint64_t seq,
                     uint64_t seed, uint32_t vocab_limit, pt_error *err)
{
    memset(s, 0, sizeof *s);
    if (seq == 0)
        return pt_fail(err, "%s: sequence length must be at least 1 token",
                       ds->idx_path);
    if (ds->total_tokens < seq + 1)
        return pt_fail(err, "%s: %" PRIu64 " tokens, fewer than one sample of "
                       "seq + 1 = %" PRIu64 " tokens", ds->idx_path,
                       ds->total_tokens, seq + 1);
    s->dataset = ds;
    s->seq = seq;
    s->seed = seed;
    s->vocab_limit = vocab_limit;
    s->samples_per_epoch = (ds->total_tokens - 1) / seq;
    uint64_t documents = ds->document_count;
    s->document_order = malloc(documents * sizeof *s->document_order);
    s->document_start = malloc((documents + 1) * sizeof *s->document_start);
    s->sample_order = malloc(s->samples_per_epoch * sizeof *s->sample_order);
    if (s->document_order == NULL || s->document_start == NULL ||
        s->sample_order == NULL) {
        gpt_sampler_free(s);
        return pt_fail(err, "%s: out of memory for the orders of %" PRIu64
                       " documents and %" PRIu64 " samples", ds->idx_path,
                       documents, s->samples_per_epoch);
    }
    return 0;
}

void gpt_sampler_free(gpt_sampler *s)
{
    free(s->document_order);
    free(s->document_start);
    free(s->sample_order);
    s->document_order = NULL;
    s->document_start = NULL;
    s->sample_order = NULL;
    s->cached = false;
}

static void build_epoch(gpt_sampler *s, uint64_t epoch)
{
    const indexed_dataset *ds = s->dataset;
    splitmix documents_rng = stream_for(s->seed, epoch, STREAM_DOCUMENTS);
    shuffled_identity(s->document_order, ds->document_count, &documents_rng);
    s->document_start[0] = 0;
    for (uint64_t slot = 0; slot < ds->document_count; slot++)
        s->document_start[slot + 1] =
            s->document_start[slot] +
            indexed_dataset_document_length(ds, s->document_order[slot]);
    splitmix samples_rng = stream_for(s->seed, epoch, STREAM_SAMPLES);
    shuffled_identity(s->sample_order, s->samples_per_epoch, &samples_rng);
    s->cached_epoch = epoch;
    s->cached = true;
}

/* The slot whose document holds stream position p: the last slot starting
 * at or before p (empty documents start where the next one does). */
static uint64_t slot_of_position(const gpt_sampler *s, uint64_t p)
{
    uint64_t low = 0, high = s->dataset->document_count;
    while (high - low > 1) {
        uint64_t middle = low + (high - low) / 2;
        if (s->document_start[middle] <= p)
            low = middle;
        else
            high = middle;
    }
    return low;
}

static int check_vocabulary(const gpt_sampler *s, uint64_t sequence,
                            uint64_t first, const uint32_t *tokens,
                            uint64_t count, pt_error *err)
{
    if (s->vocab_limit == 0)
        return 0;
    const indexed_dataset *ds = s->dataset;
    for (uint64_t t = 0; t < count; t++)
        if (tokens[t] >= s->vocab_limit)
            return pt_fail(err, "%s: offset %" PRIu64 ": token %" PRIu32
                           " is not below the vocabulary size %" PRIu32,
                           ds->bin_path,
                           indexed_dataset_sequence_offset(ds, sequence) +
                               (first + t) * ds->item_bytes,
                           tokens[t], s->vocab_limit);
    return 0;
}

/* Copies `count` tokens of the epoch's stream from position p on, walking
 * through documents (and the sequences inside each) as needed. */
static int copy_stream(const gpt_sampler *s, uint64_t p, uint64_t count,
                       uint32_t *out, pt_error *err)
{
    const indexed_dataset *ds = s->dataset;
    uint64_t slot = slot_of_position(s, p);
    uint64_t skip = p - s->document_start[slot];
    while (count > 0) {
        uint64_t first, end;
        indexed_dataset_document_sequences(ds, s->document_order[slot], &first,
                                           &end);
        for (uint64_t sequence = first; sequence < end && count > 0;
             sequence++) {
            uint64_t length = indexed_dataset_sequence_length(ds, sequence);
            if (skip >= length) {
                skip -= length;
                continue;
            }
            uint64_t take = length - skip < count ? length - skip : count;
            if (indexed_dataset_read_tokens(ds, sequence, skip, take, out,
                                            err) != 0 ||
                check_vocabulary(s, sequence, skip, out, take, err) != 0)
                return -1;
            out += take;
            count -= take;
            skip = 0;
        }
        slot++;
    }
    return 0;
}

int gpt_sampler_get(gpt_sampler *s, uint64_t epoch, uint64_t index,
                    uint32_t *tokens, pt_error *err)
{
    if (index >= s->samples_per_epoch)
        return pt_fail(err, "%s: sample %" PRIu64 " does not exist: an epoch "
                       "has %" PRIu64 " samples", s->dataset->idx_path, index,
                       s->samples_per_epoch);
    if (!s->cached || s->cached_epoch != epoch)
        build_epoch(s, epoch);
    uint64_t start = s->sample_order[index] * s->seq;
    return copy_stream(s, start, s->seq + 1, tokens, err);
}

int gpt_sampler_next(gpt_sampler *s, data_position *position,
                     uint32_t *tokens, pt_error *err)
{
    if (gpt_sampler_get(s, position->epoch, position->index, tokens, err) != 0)
        return -1;
    if (++position->index == s->samples_per_epoch) {
        position->epoch++;
        position->index = 0;
    }
    return 0;
}

/* ------------------------------------------------------------- position */

#define POSITION_MAGIC "PTDPOS01"

/* Fields after the magic, in order, 8 bytes each. */
enum position_field {
    POSITION_EPOCH,
    POSITION_INDEX,
    POSITION_SEED,
    POSITION_SEQ,
    POSITION_TOKENS,
    POSITION_DOCUMENTS,
    POSITION_FIELDS
};

_Static_assert(8 + 8 * POSITION_FIELDS == DATA_POSITION_BYTES,
               "DATA_POSITION_BYTES matches the encoded fields");

void gpt_sampler_encode_position(const gpt_sampler *s,
                                 const data_position *position,
                                 unsigned char out[DATA_POSITION_BYTES])
{
    const uint64_t fields[POSITION_FIELDS] = {
        position->epoch, position->index, s->seed, s->seq,
        s->dataset->total_tokens, s->dataset->document_count};
    memcpy(out, POSITION_MAGIC, 8);
    for (int f = 0; f < POSITION_FIELDS; f++)
        pt_store_le(out + 8 + 8 * f, fields[f], 8);
}

static int expect_same(const char *what, uint64_t saved, uint64_t current,
                       pt_error *err)
{
    if (saved == current)
        return 0;
    return pt_fail(err, "data position: saved for %s %" PRIu64 ", but this run "
                   "has %" PRIu64 "; resuming would replay other samples",
                   what, saved, current);
}

int gpt_sampler_decode_position(const gpt_sampler *s, const void *bytes,
                                size_t size, data_position *out,
                                pt_error *err)
{
    const unsigned char *in = bytes;
    if (size != DATA_POSITION_BYTES)
        return pt_fail(err, "data position: %zu bytes, expected %d", size,
                       DATA_POSITION_BYTES);
    if (memcmp(in, POSITION_MAGIC, 8) != 0)
        return pt_fail(err, "data position: bytes 0-7 are not \"%s\"",
                       POSITION_MAGIC);
    uint64_t fields[POSITION_FIELDS];
    for (int f = 0; f < POSITION_FIELDS; f++)
        fields[f] = pt_load_le(in + 8 + 8 * f, 8);
    if (expect_same("seed", fields[POSITION_SEED], s->seed, err) != 0 ||
        expect_same("seq", fields[POSITION_SEQ], s->seq, err) != 0 ||
        expect_same("a dataset of tokens", fields[POSITION_TOKENS],
                    s->dataset->total_tokens, err) != 0 ||
        expect_same("a dataset of documents", fields[POSITION_DOCUMENTS],
                    s->dataset->document_count, err) != 0)
        return -1;
    if (fields[POSITION_INDEX] >= s->samples_per_epoch)
        return pt_fail(err, "data position: sample %" PRIu64 " is past the %"
                       PRIu64 " samples of an epoch", fields[POSITION_INDEX],
                       s->samples_per_epoch);
    out->epoch = fields[POSITION_EPOCH];
    out->index = fields[POSITION_INDEX];
    return 0;
}
