/*
 * Fuzzes the bounded line reader every text reader goes through
 * (common/file_reader.c: prep, the training logs). The first byte sets
 * the longest line allowed (1 to 256 bytes, so that over-long lines are
 * common), the second a read(2) to fail (its low 2 bits: none, or the
 * 1st, 2nd or 3rd call, failed with EIO or ENOMEM by
 * tests/fault_injection.c); the rest is written as <scratch>/lines.txt.
 * The lines read must be the file exactly, each within the bound; a line
 * past the bound must be refused; a failed read must fail the reading,
 * never end it as if the file ended there.
 */
#include "fuzz.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tests/fault_injection.h"

/* The longest run of bytes without a newline. */
static size_t longest_line(const uint8_t *text, size_t size)
{
    size_t longest = 0, run = 0;
    for (size_t i = 0; i < size; i++) {
        run = text[i] == '\n' ? 0 : run + 1;
        if (run > longest)
            longest = run;
    }
    return longest;
}

/* Reads every line, checking each against the file; the reader's last
 * status. *matched counts the file's bytes the lines gave back. */
static int read_all(const char *path, size_t max_line, const uint8_t *text,
                    size_t size, size_t *matched, pt_error *err)
{
    pt_line_reader reader;
    *matched = 0;
    if (pt_line_reader_open(&reader, path, max_line, err) != 0)
        return -2;
    char *line;
    size_t length;
    int status;
    while ((status = pt_line_reader_next(&reader, &line, &length, err)) > 0) {
        if (length > max_line || *matched + length > size ||
            memcmp(line, text + *matched, length) != 0 ||
            line[length] != '\0')
            abort();
        *matched += length;
        if (reader.ended_by_newline) {
            if (*matched >= size || text[*matched] != '\n')
                abort();
            (*matched)++;
        }
    }
    pt_line_reader_close(&reader);
    return status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch_dir();
    if (dir == NULL || size < 2)
        return 0;
    size_t max_line = (size_t)data[0] + 1;
    int failing_read = data[1] & 3;
    const uint8_t *text = data + 2;
    size_t text_size = size - 2;
    char path[600];
    snprintf(path, sizeof path, "%s/lines.txt", dir);
    if (fuzz_write_file(path, text, text_size) != 0)
        return 0;
    if (failing_read > 0)
        fault_fail_read_after(failing_read - 1, data[1] & 4 ? ENOMEM : EIO);
    size_t matched;
    pt_error err = {{0}};
    int status = read_all(path, max_line, text, text_size, &matched, &err);
    bool read_failed = fault_read_fired();
    fault_clear();
    if (status == -2)
        abort();  /* the file was just written */
    if (read_failed) {
        if (status != -1 || strstr(err.message, "read error") == NULL)
            abort();
        return 0;
    }
    bool too_long = longest_line(text, text_size) > max_line;
    if (too_long != (status == -1))
        abort();
    if (too_long && strstr(err.message, "longer than") == NULL)
        abort();
    if (!too_long && matched != text_size)
        abort();
    return 0;
}
