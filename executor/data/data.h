/*
 * executor/data: Megatron "MMIDIDX" indexed datasets (reader and writer),
 * GPT training samples drawn from them and `prep` (text or JSON lines to
 * .bin/.idx with a byte-level tokenizer). docs/data.md describes the
 * formats and the sampling. Checkpoints are executor/run's.
 *
 * Like every library of Partita these functions never print or exit: they
 * return -1 and fill a pt_error naming the file, the byte offset or field,
 * and the reason.
 */
#ifndef PARTITA_EXECUTOR_DATA_H
#define PARTITA_EXECUTOR_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ------------------------------------------------------ indexed dataset */

/* The dtype codes of the .idx header (byte 17). */
typedef enum indexed_dtype {
    INDEXED_DTYPE_UINT8 = 1,
    INDEXED_DTYPE_INT8 = 2,
    INDEXED_DTYPE_INT16 = 3,
    INDEXED_DTYPE_INT32 = 4,
    INDEXED_DTYPE_INT64 = 5,
    INDEXED_DTYPE_FLOAT64 = 6,
    INDEXED_DTYPE_FLOAT32 = 7,
    INDEXED_DTYPE_UINT16 = 8
} indexed_dtype;

/* Bytes of one item of a dtype code; 0 for a code the format lacks. */
size_t indexed_dtype_size(int code);
/* "uint16", "int32", ...; "unknown" for a code the format lacks. */
const char *indexed_dtype_name(int code);
/* Whether the dtype holds integer token ids (every code but the floats). */
bool indexed_dtype_is_integer(int code);

/* Byte sizes and offsets of the .idx layout. */
#define INDEXED_MAGIC "MMIDIDX\0\0"
#define INDEXED_MAGIC_BYTES 9
#define INDEXED_HEADER_BYTES 34

/*
 * An opened, validated dataset: both files are mapped read-only. The
 * arrays of the .idx sit at unaligned offsets (34 is not a multiple of 4),
 * so they are kept as bytes and decoded by the accessors below. Owned by
 * whoever opened it; several threads may read one dataset at once.
 */
typedef struct indexed_dataset {
    char idx_path[PT_PATH_MAX];
    char bin_path[PT_PATH_MAX];
    int dtype;                      /* an indexed_dtype code, integer kind */
    size_t item_bytes;              /* bytes of one token in .bin */
    uint64_t sequence_count;        /* S */
    uint64_t document_count;        /* D - 1 */
    uint64_t total_tokens;          /* sum of all sequence lengths */
    bool has_modes;                 /* the multimodal int8[S] tail exists */
    const unsigned char *idx_map;   /* whole .idx */
    size_t idx_bytes;
    const unsigned char *bin_map;   /* whole .bin; NULL when it is empty */
    size_t bin_bytes;
    const unsigned char *lengths;   /* int32[S] inside idx_map */
    const unsigned char *pointers;  /* int64[S] inside idx_map */
    const unsigned char *doc_index; /* int64[D] inside idx_map */
} indexed_dataset;

/* Opens PREFIX.idx and PREFIX.bin, maps them and validates every field:
 * magic, version 1, dtype, counts against the file size, lengths >= 0,
 * pointers equal to the running sum of lengths x item size and ending at
 * the .bin size, document indices starting at 0, never decreasing and
 * ending at S. Nothing is left open on failure. */
int indexed_dataset_open(indexed_dataset *ds, const char *prefix,
                         pt_error *err);
void indexed_dataset_close(indexed_dataset *ds);

/* Tokens in sequence i (i < sequence_count). */
uint64_t indexed_dataset_sequence_length(const indexed_dataset *ds,
                                         uint64_t sequence);
/* Byte offset of sequence i in .bin. */
uint64_t indexed_dataset_sequence_offset(const indexed_dataset *ds,
                                         uint64_t sequence);
/* Document d spans sequences [*first, *end). */
void indexed_dataset_document_sequences(const indexed_dataset *ds,
                                        uint64_t document, uint64_t *first,
                                        uint64_t *end);
/* Tokens in document d (the sum over its sequences). */
uint64_t indexed_dataset_document_length(const indexed_dataset *ds,
                                         uint64_t document);

/* Copies `count` tokens of a sequence, starting at token `first`, into out
 * as uint32 whatever the dtype. Fails on a range past the sequence's end
 * and on a token that is negative or above UINT32_MAX (the message names
 * the .bin and the byte offset). */
int indexed_dataset_read_tokens(const indexed_dataset *ds, uint64_t sequence,
                                uint64_t first, uint64_t count, uint32_t *out,
                                pt_error *err);

/* ------------------------------------------------------ dataset writing */

/*
 * Writes PREFIX.bin and PREFIX.idx one document at a time (one sequence per
 * document, as Megatron's preprocess_data.py without sentence splitting).
 * Tokens go to a temporary .bin beside the target as they come; commit
 * writes the temporary .idx, fsyncs both and only then renames them into
 * place, .bin first. (Two renames are not one atomic step: a crash between
 * them leaves the new .bin beside the old .idx, which the reader refuses
 * unless the sizes happen to agree.) Any failure, or abort, removes the
 * temporary files: no partial file is ever left under the final names.
 */
typedef struct indexed_writer {
    char prefix[PT_PATH_MAX];
    char bin_target[PT_PATH_MAX];   /* PREFIX.bin, or the file its
                                       symbolic links lead to */
    char idx_target[PT_PATH_MAX];   /* the same for PREFIX.idx */
    char bin_temp[PT_PATH_MAX];     /* temporary .bin, "" when none */
    int bin_fd;                     /* -1 when closed */
    int dtype;
    size_t item_bytes;
    uint64_t sequence_count;
    uint64_t sequence_capacity;
    int32_t *lengths;               /* owned: one per sequence/document */
    unsigned char *staging;         /* owned: encoded tokens before write */
} indexed_writer;

