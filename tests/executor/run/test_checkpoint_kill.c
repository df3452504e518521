/*
 * A checkpoint save killed at any point leaves the previous checkpoint
 * valid (issue 7). A child process resumes a run from a checkpoint of
 * iteration 2, trains iteration 3 and saves it into the same directory,
 * with $PARTITA_CHECKPOINT_KILL_AT = K: this test's copy of checkpoint.c
 * is built with its crash points, so the child sends itself SIGKILL right
 * after the K-th step of the save that touches the disk. K runs from 1 up
 * to the first K the save finishes before, so every step is covered,
 * including the removal of what an earlier killed save left behind. After
 * each kill the directory must load as one complete checkpoint: checksums
 * valid and the blobs, byte for byte, those of iteration 2 (killed before
 * the manifest's rename) or of iteration 3 (after it); no other file in
 * its generation folder; and a resume from it must run and leave only the
 * new checkpoint.
 */
#include "run_test_support.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#define LAYERS 2
#define HIDDEN 16
#define HEADS 2
#define SEQ 16
#define GBS 4
#define MBS 2
#define BEFORE_ITERATION 2   /* the checkpoint that must survive */
#define AFTER_ITERATION 3    /* the one the killed save writes */
#define MAX_STEPS 1000       /* a save of 7 blobs takes about 60 */

static run_options tiny_options(const run_scratch *s, long iterations)
{
    run_options options = run_test_options(s, iterations);
    /* one generation after a save, so that what a kill leaves is plain
       to see (test_checkpoint_keep covers keeping more) */
    options.checkpoint_keep = 1;
    options.train.schedule.max_lr = 1e-2;
    options.train.schedule.warmup_steps = 1;
    options.train.schedule.decay_steps = 10;
    return options;
}

static void train(const plan *p, const run_options *options)
{
    run_result result;
    pt_error err = {{0}};
    int status = run_training(p, options, &result, &err);
    if (status != 0)
        fail_msg("run_training: %s", err.message);
    run_result_free(&result);
}

/* ------------------------------------------------------------- files */

static void write_bytes(const char *path, const void *data, size_t size)
{
    FILE *file = fopen(path, "wb");
    assert_non_null(file);
    assert_int_equal(fwrite(data, 1, size, file), size);
    assert_int_equal(fclose(file), 0);
}

static void *read_bytes(const char *path, size_t *size)
{
    FILE *file = fopen(path, "rb");
    assert_non_null(file);
    assert_int_equal(fseek(file, 0, SEEK_END), 0);
    long length = ftell(file);
    assert_true(length >= 0);
    rewind(file);
    void *data = malloc((size_t)length + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)length, file), (size_t)length);
    fclose(file);
    *size = (size_t)length;
    return data;
}

/* Copies the regular files and folders of src into dst (made here). */
static void copy_tree(const char *src, const char *dst)
{
    assert_int_equal(mkdir(dst, 0777), 0);
    DIR *listing = opendir(src);
    assert_non_null(listing);
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        if (entry->d_name[0] == '.')
            continue;
        char from[1024], to[1024];
        snprintf(from, sizeof from, "%s/%s", src, entry->d_name);
        snprintf(to, sizeof to, "%s/%s", dst, entry->d_name);
        struct stat info;
        assert_int_equal(stat(from, &info), 0);
        if (S_ISDIR(info.st_mode)) {
            copy_tree(from, to);
        } else {
            size_t size = 0;
            void *data = read_bytes(from, &size);
            write_bytes(to, data, size);
            free(data);
        }
    }
    closedir(listing);
}

/* What an earlier save, killed before its commit, leaves: a generation
 * folder with a finished and a half-written blob, and a half-written
 * manifest. The next save must clear them, and never load them. */
static void add_leftovers(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/gen-000002", dir);
    assert_int_equal(mkdir(path, 0777), 0);
    static const char garbage[100] = "not a tensor";
    snprintf(path, sizeof path, "%s/gen-000002/params", dir);
    write_bytes(path, garbage, sizeof garbage);
    snprintf(path, sizeof path, "%s/gen-000002/adam_m.tmp.1.00c0ffee", dir);
    write_bytes(path, garbage, sizeof garbage / 2);
    snprintf(path, sizeof path, "%s/manifest.json.tmp.1.00c0ffee", dir);
    const char *half_manifest = "{ \"format\": \"partita-checkpoint\", "
                                "\"version\": 1, \"generation\": 2, ";
    write_bytes(path, half_manifest, strlen(half_manifest));
}

/* -------------------------------------------------------- checkpoints */

/* dir's checkpoint holds exactly the blobs of reference, byte for byte. */
static void assert_same_checkpoint(const char *dir, const char *reference)
{
    checkpoint_manifest got, want;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_manifest(dir, &got, &err), 0);
    assert_int_equal(checkpoint_read_manifest(reference, &want, &err), 0);
    assert_int_equal(got.blob_count, want.blob_count);
    for (int b = 0; b < want.blob_count; b++) {
        const checkpoint_blob *blob = &want.blobs[b];
        size_t bytes = (size_t)blob->bytes;
        unsigned char *a = malloc(bytes + 1), *e = malloc(bytes + 1);
        assert_non_null(a);
        assert_non_null(e);
        if (checkpoint_read_blob(dir, blob->name, a, bytes, &err) != 0)
            fail_msg("%s", err.message);
        assert_int_equal(checkpoint_read_blob(reference, blob->name, e,
                                              bytes, &err), 0);
        assert_memory_equal(a, e, bytes);
        free(a);
        free(e);
    }
}

