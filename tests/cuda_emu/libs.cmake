# Emulated GPUs (RINGTRAIN_CUDA=EMU, docs/cuda-emulation.md): the CUDA runtime, cuDNN,
# cuBLAS and NCCL of the test tree, built as static libraries under the names the real
# build links (CUDA::cudart, CUDA::cublas, CUDNN_LIB, NCCL_LIB), and rt_emu_rewrite(),
# which turns the project's .cu files into host C++ for rt_area(). Included from the
# top-level CMakeLists.txt before the libraries are defined.
enable_language(CXX)
set(RT_EMU_DIR ${CMAKE_SOURCE_DIR}/tests/cuda_emu)
set(RT_EMU_GEN ${CMAKE_BINARY_DIR}/cuda_emu)
file(MAKE_DIRECTORY ${RT_EMU_GEN})

# rt_emu_rewrite(OUT_VAR file.cu...): the host C++ copies (launches rewritten, names kept)
function(rt_emu_rewrite out)
  set(_copies "")
  foreach(_f ${ARGN})
    file(RELATIVE_PATH _rel ${CMAKE_SOURCE_DIR} ${_f})
    string(REPLACE "/" "_" _flat ${_rel})
    string(REGEX REPLACE "\\.cu$" ".cpp" _flat ${_flat})
    add_custom_command(OUTPUT ${RT_EMU_GEN}/${_flat}
                       COMMAND ${CMAKE_COMMAND} -DIN=${_f} -DOUT=${RT_EMU_GEN}/${_flat} -DKEEP_NAMES=ON
                               -P ${RT_EMU_DIR}/rewrite_cu.cmake
                       DEPENDS ${_f} ${RT_EMU_DIR}/rewrite_cu.cmake
                       COMMENT "CUDA emulation: ${_rel} -> host C++" VERBATIM)
    set_source_files_properties(${RT_EMU_GEN}/${_flat} PROPERTIES GENERATED ON)
    list(APPEND _copies ${RT_EMU_GEN}/${_flat})
  endforeach()
  set(${out} ${_copies} PARENT_SCOPE)
endfunction()

function(rt_emu_lib name)
  add_library(${name} STATIC ${ARGN})
  set_target_properties(${name} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  target_include_directories(${name} BEFORE PUBLIC ${RT_EMU_DIR}/include)
  target_include_directories(${name} PRIVATE ${RT_EMU_DIR} ${CMAKE_SOURCE_DIR}/src ${CMAKE_BINARY_DIR}/generated)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# the runtime: kernel execution (emu.cpp) and the rest (runtime.cpp)
rt_emu_lib(rt_emu_cudart ${RT_EMU_DIR}/emu.cpp ${RT_EMU_DIR}/runtime.cpp ${RT_EMU_DIR}/ledger.cpp
           ${RT_EMU_DIR}/kernel_costs.cpp ${RT_EMU_DIR}/topology.cpp)
target_compile_definitions(rt_emu_cudart PUBLIC RT_EMU_FULL_RUNTIME=1)
# one rounding per source operation, nothing fused (what the kernels' intrinsics mean)
target_compile_options(rt_emu_cudart PUBLIC -ffp-contract=off)
find_package(Threads REQUIRED)
target_link_libraries(rt_emu_cudart PUBLIC Threads::Threads ${CMAKE_DL_LIBS})
add_library(CUDA::cudart ALIAS rt_emu_cudart)

# cuBLAS's GEMMs through the CPU BLAS (OpenBLAS)
rt_emu_lib(rt_emu_cublas ${RT_EMU_DIR}/cublas.cpp)
target_include_directories(rt_emu_cublas PRIVATE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(rt_emu_cublas PUBLIC rt_emu_cudart ${OPENBLAS_LIB})
add_library(CUDA::cublas ALIAS rt_emu_cublas)

# convolutions as im2col + OpenBLAS GEMMs (each algorithm in its own order)
rt_emu_lib(rt_emu_cudnn ${RT_EMU_DIR}/cudnn.cpp)
target_include_directories(rt_emu_cudnn PRIVATE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(rt_emu_cudnn PUBLIC rt_emu_cudart ${OPENBLAS_LIB})
set(CUDNN_LIB rt_emu_cudnn)
set(CUDNN_INCLUDE_DIR ${RT_EMU_DIR}/include)

rt_emu_lib(rt_emu_nccl ${RT_EMU_DIR}/nccl.cpp)
target_link_libraries(rt_emu_nccl PUBLIC rt_emu_cudart)
set(NCCL_LIB rt_emu_nccl)
set(NCCL_INCLUDE_DIR ${RT_EMU_DIR}/include)
