/* ZeRO-3's rule of which units a pass all-gathers on the cuda backend
 * (executor/cuda/unit_holds.c), without a GPU: a unit its buffer still
 * holds, gathered since the parameters last changed, is not gathered
 * again. Checked: the gathers of a tied stage of 8 layers over a step
 * of two micro-batches by hand; that over random passes, steps and
 * shapes every unit a pass computes is in its buffer, gathered after
 * the last change of the parameters, and that no gather is of a unit
 * its buffer held so; the closed forms of a pass's gathers after a
 * forward and after a backward that the cost model restates. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "executor/cuda/unit_holds.h"

static unit_pass_shape whole_stage(int layers, bool tied)
{
    return (unit_pass_shape){.has_embedding = true, .has_head = true,
                             .tied_head = tied, .layers = layers};
}

/* pp 1, tied, 8 layers, two micro-batches a step: the first forward
 * gathers every unit; the backward after it finds the embeddings, the
 * head and layers 7 and 6 held; the next forward the embeddings, layers
 * 0 and 1 and the head; the optimizer step forgets them all. */
static void a_step_of_two_micro_batches(void **state)
{
    (void)state;
    unit_pass_shape shape = whole_stage(8, true);
    unit_holds holds = {{0}, 0};
    for (int step = 0; step < 3; step++) {
        assert_int_equal(unit_holds_pass(&holds, &shape, false), 10);
        assert_int_equal(unit_holds_pass(&holds, &shape, true), 6);
        assert_int_equal(unit_holds_pass(&holds, &shape, false), 6);
        assert_int_equal(unit_holds_pass(&holds, &shape, true), 6);
        unit_holds_forget(&holds);
    }
    assert_int_equal(holds.gathers, 3 * 28);
    /* a stage of one layer gathers nothing after its first pass */
    shape = whole_stage(1, false);
    assert_int_equal(unit_holds_pass(&holds, &shape, false), 3);
    assert_int_equal(unit_holds_pass(&holds, &shape, true), 0);
    assert_int_equal(unit_holds_pass(&holds, &shape, false), 0);
}

/* Deterministic pseudo-random numbers (a 64-bit LCG). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static int random_int(int low, int high)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return low + (int)((rng_state >> 33) % (uint64_t)(high - low + 1));
}

/* What a buffer has in it: a unit, gathered at a version of the
 * parameters (the model of the device's memory, kept beside the rule). */
typedef struct content {
    stage_unit_kind kind;
    int layer;
    long version;
    bool filled;
} content;

/* One claim as param_units.c makes it, with the buffer's content: a
 * claim that gathers fills it with the unit at the current version and
 * must not find it there already. */
static void claim(unit_holds *holds, content *buffers, stage_unit_kind kind,
                  int layer, long version)
{
    content *c = &buffers[unit_buffer_of(kind, layer)];
    bool current = c->filled && c->kind == kind && c->layer == layer &&
                   c->version == version;
    bool gathered = unit_holds_claim(holds, kind, layer);
    assert_true(gathered == !current);
    if (gathered)
        *c = (content){kind, layer, version, true};
}

/* A pass as the backend runs it: its start, then at each unit that unit
 * (which must then be in its buffer at the current version) and the
 * next one. */
static void run_pass(unit_holds *holds, content *buffers,
                     const unit_pass_shape *shape, bool backward,
                     long version)
{
    if (backward && shape->tied_head)
        claim(holds, buffers, STAGE_UNIT_EMBEDDING, 0, version);
    stage_unit_kind kind, next_kind;
    int layer, next_layer;
    for (int i = 0; unit_pass_at(shape, backward, i, &kind, &layer); i++) {
        assert_int_equal(unit_pass_index(shape, backward, kind, layer), i);
        claim(holds, buffers, kind, layer, version);
        const content *c = &buffers[unit_buffer_of(kind, layer)];
        assert_true(c->filled && c->kind == kind && c->layer == layer &&
                    c->version == version);
        if (unit_pass_at(shape, backward, i + 1, &next_kind, &next_layer))
            claim(holds, buffers, next_kind, next_layer, version);
    }
}

static void every_unit_used_is_current(void **state)
{
    (void)state;
    for (int trial = 0; trial < 400; trial++) {
        bool embedding = random_int(0, 1), head = random_int(0, 1);
        unit_pass_shape shape = {
            .has_embedding = embedding, .has_head = head,
            .tied_head = embedding && head && random_int(0, 1),
            .layers = random_int(0, 9)};
        unit_holds holds = {{0}, 0};
        content buffers[GRAD_UNIT_BUFFERS] = {{0}};
        long version = 0;
        for (int event = 0; event < 40; event++) {
            int what = random_int(0, 9);
            if (what == 0) { /* the optimizer step, or a write */
                unit_holds_forget(&holds);
                version++;
            } else {
                run_pass(&holds, buffers, &shape, what % 2 == 0, version);
            }
        }
    }
}

/* The gathers of a pass of a stage of L layers with its ends held: after
 * a pass the other way the two layers it ended with are the two this one
 * starts with (L - 2 gathered); after one the same way they are the
 * pass's last two, which a stage of four layers or more overwrites
 * before it reaches them (L), one of three the middle one (2), one of
 * one or two keeps (0). What costmodel/zero.c counts. */
static void passes_after_passes(void **state)
{
    (void)state;
    for (int layers = 0; layers <= 9; layers++)
        for (int backward = 0; backward <= 1; backward++) {
            unit_pass_shape shape = whole_stage(layers, backward);
            unit_holds holds = {{0}, 0};
            unit_holds_pass(&holds, &shape, backward);
            int turned = unit_holds_pass(&holds, &shape, !backward);
            assert_int_equal(turned, layers > 2 ? layers - 2 : 0);
            unit_holds_pass(&holds, &shape, backward);
            int same = unit_holds_pass(&holds, &shape, backward);
            int expected = layers >= 4 ? layers : layers == 3 ? 2 : 0;
            assert_int_equal(same, expected);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_step_of_two_micro_batches),
        cmocka_unit_test(every_unit_used_is_current),
        cmocka_unit_test(passes_after_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
