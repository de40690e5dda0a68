# The one place that says which warnings attn's own code is compiled with: the
# library, the CLI, the tests, the benchmarks and the examples all get them
# from here. (A function rather than an INTERFACE target: the static library's
# private link items end up in the exported attnTargets.cmake, and these flags
# must not reach attn's users.)

# -Wconversion flags implicit narrowing (int64_t -> int, double -> float); the
# sign half of it (size_t <-> int64_t indexing) is left out as too noisy to help.
set(ATTN_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
if(ATTN_WERROR)
  list(APPEND ATTN_WARNING_FLAGS -Werror)
endif()

# attn_target_warnings(<target>...): attn's warning flags on these targets.
function(attn_target_warnings)
  foreach(target IN LISTS ARGN)
    target_compile_options(${target} PRIVATE ${ATTN_WARNING_FLAGS})
  endforeach()
endfunction()

# attn_directory_targets(<var> <dir>): the compiled targets (executables and
# libraries) defined in <dir> and the folders below it, so that a folder's
# targets get the warnings without its CMakeLists.txt naming each one.
function(attn_directory_targets var dir)
  set(found "")
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      list(APPEND found ${target})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    attn_directory_targets(below "${subdir}")
    list(APPEND found ${below})
  endforeach()
  set(${var} ${found} PARENT_SCOPE)
endfunction()
