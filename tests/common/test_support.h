/* Helpers shared by the tests of common/: scratch files in a private
 * temporary directory, paths into the source tree, message checks. */
#ifndef PARTITA_TEST_SUPPORT_H
#define PARTITA_TEST_SUPPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "tests/scratch_tree.h"

/* The source root from the test environment (tests/meson.build sets it). */
static inline const char *source_root(void)
{
    const char *root = getenv("PARTITA_SOURCE");
    if (root == NULL || root[0] == '\0')
        fail_msg("PARTITA_SOURCE is not set: run the tests with meson test");
    return root;
}

static inline void source_path(const char *relative, char *out, size_t size)
{
    snprintf(out, size, "%s/%s", source_root(), relative);
}

/* Loads a profile of the source tree (e.g. "profiles/H100.json"). */
static inline void load_bundled_profile(const char *relative, profile *p)
{
    char path[PT_PATH_MAX];
    source_path(relative, path, sizeof path);
    pt_error err = {""};
    if (profile_load_file(path, p, &err) != 0)
        fail_msg("%s", err.message);
}

/* A scratch directory, made by scratch_open and removed (with the files in
 * it and everything under it) by scratch_close. */
typedef struct scratch {
    char dir[256];
} scratch;

static inline int scratch_open(void **state)
{
    scratch *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -1;
    snprintf(s->dir, sizeof s->dir, "/tmp/partita-common-test-XXXXXX");
    if (mkdtemp(s->dir) == NULL) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static inline int scratch_close(void **state)
{
    scratch *s = *state;
    if (s != NULL)
        remove_scratch_tree(s->dir);
    free(s);
    return 0;
}

/* Writes text to <scratch>/<name> (subdirectories are made) and returns
 * the full path in out. */
static inline void scratch_write(void **state, const char *name,
                                 const char *text, char *out, size_t size)
{
    scratch *s = *state;
    snprintf(out, size, "%s/%s", s->dir, name);
    const char *slash = strrchr(name, '/');
    if (slash != NULL) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%.*s", s->dir, (int)(slash - name),
                 name);
        mkdir(sub, 0700);
    }
    FILE *file = fopen(out, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite(text, 1, strlen(text), file), strlen(text));
    assert_int_equal(fclose(file), 0);
}

static inline const char *scratch_dir(void **state)
{
    return ((scratch *)*state)->dir;
}

/* Reads a whole file into a malloc'd, NUL-terminated buffer. */
static inline char *read_whole_file(const char *path, size_t *length)
{
    FILE *file = fopen(path, "rb");
    assert_non_null(file);
    assert_int_equal(fseek(file, 0, SEEK_END), 0);
    long size = ftell(file);
    assert_true(size >= 0);
    rewind(file);
    char *text = malloc((size_t)size + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)size, file), (size_t)size);
    text[size] = '\0';
    fclose(file);
    *length = (size_t)size;
    return text;
}

/* Fails the test, showing the whole message, unless it holds every one of
 * the NULL-terminated substrings. */
static inline void assert_message_has(const pt_error *err, ...)
{
    va_list args;
    va_start(args, err);
    const char *part;
    while ((part = va_arg(args, const char *)) != NULL) {
        if (strstr(err->message, part) == NULL) {
            va_end(args);
            fail_msg("message \"%s\" lacks \"%s\"", err->message, part);
        }
    }
    va_end(args);
}

#define EXPECT_MESSAGE(err, ...) assert_message_has((err), __VA_ARGS__, NULL)

#endif
