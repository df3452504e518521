/* prep under faults (issue 33): a read that fails in the middle of the
 * input (item 1), an .idx that cannot be renamed into place after the
 * .bin was (item 5), outputs that are symbolic links (item 6) or the
 * input itself (item 3). Each leaves the old dataset as it was. Reads and
 * renames are failed by tests/fault_injection.c. */
#include "data_test_support.h"
#include "tests/fault_injection.h"

#include <errno.h>

/* The two files of prefix, read whole (the caller frees both). */
typedef struct dataset_bytes {
    unsigned char *bin, *idx;
    size_t bin_size, idx_size;
} dataset_bytes;

static dataset_bytes read_dataset(const char *prefix)
{
    char path[600];
    dataset_bytes bytes;
    snprintf(path, sizeof path, "%s.bin", prefix);
    bytes.bin = read_bytes(path, &bytes.bin_size);
    snprintf(path, sizeof path, "%s.idx", prefix);
    bytes.idx = read_bytes(path, &bytes.idx_size);
    return bytes;
}

static void assert_dataset_unchanged(const char *prefix,
                                     const dataset_bytes *before)
{
    dataset_bytes after = read_dataset(prefix);
    assert_int_equal(after.bin_size, before->bin_size);
    assert_memory_equal(after.bin, before->bin, before->bin_size);
    assert_int_equal(after.idx_size, before->idx_size);
    assert_memory_equal(after.idx, before->idx, before->idx_size);
    free(after.bin);
    free(after.idx);
    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    indexed_dataset_close(&ds);
}

static void prep_ok(const char *input, const char *prefix)
{
    pt_error err = {{0}};
    if (prep_run(input, PREP_FORMAT_TEXT, prefix, NULL, &err) != 0)
        fail_msg("%s", err.message);
}

/* in.txt and the dataset ds prepped from old_text, in the scratch
 * folder; the dataset's bytes. */
static dataset_bytes prep_old_dataset(void **state, char *input,
                                      char *prefix, const char *old_text)
{
    scratch_path(state, "in.txt", input, 512);
    scratch_path(state, "ds", prefix, 512);
    write_text(input, old_text);
    prep_ok(input, prefix);
    return read_dataset(prefix);
}

/* Item 1: getline's -1 for ENOMEM was taken for the end of the file:
 * prep wrote the documents before it and exited 0. */
static void read_error_is_refused(void **state)
{
    char input[512], prefix[512];
    dataset_bytes before = prep_old_dataset(state, input, prefix, "old\n");
    const prep_format formats[] = {PREP_FORMAT_TEXT, PREP_FORMAT_JSONL};
    const char *const inputs[] = {
        "one\n\ntwo\n\nthree\n\nfour\n",
        "{\"text\": \"one\"}\n{\"text\": \"two\"}\n"};
    for (int f = 0; f < 2; f++) {
        write_text(input, inputs[f]);
        int entries = count_entries(((scratch *)*state)->dir);
        pt_error err = {{0}};
        fault_fail_read_after(1, ENOMEM);  /* the read after the first */
        int status = prep_run(input, formats[f], prefix, NULL, &err);
        fault_clear();
        assert_int_equal(status, -1);
        assert_message_has(err.message, "in.txt: read error after line",
                           strerror(ENOMEM));
        assert_int_equal(count_entries(((scratch *)*state)->dir), entries);
        assert_dataset_unchanged(prefix, &before);
    }
    free(before.bin);
    free(before.idx);
}

/* Item 5: the .bin was renamed over the old one, then the .idx could not
 * be (an immutable file, a full directory): the pair no longer loaded. */
static void failed_idx_rename_keeps_the_old_pair(void **state)
{
    char input[512], prefix[512];
    dataset_bytes before = prep_old_dataset(
        state, input, prefix, "the old dataset\n\nof two documents\n");
    write_text(input, "a\n");
    pt_error err = {{0}};
    fault_fail_rename_after(1, EPERM);  /* the .idx, after the .bin */
    int status = prep_run(input, PREP_FORMAT_TEXT, prefix, NULL, &err);
    fault_clear();
    assert_int_equal(status, -1);
    assert_message_has(err.message, "the old pair is kept", "ds.idx",
                       strerror(EPERM));
    assert_dataset_unchanged(prefix, &before);
    assert_int_equal(count_entries(((scratch *)*state)->dir), 3);
    free(before.bin);
    free(before.idx);

    /* with no old pair, neither file appears */
    scratch_path(state, "fresh", prefix, sizeof prefix);
    fault_fail_rename_after(1, EPERM);
    status = prep_run(input, PREP_FORMAT_TEXT, prefix, NULL, &err);
    fault_clear();
    assert_int_equal(status, -1);
    assert_int_equal(count_entries(((scratch *)*state)->dir), 3);
}

/* Item 6: prep replaced the links lk.bin and lk.idx with files; every
 * other output writes through its link. */
static void symbolic_links_stay(void **state)
{
    char input[512], prefix[512], link_path[600], target[600];
    scratch_path(state, "in.txt", input, sizeof input);
    scratch_path(state, "lk", prefix, sizeof prefix);
    write_text(input, "through the links\n");
    const char *const suffixes[] = {".bin", ".idx"};
    for (int i = 0; i < 2; i++) {
        snprintf(link_path, sizeof link_path, "%s%s", prefix, suffixes[i]);
        snprintf(target, sizeof target, "real%s", suffixes[i]);
        assert_int_equal(symlink(target, link_path), 0);
    }
    prep_ok(input, prefix);
    for (int i = 0; i < 2; i++) {
        struct stat info;
        snprintf(link_path, sizeof link_path, "%s%s", prefix, suffixes[i]);
        assert_int_equal(lstat(link_path, &info), 0);
        assert_true(S_ISLNK(info.st_mode));
        scratch_path(state, i == 0 ? "real.bin" : "real.idx", target,
                     sizeof target);
        assert_int_equal(lstat(target, &info), 0);
        assert_true(S_ISREG(info.st_mode));
    }
    indexed_dataset ds;
    pt_error err = {{0}};
    assert_int_equal(indexed_dataset_open(&ds, prefix, &err), 0);
    assert_int_equal(ds.document_count, 1);
    indexed_dataset_close(&ds);
}

/* Item 3: `prep x.bin -o x` replaced its own input. */
static void output_that_is_the_input_is_refused(void **state)
{
    char input[512], prefix[512];
    scratch_path(state, "x.bin", input, sizeof input);
    scratch_path(state, "x", prefix, sizeof prefix);
    write_text(input, "text that happens to be named x.bin\n");
    pt_error err = {{0}};
    assert_int_equal(prep_run(input, PREP_FORMAT_TEXT, prefix, NULL, &err),
                     -1);
    assert_message_has(err.message, "x.bin: the output is the input it "
                                    "reads");
    size_t size;
    unsigned char *kept = read_bytes(input, &size);
    assert_string_equal((char *)kept, "text that happens to be named x.bin\n");
    free(kept);
    assert_int_equal(count_entries(((scratch *)*state)->dir), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(read_error_is_refused, scratch_open,
                                        scratch_close),
        cmocka_unit_test_setup_teardown(failed_idx_rename_keeps_the_old_pair,
                                        scratch_open, scratch_close),
        cmocka_unit_test_setup_teardown(symbolic_links_stay, scratch_open,
                                        scratch_close),
        cmocka_unit_test_setup_teardown(output_that_is_the_input_is_refused,
                                        scratch_open, scratch_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
