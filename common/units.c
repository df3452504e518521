/* Human-readable quantities, string and path helpers, and counts read
 * from the environment. Every number a
 * user sees carries its unit; three significant digits are enough for a
 * reader and keep columns narrow. */
#include "common/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pt_env_count(const char *name, const char *what, long most,
                 long fallback, long *out, pt_error *err)
{
    const char *value = getenv(name);
    *out = fallback;
    if (value == NULL || value[0] == '\0')
        return 0;
    char *end = NULL;
    long count = strtol(value, &end, 10);
    if (end == value || *end != '\0' || count < 0 || count > most)
        return pt_fail(err, "%s: expected a count of %s from 0 to %ld, got "
                            "\"%s\"",
                       name, what, most, value);
    *out = count;
    return 0;
}

/* Three significant digits: 812, 14.2, 3.41. */
static void format_three_digits(double value, const char *unit, char *out,
                                size_t out_size)
{
    double magnitude = fabs(value);
    int decimals = magnitude >= 99.95 ? 0 : magnitude >= 9.995 ? 1 : 2;
    snprintf(out, out_size, "%.*f %s", decimals, value, unit);
}

double pt_round_significant(double x, int digits)
{
    if (x == 0.0 || !isfinite(x))
        return x;
    double scale = pow(10.0, digits - 1 - (int)floor(log10(fabs(x))));
    return round(x * scale) / scale;
}

void pt_format_seconds(double seconds, char *out, size_t out_size)
{
    double magnitude = fabs(seconds);
    if (!isfinite(seconds))
        snprintf(out, out_size, "%g s", seconds);
    else if (magnitude == 0.0)
        snprintf(out, out_size, "0 s");
    else if (magnitude < 999.5e-9)
        format_three_digits(seconds * 1e9, "ns", out, out_size);
    else if (magnitude < 999.5e-6)
        format_three_digits(seconds * 1e6, "us", out, out_size);
    else if (magnitude < 999.5e-3)
        format_three_digits(seconds * 1e3, "ms", out, out_size);
    else
        format_three_digits(seconds, "s", out, out_size);
}

void pt_format_bytes(double bytes, char *out, size_t out_size)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    double magnitude = fabs(bytes);
    if (!isfinite(bytes)) {
        snprintf(out, out_size, "%g B", bytes);
        return;
    }
    if (magnitude < 1023.5) {
        snprintf(out, out_size, "%.0f B", bytes);
        return;
    }
    double scaled = bytes / 1024.0;
    size_t unit = 0;
    /* Move up while the rounded figure would reach 1024 of this unit. */
    while (fabs(scaled) >= 1023.5 && unit + 1 < sizeof units / sizeof *units) {
        scaled /= 1024.0;
        unit++;
    }
    format_three_digits(scaled, units[unit], out, out_size);
}

void pt_copy_string(char *out, size_t out_size, const char *text)
{
    if (out_size == 0)
        return;
    if (text == NULL)
        text = "";
    size_t length = strnlen(text, out_size - 1);
    memcpy(out, text, length);
    out[length] = '\0';
}

void pt_escape_controls(const char *text, char *out, size_t out_size)
{
    if (out_size == 0)
        return;
    size_t used = 0;
    for (const unsigned char *c = (const unsigned char *)(text ? text : "");
         *c != '\0'; c++) {
        char piece[8];
        if (*c == '\n' || *c == '\t' || *c == '\r')
            snprintf(piece, sizeof piece, "\\%c",
                     *c == '\n' ? 'n' : *c == '\t' ? 't' : 'r');
        else if (*c < 0x20 || *c == 0x7f)
            snprintf(piece, sizeof piece, "\\x%02x", *c);
        else if (*c == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f)
            snprintf(piece, sizeof piece, "\\u%04x", *++c);
        else
            snprintf(piece, sizeof piece, "%c", *c);
        size_t length = strlen(piece);
        if (used + length + 1 > out_size)
            break;
        memcpy(out + used, piece, length);
        used += length;
    }
    out[used] = '\0';
}

void pt_directory_of(const char *path, char *out, size_t out_size)
{
    const char *last_slash = path != NULL ? strrchr(path, '/') : NULL;
    if (last_slash == NULL) {
        pt_copy_string(out, out_size, ".");
        return;
    }
    if (last_slash == path) {
        pt_copy_string(out, out_size, "/");
        return;
    }
    size_t length = (size_t)(last_slash - path);
    if (out_size == 0)
        return;
    if (length >= out_size)
        length = out_size - 1;
    memcpy(out, path, length);
    out[length] = '\0';
}

void pt_resolve_path(const char *base_dir, const char *path, char *out,
                     size_t out_size)
{
    if (path == NULL)
        path = "";
    /* "." adds nothing but noise to the paths shown in messages. */
    if (path[0] == '/' || base_dir == NULL || base_dir[0] == '\0' ||
        strcmp(base_dir, ".") == 0) {
        pt_copy_string(out, out_size, path);
        return;
    }
    size_t base_length = strlen(base_dir);
    const char *separator = base_dir[base_length - 1] == '/' ? "" : "/";
    snprintf(out, out_size, "%s%s%s", base_dir, separator, path);
}
