/* Fuzzes partition_parse on any text, and checks that what it accepts
 * formats back to a string it parses to the same stages. */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Fewer stages than the plan limit so the "too many" branch is
     * reachable with short inputs. */
    enum { MAX_STAGES = 16 };
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    int stages[MAX_STAGES], again[MAX_STAGES];
    int count = 0, count_again = 0;
    pt_error err;
    if (partition_parse(text, stages, MAX_STAGES, &count, &err) == 0) {
        if (count < 1 || count > MAX_STAGES)
            abort();
        char formatted[MAX_STAGES * 12];
        partition_format(stages, count, formatted, sizeof formatted);
        if (partition_parse(formatted, again, MAX_STAGES, &count_again,
                            &err) != 0 ||
            count_again != count ||
            memcmp(stages, again, sizeof(int) * (size_t)count) != 0)
            abort(); /* format and parse must round-trip */
    }
    free(text);
    return 0;
}
