# attn.pc and attn-dist.pc: attn for pkg-config users (included by
# CMakeLists.txt's install section), installed into <libdir>/pkgconfig beside
# the CMake package:
#
#   c++ -std=c++20 main.cpp $(pkg-config --cflags --libs attn)
#   c++ -std=c++20 main.cpp $(pkg-config --cflags --libs attn-dist)   # attn/dist.h
#
# The prefix is found from the file's own place (${pcfiledir}), so an install
# with `cmake --install --prefix` elsewhere works. A static libattn (the
# default) carries no record of what it links, so then its dependencies go
# into Libs and Requires (a plain `pkg-config --libs attn` links); a shared one
# records them itself, and they go into the .private fields. The public headers
# need C++20 and nothing else: -std is left to the consumer, as pkg-config
# cannot say "at least".

# ${pcfiledir}/<up> is the prefix.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(attn_pc_prefix "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH attn_pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" attn_pc_up "${attn_pc_up}")
  set(attn_pc_prefix "\${pcfiledir}/${attn_pc_up}")
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(attn_pc_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(attn_pc_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()

# libattn's own dependencies: the pkg-config modules it found, then the
# libraries that have none (the BLAS as FindBLAS found it, OpenMP's flag,
# oneDNN's library file).
set(attn_pc_requires "fmt libhwy libpcre2-8 libutf8proc sentencepiece")
set(attn_pc_libs "")
foreach(lib IN LISTS BLAS_LIBRARIES)
  string(APPEND attn_pc_libs " ${lib}")
endforeach()
string(APPEND attn_pc_libs " ${OpenMP_CXX_FLAGS}")
if(ATTN_WITH_ONEDNN)
  string(APPEND attn_pc_libs " $<TARGET_LINKER_FILE:DNNL::dnnl>")
endif()
if(ATTN_LIBRARY_TYPE STREQUAL "STATIC_LIBRARY")
  set(attn_pc_requires_field "Requires: ${attn_pc_requires}")
  set(attn_pc_libs_field "Libs: -L\${libdir} -lattn${attn_pc_libs}")
else()
  set(attn_pc_requires_field "Requires.private: ${attn_pc_requires}")
  set(attn_pc_libs_field "Libs: -L\${libdir} -lattn\nLibs.private:${attn_pc_libs}")
endif()

set(attn_pc_head "prefix=${attn_pc_prefix}
exec_prefix=\${prefix}
libdir=${attn_pc_LIBDIR}
includedir=${attn_pc_INCLUDEDIR}
")
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/pkgconfig/attn.pc CONTENT "${attn_pc_head}
Name: attn
Description: The attention mechanisms of GPT-style models (Build a Large Language Model (From Scratch)) as a C++20 library
Version: ${PROJECT_VERSION}
${attn_pc_requires_field}
${attn_pc_libs_field}
Cflags: -I\${includedir}
")

# attn_dist (attn/dist.h, data-parallel training): a static library always,
# so MPI's libraries (when built with MPI) are in Libs.
set(attn_dist_pc_libs "")
set(attn_dist_pc_cflags "")
if(ATTN_WITH_MPI)
  foreach(lib IN LISTS MPI_C_LIBRARIES)
    string(APPEND attn_dist_pc_libs " ${lib}")
  endforeach()
  string(APPEND attn_dist_pc_cflags " -DATTN_WITH_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX")
endif()
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/pkgconfig/attn-dist.pc CONTENT "${attn_pc_head}
Name: attn-dist
Description: attn's data-parallel training over MPI (attn/dist.h)
Version: ${PROJECT_VERSION}
Requires: attn = ${PROJECT_VERSION}
Libs: -L\${libdir} -lattn_dist${attn_dist_pc_libs}
Cflags: -I\${includedir}${attn_dist_pc_cflags}
")

install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/attn.pc ${PROJECT_BINARY_DIR}/pkgconfig/attn-dist.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
