/*
 * prep: plain text or JSON lines -> Megatron .bin/.idx with the byte-level
 * tokenizer (token = byte value, then PREP_EOD_TOKEN). The writer publishes
 * both files atomically, so a failure anywhere leaves no output behind.
 */
#include "executor/data/data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One run of prep: the writer, a reusable token buffer and the counts. */
typedef struct prep_state {
    const char *input_path;
    indexed_writer writer;
    uint32_t *tokens;         /* owned, grows to the longest document */
    size_t token_capacity;
    prep_stats stats;
} prep_state;

static int tokenize_document(prep_state *state, const unsigned char *bytes,
                             size_t size, pt_error *err)
{
    if (size + 1 > state->token_capacity) {
        size_t capacity = 2 * (size + 1);
        uint32_t *grown = realloc(state->tokens, capacity * sizeof *grown);
        if (grown == NULL)
            return pt_fail(err, "%s: out of memory for a document of %zu "
                           "bytes", state->input_path, size);
        state->tokens = grown;
        state->token_capacity = capacity;
    }
    for (size_t i = 0; i < size; i++)
        state->tokens[i] = bytes[i];
    state->tokens[size] = PREP_EOD_TOKEN;
    if (indexed_writer_add_document(&state->writer, state->tokens, size + 1,
                                    err) != 0)
        return -1;
    state->stats.documents++;
    state->stats.tokens += size + 1;
    state->stats.text_bytes += size;
    return 0;
}

static bool is_blank(const char *line, size_t length)
{
    for (size_t i = 0; i < length; i++)
        if (strchr(" \t\r\n\f\v", line[i]) == NULL || line[i] == '\0')
            return false;
    return true;
}

/* Appends a line to the document being gathered. */
static int gather_line(prep_state *state, char **document, size_t *size,
                       size_t *capacity, const char *line, size_t length,
                       pt_error *err)
{
    if (*size + length > *capacity) {
        size_t grown_capacity = 2 * (*size + length);
        char *grown = realloc(*document, grown_capacity);
        if (grown == NULL)
            return pt_fail(err, "%s: out of memory for a document of %zu "
                           "bytes", state->input_path, *size + length);
        *document = grown;
        *capacity = grown_capacity;
    }
    memcpy(*document + *size, line, length);
    *size += length;
    return 0;
}

/* A document ends at a blank line or at the end of the file; the newline
 * that ends its last line is not part of it. */
static int flush_document(prep_state *state, const char *document,
                          size_t *size, pt_error *err)
{
    if (*size == 0)
        return 0;
    size_t length = *size;
    if (length > 0 && document[length - 1] == '\n')
        length--;
    if (length > 0 && document[length - 1] == '\r')
        length--;
    *size = 0;
    return tokenize_document(state, (const unsigned char *)document, length,
                             err);
}

static int read_text(prep_state *state, pt_line_reader *input,
                     pt_error *err)
{
    char *document = NULL, *line;
    size_t document_size = 0, document_capacity = 0, length;
    int result = 0, more = 0;
    while (result == 0 &&
           (more = pt_line_reader_next(input, &line, &length, err)) > 0) {
        if (is_blank(line, length))
            result = flush_document(state, document, &document_size, err);
        else
            result = gather_line(state, &document, &document_size,
                                 &document_capacity, line, length, err);
        /* inner newlines belong to the document */
        if (result == 0 && input->ended_by_newline && !is_blank(line, length))
            result = gather_line(state, &document, &document_size,
                                 &document_capacity, "\n", 1, err);
    }
    if (result == 0 && more < 0)
        result = -1;
    if (result == 0)
        result = flush_document(state, document, &document_size, err);
    free(document);
    return result;
}

