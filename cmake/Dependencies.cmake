# Every dependency comes from Debian's packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)

# Any CBLAS works; Debian's libopenblas-dev provides libblas.so with the cblas_* symbols.
find_package(BLAS REQUIRED)
find_path(QKV_CBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}
  PATH_SUFFIXES openblas-pthread openblas REQUIRED)

# CLI11: the command line, its tests and the fuzz targets; not the Python module (pip install .).
if(NOT SKBUILD OR QKV_BUILD_TESTS OR QKV_BUILD_FUZZ)
  find_package(CLI11 REQUIRED)
endif()

find_package(PkgConfig REQUIRED)
# .npz archives are zip files: read through libzip (libzip-dev), never a hand-written inflater.
pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET libzip)

if(QKV_SIMD)
  pkg_check_modules(HWY REQUIRED IMPORTED_TARGET libhwy)
endif()

# MPI (Debian's libopenmpi-dev) for attention across processes (src/dist, qkv/dist.h). AUTO
# builds it when find_package finds MPI and leaves it out otherwise; ON requires it; OFF never.
# Without it everything else builds and the ring entry points say that this build has no MPI.
set(QKV_WITH_MPI AUTO CACHE STRING "Ring attention over MPI (src/dist): AUTO, ON or OFF")
set_property(CACHE QKV_WITH_MPI PROPERTY STRINGS AUTO ON OFF)
set(QKV_HAVE_MPI OFF)
if(QKV_WITH_MPI STREQUAL "ON")
  find_package(MPI REQUIRED COMPONENTS C)
  set(QKV_HAVE_MPI ON)
elseif(NOT QKV_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(QKV_HAVE_MPI ON)
  endif()
endif()
message(STATUS "qkv: ring attention over MPI: ${QKV_HAVE_MPI}")
