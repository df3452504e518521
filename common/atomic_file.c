/*
 * Files that appear whole or not at all: a temporary file beside the
 * target, fsync, rename (common.h, "atomic files"). Used whole by prep
 * and step by step by the dataset writer and the checkpoints.
 */
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int pt_write_file_atomic(const char *target, const void *data, size_t size,
                         pt_error *err)
{
    char temp_path[PT_PATH_MAX + 16];
    int fd = pt_temp_file_beside(target, temp_path, sizeof temp_path, err);
    if (fd < 0)
        return -1;
    if (pt_write_fully(fd, data, size) != 0) {
        int saved = errno;
        close(fd);
        unlink(temp_path);
        return pt_fail(err, "%s: write failed: %s", temp_path,
                       strerror(saved));
    }
    if (pt_publish_temp_file(fd, temp_path, target, err) != 0)
        return -1;
    /* make the rename durable too; the file is whole either way, so a
       folder that cannot be synced loses nothing and is not an error */
    char dir[PT_PATH_MAX];
    pt_directory_of(target, dir, sizeof dir);
    pt_sync_directory(dir, NULL);
    return 0;
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
