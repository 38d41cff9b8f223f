# Installation and the CMake package: users write
#   find_package(ddp REQUIRED)
#   target_link_libraries(train PRIVATE ddp::worker)   # or ddp::worker_torch for the adapter
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ddp_export_targets)
foreach(pair common:ddp_common store:ddp_store store_server:ddp_store_server store_etcd:ddp_store_etcd
        rendezvous:ddp_rendezvous worker:ddp_worker
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
foreach(component common store store_server store_etcd rendezvous worker_lib)
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
