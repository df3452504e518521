/*
 * Megatron "MMIDIDX" indexed datasets: a validating reader over mmap and a
 * writer that publishes .bin/.idx atomically. docs/data.md describes the
 * byte layout.
 */
#include "executor/data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Offsets of the .idx header fields. */
enum {
    OFFSET_VERSION = 9,
    OFFSET_DTYPE = 17,
    OFFSET_SEQUENCE_COUNT = 18,
    OFFSET_DOC_INDEX_COUNT = 26
};

/* ------------------------------------------------------------- dtypes */

size_t indexed_dtype_size(int code)
{
    switch (code) {
    case INDEXED_DTYPE_UINT8:
    case INDEXED_DTYPE_INT8: return 1;
    case INDEXED_DTYPE_INT16:
    case INDEXED_DTYPE_UINT16: return 2;
    case INDEXED_DTYPE_INT32:
    case INDEXED_DTYPE_FLOAT32: return 4;
    case INDEXED_DTYPE_INT64:
    case INDEXED_DTYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *indexed_dtype_name(int code)
{
    switch (code) {
    case INDEXED_DTYPE_UINT8: return "uint8";
    case INDEXED_DTYPE_INT8: return "int8";
    case INDEXED_DTYPE_INT16: return "int16";
    case INDEXED_DTYPE_INT32: return "int32";
    case INDEXED_DTYPE_INT64: return "int64";
    case INDEXED_DTYPE_FLOAT64: return "float64";
    case INDEXED_DTYPE_FLOAT32: return "float32";
    case INDEXED_DTYPE_UINT16: return "uint16";
    default: return "unknown";
    }
}

bool indexed_dtype_is_integer(int code)
{
    return indexed_dtype_size(code) > 0 && code != INDEXED_DTYPE_FLOAT32 &&
           code != INDEXED_DTYPE_FLOAT64;
}

static bool dtype_is_signed(int code)
{
    return code == INDEXED_DTYPE_INT8 || code == INDEXED_DTYPE_INT16 ||
           code == INDEXED_DTYPE_INT32 || code == INDEXED_DTYPE_INT64;
}

/* The largest token id a dtype can hold (capped at UINT32_MAX). */
static uint64_t dtype_max_token(int code)
{
    switch (code) {
    case INDEXED_DTYPE_UINT8: return UINT8_MAX;
    case INDEXED_DTYPE_INT8: return INT8_MAX;
    case INDEXED_DTYPE_INT16: return INT16_MAX;
    case INDEXED_DTYPE_UINT16: return UINT16_MAX;
    case INDEXED_DTYPE_INT32: return INT32_MAX;
    default: return UINT32_MAX;
    }
}

/* ------------------------------------------------------------- mapping */

/* Maps a whole file read-only; an empty file gives NULL and size 0. */
static int map_file(const char *path, const unsigned char **map,
                    size_t *size, pt_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pt_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0) {
        int saved = errno;
        close(fd);
        return pt_fail(err, "%s: cannot stat: %s", path, strerror(saved));
    }
    if (!S_ISREG(info.st_mode)) {
        close(fd);
        return pt_fail(err, "%s: %s", path,
                       S_ISDIR(info.st_mode) ? "is a directory, not a file"
                                             : "not a regular file");
    }
    *size = (size_t)info.st_size;
    *map = NULL;
    if (*size > 0) {
        void *mapped = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mapped == MAP_FAILED) {
            int saved = errno;
            close(fd);
            return pt_fail(err, "%s: cannot map %zu bytes: %s", path, *size,
                           strerror(saved));
        }
        *map = mapped;
    }
    close(fd);
    return 0;
}

static void unmap_file(const unsigned char *map, size_t size)
{
    if (map != NULL)
        munmap((void *)map, size);
}

/* ---------------------------------------------------------- validation */

/* Fails unless `need` bytes of the field at `offset` lie inside the file. */
static int need_bytes(const indexed_dataset *ds, uint64_t offset,
                      uint64_t need, const char *field, pt_error *err)
{
    if (offset + need <= ds->idx_bytes)
        return 0;
    return pt_fail(err, "%s: offset %" PRIu64 " (%s): file ends at byte %zu, "
                   "the %" PRIu64 "-byte field does not fit (truncated?)",
                   ds->idx_path, offset, field, ds->idx_bytes, need);
}

