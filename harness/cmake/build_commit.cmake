# Writes OUT, a header naming the commit the sources were built from and
# whether tracked files differed from it, at every build: a run records the
# binary's commit, not whatever the working directory holds when it starts.
# The header is rewritten only when its text changes, so an unchanged tree
# recompiles nothing. Called as: cmake -DSRC=<checkout> -DOUT=<header> -P build_commit.cmake
set(commit "")
set(dirty 0)
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" rev-parse HEAD
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(commit "")
  else()
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes ERROR_QUIET)
    if(NOT changes STREQUAL "")
      set(dirty 1)
    endif()
  endif()
endif()
set(text "#pragma once\n// Generated at build time by harness/cmake/build_commit.cmake.\n#define CHIAR_BUILD_COMMIT \"${commit}\"\n#define CHIAR_BUILD_DIRTY ${dirty}\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
