# SPDX-License-Identifier: Apache-2.0
# Installs the build tree, then builds the README's C++ example against the installed package
# twice (CMake's find_package and pkg-config) and runs it (exit 0, or 77 without a GPU).
#   cmake -DSOURCE_DIR=... -DBUILD_DIR=... -DWORK_DIR=... -DCUDA_INCLUDE=... -DCUDA_LIB=... -P run.cmake
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")

file(READ "${SOURCE_DIR}/README.md" readme)
string(REGEX MATCH "<!-- example:begin -->\n```cpp\n(.*)\n```\n<!-- example:end -->" found "${readme}")
if(NOT found)
  message(FATAL_ERROR "README.md has no example between the example:begin/end markers")
endif()
file(WRITE "${WORK_DIR}/example.cpp" "${CMAKE_MATCH_1}\n")

# 1. find_package(tpcomm)
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" -G Ninja
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DEXAMPLE=${WORK_DIR}/example.cpp")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")

# 2. pkg-config
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs tpcomm OUTPUT_VARIABLE flags RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not know tpcomm")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(c++ -std=c++20 "${WORK_DIR}/example.cpp" -o "${WORK_DIR}/example_pc" ${flags} "-I${CUDA_INCLUDE}"
    "-L${CUDA_LIB}" -lcudart "-Wl,-rpath,${CUDA_LIB}")

# 3. It runs: a single process without a launcher (exit 77 where there is no GPU).
foreach(exe "${WORK_DIR}/build/example" "${WORK_DIR}/example_pc")
  execute_process(COMMAND "${exe}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT (rc EQUAL 0 OR rc EQUAL 77))
    message(FATAL_ERROR "${exe} exited ${rc}\n${out}\n${err}")
  endif()
  message(STATUS "${exe}: exit ${rc} ${out}")
endforeach()
