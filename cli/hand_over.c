/*
 * `partita` hands `exec` and the measuring `profile` to partita-exec, a
 * second executable, in its own place (execv: same process, same pid,
 * same environment, same argv, so mpirun, srun and ps see no
 * difference).
 *
 * Why two executables: plan, estimate, report and prep must start in
 * milliseconds and a few MB, and the CUDA runtime, cuBLASLt, NCCL and
 * Open MPI cost ~100 ms and ~200 MB to load even when unused. The other
 * way, the GPU parts in a module loaded with dlopen, would put every call
 * into the cuda backend, NCCL and MPI behind function pointers, and MPI
 * libraries are known to misbehave when loaded by dlopen (Open MPI's
 * components expect libmpi's symbols global). With execv the executor
 * stays one ordinary static link, and one path runs every backend: the
 * cpu backend's tests run `partita exec` through partita-exec as a GPU
 * run does. docs/architecture.md ("Two executables") says the same.
 */
#include "cli/cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXEC_HALF_NAME "partita-exec"

/* Beside this executable (the build tree, or an install that put both in
 * one folder), else the installed libexec folder. */
static int find_exec_half(char *out, size_t size)
{
    char self[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
    if (length > 0) {
        self[length] = '\0';
        snprintf(out, size, "%s/%s", dirname(self), EXEC_HALF_NAME);
        if (access(out, X_OK) == 0)
            return 0;
    }
    snprintf(out, size, "%s/%s", PARTITA_INSTALLED_LIBEXEC, EXEC_HALF_NAME);
    return access(out, X_OK) == 0 ? 0 : -1;
}

int cli_hand_over(int argc, char **argv)
{
    char path[PT_PATH_MAX];
    char message[PT_PATH_MAX + 300];
    if (find_exec_half(path, sizeof path) != 0) {
        snprintf(message, sizeof message,
                 "cannot find %s, the executable that runs this command "
                 "(looked beside this one and in %s)",
                 EXEC_HALF_NAME, PARTITA_INSTALLED_LIBEXEC);
        cli_error(argv[0], message);
        return EXIT_FAILURE_RUN;
    }
    char **arguments = calloc((size_t)argc + 2, sizeof *arguments);
    if (arguments == NULL) {
        cli_error(argv[0], "out of memory");
        return EXIT_FAILURE_RUN;
    }
    /* argv[0] stays partita's, so that ps, pgrep and the launcher's
     * messages show the command as it was typed */
    arguments[0] = program_invocation_name;
    memcpy(arguments + 1, argv, (size_t)argc * sizeof *argv);
    fflush(stdout);
    fflush(stderr);
    execv(path, arguments);
    /* only reached when execv failed */
    snprintf(message, sizeof message, "%s: cannot run it: %s", path,
             strerror(errno));
    free(arguments);
    cli_error(argv[0], message);
    return EXIT_FAILURE_RUN;
}
