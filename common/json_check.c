/* JSON reading with validation: every failure names the file, the JSON
 * path of the value and what was wrong with it. */
#include "common/common.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

json_t *pt_json_load_file(const char *path, pt_error *err)
{
    struct stat info;
    if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
        pt_fail(err, "%s: is a directory, not a JSON file", path);
        return NULL;
    }
    char *text = NULL;
    size_t size = 0;
    if (pt_read_file(path, PT_JSON_MAX_BYTES, &text, &size, err) != 0)
        return NULL;
    json_error_t parse_error;
    /* Duplicate keys are as suspicious as unknown ones. */
    json_t *root = json_loadb(text, size, JSON_REJECT_DUPLICATES,
                              &parse_error);
    free(text);
    if (root == NULL)
        pt_fail(err, "%s:%d:%d: malformed JSON: %s", path, parse_error.line,
                parse_error.column, parse_error.text);
    return root;
}

json_place json_place_root(const char *file)
{
    json_place place;
    place.file = file != NULL ? file : "<inline>";
    place.path[0] = '\0';
    return place;
}

json_place json_place_key(const json_place *parent, const char *key)
{
    json_place child;
    child.file = parent->file;
    if (parent->path[0] == '\0')
        pt_copy_string(child.path, sizeof child.path, key);
    else
        snprintf(child.path, sizeof child.path, "%.*s.%s",
                 (int)(sizeof child.path / 2), parent->path, key);
    return child;
}

json_place json_place_index(const json_place *parent, size_t index)
{
    json_place child;
    child.file = parent->file;
    snprintf(child.path, sizeof child.path, "%.*s[%zu]",
             (int)(sizeof child.path / 2), parent->path, index);
    return child;
}

int json_place_fail(const json_place *place, pt_error *err,
                    const char *format, ...)
{
    if (err == NULL)
        return -1;
    char reason[sizeof err->message];
    va_list args;
    va_start(args, format);
    vsnprintf(reason, sizeof reason, format, args);
    va_end(args);
    if (place->path[0] == '\0')
        snprintf(err->message, sizeof err->message, "%.256s: %.700s",
                 place->file, reason);
    else
        snprintf(err->message, sizeof err->message, "%.256s: %.256s: %.500s",
                 place->file, place->path, reason);
    return -1;
}

/* A real as the user wrote it, near enough: the fewest digits that read
 * back as the same double, and a decimal point when it has no fraction,
 * so that 48.0 is not shown as the integer 48 it is refused for being. */
static void format_real(double number, char *out, size_t out_size)
{
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, out_size, "%.*g", digits, number);
        if (strtod(out, NULL) == number)
            break;
    }
    if (isfinite(number) && strpbrk(out, ".e") == NULL &&
        strlen(out) + 3 <= out_size)
        strcat(out, ".0");
}

/* A short description of a value for "got ..." in messages. */
static void describe_value(const json_t *value, char *out, size_t out_size)
{
    switch (json_typeof(value)) {
    case JSON_OBJECT:
        pt_copy_string(out, out_size, "an object");
        break;
    case JSON_ARRAY:
        pt_copy_string(out, out_size, "an array");
        break;
    case JSON_STRING: {
        char shown[200];
        pt_escape_controls(json_string_value(value), shown, sizeof shown);
        snprintf(out, out_size, "the string \"%.40s%s\"", shown,
                 strlen(shown) > 40 ? "..." : "");
        break;
    }
    case JSON_INTEGER:
        snprintf(out, out_size, "%" JSON_INTEGER_FORMAT,
                 json_integer_value(value));
        break;
    case JSON_REAL:
        format_real(json_real_value(value), out, out_size);
        break;
    case JSON_TRUE:
        pt_copy_string(out, out_size, "true");
        break;
    case JSON_FALSE:
        pt_copy_string(out, out_size, "false");
        break;
    default:
        pt_copy_string(out, out_size, "null");
        break;
    }
}

int json_expect_object(const json_t *value, const json_place *place,
                       pt_error *err)
{
    if (json_is_object(value))
        return 0;
    char got[80];
    describe_value(value, got, sizeof got);
    return json_place_fail(place, err, "must be an object, got %s", got);
}

