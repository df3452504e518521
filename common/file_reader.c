/*
 * The one way Partita reads an input file's bytes: through read(2), so a
 * failed read is an error and never the end of the file (getline and
 * fread return the same -1 or 0 for both), and never more than a bound,
 * so an endless input (/dev/zero, a FIFO, a line of 400 MB) is refused
 * before it exhausts memory. Lines for the text readers (prep, training
 * logs), whole files for the JSON readers.
 */
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bytes asked of read(2) at a time. */
enum { READ_CHUNK = 1 << 16 };

/* Opens path for reading and refuses a directory (read(2) would say
 * EISDIR after the open, a message less plain than this one). */
static int open_input(const char *path, pt_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pt_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
        close(fd);
        return pt_fail(err, "%s: is a directory, not a file", path);
    }
    return fd;
}

/* One read(2), retried on EINTR: the bytes read, 0 at the end, -1. */
static ssize_t read_some(int fd, char *into, size_t size)
{
    for (;;) {
        ssize_t got = read(fd, into, size);
        if (got >= 0 || errno != EINTR)
            return got;
    }
}

/* ------------------------------------------------------------- lines */

int pt_line_reader_open(pt_line_reader *r, const char *path,
                        size_t max_line, pt_error *err)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->path = path;
    r->max_line = max_line;
    int fd = open_input(path, err);
    if (fd < 0)
        return -1;
    r->fd = fd;
    return 0;
}

void pt_line_reader_close(pt_line_reader *r)
{
    if (r->fd >= 0)
        close(r->fd);
    free(r->buffer);
    r->fd = -1;
    r->buffer = NULL;
}

/* Room to read into: the unread bytes moved to the front, the buffer
 * grown while it holds less than a whole line may need (the line, its
 * newline, a terminator and one chunk). */
static int make_room(pt_line_reader *r, pt_error *err)
{
    if (r->start > 0) {
        memmove(r->buffer, r->buffer + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    size_t wanted = r->end + READ_CHUNK + 1;
    if (wanted <= r->capacity)
        return 0;
    size_t grown = r->capacity > 0 ? 2 * r->capacity : READ_CHUNK + 1;
    if (grown < wanted)
        grown = wanted;
    char *bigger = realloc(r->buffer, grown);
    if (bigger == NULL)
        return pt_fail(err, "%s: out of memory for line %llu (%zu bytes so "
                            "far)",
                       r->path, (unsigned long long)r->line_number + 1,
                       r->end);
    r->buffer = bigger;
    r->capacity = grown;
    return 0;
}

static int fill(pt_line_reader *r, pt_error *err)
{
    if (make_room(r, err) != 0)
        return -1;
    ssize_t got = read_some(r->fd, r->buffer + r->end,
                            r->capacity - r->end - 1);
    if (got < 0)
        return pt_fail(err, "%s: read error after line %llu: %s", r->path,
                       (unsigned long long)r->line_number, strerror(errno));
    if (got == 0)
        r->at_end = true;
    r->end += (size_t)got;
    return 0;
}

static int line_too_long(const pt_line_reader *r, pt_error *err)
{
    return pt_fail(err, "%s:%llu: the line is longer than %zu bytes (the "
                        "most a line may hold here; is this the right "
                        "file?)",
                   r->path, (unsigned long long)r->line_number + 1,
                   r->max_line);
}

int pt_line_reader_next(pt_line_reader *r, char **line, size_t *length,
                        pt_error *err)
{
    if (r->fd < 0)
        return pt_fail(err, "%s: not open for reading", r->path);
    for (;;) {
        size_t unread = r->end - r->start;
        char *begin = r->buffer != NULL ? r->buffer + r->start : NULL;
        char *newline = unread > 0 ? memchr(begin, '\n', unread) : NULL;
        size_t size = newline != NULL ? (size_t)(newline - begin) : unread;
        if (size > r->max_line)
            return line_too_long(r, err);
        if (newline != NULL || (r->at_end && unread > 0)) {
            begin[size] = '\0';  /* the newline, or the spare byte */
            r->start += newline != NULL ? size + 1 : size;
            r->ended_by_newline = newline != NULL;
            r->line_number++;
            *line = begin;
            *length = size;
            return 1;
        }
        if (r->at_end)
            return 0;
        if (fill(r, err) != 0)
            return -1;
        r->bytes_read += r->end - r->start - unread;
    }
}

/* -------------------------------------------------------- whole files */

int pt_read_file(const char *path, size_t max_bytes, char **data,
                 size_t *size, pt_error *err)
{
    *data = NULL;
    *size = 0;
    int fd = open_input(path, err);
    if (fd < 0)
        return -1;
    /* a regular file's size is the first guess (its end is still found
       by reading: it may grow); a pipe's is not known */
    struct stat info;
    size_t guess = fstat(fd, &info) == 0 && S_ISREG(info.st_mode) &&
                           (uint64_t)info.st_size < max_bytes
                       ? (size_t)info.st_size + 2
                       : READ_CHUNK + 1;
    char *buffer = NULL;
    size_t used = 0, capacity = 0;
    int status = 0;
    for (;;) {
        if (capacity - used < 2) {
            size_t grown = capacity > 0 ? 2 * capacity : guess;
            char *bigger = realloc(buffer, grown);
            if (bigger == NULL) {
                status = pt_fail(err, "%s: out of memory after %zu bytes",
                                 path, used);
                break;
            }
            buffer = bigger;
            capacity = grown;
        }
        ssize_t got = read_some(fd, buffer + used, capacity - used - 1);
        if (got < 0) {
            status = pt_fail(err, "%s: read error after %zu bytes: %s", path,
                             used, strerror(errno));
            break;
        }
        if (got == 0)
            break;
        used += (size_t)got;
        if (used > max_bytes) {
            status = pt_fail(err, "%s: larger than %zu bytes, the most "
                                  "this file may hold (is this the right "
                                  "file?)",
                             path, max_bytes);
            break;
        }
    }
    close(fd);
    if (status != 0) {
        free(buffer);
        return -1;
    }
    buffer[used] = '\0';
    *data = buffer;
    *size = used;
    return 0;
}
