/*
 * One run at a time saves into a checkpoint folder. Two runs saving into
 * one folder each removed the other's unfinished generation as a leftover
 * of a crash, and one died part-way (issue 33, item 7). The lock is
 * flock(2) on the folder itself: no lock file to leave behind, and the
 * kernel drops it when its process ends, however it ends, so a killed run
 * never blocks the next. The holder is named from /proc/locks.
 */
#include "executor/run/run.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* The process holding a flock on the file of `info`, from /proc/locks
 * ("1: FLOCK  ADVISORY  WRITE 4242 fd:01:1837 0 EOF"); 0 when not
 * found. */
static long lock_holder(const struct stat *info)
{
    FILE *locks = fopen("/proc/locks", "r");
    if (locks == NULL)
        return 0;
    char line[256];
    long holder = 0;
    while (holder == 0 && fgets(line, sizeof line, locks) != NULL) {
        long pid;
        unsigned major, minor;
        unsigned long inode;
        /* waiting requests are listed as "1: -> FLOCK ...": not matched */
        if (sscanf(line, "%*d: FLOCK %*s %*s %ld %x:%x:%lu", &pid, &major,
                   &minor, &inode) == 4 &&
            major == major(info->st_dev) && minor == minor(info->st_dev) &&
            inode == (unsigned long)info->st_ino)
            holder = pid;
    }
    fclose(locks);
    return holder;
}

/* "process 4242 (partita)": the holder as a person can find it. */
static void describe_holder(long pid, char *out, size_t size)
{
    if (pid <= 0) {
        snprintf(out, size, "another process");
        return;
    }
    char path[64], name[64] = "";
    snprintf(path, sizeof path, "/proc/%ld/comm", pid);
    FILE *comm = fopen(path, "r");
    if (comm != NULL) {
        if (fgets(name, sizeof name, comm) == NULL)
            name[0] = '\0';
        fclose(comm);
        name[strcspn(name, "\n")] = '\0';
    }
    if (name[0] != '\0')
        snprintf(out, size, "process %ld (%s)", pid, name);
    else
        snprintf(out, size, "process %ld", pid);
}

int checkpoint_lock_take(checkpoint_lock *lock, const char *dir,
                         pt_error *err)
{
    memset(lock, 0, sizeof *lock);
    lock->fd = -1;
    pt_copy_string(lock->dir, sizeof lock->dir, dir);
    struct stat info;
    if (stat(dir, &info) != 0) {
        /* made now, so that a second run finds it locked; removed again
           by the release, with the parents made for it, when no save
           filled it */
        pt_copy_string(lock->first_made, sizeof lock->first_made, dir);
        char parent[PT_PATH_MAX];
        for (pt_directory_of(lock->first_made, parent, sizeof parent);
             stat(parent, &info) != 0 &&
             strcmp(parent, lock->first_made) != 0;
             pt_directory_of(lock->first_made, parent, sizeof parent))
            pt_copy_string(lock->first_made, sizeof lock->first_made,
                           parent);
        if (checkpoint_make_directories(dir, err) != 0)
            return -1;
        lock->made_folder = true;
    }
    lock->fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock->fd < 0) {
        int saved = errno;
        checkpoint_lock_release(lock);
        return pt_fail(err, "%s: cannot open the checkpoint folder to lock "
                            "it: %s",
                       dir, strerror(saved));
    }
    if (flock(lock->fd, LOCK_EX | LOCK_NB) == 0)
        return 0;
    int saved = errno;
    char holder[128] = "another process";
    if (saved == EWOULDBLOCK && fstat(lock->fd, &info) == 0)
        describe_holder(lock_holder(&info), holder, sizeof holder);
    checkpoint_lock_release(lock);
    if (saved != EWOULDBLOCK)
        return pt_fail(err, "%s: cannot lock the checkpoint folder: %s", dir,
                       strerror(saved));
    return pt_fail(err, "%s: %s is saving checkpoints into this folder; "
                        "two runs would remove each other's unfinished "
                        "saves: wait for it to end, or save elsewhere",
                   dir, holder);
}

void checkpoint_lock_release(checkpoint_lock *lock)
{
    if (lock->fd >= 0)
        close(lock->fd);  /* drops the flock */
    lock->fd = -1;
    /* rmdir only removes an empty folder: one a save filled stays */
    char folder[PT_PATH_MAX];
    pt_copy_string(folder, sizeof folder, lock->dir);
    while (lock->made_folder && rmdir(folder) == 0 &&
           strcmp(folder, lock->first_made) != 0) {
        char parent[PT_PATH_MAX];
        pt_directory_of(folder, parent, sizeof parent);
        pt_copy_string(folder, sizeof folder, parent);
    }
    lock->made_folder = false;
}