int indexed_writer_begin(indexed_writer *w, const char *prefix, int dtype,
                         pt_error *err);
/* Appends one document; fails when a token does not fit the dtype or the
 * document has more than INT32_MAX tokens. A failure aborts the writer. */
int indexed_writer_add_document(indexed_writer *w, const uint32_t *tokens,
                                uint64_t count, pt_error *err);
/* Publishes both files; the writer is finished either way. */
int indexed_writer_commit(indexed_writer *w, pt_error *err);
/* Drops everything written so far. Safe to call on a finished writer. */
void indexed_writer_abort(indexed_writer *w);

/* Writes a whole dataset from token arrays: document d holds
 * document_lengths[d] tokens at documents[d]. */
int indexed_dataset_write(const char *prefix, int dtype,
                          const uint32_t *const *documents,
                          const uint64_t *document_lengths,
                          uint64_t document_count, pt_error *err);

/* ------------------------------------------------------------------ prep */

/* The byte-level tokenizer: token = byte value, then end-of-document. */
#define PREP_EOD_TOKEN 256u
#define PREP_VOCAB_SIZE 257
/* The longest input line prep reads (a JSON line holds a whole
 * document): past it the input is refused, not read to the end of
 * memory. */
#define PREP_MAX_LINE_BYTES ((size_t)64 << 20)

typedef enum prep_format {
    PREP_FORMAT_TEXT,   /* documents separated by blank lines */
    PREP_FORMAT_JSONL   /* one JSON object per line with a "text" string */
} prep_format;

/* What prep read and wrote. */
typedef struct prep_stats {
    uint64_t documents;
    uint64_t tokens;        /* EOD tokens included */
    uint64_t input_bytes;   /* size of the input file */
    uint64_t text_bytes;    /* document bytes tokenized */
    uint64_t bin_bytes;     /* size of PREFIX.bin */
    uint64_t idx_bytes;     /* size of PREFIX.idx */
} prep_stats;

/* Tokenizes input into PREFIX.bin/.idx (dtype uint16). In text files a
 * document is a run of lines between blank (whitespace-only) lines, its
 * bytes taken as written without the newline of its last line. A JSON-lines
 * file gives one document per non-blank line, its "text" field as UTF-8
 * bytes; errors name the line. Fails, leaving no output, when the input
 * holds no document, or when the prefix ends in '/' or names a folder
 * (it would write hidden files, "dir/.bin"). stats may be NULL. */
int prep_run(const char *input_path, prep_format format,
             const char *output_prefix, prep_stats *stats, pt_error *err);

/* ------------------------------------------------------------- sampling */

/* Where the data stream of a training run stands: the next sample to take
 * is `index` of epoch `epoch`. A checkpoint stores it (see
 * gpt_sampler_encode_position). */
typedef struct data_position {
    uint64_t epoch;
    uint64_t index;
} data_position;

/*
 * GPT training samples in the manner of Megatron's GPT dataset: each epoch
 * lays the documents end to end in an order shuffled from (seed, epoch),
 * cuts that stream into samples of seq + 1 tokens that overlap by one
 * token (inputs and shifted targets) and cross document boundaries, and
 * visits the samples in an order shuffled from (seed, epoch) too. An epoch
 * has (total_tokens - 1) / seq samples. Deterministic for a seed on any
 * machine (own RNG, no libc rand). Owned by one thread: it caches the
 * orders of one epoch at a time.
 */
typedef struct gpt_sampler {
    const indexed_dataset *dataset; /* borrowed; must outlive the sampler */
    uint64_t seq;                   /* a sample has seq + 1 tokens */
    uint64_t seed;
    uint32_t vocab_limit;           /* tokens must be below it; 0: no check */
    uint64_t samples_per_epoch;
    uint64_t cached_epoch;          /* epoch whose orders are built */
    bool cached;
    uint64_t *document_order;       /* owned: document ids of the epoch */
    uint64_t *document_start;       /* owned: stream offset of each slot,
                                       plus the total at the end */
    uint64_t *sample_order;         /* owned: stream sample of each index */
} gpt_sampler;

/* Fails when the dataset has fewer than seq + 1 tokens. vocab_limit 0
 * disables the token range check. */
int gpt_sampler_init(gpt_sampler *s, const indexed_dataset *ds, uint64_t seq,
                     uint64_t seed, uint32_t vocab_limit, pt_error *err);
void gpt_sampler_free(gpt_sampler *s);

/* Writes sample `index` of `epoch` (seq + 1 tokens) into tokens. */
int gpt_sampler_get(gpt_sampler *s, uint64_t epoch, uint64_t index,
                    uint32_t *tokens, pt_error *err);
/* Writes the sample at *position and moves it to the next one (the first
 * sample of the next epoch after the last). */
int gpt_sampler_next(gpt_sampler *s, data_position *position,
                     uint32_t *tokens, pt_error *err);

/* A position saved with what makes it meaningful (seed, seq, token and
 * document counts), so a resume on other data or settings is refused. */
#define DATA_POSITION_BYTES 56
void gpt_sampler_encode_position(const gpt_sampler *s,
                                 const data_position *position,
                                 unsigned char out[DATA_POSITION_BYTES]);
int gpt_sampler_decode_position(const gpt_sampler *s, const void *bytes,
                                size_t size, data_position *out,
                                pt_error *err);

#endif
