# Writes OUTPUT, a header defining SUBQUAD_GIT_COMMIT as the source tree's short commit (with
# "-dirty" when tracked files differ from it, "unknown" outside a git checkout). Run at every
# build, so the bench header names the commit that was built, not the one configured; the file
# is rewritten only when the text changes, so an unchanged commit recompiles nothing.
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE not_a_checkout)
if(not_a_checkout OR NOT commit)
  set(commit "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY ${SOURCE_DIR}
                  RESULT_VARIABLE dirty ERROR_QUIET)
  if(dirty)
    string(APPEND commit "-dirty")
  endif()
endif()
set(text "#pragma once\n#define SUBQUAD_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old_text)
endif()
if(NOT old_text STREQUAL text)
  file(WRITE ${OUTPUT} "${text}")
endif()
