/* Writing profiles (common/profile.c is the format's one owner): every
 * bundled profile written and read back is the same profile, a derived
 * one comes back key for key, spreads are kept for measured profiles
 * only, and a profile the reader would refuse is not written. */
#include "test_support.h"

static const char *const bundled[] = {
    "profiles/A10-FASOP.json", "profiles/A10.json",
    "profiles/A100-40GB.json", "profiles/A100-80GB.json",
    "profiles/A100-FASOP.json", "profiles/H100.json",
    "profiles/H200-16SM.json", "profiles/H200-40SM.json",
    "profiles/H200.json", "profiles/RTX3090.json",
    "profiles/V100-16GB.json", "profiles/V100-32GB.json"};
static const char *const derived[] = {
    "profiles/A10.json", "profiles/A100-40GB.json",
    "profiles/A100-80GB.json", "profiles/RTX3090.json",
    "profiles/V100-16GB.json", "profiles/V100-32GB.json"};

/* p written by the owner and read back. */
static void round_trip(const profile *p, profile *out)
{
    pt_error err = {""};
    json_t *root = profile_to_json(p, "round trip", &err);
    if (root == NULL)
        fail_msg("%s", err.message);
    json_place place = json_place_root("round trip");
    if (profile_from_json(root, &place, out, &err) != 0)
        fail_msg("%s", err.message);
    json_decref(root);
}

static void assert_same_part(const part_cost *a, const part_cost *b)
{
    assert_true(a->forward_s == b->forward_s);
    assert_true(a->backward_s == b->backward_s);
    assert_true(a->forward_spread == b->forward_spread);
    assert_true(a->backward_spread == b->backward_spread);
}

static void assert_same_curve(const comm_curve *a, const comm_curve *b)
{
    assert_int_equal(a->sample_count, b->sample_count);
    for (int i = 0; i < a->sample_count; i++) {
        assert_int_equal(a->samples[i].gpus, b->samples[i].gpus);
        assert_true(a->samples[i].bytes == b->samples[i].bytes);
        assert_true(a->samples[i].time_s == b->samples[i].time_s);
        assert_true(a->samples[i].spread == b->samples[i].spread);
        assert_true(a->samples[i].compute_lost == b->samples[i].compute_lost);
    }
}

static void assert_same_shapes(const profile *a, const profile *b)
{
    assert_int_equal(a->shape_count, b->shape_count);
    for (int s = 0; s < a->shape_count; s++) {
        const profile_shape *x = &a->shapes[s], *y = &b->shapes[s];
        assert_int_equal(x->hidden, y->hidden);
        assert_int_equal(x->heads, y->heads);
        assert_int_equal(x->ffn_hidden, y->ffn_hidden);
        assert_int_equal(x->seq, y->seq);
        assert_int_equal(x->vocab, y->vocab);
        assert_int_equal(x->point_count, y->point_count);
        for (int i = 0; i < x->point_count; i++) {
            assert_int_equal(x->points[i].tp, y->points[i].tp);
            assert_int_equal(x->points[i].mbs, y->points[i].mbs);
            assert_same_part(&x->points[i].embedding, &y->points[i].embedding);
            assert_same_part(&x->points[i].layer, &y->points[i].layer);
            assert_same_part(&x->points[i].head, &y->points[i].head);
        }
    }
}

static void assert_same_profile(const profile *a, const profile *b)
{
    assert_string_equal(a->gpu, b->gpu);
    assert_true(a->memory_gib == b->memory_gib);
    assert_int_equal(a->source, b->source);
    assert_true(json_equal(a->provenance, b->provenance));
    assert_true(a->backward_over_forward == b->backward_over_forward);
    assert_int_equal(a->mbs_scaling, b->mbs_scaling);
    assert_int_equal(a->layer_times_include_tp_comm,
                     b->layer_times_include_tp_comm);
    assert_int_equal(a->flash_attention, b->flash_attention);
    assert_true(a->workspace_gib == b->workspace_gib);
    assert_true(a->optimizer_s_per_param == b->optimizer_s_per_param);
    assert_true(a->host_adamw_s_per_param == b->host_adamw_s_per_param);
    assert_true(a->host_copy_s_per_param == b->host_copy_s_per_param);
    assert_true(a->peak_tflops == b->peak_tflops);
    assert_true(a->memory_bandwidth_GBps == b->memory_bandwidth_GBps);
    assert_int_equal(a->sms, b->sms);
    assert_int_equal(a->sm_limit, b->sm_limit);
    assert_memory_equal(&a->roofline, &b->roofline, sizeof a->roofline);
    assert_same_shapes(a, b);
    assert_same_curve(&a->allreduce, &b->allreduce);
    assert_same_curve(&a->sendrecv, &b->sendrecv);
    assert_true((a->notes == NULL) == (b->notes == NULL));
    if (a->notes != NULL)
        assert_true(json_equal(a->notes, b->notes));
}

