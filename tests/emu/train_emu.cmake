# tests/emu/train_emu.sh: ringtrain train / eval on emulated GPUs against the CPU
foreach(_c nccl shared three eval cross kill syncs nonfinite recipes)
  add_test(NAME emu_train_${_c} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train_emu.sh $<TARGET_FILE:ringtrain> ${_c})
  set_tests_properties(emu_train_${_c} PROPERTIES LABELS emu SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()
# the stream-contract tests with random delays on every stream operation: a missing
# event wait becomes a wrong result
foreach(_t test_dist_stream_gpu test_dist_nccl test_data_loader_gpu)
  if(TEST ${_t})
    set_property(TEST ${_t} APPEND PROPERTY ENVIRONMENT RINGTRAIN_EMU_DELAY_US=500)
  endif()
endforeach()

# failures inside the nccl transport (defect 6 of issue 19): a failed call in an NCCL
# group, a peer killed inside an all-reduce
rt_test(test_nccl_faults SOURCES test_nccl_faults.c LIBS rt_dist rt_dist_testmp LABELS emu TIMEOUT 300)
target_include_directories(test_nccl_faults PRIVATE ${CMAKE_SOURCE_DIR}/tests/dist ${CMAKE_SOURCE_DIR}/tests/cuda_emu)
# staging does not block the caller: an all-reduce started while the producer's stream is held
rt_test(test_staging_async SOURCES test_staging_async.c LIBS rt_dist rt_dist_testmp LABELS emu TIMEOUT 300)
target_include_directories(test_staging_async PRIVATE ${CMAKE_SOURCE_DIR}/tests/dist)