static int check_header(indexed_dataset *ds, uint64_t *doc_index_count,
                        pt_error *err)
{
    const unsigned char *idx = ds->idx_map;
    if (need_bytes(ds, 0, INDEXED_MAGIC_BYTES, "magic", err) != 0)
        return -1;
    if (memcmp(idx, INDEXED_MAGIC, INDEXED_MAGIC_BYTES) != 0)
        return pt_fail(err, "%s: offset 0 (magic): not \"MMIDIDX\\0\\0\": "
                       "not a Megatron indexed dataset", ds->idx_path);
    if (need_bytes(ds, OFFSET_VERSION, 8, "version", err) != 0)
        return -1;
    uint64_t version = pt_load_le(idx + OFFSET_VERSION, 8);
    if (version != 1)
        return pt_fail(err, "%s: offset %d (version): %" PRIu64 ", only "
                       "version 1 is supported", ds->idx_path,
                       OFFSET_VERSION, version);
    if (need_bytes(ds, OFFSET_DTYPE, 1, "dtype", err) != 0)
        return -1;
    ds->dtype = idx[OFFSET_DTYPE];
    if (!indexed_dtype_is_integer(ds->dtype))
        return pt_fail(err, "%s: offset %d (dtype): code %d (%s) does not "
                       "hold integer tokens; expected 1-5 or 8", ds->idx_path,
                       OFFSET_DTYPE, ds->dtype, indexed_dtype_name(ds->dtype));
    ds->item_bytes = indexed_dtype_size(ds->dtype);
    if (need_bytes(ds, OFFSET_SEQUENCE_COUNT, 8, "sequence count", err) != 0 ||
        need_bytes(ds, OFFSET_DOC_INDEX_COUNT, 8, "document index count",
                   err) != 0)
        return -1;
    ds->sequence_count = pt_load_le(idx + OFFSET_SEQUENCE_COUNT, 8);
    *doc_index_count = pt_load_le(idx + OFFSET_DOC_INDEX_COUNT, 8);
    if (*doc_index_count == 0)
        return pt_fail(err, "%s: offset %d (document index count): 0, must be "
                       "at least 1 (the leading 0)", ds->idx_path,
                       OFFSET_DOC_INDEX_COUNT);
    return 0;
}

/* The arrays must fill the file exactly, with or without the multimodal
 * int8[S] modes at the end. */
static int check_array_sizes(indexed_dataset *ds, uint64_t doc_index_count,
                             pt_error *err)
{
    uint64_t s = ds->sequence_count;
    uint64_t arrays, plain;
    if (__builtin_mul_overflow(s, 12, &arrays) ||
        __builtin_mul_overflow(doc_index_count, 8, &plain) ||
        __builtin_add_overflow(arrays, plain, &plain) ||
        __builtin_add_overflow(plain, INDEXED_HEADER_BYTES, &plain))
        return pt_fail(err, "%s: offset %d: %" PRIu64 " sequences and %" PRIu64
                       " document indices cannot fit any file", ds->idx_path,
                       OFFSET_SEQUENCE_COUNT, s, doc_index_count);
    if (ds->idx_bytes < plain)
        return pt_fail(err, "%s: offset %zu: file ends there, but %" PRIu64
                       " sequences and %" PRIu64 " document indices need %"
                       PRIu64 " bytes (truncated?)", ds->idx_path,
                       ds->idx_bytes, s, doc_index_count, plain);
    if (ds->idx_bytes != plain && ds->idx_bytes - plain != s)
        return pt_fail(err, "%s: offset %" PRIu64 ": %" PRIu64 " bytes follow "
                       "the document indices; expected 0, or %" PRIu64
                       " (sequence modes)", ds->idx_path, plain,
                       (uint64_t)ds->idx_bytes - plain, s);
    ds->has_modes = s > 0 && ds->idx_bytes != plain;
    ds->lengths = ds->idx_map + INDEXED_HEADER_BYTES;
    ds->pointers = ds->lengths + 4 * s;
    ds->doc_index = ds->pointers + 8 * s;
    ds->document_count = doc_index_count - 1;
    return 0;
}

/* Lengths are not negative, each pointer is the running sum of the lengths
 * before it, and the sequences fill the .bin exactly. */
