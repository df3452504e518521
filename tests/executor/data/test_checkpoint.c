/* Checkpoints: CRC-32 against known values, a full round trip, corrupted
 * or truncated blobs refused without touching the caller's buffer, an
 * interrupted save that leaves the previous checkpoint loadable, and a
 * save shared by two writers (one process per rank). */
#include "data_test_support.h"
#include "executor/run/run.h"

#include <inttypes.h>

/* The CRC-32 of IEEE 802.3 computed bit by bit, to hold the table to. */
static uint32_t crc32_bitwise(const unsigned char *data, size_t size)
{
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < size; i++) {
        crc ^= data[i];
        for (int bit = 0; bit < 8; bit++)
            crc = (crc & 1) ? (crc >> 1) ^ 0xedb88320u : crc >> 1;
    }
    return ~crc;
}

static void crc32_matches_known_values(void **state)
{
    (void)state;
    assert_int_equal(pt_crc32("", 0), 0);
    assert_int_equal(pt_crc32("123456789", 9), 0xcbf43926u);
    const char *fox = "The quick brown fox jumps over the lazy dog";
    assert_int_equal(pt_crc32(fox, strlen(fox)), 0x414fa339u);
    /* In pieces or at once: the same. */
    uint32_t crc = pt_crc32_update(0, fox, 10);
    crc = pt_crc32_update(crc, fox + 10, strlen(fox) - 10);
    assert_int_equal(crc, 0x414fa339u);
    /* Byte b alone looks up table entry 0xff ^ b: all 256 entries. */
    for (int b = 0; b < 256; b++) {
        unsigned char byte = (unsigned char)b;
        assert_int_equal(pt_crc32(&byte, 1), crc32_bitwise(&byte, 1));
    }
}

/* Eight bytes at a time against bit by bit: every length up to 300 from
 * every offset of an 8-byte word (the tail, the word path, unaligned
 * starts), and the same data fed in pieces of every size up to 20. */
static void crc32_slices_match_bitwise(void **state)
{
    (void)state;
    unsigned char data[320];
    uint32_t mix = 0x12345678u;
    for (size_t i = 0; i < sizeof data; i++) {
        mix = mix * 1664525u + 1013904223u;
        data[i] = (unsigned char)(mix >> 24);
    }
    for (size_t offset = 0; offset < 8; offset++)
        for (size_t size = 0; size <= 300; size++)
            assert_int_equal(pt_crc32(data + offset, size),
                             crc32_bitwise(data + offset, size));
    uint32_t whole = crc32_bitwise(data, sizeof data);
    for (size_t piece = 1; piece <= 20; piece++) {
        uint32_t crc = 0;
        for (size_t at = 0; at < sizeof data; at += piece) {
            size_t left = sizeof data - at;
            crc = pt_crc32_update(crc, data + at, left < piece ? left : piece);
        }
        assert_int_equal(crc, whole);
    }
}

/* The blobs a training run saves, filled from a seed. */
typedef struct run_state {
    float params[1000];
    float adam_m[1000];
    float adam_v[1000];
    unsigned char data_position[56];
    uint64_t rng[4];
    char meta[64];
} run_state;

static void fill_state(run_state *s, int seed)
{
    for (int i = 0; i < 1000; i++) {
        s->params[i] = (float)(seed * 1000 + i) * 0.5f;
        s->adam_m[i] = (float)(seed - i);
        s->adam_v[i] = (float)(i * i + seed);
    }
    memset(s->data_position, seed, sizeof s->data_position);
    for (int i = 0; i < 4; i++)
        s->rng[i] = (uint64_t)seed * 0x9e3779b97f4a7c15u + (uint64_t)i;
    snprintf(s->meta, sizeof s->meta, "{\"step\": %d}", seed);
}

/* Writes every blob of s; commits when asked. */
static void save_state(const char *dir, const run_state *s, bool commit)
{
    checkpoint_writer writer;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "params", s->params,
                                           sizeof s->params, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "adam_m", s->adam_m,
                                           sizeof s->adam_m, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "adam_v", s->adam_v,
                                           sizeof s->adam_v, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "data_position",
                                           s->data_position,
                                           sizeof s->data_position, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "rng", s->rng,
                                           sizeof s->rng, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "meta.json", s->meta,
                                           strlen(s->meta), &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "empty", "", 0, &err), 0);
    if (commit)
        assert_int_equal(checkpoint_writer_commit(&writer, &err), 0);
}

