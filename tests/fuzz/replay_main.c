/*
 * Replays saved fuzz inputs through a harness without libFuzzer: each
 * argument is a file or a directory whose regular files are fed, in name
 * order, to LLVMFuzzerTestOneInput. Built with the sanitizers of the test
 * build, so an input that once crashed fails the test if it crashes again.
 * Fails when no input at all was found (a lost corpus must not pass).
 */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Reads a whole file; NULL on failure. */
static uint8_t *read_whole_file(const char *path, size_t *size)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        return NULL;
    uint8_t *data = NULL;
    size_t used = 0, capacity = 0;
    for (;;) {
        if (used == capacity) {
            capacity = capacity ? capacity * 2 : 4096;
            uint8_t *grown = realloc(data, capacity);
            if (grown == NULL) {
                free(data);
                fclose(file);
                return NULL;
            }
            data = grown;
        }
        size_t got = fread(data + used, 1, capacity - used, file);
        used += got;
        if (got == 0)
            break;
    }
    fclose(file);
    *size = used;
    return data;
}

static int replay_file(const char *path)
{
    size_t size = 0;
    uint8_t *data = read_whole_file(path, &size);
    if (data == NULL) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        return -1;
    }
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays every regular file of dir; returns the count or -1. */
static long replay_directory(const char *dir)
{
    struct dirent **entries = NULL;
    int count = scandir(dir, &entries, NULL, NULL);
    if (count < 0) {
        fprintf(stderr, "replay: cannot list %s\n", dir);
        return -1;
    }
    char **names = calloc((size_t)count + 1, sizeof *names);
    long replayed = 0;
    int name_count = 0;
    for (int i = 0; i < count; i++) {
        if (names != NULL && entries[i]->d_name[0] != '.')
            names[name_count++] = strdup(entries[i]->d_name);
        free(entries[i]);
    }
    free(entries);
    if (names == NULL)
        return -1;
    qsort(names, (size_t)name_count, sizeof *names, by_name);
    for (int i = 0; i < name_count; i++) {
        char path[4096];
        struct stat info;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (names[i] != NULL && stat(path, &info) == 0 &&
            S_ISREG(info.st_mode)) {
            if (replay_file(path) != 0)
                replayed = -1;
            else if (replayed >= 0)
                replayed++;
        }
        free(names[i]);
    }
    free(names);
    return replayed;
}

int main(int argc, char **argv)
{
    long total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat info;
        if (stat(argv[i], &info) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 1;
        }
        long replayed = S_ISDIR(info.st_mode) ? replay_directory(argv[i])
                        : replay_file(argv[i]) == 0 ? 1
                                                     : -1;
        if (replayed < 0)
            return 1;
        total += replayed;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no input found\n");
        return 1;
    }
    printf("replayed %ld inputs without a crash\n", total);
    return 0;
}