static int check_sequences(indexed_dataset *ds, pt_error *err)
{
    uint64_t running = 0;
    uint64_t pointers_offset = INDEXED_HEADER_BYTES + 4 * ds->sequence_count;
    for (uint64_t i = 0; i < ds->sequence_count; i++) {
        uint64_t length_offset = INDEXED_HEADER_BYTES + 4 * i;
        int32_t length = (int32_t)(uint32_t)pt_load_le(ds->lengths + 4 * i, 4);
        if (length < 0)
            return pt_fail(err, "%s: offset %" PRIu64 " (length of sequence %"
                           PRIu64 "): %" PRId32 " is negative", ds->idx_path,
                           length_offset, i, length);
        uint64_t pointer = pt_load_le(ds->pointers + 8 * i, 8);
        if (pointer != running)
            return pt_fail(err, "%s: offset %" PRIu64 " (pointer of sequence %"
                           PRIu64 "): %" PRId64 ", expected %" PRIu64 " (the "
                           "running sum of lengths x %zu bytes)", ds->idx_path,
                           pointers_offset + 8 * i, i, (int64_t)pointer,
                           running, ds->item_bytes);
        running += (uint64_t)length * ds->item_bytes;
        if (running > ds->bin_bytes)
            return pt_fail(err, "%s: offset %" PRIu64 " (length of sequence %"
                           PRIu64 "): the sequence ends at byte %" PRIu64
                           " but %s has only %zu bytes (lengths overrun the "
                           ".bin)", ds->idx_path, length_offset, i, running,
                           ds->bin_path, ds->bin_bytes);
        ds->total_tokens += (uint64_t)length;
    }
    if (running != ds->bin_bytes)
        return pt_fail(err, "%s: %zu bytes, but %s describes %" PRIu64
                       " bytes of sequences", ds->bin_path, ds->bin_bytes,
                       ds->idx_path, running);
    return 0;
}

static int check_document_index(const indexed_dataset *ds, pt_error *err)
{
    uint64_t base = INDEXED_HEADER_BYTES + 12 * ds->sequence_count;
    uint64_t previous = 0;
    for (uint64_t j = 0; j <= ds->document_count; j++) {
        uint64_t entry = pt_load_le(ds->doc_index + 8 * j, 8);
        if (j == 0 && entry != 0)
            return pt_fail(err, "%s: offset %" PRIu64 " (document index 0): %"
                           PRId64 ", must be 0", ds->idx_path, base,
                           (int64_t)entry);
        if (entry < previous || entry > ds->sequence_count)
            return pt_fail(err, "%s: offset %" PRIu64 " (document index %"
                           PRIu64 "): %" PRId64 " %s", ds->idx_path,
                           base + 8 * j, j, (int64_t)entry,
                           entry < previous
                               ? "is below the entry before it (must never "
                                 "decrease)"
                               : "is past the sequence count");
        previous = entry;
    }
    if (previous != ds->sequence_count)
        return pt_fail(err, "%s: offset %" PRIu64 " (document index %" PRIu64
                       "): %" PRIu64 ", the last entry must equal the sequence "
                       "count %" PRIu64, ds->idx_path,
                       base + 8 * ds->document_count, ds->document_count,
                       previous, ds->sequence_count);
    return 0;
}

static int set_paths(indexed_dataset *ds, const char *prefix, pt_error *err)
{
    int idx_len = snprintf(ds->idx_path, sizeof ds->idx_path, "%s.idx", prefix);
    int bin_len = snprintf(ds->bin_path, sizeof ds->bin_path, "%s.bin", prefix);
    if (idx_len < 0 || bin_len < 0 || (size_t)idx_len >= sizeof ds->idx_path ||
        (size_t)bin_len >= sizeof ds->bin_path)
        return pt_fail(err, "%s: dataset prefix too long", prefix);
    return 0;
}

int indexed_dataset_open(indexed_dataset *ds, const char *prefix,
                         pt_error *err)
{
    memset(ds, 0, sizeof *ds);
    if (set_paths(ds, prefix, err) != 0)
        return -1;
    if (map_file(ds->idx_path, &ds->idx_map, &ds->idx_bytes, err) != 0)
        return -1;
    uint64_t doc_index_count = 0;
    if (check_header(ds, &doc_index_count, err) != 0 ||
        check_array_sizes(ds, doc_index_count, err) != 0 ||
        map_file(ds->bin_path, &ds->bin_map, &ds->bin_bytes, err) != 0 ||
        check_sequences(ds, err) != 0 || check_document_index(ds, err) != 0) {
        indexed_dataset_close(ds);
        return -1;
    }
    return 0;
}

