/*
 * Files that appear whole or not at all: a temporary file beside the
 * target, fsync, rename (common.h, "atomic files"); "-", devices and FIFOs
 * written through; and the check, before any work, that an output can be
 * written. Every file Partita writes goes through here: whole by the JSON
 * writer and the report, step by step by the dataset writer and the
 * checkpoints.
 */
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int pt_write_fully(int fd, const void *data, size_t size)
{
    const unsigned char *next = data;
    while (size > 0) {
        ssize_t written = write(fd, next, size);
        if (written < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        next += written;
        size -= (size_t)written;
    }
    return 0;
}

int pt_temp_file_beside(const char *target, char *temp_path,
                        size_t temp_size, pt_error *err)
{
    /* Not mkstemp: it makes files 0600, and published datasets and
     * checkpoints should get the usual permissions (0666 less umask). The
     * name mixes the process id and the clock; O_EXCL settles races. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t salt = (uint64_t)now.tv_sec * 1000000007u + (uint64_t)now.tv_nsec;
    for (int attempt = 0; attempt < 100; attempt++) {
        int needed = snprintf(temp_path, temp_size, "%s.tmp.%ld.%08" PRIx64,
                              target, (long)getpid(),
                              (salt + (uint64_t)attempt * 0x9e3779b9u) &
                                  0xffffffffu);
        if (needed < 0 || (size_t)needed >= temp_size) {
            temp_path[0] = '\0';
            return pt_fail(err, "%s: path too long for a temporary file",
                           target);
        }
        int fd = open(temp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                      0666);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST) {
            int saved = errno;
            temp_path[0] = '\0';
            return pt_fail(err, "%s: cannot create a temporary file beside "
                           "it: %s", target, strerror(saved));
        }
    }
    temp_path[0] = '\0';
    return pt_fail(err, "%s: no free temporary name beside it", target);
}

int pt_finish_temp_file(int fd, const char *temp_path, pt_error *err)
{
    if (fsync(fd) != 0) {
        int saved = errno;
        close(fd);
        unlink(temp_path);
        return pt_fail(err, "%s: fsync failed: %s", temp_path,
                       strerror(saved));
    }
    if (close(fd) != 0) {
        int saved = errno;
        unlink(temp_path);
        return pt_fail(err, "%s: close failed: %s", temp_path,
                       strerror(saved));
    }
    return 0;
}

int pt_rename_into_place(const char *temp_path, const char *target,
                         pt_error *err)
{
    if (rename(temp_path, target) != 0) {
        int saved = errno;
        unlink(temp_path);
        return pt_fail(err, "%s: cannot rename %s into place: %s", target,
                       temp_path, strerror(saved));
    }
    return 0;
}

int pt_publish_temp_file(int fd, const char *temp_path, const char *target,
                         pt_error *err)
{
    if (pt_finish_temp_file(fd, temp_path, err) != 0)
        return -1;
    return pt_rename_into_place(temp_path, target, err);
}

int pt_sync_directory(const char *dir, pt_error *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return pt_fail(err, "%s: cannot open directory to fsync it: %s", dir,
                       strerror(errno));
    int result = fsync(fd);
    int saved = errno;
    close(fd);
    if (result != 0)
        return pt_fail(err, "%s: fsync of the directory failed: %s", dir,
                       strerror(saved));
    return 0;
}

/* ------------------------------------------------------ where a file goes */

/* How an output reaches its place: "-" is standard output; a device, FIFO
 * or socket is written through, as cp and tee do (renaming over /dev/null
 * would replace the device with a regular file); a regular file, or none
 * yet, is replaced by a rename. Symbolic links are followed, so the link
 * stays and its target gets the bytes. */
typedef enum output_kind {
    OUTPUT_STANDARD,
    OUTPUT_THROUGH,
    OUTPUT_REPLACE,
} output_kind;

/* Where path leads once its symbolic links are followed: resolved names
 * the file (which need not exist), *info its status when *exists. */
typedef struct output_place {
    output_kind kind;
    char resolved[PT_PATH_MAX];
    bool exists;
    struct stat info;
} output_place;

/* The target of the link at `link` (relative targets count from the
 * link's folder). */
static int read_link_target(const char *link, char *out, size_t size,
                            pt_error *err)
{
    char target[PT_PATH_MAX];
    ssize_t length = readlink(link, target, sizeof target - 1);
    if (length < 0)
        return pt_fail(err, "%s: cannot read the symbolic link: %s", link,
                       strerror(errno));
    target[length] = '\0';
    char folder[PT_PATH_MAX];
    pt_directory_of(link, folder, sizeof folder);
    pt_resolve_path(folder, target, out, size);
    return 0;
}

static int locate_output(const char *path, output_place *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    if (strcmp(path, "-") == 0) {
        out->kind = OUTPUT_STANDARD;
        return 0;
    }
    if (path[0] == '\0')
        return pt_fail(err, "an output file needs a name");
    pt_copy_string(out->resolved, sizeof out->resolved, path);
    for (int hops = 0;; hops++) {
        if (lstat(out->resolved, &out->info) != 0) {
            /* a missing file, or a folder of its path that is a file:
               the check of its folder says which */
            if (errno != ENOENT && errno != ENOTDIR)
                return pt_fail(err, "%s: %s", path, strerror(errno));
            out->kind = OUTPUT_REPLACE;
            return 0;
        }
        if (!S_ISLNK(out->info.st_mode))
            break;
        if (hops == 40)
            return pt_fail(err, "%s: too many symbolic links", path);
        char next[PT_PATH_MAX];
        if (read_link_target(out->resolved, next, sizeof next, err) != 0)
            return -1;
        pt_copy_string(out->resolved, sizeof out->resolved, next);
    }
    out->exists = true;
    if (S_ISDIR(out->info.st_mode))
        return pt_fail(err, "%s: is a directory, not a file", path);
    out->kind = S_ISREG(out->info.st_mode) ? OUTPUT_REPLACE : OUTPUT_THROUGH;
    return 0;
}

int pt_output_target(const char *path, char *resolved, size_t size,
                     pt_error *err)
{
    output_place place;
    if (locate_output(path, &place, err) != 0)
        return -1;
    if (place.kind != OUTPUT_REPLACE)
        return pt_fail(err, "%s: not a regular file (a file written in "
                            "steps is renamed into place)",
                       path);
    pt_copy_string(resolved, size, place.resolved);
    return 0;
}

/* Writes to standard output or through a device or FIFO: no temporary,
 * no rename (there is nothing to replace atomically). */
static int write_through(const output_place *place, const char *path,
                         const void *data, size_t size, pt_error *err)
{
    int fd = STDOUT_FILENO;
    if (place->kind == OUTPUT_THROUGH) {
        fd = open(place->resolved, O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (fd < 0)
            return pt_fail(err, "%s: cannot open for writing: %s", path,
                           strerror(errno));
    }
    int status = pt_write_fully(fd, data, size);
    int saved = errno;
    if (place->kind == OUTPUT_THROUGH && close(fd) != 0 && status == 0) {
        status = -1;
        saved = errno;
    }
    if (status != 0)
        return pt_fail(err, "%s: write failed: %s",
                       place->kind == OUTPUT_STANDARD ? "standard output"
                                                      : path,
                       strerror(saved));
    return 0;
}

int pt_write_file_atomic(const char *target, const void *data, size_t size,
                         pt_error *err)
{
    output_place place;
    if (locate_output(target, &place, err) != 0)
        return -1;
    if (place.kind != OUTPUT_REPLACE)
        return write_through(&place, target, data, size, err);
    char temp_path[PT_PATH_MAX + 16];
    int fd = pt_temp_file_beside(place.resolved, temp_path, sizeof temp_path,
                                 err);
    if (fd < 0)
        return -1;
    /* a replaced file keeps its permissions, as one written in place
       would */
    if (place.exists)
        fchmod(fd, place.info.st_mode & 07777);
    if (pt_write_fully(fd, data, size) != 0) {
        int saved = errno;
        close(fd);
        unlink(temp_path);
        return pt_fail(err, "%s: write failed: %s", temp_path,
                       strerror(saved));
    }
    if (pt_publish_temp_file(fd, temp_path, place.resolved, err) != 0)
        return -1;
    /* make the rename durable too; the file is whole either way, so a
       folder that cannot be synced loses nothing and is not an error */
    char dir[PT_PATH_MAX];
    pt_directory_of(place.resolved, dir, sizeof dir);
    pt_sync_directory(dir, NULL);
    return 0;
}

/* ------------------------------------------------ outputs checked early */

/* Creates and removes a file in folder: the one sure test that it takes
 * new files (permissions, read-only mounts, quotas on inodes; access()
 * says yes to root on a read-only file system). */
static int probe_folder(const char *folder, const char *output,
                        pt_error *err)
{
    struct stat info;
    if (stat(folder, &info) != 0)
        return pt_fail(err, "%s: cannot write there: folder %s: %s", output,
                       folder, strerror(errno));
    if (!S_ISDIR(info.st_mode))
        return pt_fail(err, "%s: cannot write there: %s is not a folder",
                       output, folder);
    char probe[PT_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.partita-write-test.%ld", folder,
             (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST)
        return pt_fail(err, "%s: cannot write there: cannot create a file "
                            "in folder %s: %s",
                       output, folder, strerror(errno));
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    return 0;
}

int pt_check_output_file(const char *path, pt_error *err)
{
    output_place place;
    if (locate_output(path, &place, err) != 0)
        return -1;
    if (place.kind == OUTPUT_STANDARD)
        return 0;
    if (place.kind == OUTPUT_THROUGH) {
        /* opening a FIFO would wait for its reader: only ask */
        if (access(place.resolved, W_OK) != 0)
            return pt_fail(err, "%s: cannot write there: %s", path,
                           strerror(errno));
        return 0;
    }
    char folder[PT_PATH_MAX];
    pt_directory_of(place.resolved, folder, sizeof folder);
    return probe_folder(folder, path, err);
}

int pt_check_output_folder(const char *dir, pt_error *err)
{
    if (dir[0] == '\0')
        return pt_fail(err, "an output folder needs a name");
    /* the nearest folder that exists: the rest will be made in it */
    char existing[PT_PATH_MAX];
    pt_copy_string(existing, sizeof existing, dir);
    struct stat info;
    while (stat(existing, &info) != 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            return pt_fail(err, "%s: cannot write there: %s: %s", dir,
                           existing, strerror(errno));
        char parent[PT_PATH_MAX];
        pt_directory_of(existing, parent, sizeof parent);
        if (strcmp(parent, existing) == 0)
            break;
        pt_copy_string(existing, sizeof existing, parent);
    }
    return probe_folder(existing, dir, err);
}

/* ------------------------------------------- an output that is an input */

int pt_check_output_not_input(const char *output, const char *input,
                              const char *input_role, pt_error *err)
{
    if (output == NULL || input == NULL || strcmp(output, "-") == 0)
        return 0;
    struct stat written, read;
    /* stat follows links: a link to the input is the input */
    if (stat(output, &written) != 0 || stat(input, &read) != 0)
        return 0;
    if (written.st_dev != read.st_dev || written.st_ino != read.st_ino ||
        !S_ISREG(written.st_mode))
        return 0;
    if (strcmp(output, input) == 0)
        return pt_fail(err, "%s: the output is the %s it reads: writing it "
                            "would replace the input; give another name",
                       output, input_role);
    return pt_fail(err, "%s: the output is the same file as the %s %s: "
                        "writing it would replace the input; give another "
                        "name",
                   output, input_role, input);
}
