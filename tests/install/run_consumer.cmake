# Builds and runs a consumer project against attn; any failing step fails the
# test (message(FATAL_ERROR) makes `cmake -P` exit non-zero). Run by ctest:
#
#   cmake -DMODE=find_package|add_subdirectory -DATTN_SOURCE_DIR=... -DATTN_BINARY_DIR=...
#         -DWORK_DIR=... -DCONFIG=... -DGENERATOR=... -DMAKE_PROGRAM=... -DCXX_COMPILER=...
#         -P run_consumer.cmake
#
# find_package:     cmake --install <attn's build> --prefix WORK_DIR/prefix, then
#                   consumer/ with CMAKE_PREFIX_PATH=that prefix.
# add_subdirectory: subdir_consumer/, which builds attn's library from source; then
#                   checks that no CLI, test, benchmark or example was built.
cmake_minimum_required(VERSION 3.25)

foreach(var MODE ATTN_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()
set(here ${CMAKE_CURRENT_LIST_DIR})

# run(<what> COMMAND...): run a command, echoing it; stop on failure.
function(run what)
  message(STATUS "[${MODE}] ${what}")
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[${MODE}] ${what}: failed (${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(generator_args -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(MAKE_PROGRAM)
  list(APPEND generator_args -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()

if(MODE STREQUAL "find_package")
  if(NOT ATTN_BINARY_DIR)
    message(FATAL_ERROR "run_consumer.cmake: -DATTN_BINARY_DIR=... is required")
  endif()
  set(prefix ${WORK_DIR}/prefix)
  run("install attn into ${prefix}"
    ${CMAKE_COMMAND} --install ${ATTN_BINARY_DIR} --prefix ${prefix} --config ${CONFIG})
  file(GLOB_RECURSE config_files ${prefix}/*/attnConfig.cmake)
  file(GLOB_RECURSE libraries ${prefix}/*/libattn.a ${prefix}/*/libattn.so)
  foreach(required ${prefix}/include/attn/attn.h ${prefix}/include/attn/nn.h)
    if(NOT EXISTS ${required})
      message(FATAL_ERROR "[${MODE}] not installed: ${required}")
    endif()
  endforeach()
  if(NOT config_files OR NOT libraries)
    message(FATAL_ERROR "[${MODE}] attnConfig.cmake or libattn missing under ${prefix}")
  endif()
  run("configure consumer/ (find_package(attn))"
    ${CMAKE_COMMAND} -S ${here}/consumer -B ${WORK_DIR}/build ${generator_args}
    -DCMAKE_BUILD_TYPE=${CONFIG} -DCMAKE_PREFIX_PATH=${prefix} -DATTN_EXPECTED_PREFIX=${prefix})
elseif(MODE STREQUAL "add_subdirectory")
  # No build type: attn must not pick one for its parent (the library then
  # builds without optimisation, which is also the quickest).
  run("configure subdir_consumer/ (add_subdirectory(attn))"
    ${CMAKE_COMMAND} -S ${here}/subdir_consumer -B ${WORK_DIR}/build ${generator_args}
    -DATTN_SOURCE_DIR=${ATTN_SOURCE_DIR})
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be find_package or add_subdirectory, not '${MODE}'")
endif()

run("build the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build --config ${CONFIG} --parallel 2)

if(MODE STREQUAL "add_subdirectory")
  # Only the library (and the consumer) may have been built.
  file(GLOB_RECURSE built LIST_DIRECTORIES false ${WORK_DIR}/build/attn/*)
  foreach(file IN LISTS built)
    get_filename_component(name ${file} NAME)
    if(name MATCHES "^(attn|attn_tests.*|example_.*|bench_.*)$")
      message(FATAL_ERROR "[${MODE}] attn as a subproject built ${file}")
    endif()
  endforeach()
  file(GLOB_RECURSE libraries ${WORK_DIR}/build/attn/libattn.a ${WORK_DIR}/build/attn/libattn.so)
  if(NOT libraries)
    message(FATAL_ERROR "[${MODE}] libattn was not built under ${WORK_DIR}/build/attn")
  endif()
endif()

file(GLOB_RECURSE consumer LIST_DIRECTORIES false ${WORK_DIR}/build/consumer ${WORK_DIR}/build/*/consumer)
if(NOT consumer)
  message(FATAL_ERROR "[${MODE}] the consumer executable was not built")
endif()
list(GET consumer 0 consumer)
message(STATUS "[${MODE}] run ${consumer}")
execute_process(COMMAND ${consumer} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "attn consumer: OK")
  message(FATAL_ERROR "[${MODE}] the consumer failed (${rc})")
endif()
message(STATUS "[${MODE}] passed")
