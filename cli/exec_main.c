/*
 * partita-exec: the half of partita that loads the GPU stack (the CUDA
 * runtime, cuBLASLt, NCCL, MPI). `partita exec ...` and the measuring
 * `partita profile ...` come here through execv (cli/hand_over.c) with
 * partita's argv (argv[0] too, so ps shows the command as typed);
 * every message and exit status is the one `partita` documents. Not
 * meant to be run by hand.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "exec") == 0)
        return command_exec(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "profile") == 0)
        return command_profile_measure(argc - 1, argv + 1);
    fprintf(stderr, "partita-exec: runs 'partita exec' and the measuring "
                    "'partita profile' for partita: run those instead\n");
    return EXIT_BAD_INPUT;
}