/* One JSON line: an object whose "text" is a string. */
static int tokenize_json_line(prep_state *state, const char *line,
                              size_t length, uint64_t line_number,
                              pt_error *err)
{
    json_error_t parse_error;
    json_t *object = json_loadb(line, length, JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                &parse_error);
    if (object == NULL)
        return pt_fail(err, "%s:%" PRIu64 ": invalid JSON near byte %d of "
                       "the line: %s", state->input_path, line_number,
                       parse_error.position, parse_error.text);
    int result;
    json_t *text = json_object_get(object, "text");
    if (!json_is_object(object))
        result = pt_fail(err, "%s:%" PRIu64 ": not a JSON object",
                         state->input_path, line_number);
    else if (text == NULL)
        result = pt_fail(err, "%s:%" PRIu64 ": the object has no \"text\" "
                         "field", state->input_path, line_number);
    else if (!json_is_string(text))
        result = pt_fail(err, "%s:%" PRIu64 ": \"text\" must be a string",
                         state->input_path, line_number);
    else
        result = tokenize_document(
            state, (const unsigned char *)json_string_value(text),
            json_string_length(text), err);
    json_decref(object);
    return result;
}

static int read_json_lines(prep_state *state, pt_line_reader *input,
                           pt_error *err)
{
    char *line;
    size_t length;
    int result = 0, more = 0;
    while (result == 0 &&
           (more = pt_line_reader_next(input, &line, &length, err)) > 0)
        if (!is_blank(line, length))
            result = tokenize_json_line(state, line, length,
                                        input->line_number, err);
    return result == 0 && more < 0 ? -1 : result;
}

static int read_input(prep_state *state, prep_format format, pt_error *err)
{
    pt_line_reader input;
    if (pt_line_reader_open(&input, state->input_path, PREP_MAX_LINE_BYTES,
                            err) != 0)
        return -1;
    int result = format == PREP_FORMAT_JSONL
                     ? read_json_lines(state, &input, err)
                     : read_text(state, &input, err);
    state->stats.input_bytes = input.bytes_read;
    pt_line_reader_close(&input);
    if (result == 0 && state->stats.documents == 0)
        result = pt_fail(err, "%s: no documents (the file is empty or blank)",
                         state->input_path);
    return result;
}

/* A prefix names the two files: "dir/" or a folder would write the
 * hidden files dir/.bin and dir/.idx. */
static int check_prefix(const char *prefix, pt_error *err)
{
    size_t length = strlen(prefix);
    struct stat info;
    if (length == 0)
        return pt_fail(err, "the output prefix is empty: give PREFIX for "
                            "PREFIX.bin and PREFIX.idx");
    if (prefix[length - 1] == '/')
        return pt_fail(err, "%s: the output prefix ends in '/': it would "
                            "write the hidden files %s.bin and %s.idx; give "
                            "a name in the folder, e.g. %scorpus",
                       prefix, prefix, prefix, prefix);
    if (stat(prefix, &info) == 0 && S_ISDIR(info.st_mode))
        return pt_fail(err, "%s: the output prefix is a folder: give a name "
                            "in it, e.g. %s/corpus (for corpus.bin and "
                            "corpus.idx)",
                       prefix, prefix);
    return 0;
}

/* PREFIX.bin and PREFIX.idx must not be the input they are made from. */
static int check_outputs_not_input(const char *prefix, const char *input,
                                   pt_error *err)
{
    const char *const suffixes[] = {".bin", ".idx"};
    for (int i = 0; i < 2; i++) {
        char output[PT_PATH_MAX + 8];
        snprintf(output, sizeof output, "%s%s", prefix, suffixes[i]);
        if (pt_check_output_not_input(output, input, "input", err) != 0)
            return -1;
    }
    return 0;
}

int prep_run(const char *input_path, prep_format format,
             const char *output_prefix, prep_stats *stats, pt_error *err)
{
    if (check_prefix(output_prefix, err) != 0 ||
        check_outputs_not_input(output_prefix, input_path, err) != 0)
        return -1;
    prep_state state = {.input_path = input_path};
    if (indexed_writer_begin(&state.writer, output_prefix, INDEXED_DTYPE_UINT16,
                             err) != 0)
        return -1;
    int result = read_input(&state, format, err);
    if (result == 0)
        result = indexed_writer_commit(&state.writer, err);
    else
        indexed_writer_abort(&state.writer);
    free(state.tokens);
    if (result == 0 && stats != NULL) {
        uint64_t documents = state.stats.documents;
        state.stats.bin_bytes = 2 * state.stats.tokens;
        state.stats.idx_bytes =
            INDEXED_HEADER_BYTES + 12 * documents + 8 * (documents + 1);
        *stats = state.stats;
    }
    return result;
}
