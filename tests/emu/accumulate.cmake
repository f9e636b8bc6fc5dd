# tests/train/accumulate.sh on 2 emulated GPUs over NCCL (train.accumulate, issue 42 item 1)
foreach(_c equiv flight resume errors)
  add_test(NAME emu_train_accum_${_c}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/train/accumulate.sh $<TARGET_FILE:ringtrain> ${_c} cuda)
  set_tests_properties(emu_train_accum_${_c} PROPERTIES LABELS emu SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()
