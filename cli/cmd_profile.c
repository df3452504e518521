/*
 * partita profile, as `partita` runs it: --derive (cli/cmd_derive.c),
 * --from-logs (cli/cmd_runs.c), --fit-roofline (cli/cmd_fit_roofline.c)
 * and --compare here,
 * with the help and bad arguments; a measurement is handed to
 * partita-exec (cli/hand_over.c), the executable that loads the GPU
 * stack, which parses the same arguments again (cli/profile_measure.c).
 */
#include "cli/cli.h"

#include <string.h>

static bool asks_for(int argc, char **argv, const char *flag)
{
    size_t length = strlen(flag);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], flag) == 0 ||
            (strncmp(argv[i], flag, length) == 0 && argv[i][length] == '='))
            return true;
    return false;
}

int command_profile(int argc, char **argv)
{
    if (asks_for(argc, argv, "--derive"))
        return cmd_profile_derive(argc, argv);
    if (asks_for(argc, argv, "--from-logs"))
        return cmd_profile_from_logs(argc, argv);
    if (asks_for(argc, argv, "--fit-roofline"))
        return cmd_profile_fit_roofline(argc, argv);
    profile_arguments args;
    int status = profile_run_unless_measuring(argc, argv, &args);
    if (status != PROFILE_MEASURE)
        return status;
    return cli_hand_over(argc, argv);
}
