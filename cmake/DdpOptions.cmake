# Build options of ddp, parsed once here.
#
#   DDP_WITH_NCCL   build the NCCL backend (default: on when CUDA and NCCL are found)
#   DDP_WITH_TORCH  build the libtorch adapter (default: on when libtorch is found)
#   DDP_SANITIZE    "", address, undefined or thread (a sanitizer for project code)

set(DDP_SANITIZE "" CACHE STRING "Sanitizer for project code: address, undefined, thread or empty")
set_property(CACHE DDP_SANITIZE PROPERTY STRINGS "" address undefined thread)
if(NOT DDP_SANITIZE STREQUAL "" AND NOT DDP_SANITIZE MATCHES "^(address|undefined|thread)$")
  message(FATAL_ERROR "DDP_SANITIZE='${DDP_SANITIZE}': expected address, undefined or thread")
endif()
if(DDP_SANITIZE)
  add_compile_options(-fsanitize=${DDP_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${DDP_SANITIZE})
  if(DDP_SANITIZE STREQUAL "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC warns that TSan does not model Asio's atomic_thread_fence; not a project bug.
    add_compile_options(-Wno-tsan)
  endif()
endif()

# Warnings as errors for the project's own targets only (not for system headers).
function(ddp_project_target target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror
                         -Wno-error=deprecated-declarations)
endfunction()
