# cmake -DREADME=README.md -DSOURCE=examples/forward.c -P readme_sync.cmake
#
# README.md's usage example (the first ```c block after "## Usage") must be
# the text of examples/forward.c between its "/* README begin */" and
# "/* README end */" lines, so that the example users copy is the one CI runs.
file(READ "${SOURCE}" src)
string(FIND "${src}" "/* README begin */\n" begin)
string(FIND "${src}" "/* README end */\n" end)
if(begin LESS 0 OR end LESS begin)
  message(FATAL_ERROR "${SOURCE}: no /* README begin */ ... /* README end */ lines")
endif()
string(LENGTH "/* README begin */\n" skip)
math(EXPR begin "${begin} + ${skip}")
math(EXPR len "${end} - ${begin}")
string(SUBSTRING "${src}" ${begin} ${len} excerpt)

file(READ "${README}" readme)
string(FIND "${readme}" "\n## Usage\n" usage)
if(usage LESS 0)
  message(FATAL_ERROR "${README}: no \"## Usage\" section")
endif()
string(SUBSTRING "${readme}" ${usage} -1 readme)
string(FIND "${readme}" "```c\n" open)
if(open LESS 0)
  message(FATAL_ERROR "${README}: no ```c block in the Usage section")
endif()
math(EXPR open "${open} + 5")
string(SUBSTRING "${readme}" ${open} -1 readme)
string(FIND "${readme}" "```\n" close)
string(SUBSTRING "${readme}" 0 ${close} block)

if(NOT block STREQUAL excerpt)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/readme_usage.c" "${block}")
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/forward_excerpt.c" "${excerpt}")
  message(FATAL_ERROR "README.md's usage example is not examples/forward.c between its README markers: "
                      "copy the excerpt over (diff ${CMAKE_CURRENT_BINARY_DIR}/readme_usage.c "
                      "${CMAKE_CURRENT_BINARY_DIR}/forward_excerpt.c)")
endif()
message(STATUS "README.md's usage example matches ${SOURCE}")
