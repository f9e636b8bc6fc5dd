/* One label type from the loader to the loss (issue: "a batch goes from rt_loader_next
 * to the loss with no cast"). Both checks are at compile time: if rt_batch.labels or
 * rt_model_loss / rt_model_train_step stop taking int64 labels, this file does not build
 * and the test fails. The run-time part checks the element size the loader documents. */
#include "data/loader.h"
#include "model/model.h"

#include <stdint.h>
#include <stdio.h>

#define IS_I64_PTR(x) _Generic((x), int64_t *: 1, const int64_t *: 1, default: 0)

_Static_assert(IS_I64_PTR(((rt_batch *)0)->labels), "rt_batch.labels must be int64_t *");
_Static_assert(_Generic(&rt_model_loss, rt_status (*)(rt_model *, const int64_t *): 1, default: 0),
               "rt_model_loss must take const int64_t * labels");

int main(void) {
    rt_batch b = {0};
    int64_t lab[2] = {3, 7};
    b.labels = lab;
    /* the loader's labels go to the loss as they are */
    const int64_t *to_loss = b.labels;
    if (sizeof *b.labels != 8 || to_loss[1] != 7) {
        fprintf(stderr, "label element size %zu, expected 8\n", sizeof *b.labels);
        return 1;
    }
    return 0;
}
