# `cmake --install` puts the library, headers and a package config in place, so that another
# project can say find_package(qkv) and link qkv::qkv.
include(CMakePackageConfigHelpers)
install(TARGETS qkv EXPORT qkvTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/qkv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT qkvTargets NAMESPACE qkv:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qkv)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qkvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/qkvConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qkv)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/qkvConfig.cmake ${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qkv)

# pkg-config's qkv.pc, for builds without CMake (the C API from a Makefile, say). libqkv's
# dependencies are private to the shared library, so Libs needs only -lqkv.
set(QKV_PC_DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(QKV_PC_PREFIX_FROM_PCDIR "")
  set(QKV_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(QKV_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  # From <prefix>/lib/pkgconfig (or lib/x86_64-linux-gnu/pkgconfig) back up to <prefix>.
  file(RELATIVE_PATH QKV_PC_PREFIX_FROM_PCDIR "/prefix/${QKV_PC_DESTINATION}" "/prefix")
  string(REGEX REPLACE "/$" "" QKV_PC_PREFIX_FROM_PCDIR "${QKV_PC_PREFIX_FROM_PCDIR}")
  set(QKV_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(QKV_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/qkv.pc.in ${PROJECT_BINARY_DIR}/qkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/qkv.pc DESTINATION ${QKV_PC_DESTINATION})
