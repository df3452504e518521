/* report: files written whole or not at all. */
#include "report/report.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int report_write_file_atomic(const char *dir, const char *name,
                             const char *data, size_t size, pt_error *err)
{
    char final_path[PT_PATH_MAX], temp_path[PT_PATH_MAX + 16];
    snprintf(final_path, sizeof final_path, "%s/%s", dir, name);
    snprintf(temp_path, sizeof temp_path, "%s/.%s.XXXXXX", dir, name);
    int fd = mkstemp(temp_path);
    if (fd < 0)
        return pt_fail(err, "%s: cannot create a temporary file: %s",
                       final_path, strerror(errno));
    size_t written = 0;
    while (written < size) {
        ssize_t n = write(fd, data + written, size - written);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int saved = errno;
            close(fd);
            unlink(temp_path);
            return pt_fail(err, "%s: write failed: %s", final_path,
                           strerror(saved));
        }
        written += (size_t)n;
    }
    /* mkstemp makes the file 0600; a report is meant to be shared. */
    if (fchmod(fd, 0644) != 0 || fsync(fd) != 0 || close(fd) != 0) {
        int saved = errno;
        unlink(temp_path);
        return pt_fail(err, "%s: write failed: %s", final_path,
                       strerror(saved));
    }
    if (rename(temp_path, final_path) != 0) {
        int saved = errno;
        unlink(temp_path);
        return pt_fail(err, "%s: cannot rename the temporary file into "
                            "place: %s", final_path, strerror(saved));
    }
    return 0;
}
