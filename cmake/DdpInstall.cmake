# Installation and the CMake package: users write
#   find_package(ddp REQUIRED)
#   target_link_libraries(train PRIVATE ddp::worker)   # or ddp::worker_torch for the adapter
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ddp_export_targets)
foreach(pair common:ddp_common worker_contract:ddp_worker_contract store:ddp_store store_server:ddp_store_server store_etcd:ddp_store_etcd
        rendezvous:ddp_rendezvous rendezvous_factory:ddp_rendezvous_factory worker:ddp_worker
        worker_torch:ddp_worker_torch)
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 export_name)
  list(GET pair 1 target)
  if(TARGET ${target})
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
    list(APPEND _ddp_export_targets ${target})
  endif()
endforeach()

install(TARGETS ${_ddp_export_targets} EXPORT ddpTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(component common worker_contract store store_server store_etcd rendezvous rendezvous/factory worker_lib)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${component}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
foreach(program ddprun ddp_rendezvous_daemon)
  if(TARGET ${program})
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

set(DDP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ddpConfig.cmake INSTALL_DESTINATION ${DDP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  DESTINATION ${DDP_INSTALL_CMAKEDIR})

# pkg-config files for other build systems: ddp.pc (the worker library) and,
# with libtorch, ddp-torch.pc (the adapter). Each finds the prefix from its own
# place (${pcfiledir}), so `cmake --install --prefix` anywhere gives working files.
set(DDP_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH DDP_PC_PREFIX_FROM_PCDIR /prefix/${DDP_PC_DIR} /prefix)
string(REGEX REPLACE "/$" "" DDP_PC_PREFIX_FROM_PCDIR "${DDP_PC_PREFIX_FROM_PCDIR}")
set(DDP_PC_CFLAGS "")
set(DDP_PC_NCCL_NAME "")
set(DDP_PC_NCCL_LIBS "")
if(DDP_WITH_NCCL)
  set(DDP_PC_CFLAGS "-DDDP_WITH_NCCL=1")
  set(DDP_PC_NCCL_NAME ", NCCL")
  get_filename_component(_ddp_nccl_dir ${DDP_NCCL_LIBRARY} DIRECTORY)
  get_filename_component(_ddp_cudart_dir ${DDP_CUDART_LIBRARY} DIRECTORY)
  set(_ddp_cuda_dirs ${_ddp_nccl_dir} ${_ddp_cudart_dir})
  list(REMOVE_DUPLICATES _ddp_cuda_dirs)
  list(TRANSFORM _ddp_cuda_dirs PREPEND "-L")
  string(JOIN " " DDP_PC_NCCL_LIBS ${_ddp_cuda_dirs} -lnccl -lcudart)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/ddp.pc.in ${PROJECT_BINARY_DIR}/ddp.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ddp.pc DESTINATION ${DDP_PC_DIR})
if(DDP_WITH_TORCH)
  # libtorch-dev's libraries: libtorch, libtorch_cpu and libc10, beside TORCH_LIBRARY.
  get_filename_component(_ddp_torch_libdir ${TORCH_LIBRARY} DIRECTORY)
  set(DDP_PC_TORCH_LIBS "-L${_ddp_torch_libdir} -ltorch -ltorch_cpu -lc10")
  # /usr/include is the compiler's own: as -I it would reorder the system headers.
  set(_ddp_torch_includes ${TORCH_INCLUDE_DIRS})
  list(REMOVE_ITEM _ddp_torch_includes /usr/include)
  list(TRANSFORM _ddp_torch_includes PREPEND "-I")
  string(JOIN " " DDP_PC_TORCH_CFLAGS ${_ddp_torch_includes} ${TORCH_CXX_FLAGS})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/ddp-torch.pc.in ${PROJECT_BINARY_DIR}/ddp-torch.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/ddp-torch.pc DESTINATION ${DDP_PC_DIR})
endif()