static void load_state(const char *dir, run_state *s)
{
    pt_error err = {{0}};
    memset(s, 0, sizeof *s);
    assert_int_equal(checkpoint_verify(dir, &err), 0);
    assert_int_equal(checkpoint_read_blob(dir, "params", s->params,
                                          sizeof s->params, &err), 0);
    assert_int_equal(checkpoint_read_blob(dir, "adam_m", s->adam_m,
                                          sizeof s->adam_m, &err), 0);
    assert_int_equal(checkpoint_read_blob(dir, "adam_v", s->adam_v,
                                          sizeof s->adam_v, &err), 0);
    assert_int_equal(checkpoint_read_blob(dir, "data_position",
                                          s->data_position,
                                          sizeof s->data_position, &err), 0);
    assert_int_equal(checkpoint_read_blob(dir, "rng", s->rng, sizeof s->rng,
                                          &err), 0);
    uint64_t meta_bytes = 0;
    assert_int_equal(checkpoint_blob_size(dir, "meta.json", &meta_bytes, &err),
                     0);
    assert_true(meta_bytes < sizeof s->meta);
    assert_int_equal(checkpoint_read_blob(dir, "meta.json", s->meta,
                                          meta_bytes, &err), 0);
    assert_int_equal(checkpoint_read_blob(dir, "empty", NULL, 0, &err), 0);
}

static void assert_state_equal(const run_state *a, const run_state *b)
{
    assert_memory_equal(a, b, sizeof *a);
}

static void round_trip(void **state)
{
    char dir[512];
    scratch_path(state, "runs/ckpt", dir, sizeof dir);  /* made with parents */
    assert_false(checkpoint_exists(dir));
    run_state saved, loaded;
    memset(&saved, 0, sizeof saved);
    fill_state(&saved, 1);
    save_state(dir, &saved, true);
    assert_true(checkpoint_exists(dir));
    load_state(dir, &loaded);
    assert_state_equal(&saved, &loaded);

    checkpoint_manifest manifest;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_read_manifest(dir, &manifest, &err), 0);
    assert_int_equal(manifest.generation, 1);
    assert_int_equal(manifest.blob_count, 7);
    assert_string_equal(manifest.blobs[0].name, "params");
    assert_int_equal(manifest.blobs[0].bytes, sizeof saved.params);
    assert_int_equal(manifest.blobs[0].crc32,
                     pt_crc32(saved.params, sizeof saved.params));
    assert_int_equal(manifest.blobs[6].bytes, 0);

    /* A second save replaces the first and removes its generation. */
    memset(&saved, 0, sizeof saved);
    fill_state(&saved, 2);
    save_state(dir, &saved, true);
    load_state(dir, &loaded);
    assert_state_equal(&saved, &loaded);
    char old_generation[600];
    snprintf(old_generation, sizeof old_generation, "%s/gen-000001", dir);
    assert_false(file_exists(old_generation));
    assert_int_equal(count_entries(dir), 2);  /* manifest + gen-000002 */
}

/* Fills a buffer with a pattern, to show a failed read left it alone. */
static void assert_untouched(const unsigned char *buffer, size_t size)
{
    for (size_t i = 0; i < size; i++)
        assert_int_equal(buffer[i], 0xab);
}

static void corrupted_byte_is_detected(void **state)
{
    char dir[512], path[600];
    scratch_path(state, "ckpt", dir, sizeof dir);
    run_state saved;
    memset(&saved, 0, sizeof saved);
    fill_state(&saved, 3);
    save_state(dir, &saved, true);
    snprintf(path, sizeof path, "%s/gen-000001/adam_v", dir);
    size_t size;
    unsigned char *bytes = read_bytes(path, &size);
    bytes[1234] ^= 0x10;
    write_bytes(path, bytes, size);
    free(bytes);

    pt_error err = {{0}};
    assert_int_equal(checkpoint_verify(dir, &err), -1);
    assert_message_has(err.message, "gen-000001/adam_v", "checksum mismatch",
                       "corrupt");
    unsigned char buffer[sizeof saved.adam_v];
    memset(buffer, 0xab, sizeof buffer);
    assert_int_equal(checkpoint_read_blob(dir, "adam_v", buffer, sizeof buffer,
                                          &err), -1);
    assert_message_has(err.message, "gen-000001/adam_v", "checksum mismatch");
    assert_untouched(buffer, sizeof buffer);
    /* The intact blobs still read. */
    assert_int_equal(checkpoint_read_blob(dir, "adam_m", buffer,
                                          sizeof saved.adam_m, &err), 0);
    assert_memory_equal(buffer, saved.adam_m, sizeof saved.adam_m);
}

