/* Helpers of the command-line layer: locating bundled files, paths, errors. */
#include "cli/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void cli_error(const char *command, const char *message)
{
    /* messages quote input files: their control characters are shown,
       never sent to the terminal (4 bytes at most for each) */
    char shown[4 * sizeof(pt_error) + 1];
    pt_escape_controls(message, shown, sizeof shown);
    fprintf(stderr, "partita %s: %s\n", command, shown);
}

void cli_error_in(const char *command, const char *file,
                  const char *message)
{
    size_t length = strlen(file);
    if (strncmp(message, file, length) == 0 && message[length] == ':') {
        cli_error(command, message);
        return;
    }
    char located[PT_PATH_MAX + sizeof(pt_error) + 2];
    snprintf(located, sizeof located, "%s: %s", file, message);
    cli_error(command, located);
}

void cli_text_to_stderr(void)
{
    fflush(stdout);
    /* glibc documents stdout as a variable that may be assigned; the
       writers of files use the descriptor, never this stream */
    stdout = stderr;
}

const char *cli_output_name(const char *path)
{
    return strcmp(path, "-") == 0 ? "standard output" : path;
}

int cli_parse_int_list(const char *command, const char *option,
                       const char *text, int max_value, int *values,
                       int capacity, int *count)
{
    *count = 0;
    const char *at = text;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long value = strtol(at, &end, 10);
        if (errno != 0 || end == at || value < 1 || value > max_value ||
            *count == capacity || (*end != ',' && *end != '\0') ||
            at[0] == '+' || at[0] == ' ') {
            fprintf(stderr, "partita %s: %s: expected a comma-separated "
                            "list of integers from 1 to %d (at most %d), "
                            "got '%s'\n",
                    command, option, max_value, capacity, text);
            return -1;
        }
        values[(*count)++] = (int)value;
        if (*end == '\0')
            return 0;
        at = end + 1;
    }
}

int cli_check_output(const char *command, const char *path, bool folder)
{
    pt_error err = {{0}};
    int status = folder ? pt_check_output_folder(path, &err)
                        : pt_check_output_file(path, &err);
    if (status != 0)
        cli_error(command, err.message);
    return status;
}

int cli_check_not_input(const char *command, const char *output,
                        const char *input, const char *role)
{
    pt_error err = {{0}};
    if (pt_check_output_not_input(output, input, role, &err) == 0)
        return 0;
    cli_error(command, err.message);
    return -1;
}

int cli_check_not_plan_input(const char *command, const char *output,
                             const char *plan_path, const plan *p)
{
    if (cli_check_not_input(command, output, plan_path, "plan") != 0)
        return -1;
    const char *const refs[] = {p->model_ref, p->cluster_ref};
    const char *const roles[] = {"model", "cluster"};
    for (int i = 0; i < 2; i++) {
        if (refs[i][0] == '\0')
            continue;
        char path[PT_PATH_MAX];
        pt_resolve_path(p->source_dir, refs[i], path, sizeof path);
        if (cli_check_not_input(command, output, path, roles[i]) != 0)
            return -1;
    }
    return 0;
}

int cli_write_json(const char *command, json_t *root, const char *path,
                   pt_error *err)
{
    int status = root != NULL && json_write_file_atomic(root, path, err) == 0
                     ? 0
                     : -1;
    json_decref(root);
    if (status != 0)
        cli_error(command, err->message);
    return status;
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

void cli_command_and_date(int argc, char **argv, char *out, size_t size,
                          char *date, size_t date_size)
{
    snprintf(out, size, "partita");
    for (int i = 0; i < argc; i++) {
        size_t used = strlen(out);
        snprintf(out + used, size - used, " %s", argv[i]);
    }
    time_t now = time(NULL);
    strftime(date, date_size, "%Y-%m-%d", gmtime(&now));
}
