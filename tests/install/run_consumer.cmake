# Builds and runs a consumer project against attn; any failing step fails the
# test (message(FATAL_ERROR) makes `cmake -P` exit non-zero). Run by ctest:
#
#   cmake -DMODE=find_package|add_subdirectory -DATTN_SOURCE_DIR=... -DATTN_BINARY_DIR=...
#         -DWORK_DIR=... -DCONFIG=... -DGENERATOR=... -DMAKE_PROGRAM=... -DCXX_COMPILER=...
#         [-DWITH_CLI=ON] [-DWITH_MANPAGE=ON] [-DPKG_CONFIG=...] -P run_consumer.cmake
#
# find_package:     cmake --install <attn's build> --prefix WORK_DIR/prefix (and a
#                   check of what it installed: headers, libattn and libattn_dist,
#                   the CMake and pkg-config packages, LICENSE and the docs, and
#                   with the CLI its man page and bash completion), then consumer/
#                   with CMAKE_PREFIX_PATH=that prefix: attn::attn and attn::dist.
# pkg_config:       the same install, then consumer/main.cpp and dist_main.cpp
#                   compiled and linked by the compiler alone with
#                   `pkg-config --cflags --libs attn` (and attn-dist), as a
#                   Makefile would (-DPKG_CONFIG=... names pkg-config).
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

# Installs attn into WORK_DIR/prefix and checks what is there.
function(install_attn)
  if(NOT ATTN_BINARY_DIR)
    message(FATAL_ERROR "run_consumer.cmake: -DATTN_BINARY_DIR=... is required")
  endif()
  set(prefix ${WORK_DIR}/prefix)
  run("install attn into ${prefix}"
    ${CMAKE_COMMAND} --install ${ATTN_BINARY_DIR} --prefix ${prefix} --config ${CONFIG})
  set(required ${prefix}/include/attn/attn.h ${prefix}/include/attn/nn.h
    ${prefix}/include/attn/dist.h ${prefix}/share/doc/attn/LICENSE
    ${prefix}/share/doc/attn/README.md ${prefix}/share/doc/attn/docs/architecture.md)
  if(WITH_CLI)
    list(APPEND required ${prefix}/bin/attn ${prefix}/share/bash-completion/completions/attn)
  endif()
  if(WITH_MANPAGE)
    list(APPEND required ${prefix}/share/man/man1/attn.1)
  endif()
  foreach(file IN LISTS required)
    if(NOT EXISTS ${file})
      message(FATAL_ERROR "[${MODE}] not installed: ${file}")
    endif()
  endforeach()
  # The man page is help2man's, with every command's options.
  if(WITH_MANPAGE)
    file(READ ${prefix}/share/man/man1/attn.1 man)
    foreach(expected "\.TH ATTN \"1\"" "\.SS attn generate" "\.SS attn train" "--max-new-tokens")
      if(NOT man MATCHES "${expected}")
        message(FATAL_ERROR "[${MODE}] attn.1 lacks ${expected}")
      endif()
    endforeach()
  endif()
  foreach(pattern attnConfig.cmake libattn.* libattn_dist.a attn.pc attn-dist.pc)
    file(GLOB_RECURSE found ${prefix}/*/${pattern})
    if(NOT found)
      message(FATAL_ERROR "[${MODE}] ${pattern} missing under ${prefix}")
    endif()
  endforeach()
  file(GLOB_RECURSE pc ${prefix}/*/attn.pc)
  list(GET pc 0 pc)
  get_filename_component(pc_dir ${pc} DIRECTORY)
  set(prefix ${prefix} PARENT_SCOPE)
  set(pc_dir ${pc_dir} PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "find_package")
  install_attn()
  run("configure consumer/ (find_package(attn))"
    ${CMAKE_COMMAND} -S ${here}/consumer -B ${WORK_DIR}/build ${generator_args}
    -DCMAKE_BUILD_TYPE=${CONFIG} -DCMAKE_PREFIX_PATH=${prefix} -DATTN_EXPECTED_PREFIX=${prefix})
elseif(MODE STREQUAL "pkg_config")
  if(NOT PKG_CONFIG)
    message(FATAL_ERROR "run_consumer.cmake: -DPKG_CONFIG=... is required")
  endif()
  install_attn()
  file(MAKE_DIRECTORY ${WORK_DIR}/build)
  # The installed .pc files first; pkg-config's own look-up of the system
  # modules they require (fmt, libhwy, ...) stays on its default list.
  set(pkg_env ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir})
  execute_process(COMMAND ${pkg_env} ${PKG_CONFIG} --modversion attn
    OUTPUT_VARIABLE pc_version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  file(STRINGS ${ATTN_SOURCE_DIR}/VERSION version LIMIT_COUNT 1)
  if(NOT rc EQUAL 0 OR NOT pc_version STREQUAL version)
    message(FATAL_ERROR "[${MODE}] pkg-config --modversion attn says '${pc_version}' (${rc}), VERSION says '${version}'")
  endif()
  foreach(pair "attn;main.cpp;consumer" "attn-dist;dist_main.cpp;consumer_dist")
    list(GET pair 0 module)
    list(GET pair 1 source)
    list(GET pair 2 program)
    execute_process(COMMAND ${pkg_env} ${PKG_CONFIG} --cflags --libs ${module}
      OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "[${MODE}] pkg-config --cflags --libs ${module} failed (${rc}): ${err}")
    endif()
    string(FIND "${flags}" "${prefix}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "[${MODE}] pkg-config ${module} does not point into ${prefix}: ${flags}")
    endif()
    separate_arguments(flags UNIX_COMMAND "${flags}")
    run("compile and link consumer/${source} with pkg-config ${module}"
      ${CXX_COMPILER} -std=c++20 -O1 ${here}/consumer/${source} -o ${WORK_DIR}/build/${program} ${flags})
  endforeach()
  set(pkg_config_built TRUE)
elseif(MODE STREQUAL "add_subdirectory")
  # No build type: attn must not pick one for its parent (the library then
  # builds without optimisation, which is also the quickest).
  run("configure subdir_consumer/ (add_subdirectory(attn))"
    ${CMAKE_COMMAND} -S ${here}/subdir_consumer -B ${WORK_DIR}/build ${generator_args}
    -DATTN_SOURCE_DIR=${ATTN_SOURCE_DIR})
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be find_package, pkg_config or add_subdirectory, not '${MODE}'")
endif()

if(NOT pkg_config_built)
  run("build the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build --config ${CONFIG} --parallel 2)
endif()

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

# run_program(<name> <expected line>): the consumer program built above.
function(run_program name expected)
  file(GLOB_RECURSE program LIST_DIRECTORIES false ${WORK_DIR}/build/${name} ${WORK_DIR}/build/*/${name})
  if(NOT program)
    message(FATAL_ERROR "[${MODE}] the consumer executable ${name} was not built")
  endif()
  list(GET program 0 program)
  message(STATUS "[${MODE}] run ${program}")
  execute_process(COMMAND ${program} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "${expected}")
    message(FATAL_ERROR "[${MODE}] ${name} failed (${rc})")
  endif()
endfunction()

run_program(consumer "attn consumer: OK")
if(NOT MODE STREQUAL "add_subdirectory")
  run_program(consumer_dist "attn dist consumer: OK")
endif()
message(STATUS "[${MODE}] passed")