void indexed_dataset_close(indexed_dataset *ds)
{
    unmap_file(ds->idx_map, ds->idx_bytes);
    unmap_file(ds->bin_map, ds->bin_bytes);
    ds->idx_map = NULL;
    ds->bin_map = NULL;
    ds->idx_bytes = 0;
    ds->bin_bytes = 0;
}

/* ------------------------------------------------------------- access */

uint64_t indexed_dataset_sequence_length(const indexed_dataset *ds,
                                         uint64_t sequence)
{
    return pt_load_le(ds->lengths + 4 * sequence, 4);
}

uint64_t indexed_dataset_sequence_offset(const indexed_dataset *ds,
                                         uint64_t sequence)
{
    return pt_load_le(ds->pointers + 8 * sequence, 8);
}

void indexed_dataset_document_sequences(const indexed_dataset *ds,
                                        uint64_t document, uint64_t *first,
                                        uint64_t *end)
{
    *first = pt_load_le(ds->doc_index + 8 * document, 8);
    *end = pt_load_le(ds->doc_index + 8 * (document + 1), 8);
}

uint64_t indexed_dataset_document_length(const indexed_dataset *ds,
                                         uint64_t document)
{
    uint64_t first, end, tokens = 0;
    indexed_dataset_document_sequences(ds, document, &first, &end);
    for (uint64_t i = first; i < end; i++)
        tokens += indexed_dataset_sequence_length(ds, i);
    return tokens;
}

int indexed_dataset_read_tokens(const indexed_dataset *ds, uint64_t sequence,
                                uint64_t first, uint64_t count, uint32_t *out,
                                pt_error *err)
{
    if (sequence >= ds->sequence_count)
        return pt_fail(err, "%s: sequence %" PRIu64 " does not exist (%" PRIu64
                       " sequences)", ds->idx_path, sequence,
                       ds->sequence_count);
    uint64_t length = indexed_dataset_sequence_length(ds, sequence);
    if (first > length || count > length - first)
        return pt_fail(err, "%s: tokens %" PRIu64 "..%" PRIu64 " are past the "
                       "end of sequence %" PRIu64 " (%" PRIu64 " tokens)",
                       ds->bin_path, first, first + count, sequence, length);
    size_t item = ds->item_bytes;
    uint64_t offset = indexed_dataset_sequence_offset(ds, sequence) +
                      first * item;
    uint64_t sign_bit = (uint64_t)1 << (8 * item - 1);
    bool is_signed = dtype_is_signed(ds->dtype);
    for (uint64_t t = 0; t < count; t++, offset += item) {
        uint64_t raw = pt_load_le(ds->bin_map + offset, item);
        if ((is_signed && (raw & sign_bit)) || raw > UINT32_MAX)
            return pt_fail(err, "%s: offset %" PRIu64 ": token %s is not a "
                           "valid token id (%s)", ds->bin_path, offset,
                           is_signed && (raw & sign_bit) ? "value negative"
                                                          : "above 2^32 - 1",
                           indexed_dtype_name(ds->dtype));
        out[t] = (uint32_t)raw;
    }
    return 0;
}

/* -------------------------------------------------------------- writer */

enum { STAGING_TOKENS = 1 << 16 };

int indexed_writer_begin(indexed_writer *w, const char *prefix, int dtype,
                         pt_error *err)
{
    memset(w, 0, sizeof *w);
    w->bin_fd = -1;
    if (!indexed_dtype_is_integer(dtype))
        return pt_fail(err, "%s: dtype code %d (%s) cannot hold token ids",
                       prefix, dtype, indexed_dtype_name(dtype));
    char bin_path[PT_PATH_MAX], idx_path[PT_PATH_MAX];
    int needed = snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
    if (needed < 0 || (size_t)needed >= sizeof bin_path)
        return pt_fail(err, "%s: dataset prefix too long", prefix);
    snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
    /* symbolic links stay: their targets get the new files */
    if (pt_output_target(bin_path, w->bin_target, sizeof w->bin_target,
                         err) != 0 ||
        pt_output_target(idx_path, w->idx_target, sizeof w->idx_target,
                         err) != 0)
        return -1;
    pt_copy_string(w->prefix, sizeof w->prefix, prefix);
    w->dtype = dtype;
    w->item_bytes = indexed_dtype_size(dtype);
    w->staging = malloc(STAGING_TOKENS * w->item_bytes);
    if (w->staging == NULL)
        return pt_fail(err, "%s: out of memory", prefix);
    w->bin_fd = pt_temp_file_beside(w->bin_target, w->bin_temp,
                                    sizeof w->bin_temp, err);
    if (w->bin_fd < 0) {
        indexed_writer_abort(w);
        return -1;
    }
    return 0;
}

