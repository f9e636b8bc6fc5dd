# scripts/gpu-perf on the emulated GPUs (issue 39): the whole script, its tiers and its
# JSON, so that its first run on a lent GPU cannot fail on its own mistakes
add_test(NAME emu_gpu_perf COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_perf_emu.sh ${CMAKE_BINARY_DIR})
set_tests_properties(emu_gpu_perf PROPERTIES LABELS emu TIMEOUT 600)