static bool key_is_allowed(const char *key, const char *const *allowed)
{
    if (strcmp(key, "notes") == 0)
        return true;
    for (size_t i = 0; allowed[i] != NULL; i++)
        if (strcmp(key, allowed[i]) == 0)
            return true;
    return false;
}

int json_check_keys(const json_t *obj, const json_place *place,
                    const char *const *allowed, pt_error *err)
{
    if (json_expect_object(obj, place, err) != 0)
        return -1;
    const char *key;
    json_t *value;
    /* json_object_foreach wants a non-const object; it does not write. */
    json_object_foreach((json_t *)obj, key, value) {
        (void)value;
        if (key_is_allowed(key, allowed))
            continue;
        char list[512] = "";
        size_t used = 0;
        for (size_t i = 0; allowed[i] != NULL && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                     i > 0 ? ", " : "", allowed[i]);
        json_place where = json_place_key(place, key);
        return json_place_fail(&where, err,
                               "unknown key (allowed: %s, notes)", list);
    }
    return 0;
}

/* The value of key, or NULL. Fails when a required key is absent. */
static int find_field(const json_t *obj, const json_place *place,
                      const char *key, bool required, json_t **value,
                      pt_error *err)
{
    *value = NULL;
    if (json_expect_object(obj, place, err) != 0)
        return -1;
    *value = json_object_get(obj, key);
    if (*value == NULL && required) {
        json_place where = json_place_key(place, key);
        return json_place_fail(&where, err, "missing (required)");
    }
    return 0;
}

/* "must be a positive integer", "must be an integer in [2, 8]"... The
 * lower bound is the one users trip on, so it leads the wording. */
static void describe_int_range(long long min, long long max, char *out,
                               size_t out_size)
{
    /* A large upper bound only guards against absurd input; "at most"
     * is reported separately when it is crossed. */
    bool loose_upper_bound = max >= 1024;
    if (min == 1 && loose_upper_bound)
        pt_copy_string(out, out_size, "must be a positive integer");
    else if (min == 0 && loose_upper_bound)
        pt_copy_string(out, out_size, "must be a non-negative integer");
    else if (loose_upper_bound)
        snprintf(out, out_size, "must be an integer >= %lld", min);
    else
        snprintf(out, out_size, "must be an integer in [%lld, %lld]", min,
                 max);
}

int json_get_int(const json_t *obj, const json_place *place, const char *key,
                 bool required, long long min, long long max, long long *out,
                 pt_error *err)
{
    json_t *value;
    if (find_field(obj, place, key, required, &value, err) != 0)
        return -1;
    if (value == NULL)
        return 0;
    json_place where = json_place_key(place, key);
    char expected[96];
    describe_int_range(min, max, expected, sizeof expected);
    char got[80];
    describe_value(value, got, sizeof got);
    if (!json_is_integer(value) || json_integer_value(value) < min)
        return json_place_fail(&where, err, "%s, got %s", expected, got);
    long long number = json_integer_value(value);
    if (number > max)
        return json_place_fail(&where, err, "must be at most %lld, got %lld",
                               max, number);
    *out = number;
    return 0;
}

/* The number at key, and in got how the file wrote it. */
static int get_finite_number(const json_t *obj, const json_place *place,
                             const char *key, bool required, bool *present,
                             double *number, char *got, size_t got_size,
                             pt_error *err)
{
    json_t *value;
    *present = false;
    if (find_field(obj, place, key, required, &value, err) != 0)
        return -1;
    if (value == NULL)
        return 0;
    describe_value(value, got, got_size);
    if (!json_is_number(value)) {
        json_place where = json_place_key(place, key);
        return json_place_fail(&where, err, "must be a number, got %s", got);
    }
    *number = json_number_value(value);
    *present = true;
    return 0;
}