/* The generation folder the manifest names holds its blobs and its own
 * copy of the manifest, nothing else: no temporary or half-written file
 * sits where a load looks. */
static void assert_generation_is_clean(const char *dir)
{
    checkpoint_manifest manifest;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_manifest(dir, &manifest, &err), 0);
    char folder[1024];
    snprintf(folder, sizeof folder, "%s/gen-%06llu", dir,
             (unsigned long long)manifest.generation);
    DIR *listing = opendir(folder);
    assert_non_null(listing);
    int files = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 ||
            strcmp(entry->d_name, "..") == 0 ||
            strcmp(entry->d_name, CHECKPOINT_GENERATION_MANIFEST) == 0)
            continue;
        bool listed = false;
        for (int b = 0; b < manifest.blob_count; b++)
            listed |= strcmp(entry->d_name, manifest.blobs[b].name) == 0;
        if (!listed)
            fail_msg("%s holds %s, which its manifest does not list", folder,
                     entry->d_name);
        files++;
    }
    closedir(listing);
    assert_int_equal(files, manifest.blob_count);
}

/* After a finished save: manifest.json and one generation folder. */
static void assert_only_one_generation(const char *dir)
{
    DIR *listing = opendir(dir);
    assert_non_null(listing);
    int entries = 0, generations = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        entries++;
        if (strncmp(entry->d_name, "gen-", 4) == 0)
            generations++;
        else if (strcmp(entry->d_name, CHECKPOINT_MANIFEST) != 0)
            fail_msg("%s: leftover %s after a finished save", dir,
                     entry->d_name);
    }
    closedir(listing);
    assert_int_equal(generations, 1);
    assert_int_equal(entries, 2);
}

/* ------------------------------------------------------------- the test */

/* Runs the resume-and-save in a child killed after step kill_at; returns
 * true when it was killed, false when it finished first. */
static bool save_killed_at(const plan *p, const run_options *options,
                           long kill_at)
{
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        char text[32];
        snprintf(text, sizeof text, "%ld", kill_at);
        setenv("PARTITA_CHECKPOINT_KILL_AT", text, 1);
        run_result result;
        pt_error err = {{0}};
        int status = run_training(p, options, &result, &err);
        if (status != 0)
            fprintf(stderr, "child: %s\n", err.message);
        _exit(status == 0 ? 0 : 3);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0)
        assert_int_equal(errno, EINTR);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        return true;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the save killed at step %ld ended otherwise (status 0x%x)",
                 kill_at, status);
    return false;
}

static void killed_saves_keep_a_whole_checkpoint(void **state)
{
    run_scratch *s = *state;
    plan p;
    tiny_plan(&p, LAYERS, HIDDEN, HEADS, SEQ, 257, GBS, MBS);
    char before[512], after[512];
    run_path(s, "before", before, sizeof before);
    run_path(s, "after", after, sizeof after);
    run_options options = tiny_options(s, BEFORE_ITERATION);
    options.save_dir = before;
    train(&p, &options);
    options = tiny_options(s, AFTER_ITERATION);
    options.load_dir = before;
    options.save_dir = after;
    train(&p, &options);

    long kills = 0, old_kept = 0, new_kept = 0;
    for (long step = 1; step <= MAX_STEPS; step++) {
        char dir[512], name[64];
        snprintf(name, sizeof name, "killed-at-%ld", step);
        run_path(s, name, dir, sizeof dir);
        copy_tree(before, dir);
        add_leftovers(dir);
        options = tiny_options(s, AFTER_ITERATION);
        options.load_dir = dir;
        options.save_dir = dir;
        if (!save_killed_at(&p, &options, step)) {
            assert_int_equal(run_checkpoint_iteration(dir), AFTER_ITERATION);
            assert_same_checkpoint(dir, after);
            assert_only_one_generation(dir);
            break;
        }
        kills++;
        pt_error err = {{0}};
        if (checkpoint_verify(dir, &err) != 0)
            fail_msg("killed at step %ld: %s", step, err.message);
        long iteration = run_checkpoint_iteration(dir);
        if (iteration == BEFORE_ITERATION) {
            /* the manifest's rename is one step: none after it goes back */
            assert_int_equal(new_kept, 0);
            old_kept++;
        } else {
            assert_int_equal(iteration, AFTER_ITERATION);
            new_kept++;
        }
        assert_same_checkpoint(dir, iteration == BEFORE_ITERATION ? before
                                                                  : after);
        assert_generation_is_clean(dir);
        /* what the killed save left is cleared by the next one */
        options.iterations = iteration + 1;
        train(&p, &options);
        assert_only_one_generation(dir);
        remove_scratch_tree(dir);
    }
    /* every step was reached: removing 4 leftovers, 7 blobs and the
     * generation's manifest of 5 steps each, the commit, removing the old
     * generation */
    assert_true(kills >= 4 + 8 * 5 + 8);
    assert_true(kills < MAX_STEPS);
    assert_true(old_kept > 0);
    assert_true(new_kept > 0);
    print_message("killed %ld saves: %ld kept iteration %d, %ld iteration "
                  "%d\n", kills, old_kept, BEFORE_ITERATION, new_kept,
                  AFTER_ITERATION);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(killed_saves_keep_a_whole_checkpoint),
    };
    return cmocka_run_group_tests(tests, run_scratch_open, run_scratch_close);
}
