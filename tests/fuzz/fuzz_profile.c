/* Fuzzes the profile reader and the lookups made on a loaded profile. */
#include "fuzz.h"

#include "common/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t json_error;
    json_t *root = json_loadb((const char *)data, size, 0, &json_error);
    if (root == NULL)
        return 0;
    json_place place = json_place_root("fuzz-profile.json");
    profile p;
    pt_error err;
    if (profile_from_json(root, &place, &p, &err) == 0) {
        (void)profile_source_name(p.source);
        for (int s = 0; s < p.shape_count; s++) {
            const profile_shape *shape = &p.shapes[s];
            model_shape model = profile_shape_model(shape);
            (void)profile_find_shape(&p, &model);
            for (int i = 0; i < shape->point_count && i < 64; i++)
                (void)profile_find_point(shape, shape->points[i].tp,
                                         shape->points[i].mbs);
            (void)profile_find_point(shape, 0, 0);
        }
        profile_free(&p);
    }
    json_decref(root);
    return 0;
}
