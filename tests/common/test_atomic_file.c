/* Where the one writer puts a file (issue 18, items 1-3): a regular file
 * is replaced by a rename, but a symbolic link keeps pointing at its
 * target, a FIFO or a device is written through, "-" is standard output
 * and a directory is refused; and outputs are checked before any work. */
#include "test_support.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

static const char *const text = "{\n  \"gbs\": 64\n}\n";

static void write_ok(const char *path)
{
    pt_error err = {""};
    int status = pt_write_file_atomic(path, text, strlen(text), &err);
    if (status != 0)
        fail_msg("%s", err.message);
}

static void expect_content(const char *path, const char *expected)
{
    size_t length;
    char *content = read_whole_file(path, &length);
    assert_string_equal(content, expected);
    free(content);
}

static void test_symbolic_link_kept(void **state)
{
    const char *dir = scratch_dir(state);
    char target[512], link[512], dangling[512], missing[512];
    scratch_write(state, "target.json", "old\n", target, sizeof target);
    snprintf(link, sizeof link, "%s/link.json", dir);
    assert_int_equal(symlink("target.json", link), 0);
    write_ok(link);
    struct stat info;
    assert_int_equal(lstat(link, &info), 0);
    assert_true(S_ISLNK(info.st_mode));
    expect_content(target, text);

    /* a link to a file not there yet: the file is made where it points */
    snprintf(dangling, sizeof dangling, "%s/dangling.json", dir);
    snprintf(missing, sizeof missing, "%s/made-by-link.json", dir);
    assert_int_equal(symlink(missing, dangling), 0);
    write_ok(dangling);
    assert_int_equal(lstat(dangling, &info), 0);
    assert_true(S_ISLNK(info.st_mode));
    expect_content(missing, text);
}

static void test_fifo_written_through(void **state)
{
    char fifo[512], received[512];
    snprintf(fifo, sizeof fifo, "%s/pipe", scratch_dir(state));
    snprintf(received, sizeof received, "%s/received", scratch_dir(state));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    pid_t reader = fork();
    assert_true(reader >= 0);
    if (reader == 0) {
        /* the reader copies what comes through the FIFO into a file */
        int in = open(fifo, O_RDONLY);
        int out = open(received, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        char buffer[256];
        ssize_t got;
        while (in >= 0 && out >= 0 &&
               (got = read(in, buffer, sizeof buffer)) > 0)
            if (write(out, buffer, (size_t)got) != got)
                _exit(1);
        _exit(in >= 0 && out >= 0 && close(out) == 0 ? 0 : 1);
    }
    write_ok(fifo);
    int status;
    assert_int_equal(waitpid(reader, &status, 0), reader);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct stat info;
    assert_int_equal(lstat(fifo, &info), 0);
    assert_true(S_ISFIFO(info.st_mode));
    expect_content(received, text);
}

/* A character device like /dev/null: made in the scratch folder when this
 * process may (root), else /dev/null itself, which a process that is not
 * root cannot replace anyway. */
static void test_device_written_through(void **state)
{
    char device[512];
    snprintf(device, sizeof device, "%s/null", scratch_dir(state));
    if (mknod(device, S_IFCHR | 0666, makedev(1, 3)) != 0) {
        if (geteuid() == 0)
            skip();
        snprintf(device, sizeof device, "/dev/null");
    }
    write_ok(device);
    struct stat info;
    assert_int_equal(lstat(device, &info), 0);
    assert_true(S_ISCHR(info.st_mode));
}

static void test_dash_is_standard_output(void **state)
{
    const char *dir = scratch_dir(state);
    char captured[512], here[1024];
    snprintf(captured, sizeof captured, "%s/stdout.txt", dir);
    assert_non_null(getcwd(here, sizeof here));
    assert_int_equal(chdir(dir), 0);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int capture = open(captured, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && capture >= 0);
    dup2(capture, STDOUT_FILENO);
    close(capture);
    pt_error err = {""};
    int status = pt_write_file_atomic("-", text, strlen(text), &err);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    assert_int_equal(status, 0);
    expect_content(captured, text);
    assert_int_equal(access("-", F_OK), -1);
    assert_int_equal(chdir(here), 0);
}

static void test_directory_and_mode(void **state)
{
    const char *dir = scratch_dir(state);
    pt_error err = {""};
    assert_int_equal(pt_write_file_atomic(dir, text, strlen(text), &err),
                     -1);
    EXPECT_MESSAGE(&err, dir, "is a directory");
    /* a replaced file keeps its permissions */
    char path[512];
    scratch_write(state, "private.json", "old\n", path, sizeof path);
    assert_int_equal(chmod(path, 0600), 0);
    write_ok(path);
    struct stat info;
    assert_int_equal(stat(path, &info), 0);
    assert_int_equal(info.st_mode & 0777, 0600);
    expect_content(path, text);
}

/* Entries of dir other than . and .. */
static int entry_count(const char *dir)
{
    int count = count_scratch_entries(dir, 0);
    assert_true(count >= 0);
    return count;
}

static void test_outputs_checked_first(void **state)
{
    const char *dir = scratch_dir(state);
    pt_error err = {""};
    char path[600], file[512];
    assert_int_equal(pt_check_output_file("-", &err), 0);
    snprintf(path, sizeof path, "%s/plan.json", dir);
    assert_int_equal(pt_check_output_file(path, &err), 0);
    assert_int_equal(entry_count(dir), 0); /* the test file is gone */
    snprintf(path, sizeof path, "%s/missing/plan.json", dir);
    assert_int_equal(pt_check_output_file(path, &err), -1);
    EXPECT_MESSAGE(&err, path, "cannot write there");
    scratch_write(state, "regular", "x", file, sizeof file);
    snprintf(path, sizeof path, "%s/regular/plan.json", dir);
    assert_int_equal(pt_check_output_file(path, &err), -1);
    EXPECT_MESSAGE(&err, file, "is not a folder");
    assert_int_equal(pt_check_output_file(dir, &err), -1);
    EXPECT_MESSAGE(&err, dir, "is a directory");

    /* folders: made when missing, so their nearest existing ancestor
       must be a folder that takes files */
    snprintf(path, sizeof path, "%s/new/deeper/ckpt", dir);
    assert_int_equal(pt_check_output_folder(path, &err), 0);
    assert_int_equal(access(path, F_OK), -1); /* nothing made yet */
    snprintf(path, sizeof path, "%s/regular/ckpt", dir);
    assert_int_equal(pt_check_output_folder(path, &err), -1);
    EXPECT_MESSAGE(&err, file, "is not a folder");
    assert_int_equal(entry_count(dir), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_symbolic_link_kept,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_fifo_written_through,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_device_written_through,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_dash_is_standard_output,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_directory_and_mode,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(test_outputs_checked_first,
                                        scratch_open, scratch_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
