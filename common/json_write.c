/* JSON out: the one layout every file Partita writes shares, and the one
 * atomic file writer (a temporary file beside the target, fsync, rename),
 * so that a crash or a full disk never leaves half a file or loses the
 * old one. */
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reals keep 9 significant digits: nanoseconds of a 1-second step, and
 * every figure a user typed survives a round trip. */
#define JSON_TEXT_FLAGS (JSON_ENCODE_ANY | JSON_REAL_PRECISION(9))
/* Arrays of numbers and strings fill lines up to this many columns. */
#define JSON_TEXT_COLUMNS 78

/* A text under construction; `failed` once an allocation failed. */
typedef struct text_buffer {
    char *data;
    size_t length, capacity;
    size_t line_start;   /* offset where the current line begins */
    bool failed;
} text_buffer;

static void append(text_buffer *out, const char *text, size_t length)
{
    if (out->failed)
        return;
    if (out->length + length + 1 > out->capacity) {
        size_t capacity = out->capacity ? out->capacity : 4096;
        while (out->length + length + 1 > capacity)
            capacity *= 2;
        char *grown = realloc(out->data, capacity);
        if (grown == NULL) {
            out->failed = true;
            return;
        }
        out->data = grown;
        out->capacity = capacity;
    }
    memcpy(out->data + out->length, text, length);
    out->length += length;
    out->data[out->length] = '\0';
}

static void new_line(text_buffer *out, int indent)
{
    append(out, "\n", 1);
    out->line_start = out->length;
    for (int i = 0; i < indent; i++)
        append(out, " ", 1);
}

static size_t column(const text_buffer *out)
{
    return out->length - out->line_start;
}

/* The text of a number, string, true, false or null as Jansson encodes
 * it: in small when it fits (*heap NULL), else in *heap (caller frees).
 * Returns the length, 0 when out of memory. */
static size_t scalar_text(const json_t *value, char *small, size_t size,
                          char **heap)
{
    *heap = NULL;
    size_t needed = json_dumpb(value, small, size, JSON_TEXT_FLAGS);
    if (needed > 0 && needed <= size)
        return needed;
    *heap = json_dumps(value, JSON_TEXT_FLAGS);
    return *heap != NULL ? strlen(*heap) : 0;
}

static void append_scalar(text_buffer *out, const json_t *value)
{
    char small[64], *heap;
    size_t length = scalar_text(value, small, sizeof small, &heap);
    if (length == 0)
        out->failed = true;
    else
        append(out, heap != NULL ? heap : small, length);
    free(heap);
}

static void append_key(text_buffer *out, const char *key)
{
    json_t *name = json_string(key);
    if (name == NULL) {
        out->failed = true;
        return;
    }
    append_scalar(out, name);
    json_decref(name);
    append(out, ": ", 2);
}

static bool is_container(const json_t *value)
{
    return json_is_object(value) || json_is_array(value);
}

static void append_value(text_buffer *out, const json_t *value, int indent);

/* [a, b, c] on the current line when it fits; else the elements fill
 * lines indented under the key. */
static void append_scalar_array(text_buffer *out, const json_t *array,
                                int indent)
{
    size_t count = json_array_size(array);
    size_t total = 2;
    for (size_t i = 0; i < count && total < JSON_TEXT_COLUMNS; i++)
        total += json_dumpb(json_array_get(array, i), NULL, 0,
                            JSON_TEXT_FLAGS) + 2;
    bool one_line = column(out) + total <= JSON_TEXT_COLUMNS;
    append(out, "[", 1);
    if (!one_line)
        new_line(out, indent + 2);
    for (size_t i = 0; i < count; i++) {
        char small[64], *heap;
        size_t length = scalar_text(json_array_get(array, i), small,
                                    sizeof small, &heap);
        if (length == 0)
            out->failed = true;
        if (i > 0) {
            append(out, ",", 1);
            if (!one_line && column(out) + 1 + length + 1 > JSON_TEXT_COLUMNS)
                new_line(out, indent + 2);
            else
                append(out, " ", 1);
        }
        append(out, heap != NULL ? heap : small, length);
        free(heap);
    }
    if (!one_line)
        new_line(out, indent);
    append(out, "]", 1);
}

static void append_array(text_buffer *out, const json_t *array, int indent)
{
    size_t count = json_array_size(array);
    bool scalars = true;
    for (size_t i = 0; i < count && scalars; i++)
        scalars = !is_container(json_array_get(array, i));
    if (count == 0 || scalars) {
        append_scalar_array(out, array, indent);
        return;
    }
    append(out, "[", 1);
    for (size_t i = 0; i < count; i++) {
        if (i > 0)
            append(out, ",", 1);
        new_line(out, indent + 2);
        append_value(out, json_array_get(array, i), indent + 2);
    }
    new_line(out, indent);
    append(out, "]", 1);
}

static void append_object(text_buffer *out, const json_t *object, int indent)
{
    if (json_object_size(object) == 0) {
        append(out, "{}", 2);
        return;
    }
    append(out, "{", 1);
    const char *key;
    json_t *member;
    bool first = true;
    /* Jansson keeps the order in which keys were set. */
    json_object_foreach((json_t *)object, key, member) {
        if (!first)
            append(out, ",", 1);
        first = false;
        new_line(out, indent + 2);
        append_key(out, key);
        append_value(out, member, indent + 2);
    }
    new_line(out, indent);
    append(out, "}", 1);
}

static void append_value(text_buffer *out, const json_t *value, int indent)
{
    if (json_is_object(value))
        append_object(out, value, indent);
    else if (json_is_array(value))
        append_array(out, value, indent);
    else
        append_scalar(out, value);
}

char *json_format_text(const json_t *root)
{
    text_buffer out = {0};
    append_value(&out, root, 0);
    append(&out, "\n", 1);
    if (out.failed) {
        free(out.data);
        return NULL;
    }
    return out.data;
}

void json_put(json_t *obj, const char *key, json_t *value, int *failures)
{
    /* json_object_set_new releases value itself when it fails. */
    if (value == NULL || json_object_set_new(obj, key, value) != 0)
        (*failures)++;
}

void json_push(json_t *array, json_t *value, int *failures)
{
    /* json_array_append_new releases value itself when it fails. */
    if (value == NULL || json_array_append_new(array, value) != 0)
        (*failures)++;
}

int json_write_file_atomic(const json_t *root, const char *path,
                           pt_error *err)
{
    char *text = json_format_text(root);
    if (text == NULL)
        return pt_fail(err, "%s: out of memory serialising JSON", path);
    int status = pt_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return status;
}
