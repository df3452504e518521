/* Fuzzes the model reader: model_from_json on any JSON text. */
#include "fuzz.h"

#include "common/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t json_error;
    json_t *root = json_loadb((const char *)data, size, 0, &json_error);
    if (root == NULL)
        return 0;
    json_place place = json_place_root("fuzz-model.json");
    model_shape model;
    pt_error err;
    if (model_from_json(root, &place, &model, &err) == 0) {
        /* A model that loads must give finite counts. */
        volatile double parameters = model_parameter_count(&model) +
                                     model_layer_parameter_count(&model);
        (void)parameters;
    }
    json_decref(root);
    return 0;
}
