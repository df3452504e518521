/* Helpers of the command-line layer: locating bundled files, paths, errors. */
#include "cli/cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_error(const char *command, const char *message)
{
    fprintf(stderr, "partita %s: %s\n", command, message);
}

static bool file_exists(const char *path)
{
    return access(path, R_OK) == 0;
}

int cli_locate(const char *kind, const char *name_or_path, char *out,
               size_t out_size, pt_error *err)
{
    if (file_exists(name_or_path)) {
        pt_copy_string(out, out_size, name_or_path);
        return 0;
    }
    /* A bare name: look in ./<kind>, then the source tree, then the
     * installed data directory. */
    const char *roots[] = {".", PARTITA_SOURCE_ROOT, PARTITA_INSTALLED_DATA};
    bool has_suffix = strlen(name_or_path) > 5 &&
        strcmp(name_or_path + strlen(name_or_path) - 5, ".json") == 0;
    if (strchr(name_or_path, '/') == NULL) {
        for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
            char candidate[PT_PATH_MAX];
            snprintf(candidate, sizeof candidate, "%s/%s/%s%s", roots[i],
                     kind, name_or_path, has_suffix ? "" : ".json");
            if (file_exists(candidate)) {
                pt_copy_string(out, out_size, candidate);
                return 0;
            }
        }
    }
    return pt_fail(err,
                   "%s: no such file, and no bundled %s of that name "
                   "(looked in ./%s, %s/%s, %s/%s)",
                   name_or_path, kind, kind, PARTITA_SOURCE_ROOT, kind,
                   PARTITA_INSTALLED_DATA, kind);
}

/* Splits an absolute path into its components in place. */
static int split_components(char *path, char **parts, int max_parts)
{
    int count = 0;
    for (char *token = strtok(path, "/"); token != NULL && count < max_parts;
         token = strtok(NULL, "/"))
        parts[count++] = token;
    return count;
}

void cli_relative_path(const char *from_dir, const char *target, char *out,
                       size_t out_size)
{
    char from_absolute[PATH_MAX], target_absolute[PATH_MAX];
    if (realpath(from_dir, from_absolute) == NULL ||
        realpath(target, target_absolute) == NULL) {
        pt_copy_string(out, out_size, target);
        return;
    }
    char *from_parts[256], *target_parts[256];
    int from_count = split_components(from_absolute, from_parts, 256);
    int target_count = split_components(target_absolute, target_parts, 256);
    int common = 0;
    while (common < from_count && common < target_count &&
           strcmp(from_parts[common], target_parts[common]) == 0)
        common++;
    out[0] = '\0';
    size_t used = 0;
    for (int i = common; i < from_count && used + 4 < out_size; i++)
        used += (size_t)snprintf(out + used, out_size - used, "../");
    for (int i = common; i < target_count && used < out_size; i++)
        used += (size_t)snprintf(out + used, out_size - used, "%s%s",
                                 target_parts[i],
                                 i + 1 < target_count ? "/" : "");
}
