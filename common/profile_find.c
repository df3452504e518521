/* Where a GPU's profile is found: the folders `partita` looks in for
 * <gpu>.json (--profiles, $PARTITA_PROFILES, beside the cluster's file,
 * the source tree, the installed ones), and a profile loaded for the GPU
 * it was found for. The format itself is profile.c's. */
#include "common/common.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_regular_file(const char *path)
{
    struct stat info;
    return stat(path, &info) == 0 && S_ISREG(info.st_mode);
}

/* A folder that can be listed; errno says why not. */
static bool is_readable_folder(const char *path)
{
    DIR *folder = opendir(path);
    if (folder == NULL)
        return false;
    closedir(folder);
    return true;
}

int profile_load_for_gpu(const char *path, const char *gpu, profile *out,
                         pt_error *err)
{
    if (profile_load_file(path, out, err) != 0)
        return -1;
    if (strcmp(out->gpu, gpu) == 0)
        return 0;
    pt_fail(err, "%s: gpu: is \"%s\", but the file was found as the "
                 "profile of GPU \"%s\" (its name): a profile's gpu must "
                 "be its file name without .json",
            path, out->gpu, gpu);
    profile_free(out);
    return -1;
}

/* Tries dir/<gpu>.json; records the place in `looked` for the message. */
static bool try_directory(const char *dir, const char *label,
                          const char *gpu, char *out_path, size_t out_size,
                          char *looked, size_t looked_size)
{
    if (dir == NULL || dir[0] == '\0')
        return false;
    char candidate[PT_PATH_MAX];
    char file_name[PT_NAME_MAX + 8];
    snprintf(file_name, sizeof file_name, "%s.json", gpu);
    pt_resolve_path(dir, file_name, candidate, sizeof candidate);
    if (is_regular_file(candidate)) {
        pt_copy_string(out_path, out_size, candidate);
        return true;
    }
    size_t used = strlen(looked);
    if (used < looked_size)
        snprintf(looked + used, looked_size - used, "%s%s (%s)",
                 used > 0 ? ", " : "", dir, label);
    return false;
}

int profile_find(const char *gpu, const char *extra_dir,
                 const char *cluster_dir, char *out_path, size_t out_size,
                 pt_error *err)
{
    if (gpu == NULL || gpu[0] == '\0' || strchr(gpu, '/') != NULL ||
        strlen(gpu) >= PT_NAME_MAX)
        return pt_fail(err, "GPU name \"%.64s\" cannot name a profile file",
                       gpu != NULL ? gpu : "");
    char looked[768] = "";
    char beside_cluster[PT_PATH_MAX] = "";
    if (cluster_dir != NULL && cluster_dir[0] != '\0')
        pt_resolve_path(cluster_dir, "../profiles", beside_cluster,
                        sizeof beside_cluster);
    const char *installed = NULL, *source_tree = NULL;
#ifdef PARTITA_SOURCE_PROFILES
    source_tree = PARTITA_SOURCE_PROFILES;
#endif
#ifdef PARTITA_INSTALLED_PROFILES
    installed = PARTITA_INSTALLED_PROFILES;
#endif
    const struct {
        const char *dir;
        const char *label;
    } places[] = {
        {extra_dir, "--profiles"},
        {getenv("PARTITA_PROFILES"), "$PARTITA_PROFILES"},
        /* an inline cluster's file is the plan's */
        {beside_cluster,
         "beside the folder of the file holding the cluster"},
        {source_tree, "source tree"},
        {installed, "installed"},
    };
    /* the folders a user names must be there: a typo would otherwise
       fall back to the bundled profiles without a word */
    for (size_t i = 0; i < 2; i++)
        if (places[i].dir != NULL && places[i].dir[0] != '\0' &&
            !is_readable_folder(places[i].dir))
            return pt_fail(err, "%s %s: cannot read the folder: %s",
                           places[i].label, places[i].dir, strerror(errno));
    for (size_t i = 0; i < sizeof places / sizeof *places; i++)
        if (try_directory(places[i].dir, places[i].label, gpu, out_path,
                          out_size, looked, sizeof looked))
            return 0;
    return pt_fail(err, "no profile for GPU \"%s\": looked for %s.json in %s",
                   gpu, gpu, looked[0] != '\0' ? looked : "no directory");
}
