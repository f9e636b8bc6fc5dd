# train.deterministic on emulated GPUs (tests/emu/determinism.sh): two deterministic runs
# and a run stopped and resumed are bit-identical, the checkpoint records the convolution
# algorithms, a bad record is refused by name, the non-deterministic mode records its
# choice, a GPU checkpoint resumes on the CPU (one); the same runs with 2 ranks sharing
# the GPU, which take rank 0's choice (ranks); train.cudnn_benchmark's timed choice among
# the deterministic algorithms, its exact resume and 2 GPUs running rank 0's choice (timed).
foreach(_c one ranks timed)
  add_test(NAME emu_determinism_${_c}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/determinism.sh $<TARGET_FILE:ringtrain> ${_c})
  set_tests_properties(emu_determinism_${_c} PROPERTIES LABELS emu SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()