void indexed_writer_abort(indexed_writer *w)
{
    if (w->bin_fd >= 0)
        close(w->bin_fd);
    if (w->bin_temp[0] != '\0')
        unlink(w->bin_temp);
    w->bin_fd = -1;
    w->bin_temp[0] = '\0';
    free(w->lengths);
    free(w->staging);
    w->lengths = NULL;
    w->staging = NULL;
}

static int grow_lengths(indexed_writer *w, pt_error *err)
{
    if (w->sequence_count < w->sequence_capacity)
        return 0;
    uint64_t capacity = w->sequence_capacity ? 2 * w->sequence_capacity : 1024;
    int32_t *grown = realloc(w->lengths, capacity * sizeof *grown);
    if (grown == NULL)
        return pt_fail(err, "%s.bin: out of memory for %" PRIu64 " documents",
                       w->prefix, capacity);
    w->lengths = grown;
    w->sequence_capacity = capacity;
    return 0;
}

static int stage_and_write(indexed_writer *w, const uint32_t *tokens,
                           uint64_t count, pt_error *err)
{
    uint64_t max_token = dtype_max_token(w->dtype);
    for (uint64_t done = 0; done < count;) {
        uint64_t chunk = count - done < STAGING_TOKENS ? count - done
                                                       : STAGING_TOKENS;
        for (uint64_t t = 0; t < chunk; t++) {
            uint32_t token = tokens[done + t];
            if (token > max_token)
                return pt_fail(err, "%s.bin: document %" PRIu64 ", token %"
                               PRIu64 ": %" PRIu32 " does not fit %s",
                               w->prefix, w->sequence_count, done + t, token,
                               indexed_dtype_name(w->dtype));
            pt_store_le(w->staging + t * w->item_bytes, token, w->item_bytes);
        }
        if (pt_write_fully(w->bin_fd, w->staging, chunk * w->item_bytes) != 0)
            return pt_fail(err, "%s: write failed: %s", w->bin_temp,
                           strerror(errno));
        done += chunk;
    }
    return 0;
}

int indexed_writer_add_document(indexed_writer *w, const uint32_t *tokens,
                                uint64_t count, pt_error *err)
{
    if (w->bin_fd < 0)
        return pt_fail(err, "%s: dataset writer is not open", w->prefix);
    if (count > INT32_MAX) {
        indexed_writer_abort(w);
        return pt_fail(err, "%s.bin: document %" PRIu64 " has %" PRIu64
                       " tokens, more than a sequence length can hold (2^31 - "
                       "1)", w->prefix, w->sequence_count, count);
    }
    if (grow_lengths(w, err) != 0 ||
        stage_and_write(w, tokens, count, err) != 0) {
        indexed_writer_abort(w);
        return -1;
    }
    w->lengths[w->sequence_count++] = (int32_t)count;
    return 0;
}

/* The whole .idx in memory: header, lengths, pointers, document indices
 * (one sequence per document, so entry j is j). */
static unsigned char *encode_index(const indexed_writer *w, size_t *size)
{
    uint64_t s = w->sequence_count;
    *size = INDEXED_HEADER_BYTES + 12 * s + 8 * (s + 1);
    unsigned char *idx = calloc(1, *size);
    if (idx == NULL)
        return NULL;
    memcpy(idx, INDEXED_MAGIC, INDEXED_MAGIC_BYTES);
    pt_store_le(idx + OFFSET_VERSION, 1, 8);
    idx[OFFSET_DTYPE] = (unsigned char)w->dtype;
    pt_store_le(idx + OFFSET_SEQUENCE_COUNT, s, 8);
    pt_store_le(idx + OFFSET_DOC_INDEX_COUNT, s + 1, 8);
    unsigned char *lengths = idx + INDEXED_HEADER_BYTES;
    unsigned char *pointers = lengths + 4 * s;
    unsigned char *documents = pointers + 8 * s;
    uint64_t pointer = 0;
    for (uint64_t i = 0; i < s; i++) {
        pt_store_le(lengths + 4 * i, (uint32_t)w->lengths[i], 4);
        pt_store_le(pointers + 8 * i, pointer, 8);
        pointer += (uint64_t)w->lengths[i] * w->item_bytes;
    }
    for (uint64_t j = 0; j <= s; j++)
        pt_store_le(documents + 8 * j, j, 8);
    return idx;
}

