# tests/emu/p2p.sh: `ringtrain bench p2p` on emulated GPUs with a configured topology
# (RINGTRAIN_EMU_TOPOLOGY; issue 42, item 7)
foreach(_c puzzle transpose one bad)
  add_test(NAME emu_bench_p2p_${_c} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/p2p.sh $<TARGET_FILE:ringtrain> ${_c})
  set_tests_properties(emu_bench_p2p_${_c} PROPERTIES LABELS emu TIMEOUT 120)
endforeach()
