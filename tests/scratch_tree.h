/* Removing a test's scratch directory and everything under it, and
 * counting what it holds; shared by the test-support headers of every
 * module. */
#ifndef PARTITA_TESTS_SCRATCH_TREE_H
#define PARTITA_TESTS_SCRATCH_TREE_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Deletes path: a file, or a directory with all it holds (symbolic links
 * are removed, never followed). */
static inline void remove_scratch_tree(const char *path)
{
    struct stat info;
    if (lstat(path, &info) != 0)
        return;
    if (!S_ISDIR(info.st_mode)) {
        unlink(path);
        return;
    }
    DIR *handle = opendir(path);
    if (handle != NULL) {
        struct dirent *entry;
        while ((entry = readdir(handle)) != NULL) {
            if (strcmp(entry->d_name, ".") == 0 ||
                strcmp(entry->d_name, "..") == 0)
                continue;
            char child[1024];
            int length = snprintf(child, sizeof child, "%s/%s", path,
                                  entry->d_name);
            if (length > 0 && (size_t)length < sizeof child)
                remove_scratch_tree(child);
        }
        closedir(handle);
    }
    rmdir(path);
}

/* Entries of dir other than . and .. (with hidden_only, those whose name
 * starts with '.': temporary files); -1 when dir cannot be read. */
static inline int count_scratch_entries(const char *dir, int hidden_only)
{
    DIR *handle = opendir(dir);
    if (handle == NULL)
        return -1;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(handle)) != NULL)
        if (strcmp(entry->d_name, ".") != 0 &&
            strcmp(entry->d_name, "..") != 0 &&
            (!hidden_only || entry->d_name[0] == '.'))
            count++;
    closedir(handle);
    return count;
}

#endif
