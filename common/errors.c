/* Errors travel up as formatted messages; only the command line shows
 * them. */
#include "common/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int pt_fail(pt_error *err, const char *format, ...)
{
    if (err != NULL) {
        va_list args;
        va_start(args, format);
        vsnprintf(err->message, sizeof err->message, format, args);
        va_end(args);
    }
    return -1;
}

void pt_error_prefix(pt_error *err, const char *format, ...)
{
    if (err == NULL)
        return;
    char prefix[sizeof err->message];
    va_list args;
    va_start(args, format);
    vsnprintf(prefix, sizeof prefix, format, args);
    va_end(args);

    /* Shift the old message right, then write the prefix in front. */
    size_t capacity = sizeof err->message;
    size_t prefix_length = strnlen(prefix, capacity - 1);
    size_t head_length = prefix_length + 2; /* "prefix: " */
    if (head_length >= capacity)
        head_length = capacity - 1;
    size_t old_length = strnlen(err->message, capacity - 1);
    if (head_length + old_length >= capacity)
        old_length = capacity - 1 - head_length;
    memmove(err->message + head_length, err->message, old_length);
    err->message[head_length + old_length] = '\0';
    memcpy(err->message, prefix, head_length < prefix_length ? head_length
                                                             : prefix_length);
    if (head_length >= prefix_length + 2) {
        err->message[prefix_length] = ':';
        err->message[prefix_length + 1] = ' ';
    }
}