static void truncated_blob_is_detected(void **state)
{
    char dir[512], path[600];
    scratch_path(state, "ckpt", dir, sizeof dir);
    run_state saved;
    memset(&saved, 0, sizeof saved);
    fill_state(&saved, 4);
    save_state(dir, &saved, true);
    snprintf(path, sizeof path, "%s/gen-000001/params", dir);
    assert_int_equal(truncate(path, 100), 0);
    pt_error err = {{0}};
    unsigned char buffer[sizeof saved.params];
    memset(buffer, 0xab, sizeof buffer);
    assert_int_equal(checkpoint_read_blob(dir, "params", buffer, sizeof buffer,
                                          &err), -1);
    assert_message_has(err.message, "gen-000001/params: 100 bytes",
                       "manifest records 4000", "truncated");
    assert_untouched(buffer, sizeof buffer);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(checkpoint_verify(dir, &err), -1);
    assert_message_has(err.message, "gen-000001/params", "cannot open");
}

/* Blobs written without a commit (a save killed before its manifest)
 * leave the previous checkpoint exactly as it was; the next save clears
 * the leftovers. */
static void interrupted_save_keeps_the_previous_checkpoint(void **state)
{
    char dir[512], path[600];
    scratch_path(state, "ckpt", dir, sizeof dir);
    pt_error err = {{0}};
    run_state first, second, third, loaded;
    memset(&first, 0, sizeof first);
    memset(&second, 0, sizeof second);
    memset(&third, 0, sizeof third);
    fill_state(&first, 5);
    fill_state(&second, 6);
    fill_state(&third, 7);

    /* Interrupted very first save: nothing to load, and it says why. */
    save_state(dir, &first, false);
    assert_false(checkpoint_exists(dir));
    assert_int_equal(checkpoint_verify(dir, &err), -1);
    assert_message_has(err.message, "no manifest.json",
                       "no checkpoint was committed");

    save_state(dir, &first, true);
    save_state(dir, &second, false);
    load_state(dir, &loaded);
    assert_state_equal(&first, &loaded);
    snprintf(path, sizeof path, "%s/gen-000003", dir);
    assert_true(file_exists(path));  /* the interrupted save's blobs */

    /* A commit killed while writing its manifest leaves a temporary. */
    char stray[600];
    snprintf(stray, sizeof stray, "%s/manifest.json.tmp.1.2", dir);
    write_text(stray, "{\"format\": \"partita-chec");
    load_state(dir, &loaded);
    assert_state_equal(&first, &loaded);

    save_state(dir, &third, true);
    load_state(dir, &loaded);
    assert_state_equal(&third, &loaded);
    assert_false(file_exists(path));
    assert_false(file_exists(stray));
    assert_int_equal(count_entries(dir), 2);  /* manifest + gen-000004 */
}

static void aborted_save_keeps_the_previous_checkpoint(void **state)
{
    char dir[512];
    scratch_path(state, "ckpt", dir, sizeof dir);
    run_state saved, loaded;
    memset(&saved, 0, sizeof saved);
    fill_state(&saved, 8);
    save_state(dir, &saved, true);
    checkpoint_writer writer;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "params", "xyz", 3, &err),
                     0);
    checkpoint_writer_abort(&writer);
    assert_int_equal(count_entries(dir), 2);
    assert_int_equal(checkpoint_writer_commit(&writer, &err), -1);
    assert_message_has(err.message, "no checkpoint save in progress");
    load_state(dir, &loaded);
    assert_state_equal(&saved, &loaded);
}

static void bad_blob_names_and_sizes_are_refused(void **state)
{
    char dir[512];
    scratch_path(state, "ckpt", dir, sizeof dir);
    checkpoint_writer writer;
    pt_error err = {{0}};
    const char *bad_names[] = {"", ".hidden", "a/b", "spa ce", "../up"};
    for (size_t n = 0; n < sizeof bad_names / sizeof *bad_names; n++) {
        assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), 0);
        assert_int_equal(checkpoint_write_blob(&writer, bad_names[n], "x", 1,
                                               &err), -1);
        assert_message_has(err.message, "blob name");
        checkpoint_writer_abort(&writer);
    }
    assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "params", "abcd", 4, &err),
                     0);
    assert_int_equal(checkpoint_write_blob(&writer, "params", "abcd", 4, &err),
                     -1);
    assert_message_has(err.message, "\"params\" written twice");
    /* A failed write ends the save: nothing to commit, nothing left. */
    assert_int_equal(checkpoint_writer_commit(&writer, &err), -1);
    assert_int_equal(count_entries(dir), 0);
    assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "params", "abcd", 4, &err),
                     0);
    assert_int_equal(checkpoint_writer_commit(&writer, &err), 0);

    unsigned char buffer[8];
    memset(buffer, 0xab, sizeof buffer);
    assert_int_equal(checkpoint_read_blob(dir, "params", buffer, 8, &err), -1);
    assert_message_has(err.message, "\"params\" holds 4 bytes", "has 8");
    assert_untouched(buffer, sizeof buffer);
    assert_int_equal(checkpoint_read_blob(dir, "adam_m", buffer, 4, &err), -1);
    assert_message_has(err.message, "manifest.json", "no blob named \"adam_m\"",
                       "it holds: params");
    assert_untouched(buffer, sizeof buffer);
    assert_int_equal(checkpoint_read_blob(dir, "params", buffer, 4, &err), 0);
    assert_memory_equal(buffer, "abcd", 4);
}

