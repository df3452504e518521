/* Helpers shared by the harnesses: a scratch directory, plan loading. */
#include "fuzz.h"

#include "common/common.h"

#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One directory per process: the harnesses run single-threaded, and a
 * process-wide cache is what libFuzzer's model of a harness expects. */
static char scratch_path[512];

static int remove_entry(const char *path, const struct stat *info, int type,
                        struct FTW *walk)
{
    (void)info;
    (void)type;
    (void)walk;
    remove(path);
    return 0;
}

int fuzz_write_file(const char *path, const void *data, size_t size)
{
    FILE *file = fopen(path, "wb");
    if (file == NULL)
        return -1;
    size_t written = size > 0 ? fwrite(data, 1, size, file) : 0;
    return fclose(file) == 0 && written == size ? 0 : -1;
}

/* Removes what the harnesses left, depth first. */
static void remove_scratch(void)
{
    nftw(scratch_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_scratch_dir(void)
{
    if (scratch_path[0] != '\0')
        return scratch_path;
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0')
        base = "/tmp";
    snprintf(scratch_path, sizeof scratch_path, "%s/partita-fuzz-XXXXXX",
             base);
    if (mkdtemp(scratch_path) == NULL) {
        scratch_path[0] = '\0';
        return NULL;
    }
    atexit(remove_scratch);
    return scratch_path;
}

/* A path reference is followed only when it stays inside the scratch
 * directory: relative, no "..". Anything else could make the reader open
 * /dev/zero or a large file and hang the campaign, which says nothing
 * about the reader. */
static bool reference_is_contained(const json_t *root, const char *key)
{
    const json_t *value = json_object_get(root, key);
    if (!json_is_string(value))
        return true;
    const char *text = json_string_value(value);
    return text[0] != '/' && strstr(text, "..") == NULL;
}

int fuzz_load_plan(const uint8_t *data, size_t size, plan *out)
{
    json_error_t json_error;
    json_t *root = json_loadb((const char *)data, size, 0, &json_error);
    if (root == NULL)
        return -1;
    const char *dir = fuzz_scratch_dir();
    if (dir == NULL || !reference_is_contained(root, "model") ||
        !reference_is_contained(root, "cluster")) {
        json_decref(root);
        return -1;
    }
    /* The plan "lives" in the empty scratch directory, so a relative
     * model or cluster reference exercises the file-not-found path. */
    char plan_file[600];
    snprintf(plan_file, sizeof plan_file, "%s/plan.json", dir);
    pt_error err;
    int status = plan_from_json(root, plan_file, out, &err);
    json_decref(root);
    return status;
}
