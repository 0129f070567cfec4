# Cross-building kplegd for arm64 with clang against the arm64 Debian root that
# scripts/sysroot.sh unpacks (KPLEG_SYSROOT, default /var/cache/kpleg/sysroot-arm64):
#
#   cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#     -DKPLEG_FUZZ=OFF -DKPLEG_BENCH=OFF
#   cmake --build build/arm64 --target kplegd
#
# The BPF object is the same CO-RE code compiled with -D__TARGET_ARCH_arm64 against
# bpf/vmlinux/arm64/vmlinux.h. Tools that run at build time (protoc, gRPC's plugin, bpftool)
# are the host's.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT KPLEG_SYSROOT)
  if(DEFINED ENV{KPLEG_SYSROOT})
    set(KPLEG_SYSROOT "$ENV{KPLEG_SYSROOT}")
  else()
    set(KPLEG_SYSROOT /var/cache/kpleg/sysroot-arm64)
  endif()
endif()
set(KPLEG_SYSROOT "${KPLEG_SYSROOT}" CACHE PATH "scripts/sysroot.sh's directory (its root/ is the sysroot)")
# try_compile projects get the toolchain file again, without the cache.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES KPLEG_SYSROOT)
if(NOT EXISTS "${KPLEG_SYSROOT}/root/.kpleg-sysroot")
  message(FATAL_ERROR "no arm64 root in ${KPLEG_SYSROOT}: run scripts/sysroot.sh")
endif()
set(CMAKE_SYSROOT "${KPLEG_SYSROOT}/root")

set(triple aarch64-linux-gnu)
set(CMAKE_C_COMPILER clang)
set(CMAKE_CXX_COMPILER clang++)
set(CMAKE_C_COMPILER_TARGET ${triple})
set(CMAKE_CXX_COMPILER_TARGET ${triple})
set(CMAKE_EXE_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-fuse-ld=lld")

set(CMAKE_FIND_ROOT_PATH "${CMAKE_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_LIBRARY_ARCHITECTURE ${triple})

set(ENV{PKG_CONFIG_SYSROOT_DIR} "${CMAKE_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR} "${CMAKE_SYSROOT}/usr/lib/${triple}/pkgconfig:${CMAKE_SYSROOT}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# The host's code generators (the same Debian versions as the arm64 libraries).
set(Protobuf_PROTOC_EXECUTABLE /usr/bin/protoc CACHE FILEPATH "")
set(KPLEG_GRPC_CPP_PLUGIN /usr/bin/grpc_cpp_plugin CACHE FILEPATH "the host's gRPC C++ plugin")
