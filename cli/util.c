/* Helpers of the command-line layer: locating bundled files, paths, errors. */
#include "cli/cli.h"

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