static void test_bundled_round_trip(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bundled / sizeof bundled[0]; i++) {
        profile read, written;
        load_bundled_profile(bundled[i], &read);
        round_trip(&read, &written);
        assert_same_profile(&read, &written);
        profile_free(&read);
        profile_free(&written);
    }
}

/* What `partita profile --derive` wrote is what the owner writes now,
 * key for key and value for value (the bundled files' line breaks are an
 * older layout's). */
static void test_derived_as_written(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof derived / sizeof derived[0]; i++) {
        char path[PT_PATH_MAX];
        source_path(derived[i], path, sizeof path);
        pt_error err = {""};
        json_t *file = pt_json_load_file(path, &err);
        assert_non_null(file);
        profile p;
        load_bundled_profile(derived[i], &p);
        json_t *root = profile_to_json(&p, derived[i], &err);
        assert_non_null(root);
        assert_true(json_equal(root, file));
        json_decref(root);
        json_decref(file);
        profile_free(&p);
    }
}

/* Profiles written before shapes carried their layer's architecture
 * load as GPT-2 layers, and those Partita wrote (measured, derived) are
 * written back key for key and value for value: none gains an
 * architecture key. (The hand-written published ones are read, never
 * rewritten: their backward times are filled in by a ratio.) */
static void test_old_profiles_unchanged(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bundled / sizeof bundled[0]; i++) {
        char path[PT_PATH_MAX];
        source_path(bundled[i], path, sizeof path);
        pt_error err = {""};
        json_t *file = pt_json_load_file(path, &err);
        assert_non_null(file);
        profile p;
        load_bundled_profile(bundled[i], &p);
        for (int s = 0; s < p.shape_count; s++) {
            model_shape layer = profile_shape_model(&p.shapes[s]);
            if (!model_is_gpt(&layer))
                continue; /* a Llama shape measured since (issue 35) */
            assert_int_equal(p.shapes[s].kv_heads, 0);
        }
        json_t *root = profile_to_json(&p, bundled[i], &err);
        assert_non_null(root);
        if (p.source != PROFILE_PUBLISHED && !json_equal(root, file))
            fail_msg("%s: written again, it is not the file", bundled[i]);
        json_decref(root);
        json_decref(file);
        profile_free(&p);
    }
}

/* The measured H100 profile keeps its spreads; the same costs labelled
 * "published" are written without them. */
static void test_spreads_for_measured_only(void **state)
{
    (void)state;
    profile p;
    load_bundled_profile("profiles/H100.json", &p);
    assert_int_equal(p.source, PROFILE_MEASURED);
    assert_true(p.shapes[0].points[0].layer.forward_spread > 0.0);
    pt_error err = {""};
    json_t *root = profile_to_json(&p, "measured", &err);
    char *text = json_format_text(root);
    assert_non_null(strstr(text, "\"forward_spread\""));
    free(text);
    json_decref(root);
    p.source = PROFILE_PUBLISHED;
    root = profile_to_json(&p, "published", &err);
    text = json_format_text(root);
    assert_null(strstr(text, "\"forward_spread\""));
    assert_null(strstr(text, "\"backward_spread\""));
    free(text);
    json_decref(root);
    profile_free(&p);
}

/* A profile the reader refuses is not written: the message names the
 * label and the field. */
static void test_refused_profile_is_not_written(void **state)
{
    (void)state;
    profile p;
    load_bundled_profile("profiles/A10.json", &p);
    p.workspace_gib = p.memory_gib + 1.0;
    pt_error err = {""};
    assert_null(profile_to_json(&p, "broken.json", &err));
    assert_non_null(strstr(err.message, "broken.json"));
    assert_non_null(strstr(err.message, "workspace_gib"));
    profile_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bundled_round_trip),
        cmocka_unit_test(test_derived_as_written),
        cmocka_unit_test(test_old_profiles_unchanged),
        cmocka_unit_test(test_spreads_for_measured_only),
        cmocka_unit_test(test_refused_profile_is_not_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
