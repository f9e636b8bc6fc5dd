# tests/train/trace.sh gpu: a traced run on emulated GPUs (nccl and staged) has the GPU
# stream track on every rank (issue 21, item 1)
add_test(NAME emu_trace_gpu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/train/trace.sh $<TARGET_FILE:ringtrain> gpu)
set_tests_properties(emu_trace_gpu PROPERTIES LABELS emu SKIP_RETURN_CODE 77 TIMEOUT 600)
