# Makes the CLI's installed documents from the built binary (CMakeLists.txt):
#
#   cmake -DATTN=<attn> -DOUT=<file> -DWHAT=completion -P cli_docs.cmake
#       the bash completion script, `attn --completion bash`
#   cmake -DATTN=<attn> -DOUT=<file> -DWHAT=man -DHELP2MAN=<help2man> -P cli_docs.cmake
#       the man page attn.1: help2man on `attn --help` and `attn --version`,
#       with every command's --help as the section COMMANDS
#
# Each is written beside OUT and renamed onto it, so a failed run leaves no
# half file for the next build to take as done.
foreach(var ATTN OUT WHAT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "cli_docs.cmake: -D${var}=... is required")
  endif()
endforeach()
get_filename_component(dir ${OUT} DIRECTORY)
file(MAKE_DIRECTORY ${dir})

# attn <args>: its stdout, or a fatal error naming the command.
function(attn_output var)
  execute_process(COMMAND ${ATTN} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cli_docs.cmake: attn ${ARGN} failed (${rc}): ${err}")
  endif()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()

if(WHAT STREQUAL "completion")
  attn_output(script --completion bash)
  file(WRITE ${OUT}.tmp "${script}")
elseif(WHAT STREQUAL "man")
  if(NOT HELP2MAN)
    message(FATAL_ERROR "cli_docs.cmake: -DHELP2MAN=... is required for the man page")
  endif()
  # The commands, as `attn --help` lists them under "Subcommands:".
  attn_output(help --help)
  string(REGEX MATCH "Subcommands:\n.*" listing "${help}")
  string(REGEX MATCHALL "\n  [a-z][a-z0-9-]*" commands "${listing}")
  if(NOT commands)
    message(FATAL_ERROR "cli_docs.cmake: no commands found in attn --help")
  endif()
  set(include "[COMMANDS]\n")
  foreach(command IN LISTS commands)
    string(STRIP "${command}" command)
    attn_output(text ${command} --help)
    # roff: a backslash is \e, and a line may not start with a control character.
    string(REPLACE "\\" "\\e" text "${text}")
    string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
    string(APPEND include ".SS attn ${command}\n.nf\n${text}.fi\n")
  endforeach()
  file(WRITE ${OUT}.include "${include}")
  attn_output(version --version)
  string(REGEX MATCH "^attn [^\n]*" version_line "${version}")
  execute_process(
    COMMAND ${HELP2MAN} --no-info --section=1 --source=attn
            "--name=attention mechanisms of GPT-style models: walkthrough, generate, train, serve"
            "--version-string=${version_line}" --include=${OUT}.include --output=${OUT}.tmp ${ATTN}
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  file(REMOVE ${OUT}.include)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cli_docs.cmake: help2man failed (${rc}): ${err}")
  endif()
else()
  message(FATAL_ERROR "cli_docs.cmake: WHAT must be completion or man, not '${WHAT}'")
endif()
file(RENAME ${OUT}.tmp ${OUT})
