/* The wrappers of fault_injection.h: with --wrap=read the linker sends
 * every call of read() in the test and the libraries to __wrap_read, and
 * __real_read is the C library's. */
#include "tests/fault_injection.h"

#include <errno.h>
#include <stdio.h>
#include <sys/types.h>

ssize_t __real_read(int fd, void *buffer, size_t size);
ssize_t __wrap_read(int fd, void *buffer, size_t size);
int __real_rename(const char *from, const char *to);
int __wrap_rename(const char *from, const char *to);

/* Calls still to pass before the fault; -1: no fault armed. */
static long reads_left = -1, renames_left = -1;
static int read_error, rename_error;
static bool read_fired;

void fault_fail_read_after(long calls_before, int error)
{
    reads_left = calls_before;
    read_error = error;
    read_fired = false;
}

void fault_fail_rename_after(long calls_before, int error)
{
    renames_left = calls_before;
    rename_error = error;
}

void fault_clear(void)
{
    reads_left = -1;
    renames_left = -1;
    read_fired = false;
}

bool fault_read_fired(void)
{
    return read_fired;
}

ssize_t __wrap_read(int fd, void *buffer, size_t size)
{
    if (reads_left == 0) {
        reads_left = -1;
        read_fired = true;
        errno = read_error;
        return -1;
    }
    if (reads_left > 0)
        reads_left--;
    return __real_read(fd, buffer, size);
}

int __wrap_rename(const char *from, const char *to)
{
    if (renames_left == 0) {
        renames_left = -1;
        errno = rename_error;
        return -1;
    }
    if (renames_left > 0)
        renames_left--;
    return __real_rename(from, to);
}