int json_get_number(const json_t *obj, const json_place *place,
                    const char *key, bool required, double min, double max,
                    double *out, pt_error *err)
{
    bool present;
    double number = 0.0;
    char got[80];
    if (get_finite_number(obj, place, key, required, &present, &number, got,
                          sizeof got, err) != 0)
        return -1;
    if (!present)
        return 0;
    if (!(number >= min && number <= max)) {
        json_place where = json_place_key(place, key);
        /* below zero, that alone; else the whole range (an upper bound
           guards against values beyond physical sense) */
        if (number < min && min == 0.0)
            return json_place_fail(&where, err,
                                   "must be a non-negative number, got %s",
                                   got);
        if (max >= DBL_MAX)
            return json_place_fail(&where, err,
                                   "must be a number >= %g, got %s", min,
                                   got);
        return json_place_fail(&where, err,
                               "must be a number in [%g, %g], got %s", min,
                               max, got);
    }
    *out = number;
    return 0;
}

int json_get_positive_number(const json_t *obj, const json_place *place,
                             const char *key, bool required, double *out,
                             pt_error *err)
{
    bool present;
    double number = 0.0;
    char got[80];
    if (get_finite_number(obj, place, key, required, &present, &number, got,
                          sizeof got, err) != 0)
        return -1;
    if (!present)
        return 0;
    if (!(number > 0.0 && isfinite(number))) {
        json_place where = json_place_key(place, key);
        return json_place_fail(&where, err,
                               "must be a positive number, got %s", got);
    }
    *out = number;
    return 0;
}

int json_get_bool(const json_t *obj, const json_place *place, const char *key,
                  bool required, bool *out, pt_error *err)
{
    json_t *value;
    if (find_field(obj, place, key, required, &value, err) != 0)
        return -1;
    if (value == NULL)
        return 0;
    if (!json_is_boolean(value)) {
        json_place where = json_place_key(place, key);
        char got[80];
        describe_value(value, got, sizeof got);
        return json_place_fail(&where, err,
                               "must be true or false, got %s", got);
    }
    *out = json_is_true(value);
    return 0;
}

int json_get_string(const json_t *obj, const json_place *place,
                    const char *key, bool required, char *out,
                    size_t out_size, pt_error *err)
{
    json_t *value;
    if (find_field(obj, place, key, required, &value, err) != 0)
        return -1;
    if (value == NULL)
        return 0;
    json_place where = json_place_key(place, key);
    if (!json_is_string(value)) {
        char got[80];
        describe_value(value, got, sizeof got);
        return json_place_fail(&where, err, "must be a string, got %s", got);
    }
    size_t length = json_string_length(value);
    if (length + 1 > out_size)
        return json_place_fail(&where, err,
                               "too long: %zu characters, at most %zu",
                               length, out_size - 1);
    if (strlen(json_string_value(value)) != length)
        return json_place_fail(&where, err,
                               "must not contain a NUL character");
    /* names and paths: a control character would reach the terminal in
       every table that shows them */
    const unsigned char *text = (const unsigned char *)json_string_value(value);
    for (size_t i = 0; i < length; i++)
        if (text[i] < 0x20 || text[i] == 0x7f ||
            (text[i] == 0xc2 && text[i + 1] >= 0x80 && text[i + 1] <= 0x9f))
            return json_place_fail(&where, err,
                                   "must not contain control characters "
                                   "(byte %zu is 0x%02x)",
                                   i + 1, text[i + (text[i] == 0xc2)]);
    memcpy(out, json_string_value(value), length + 1);
    return 0;
}

int json_get_choice(const json_t *obj, const json_place *place,
                    const char *key, bool required,
                    const char *const *names, int *out, pt_error *err)
{
    char text[64];
    json_t *value;
    if (find_field(obj, place, key, required, &value, err) != 0)
        return -1;
    if (value == NULL)
        return 0;
    char list[256] = "";
    size_t used = 0;
    for (size_t i = 0; names[i] != NULL && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s\"%s\"",
                                 i > 0 ? ", " : "", names[i]);
    json_place where = json_place_key(place, key);
    if (!json_is_string(value)) {
        char got[80];
        describe_value(value, got, sizeof got);
        return json_place_fail(&where, err, "must be one of %s, got %s",
                               list, got);
    }
    pt_copy_string(text, sizeof text, json_string_value(value));
    for (int i = 0; names[i] != NULL; i++) {
        if (strcmp(json_string_value(value), names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return json_place_fail(&where, err, "must be one of %s, got \"%.60s\"",
                           list, text);
}
