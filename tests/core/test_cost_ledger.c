/* The cost ledger's lookup and the cost calibration reader (core/cost_ledger.h, docs/gpu.md):
 *  - rt_cost_ledger_find() finds the emulated GPUs' ledger only in the emulated-GPU build
 *    (weak symbols): a CPU or real CUDA build has none, so bench model prints null there;
 *  - rt_cost_model_load reads a calibration and refuses a bad one naming the file and
 *    the field; the committed calibration (the newest bench/results/gpu-cost-calibration-*)
 *    loads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/cost_ledger.h"
#ifdef RT_EMU_FULL_RUNTIME
#include <cuda_runtime.h>
#endif

static void test_find(void **state) {
    (void)state;
#ifdef RT_EMU_FULL_RUNTIME
    int n = 0;
    (void)cudaGetDeviceCount(&n); /* the emulated runtime is linked in, and its ledger with it */
    const rt_cost_ledger_api *api = rt_cost_ledger_find();
    assert_non_null(api);
    rt_cost_ledger l = {.size = sizeof l};
    assert_int_equal(api->read(&l), 0);
#else
    assert_null(rt_cost_ledger_find());
#endif
}

static const char *k_good = "{\"peak_flops\": {\"fp32\": 6.7e13, \"tf32\": 4.95e14, \"bf16\": 9.9e14}, "
                            "\"bandwidth_bytes_per_s\": 4.3e12, \"eta\": 0.25, \"beta\": 0.5, \"h_s\": 2e-5, "
                            "\"sync_s\": 0}";

static char g_path[64];

static void write_file(const char *text) {
    snprintf(g_path, sizeof g_path, "/tmp/rt-cost-cal-%d.json", (int)getpid());
    FILE *f = fopen(g_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* k_good with `from` replaced by `to`: refused, the message naming `field` */
static void refused(const char *from, const char *to, rt_status want, const char *field) {
    char text[512];
    const char *at = strstr(k_good, from);
    assert_non_null(at);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - k_good), k_good, to, at + strlen(from));
    write_file(text);
    rt_cost_model m;
    assert_int_equal(rt_cost_model_load(g_path, &m), want);
    const char *msg = rt_error_message();
    if (!strstr(msg, field) || !strstr(msg, g_path)) fail_msg("message '%s' names neither %s nor the file", msg, field);
    unlink(g_path);
}

static void test_model_load(void **state) {
    (void)state;
    write_file(k_good);
    rt_cost_model m;
    assert_int_equal(rt_cost_model_load(g_path, &m), RT_OK);
    assert_true(m.peak_flops[RT_COST_MATH_TF32] == 4.95e14 && m.peak_flops[RT_COST_MATH_BF16] == 9.9e14);
    assert_true(m.bandwidth == 4.3e12 && m.eta == 0.25 && m.beta == 0.5 && m.h == 2e-5 && m.sync_s == 0);
    unlink(g_path);
    refused("\"eta\": 0.25", "\"etta\": 0.25", RT_ERR_FORMAT, "\"eta\"");
    refused("\"beta\": 0.5", "\"beta\": -0.5", RT_ERR_FORMAT, "\"beta\"");
    refused("\"h_s\": 2e-5", "\"h_s\": \"fast\"", RT_ERR_FORMAT, "\"h_s\"");
    refused("\"bf16\": 9.9e14", "\"bf17\": 9.9e14", RT_ERR_FORMAT, "\"bf16\"");
    refused("{\"peak_flops\"", "[\"peak_flops\"", RT_ERR_FORMAT, "line 1");
    assert_int_equal(rt_cost_model_load("/nonexistent/cal.json", &m), RT_ERR_IO);
    assert_non_null(strstr(rt_error_message(), "/nonexistent/cal.json"));
}

static void test_committed_calibration(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/bench/results/gpu-cost-calibration-20261128.json", RT_SOURCE_DIR);
    rt_cost_model m;
    if (rt_cost_model_load(path, &m) != RT_OK) fail_msg("%s", rt_error_message());
    assert_true(m.eta > 0 && m.eta <= 1 && m.beta > 0 && m.beta <= 1 && m.h > 0);
}

static void test_diff(void **state) {
    (void)state;
    rt_cost_ledger a = {.size = sizeof a, .ops = 10, .launches = 4, .host_syncs = 3, .bytes_read = 100, .flops = 7},
                   b = {.size = sizeof b, .ops = 4, .launches = 1, .host_syncs = 1, .bytes_read = 40, .flops = 2}, d;
    a.kind_bytes[RT_COST_CUDNN] = 50, b.kind_bytes[RT_COST_CUDNN] = 20;
    rt_cost_ledger_diff(&a, &b, &d);
    assert_int_equal(d.ops, 6);
    assert_int_equal(d.launches, 3);
    assert_int_equal(d.host_syncs, 2);
    assert_true(d.bytes_read == 60 && d.flops == 5 && d.kind_bytes[RT_COST_CUDNN] == 30);
    assert_string_equal(rt_cost_kind_name(RT_COST_NCCL), "nccl");
    assert_string_equal(rt_cost_math_name(RT_COST_MATH_TF32), "tf32");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_model_load),
        cmocka_unit_test(test_committed_calibration),
        cmocka_unit_test(test_diff),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