static void damaged_manifest_is_refused(void **state)
{
    char dir[512], path[600];
    scratch_path(state, "ckpt", dir, sizeof dir);
    checkpoint_writer writer;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), 0);
    assert_int_equal(checkpoint_write_blob(&writer, "params", "abcd", 4, &err),
                     0);
    assert_int_equal(checkpoint_writer_commit(&writer, &err), 0);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    const struct {
        const char *content;
        const char *reason;
    } cases[] = {
        {"{\"format\": \"partita-checkpoint\", ", "manifest.json"},
        {"{\"format\": \"other\", \"version\": 1, \"generation\": 1, "
         "\"blobs\": []}", "not a Partita checkpoint"},
        {"{\"format\": \"partita-checkpoint\", \"version\": 1, \"generation\": "
         "1, \"blobs\": [{\"name\": \"params\", \"bytes\": 4, \"crc32\": "
         "\"xyz\"}]}", "blobs[0].crc32"},
        {"{\"format\": \"partita-checkpoint\", \"version\": 1, \"generation\": "
         "1, \"blobs\": [{\"name\": \"params\", \"bytes\": 5, \"crc32\": "
         "\"00000000\"}]}", "4 bytes, the manifest records 5"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        write_text(path, cases[c].content);
        unsigned char buffer[4];
        memset(buffer, 0xab, sizeof buffer);
        assert_int_equal(checkpoint_verify(dir, &err), -1);
        assert_message_has(err.message, cases[c].reason);
        assert_int_equal(checkpoint_read_blob(dir, "params", buffer, 4, &err),
                         -1);
        assert_untouched(buffer, sizeof buffer);
    }
}

/* Issue 33, item 4: a folder with another program's manifest.json was
 * taken for a damaged checkpoint, and --overwrite replaced the file. */
