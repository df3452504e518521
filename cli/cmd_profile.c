/*
 * partita profile, as `partita` runs it: --derive and --compare here,
 * with the help and bad arguments; a measurement is handed to
 * partita-exec (cli/hand_over.c), the executable that loads the GPU
 * stack, which parses the same arguments again (cli/profile_measure.c).
 */
#include "cli/cli.h"

#include <string.h>

static bool asks_for_derive(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--derive") == 0 ||
            strncmp(argv[i], "--derive=", 9) == 0)
            return true;
    return false;
}

int command_profile(int argc, char **argv)
{
    if (asks_for_derive(argc, argv))
        return cmd_profile_derive(argc, argv);
    profile_arguments args;
    int status = profile_run_unless_measuring(argc, argv, &args);
    if (status != PROFILE_MEASURE)
        return status;
    return cli_hand_over(argc, argv);
}
