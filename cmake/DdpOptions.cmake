# Build options of ddp, parsed once here.
#
#   DDP_WITH_NCCL   build the NCCL backend (default: on when CUDA and NCCL are found)
#   DDP_WITH_TORCH  build the libtorch adapter (default: on when libtorch is found)
#   DDP_SANITIZE    "", address, undefined, thread or address,undefined
#                   (sanitizers for project code; scripts/test builds build-asan/
#                   with address,undefined and build-tsan/ with thread)
#   DDP_WERROR      warnings are errors in the project's own targets (default off,
#                   so that a newer compiler's new warning does not break a user's
#                   build; scripts/test turns it on, so that CI fails on any warning)

set(DDP_SANITIZE "" CACHE STRING
    "Sanitizers for project code: address, undefined, thread, address,undefined or empty")
set_property(CACHE DDP_SANITIZE PROPERTY STRINGS "" address undefined thread "address,undefined")
# "address+undefined" is accepted as a spelling that needs no quoting in shells.
string(REPLACE "+" "," _ddp_sanitize "${DDP_SANITIZE}")
if(NOT _ddp_sanitize STREQUAL "" AND
   NOT _ddp_sanitize MATCHES "^(address|undefined|thread|address,undefined|undefined,address)$")
  message(FATAL_ERROR "DDP_SANITIZE='${DDP_SANITIZE}': expected address, undefined, thread "
                      "or address,undefined (TSan cannot be combined with ASan)")
endif()
if(_ddp_sanitize)
  add_compile_options(-fsanitize=${_ddp_sanitize} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${_ddp_sanitize})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC's -Wmaybe-uninitialized misfires on sanitizer-instrumented code (GCC's
    # manual warns of false positives under -fsanitize; seen in std::regex's
    # std::function in launcher/src/cli.cc). The plain build keeps the warning.
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
  if(_ddp_sanitize MATCHES "undefined")
    # UBSan only prints and goes on by default: make undefined behaviour fail the test.
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  if(_ddp_sanitize STREQUAL "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC warns that TSan does not model Asio's atomic_thread_fence; not a project bug.
    add_compile_options(-Wno-tsan)
  endif()
endif()

if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  # elfutils 0.188 (eu-stack: the stacks of a hang report) finds a frame's line
  # in clang's output only through .debug_aranges, which clang does not write
  # unless asked (and only with full debug information: see tests/agent).
  add_compile_options(-gdwarf-aranges)
endif()

option(DDP_WERROR "Treat warnings in the project's own code as errors (CI turns it on)" OFF)

# The project's own targets warn (system headers do not), and with DDP_WERROR
# a warning fails the build.
function(ddp_project_target target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
  if(DDP_WERROR)
    target_compile_options(${target} PRIVATE -Werror -Wno-error=deprecated-declarations)
  endif()
endfunction()