static void foreign_manifest_is_never_touched(void **state)
{
    char dir[512], path[600];
    scratch_path(state, "app", dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    const char *const foreign[] = {"{\"name\":\"app\"}\n", "not json\n"};
    for (int f = 0; f < 2; f++) {
        write_text(path, foreign[f]);
        pt_error err = {{0}};
        assert_int_equal(checkpoint_check_ours(dir, &err), -1);
        assert_message_has(err.message, "manifest.json",
                           "not a Partita checkpoint");
        checkpoint_writer writer;
        assert_int_equal(checkpoint_writer_begin(&writer, dir, &err), -1);
        assert_int_equal(checkpoint_verify(dir, &err), -1);
        assert_message_has(err.message, "manifest.json");
        size_t size;
        unsigned char *kept = read_bytes(path, &size);
        assert_string_equal((char *)kept, foreign[f]);
        free(kept);
        assert_int_equal(count_entries(dir), 1);
    }
    /* an empty folder, or one of ours, is fine */
    scratch_path(state, "ours", dir, sizeof dir);
    pt_error err = {{0}};
    assert_int_equal(checkpoint_check_ours(dir, &err), 0);
    run_state s;
    fill_state(&s, 1);
    save_state(dir, &s, true);
    assert_int_equal(checkpoint_check_ours(dir, &err), 0);
}

/* Issue 33, item 7: two runs saving into one folder removed each other's
 * unfinished saves. The second lock is refused naming the holder (flock
 * locks conflict between two opens even in one process); a folder the
 * lock made goes again with it while empty. */
static void second_lock_is_refused(void **state)
{
    char dir[512];
    scratch_path(state, "deep/ckpt", dir, sizeof dir);
    checkpoint_lock first, second;
    pt_error err = {{0}};
    assert_int_equal(checkpoint_lock_take(&first, dir, &err), 0);
    assert_true(file_exists(dir));
    assert_int_equal(checkpoint_lock_take(&second, dir, &err), -1);
    char holder[64];
    snprintf(holder, sizeof holder, "process %ld", (long)getpid());
    assert_message_has(err.message, "ckpt: ", holder,
                       "is saving checkpoints into this folder");
    checkpoint_lock_release(&second);  /* not held: nothing happens */
    checkpoint_lock_release(&first);
    assert_false(file_exists(dir));
    char parent[512];
    scratch_path(state, "deep", parent, sizeof parent);
    assert_false(file_exists(parent));  /* made for it, removed with it */
    assert_int_equal(checkpoint_lock_take(&second, dir, &err), 0);
    run_state s;
    fill_state(&s, 2);
    save_state(dir, &s, true);  /* the holder saves; the folder stays */
    checkpoint_lock_release(&second);
    assert_true(file_exists(dir));
}

/* One process per rank: a second writer joins the generation the first
 * began, writes its blob there and hands its record over; the first
 * commits both. A joined writer cannot commit, and its abort removes only
 * its own blobs. */
static void joined_writer_adds_its_blobs(void **state)
{
    char dir[512];
    scratch_path(state, "joined", dir, sizeof dir);
    pt_error err = {{0}};
    checkpoint_writer first, second;
    assert_int_equal(checkpoint_writer_join(&second, dir, 1, &err), -1);
    assert_non_null(strstr(err.message, "gen-000001"));
    assert_int_equal(checkpoint_writer_begin(&first, dir, &err), 0);
    assert_int_equal(checkpoint_writer_join(&second, dir, first.generation,
                                            &err),
                     0);
    const float mine[3] = {1.0f, 2.0f, 3.0f}, theirs[2] = {4.0f, 5.0f};
    assert_int_equal(checkpoint_write_blob(&first, "params.rank0", mine,
                                           sizeof mine, &err),
                     0);
    assert_int_equal(checkpoint_write_blob(&second, "params.rank1", theirs,
                                           sizeof theirs, &err),
                     0);
    assert_int_equal(checkpoint_writer_commit(&second, &err), -1);
    assert_int_equal(checkpoint_writer_add(&first, &second.blobs[0], &err),
                     0);
    assert_int_equal(checkpoint_writer_commit(&first, &err), 0);
    assert_int_equal(checkpoint_verify(dir, &err), 0);
    float read_back[2] = {0};
    assert_int_equal(checkpoint_read_blob(dir, "params.rank1", read_back,
                                          sizeof read_back, &err),
                     0);
    assert_true(read_back[0] == 4.0f && read_back[1] == 5.0f);

    /* a joined writer's abort leaves the rest of the generation */
    checkpoint_writer third, fourth;
    assert_int_equal(checkpoint_writer_begin(&third, dir, &err), 0);
    assert_int_equal(checkpoint_write_blob(&third, "params.rank0", mine,
                                           sizeof mine, &err),
                     0);
    assert_int_equal(checkpoint_writer_join(&fourth, dir, third.generation,
                                            &err),
                     0);
    assert_int_equal(checkpoint_write_blob(&fourth, "params.rank1", theirs,
                                           sizeof theirs, &err),
                     0);
    /* a joined writer takes no records (it never commits): refusing one
     * aborts it */
    assert_int_equal(checkpoint_writer_add(&fourth, &third.blobs[0], &err),
                     -1);
    assert_false(fourth.active);
    char path[700];
    snprintf(path, sizeof path, "%s/gen-%06llu/params.rank1", dir,
             (unsigned long long)third.generation);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/gen-%06llu/params.rank0", dir,
             (unsigned long long)third.generation);
    assert_int_equal(access(path, F_OK), 0);
    checkpoint_writer_abort(&third);
    assert_int_equal(checkpoint_verify(dir, &err), 0); /* the first stays */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crc32_matches_known_values),
        cmocka_unit_test(crc32_slices_match_bitwise),
        SCRATCH_TEST(round_trip),
        SCRATCH_TEST(corrupted_byte_is_detected),
        SCRATCH_TEST(truncated_blob_is_detected),
        SCRATCH_TEST(interrupted_save_keeps_the_previous_checkpoint),
        SCRATCH_TEST(aborted_save_keeps_the_previous_checkpoint),
        SCRATCH_TEST(bad_blob_names_and_sizes_are_refused),
        SCRATCH_TEST(damaged_manifest_is_refused),
        SCRATCH_TEST(joined_writer_adds_its_blobs),
        SCRATCH_TEST(foreign_manifest_is_never_touched),
        SCRATCH_TEST(second_lock_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
