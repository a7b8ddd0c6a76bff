# chiar_add_plugin(NAME SOURCES file... [OUTPUT_DIR dir])
#
# Builds one plugin as a MODULE library named chiar_<NAME>.so that links the
# core library (never a static copy: interface type info must be unique) and
# exports only its entry point.
function(chiar_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "chiar_add_plugin(${name}): SOURCES is required")
  endif()
  if(NOT ARG_OUTPUT_DIR)
    if(CHIAR_PLUGIN_OUTPUT_DIR)
      set(ARG_OUTPUT_DIR ${CHIAR_PLUGIN_OUTPUT_DIR})
    else()
      set(ARG_OUTPUT_DIR ${CMAKE_BINARY_DIR}/plugins)
    endif()
  endif()
  set(target chiar_plugin_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE chiar::core)
  # The harness's own settings, also for plugins built out of tree: its C++
  # standard (chiar::core requires it), hidden visibility (only the entry
  # point is exported), position independent.
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME chiar_${name}
    PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR}
    CXX_EXTENSIONS OFF
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  chiar_share_pch(${target})
endfunction()

# Reuses the precompiled libtorch header when building in-tree. An
# executable is compiled with -fPIC instead of -fPIE so the header's flags match.
function(chiar_share_pch target)
  if(NOT (TARGET chiar_pch AND CHIAR_SHARE_PCH))
    return()
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  target_precompile_headers(${target} REUSE_FROM chiar_pch)
endfunction()