/* The new .idx in a finished temporary file beside its target. */
static int write_index_temp(const indexed_writer *w, char *idx_temp,
                            size_t temp_size, pt_error *err)
{
    size_t idx_size;
    unsigned char *idx = encode_index(w, &idx_size);
    if (idx == NULL)
        return pt_fail(err, "%s.idx: out of memory for the index", w->prefix);
    int fd = pt_temp_file_beside(w->idx_target, idx_temp, temp_size, err);
    if (fd < 0) {
        free(idx);
        return -1;
    }
    int written = pt_write_fully(fd, idx, idx_size);
    int saved = errno;
    free(idx);
    if (written != 0) {
        close(fd);
        unlink(idx_temp);
        return pt_fail(err, "%s: write failed: %s", idx_temp, strerror(saved));
    }
    return pt_finish_temp_file(fd, idx_temp, err);
}

/* A second name for the .bin being replaced, so that it comes back if
 * the .idx cannot follow ("" in *backup when there is no old .bin). */
static int keep_old_bin(const indexed_writer *w, char *backup, size_t size,
                        pt_error *err)
{
    backup[0] = '\0';
    if (access(w->bin_target, F_OK) != 0)
        return 0;
    int fd = pt_temp_file_beside(w->bin_target, backup, size, err);
    if (fd < 0)
        return -1;
    close(fd);
    unlink(backup);
    if (link(w->bin_target, backup) != 0) {
        int saved = errno;
        backup[0] = '\0';
        return pt_fail(err, "%s: cannot keep the old file while the pair is "
                            "replaced: %s (nothing was changed)",
                       w->bin_target, strerror(saved));
    }
    return 0;
}

/* Both temporaries are complete and on disk before either is renamed;
 * the old .bin is kept under a second name until the .idx is in place,
 * and put back if the .idx cannot be: the pair changes together or not
 * at all (only a crash between the two renames leaves a new .bin with
 * the old .idx, which the reader refuses as a mismatch). */
static int publish_dataset(indexed_writer *w, pt_error *err)
{
    char idx_temp[PT_PATH_MAX + 24], backup[PT_PATH_MAX + 24];
    if (write_index_temp(w, idx_temp, sizeof idx_temp, err) != 0)
        return -1;
    if (keep_old_bin(w, backup, sizeof backup, err) != 0 ||
        pt_rename_into_place(w->bin_temp, w->bin_target, err) != 0) {
        unlink(idx_temp);
        if (backup[0] != '\0')
            unlink(backup);
        return -1;
    }
    w->bin_temp[0] = '\0';
    if (pt_rename_into_place(idx_temp, w->idx_target, err) != 0) {
        if (backup[0] != '\0')
            rename(backup, w->bin_target);
        else
            unlink(w->bin_target);
        pt_error_prefix(err, "%s: not replaced, the old pair is kept",
                        w->prefix);
        return -1;
    }
    if (backup[0] != '\0')
        unlink(backup);
    char dir[PT_PATH_MAX];
    pt_directory_of(w->bin_target, dir, sizeof dir);
    if (pt_sync_directory(dir, err) != 0)
        return -1;
    pt_directory_of(w->idx_target, dir, sizeof dir);
    return pt_sync_directory(dir, err);
}

int indexed_writer_commit(indexed_writer *w, pt_error *err)
{
    if (w->bin_fd < 0)
        return pt_fail(err, "%s: dataset writer is not open", w->prefix);
    int fd = w->bin_fd;
    w->bin_fd = -1;
    int result = -1;
    if (pt_finish_temp_file(fd, w->bin_temp, err) == 0)
        result = publish_dataset(w, err);
    else
        w->bin_temp[0] = '\0';  /* finish_temp_file removed it */
    indexed_writer_abort(w);     /* frees; removes only what is unpublished */
    return result;
}

int indexed_dataset_write(const char *prefix, int dtype,
                          const uint32_t *const *documents,
                          const uint64_t *document_lengths,
                          uint64_t document_count, pt_error *err)
{
    indexed_writer writer;
    if (indexed_writer_begin(&writer, prefix, dtype, err) != 0)
        return -1;
    for (uint64_t d = 0; d < document_count; d++)
        if (indexed_writer_add_document(&writer, documents[d],
                                        document_lengths[d], err) != 0)
            return -1;
    return indexed_writer_commit(&writer, err);
}
