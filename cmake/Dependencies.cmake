# Every dependency comes from Debian's packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)

# Any CBLAS works; Debian's libopenblas-dev provides libblas.so with the cblas_* symbols.
find_package(BLAS REQUIRED)
find_path(QKV_CBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}
  PATH_SUFFIXES openblas-pthread openblas REQUIRED)

find_package(CLI11 REQUIRED)

find_package(PkgConfig REQUIRED)
# .npz archives are zip files: read through libzip (libzip-dev), never a hand-written inflater.
pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET libzip)

if(QKV_SIMD)
  pkg_check_modules(HWY REQUIRED IMPORTED_TARGET libhwy)
endif()
