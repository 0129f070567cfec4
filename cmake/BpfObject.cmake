# bpf_object(<name> <source.bpf.c> [HEADERS ...])
#
# Compiles a BPF program with clang (-target bpf, CO-RE against the vendored vmlinux.h),
# generates its libbpf skeleton with bpftool, and yields an INTERFACE target <name>_skel whose
# include directory holds <name>.skel.h. Header dependencies are tracked through clang's depfile,
# so editing any included header rebuilds the object and the skeleton.

find_program(BPF_CLANG NAMES clang-14 clang REQUIRED)
find_program(BPFTOOL NAMES bpftool PATHS /usr/sbin /sbin REQUIRED)

if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(BPF_ARCH x86)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  set(BPF_ARCH arm64)
else()
  message(FATAL_ERROR "kpleg: no vendored vmlinux.h for ${CMAKE_SYSTEM_PROCESSOR}")
endif()

# clang's own system include dirs, so that <asm/...> and friends resolve for -target bpf the
# same way libbpf-bootstrap does it.
execute_process(
  COMMAND sh -c "${BPF_CLANG} -v -E - </dev/null 2>&1 | sed -n '/<...> search starts here:/,/End of search list./{ s| \\(/.*\\)|-idirafter \\1|p }'"
  OUTPUT_VARIABLE BPF_SYS_INCLUDES_RAW
  OUTPUT_STRIP_TRAILING_WHITESPACE)
separate_arguments(BPF_SYS_INCLUDES UNIX_COMMAND "${BPF_SYS_INCLUDES_RAW}")

function(bpf_object name source)
  set(src ${CMAKE_CURRENT_SOURCE_DIR}/${source})
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/${name})
  set(obj ${out_dir}/${name}.bpf.o)
  set(skel ${out_dir}/${name}.skel.h)
  set(dep ${out_dir}/${name}.bpf.d)
  file(MAKE_DIRECTORY ${out_dir})

  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${BPF_CLANG} -g -O2 -Wall -Werror -target bpf -D__TARGET_ARCH_${BPF_ARCH}
            -I${CMAKE_SOURCE_DIR}/bpf -I${CMAKE_SOURCE_DIR}/bpf/vmlinux/${BPF_ARCH}
            ${BPF_SYS_INCLUDES}
            -MD -MF ${dep} -MT ${obj}
            -c ${src} -o ${obj}
    DEPENDS ${src}
    DEPFILE ${dep}
    COMMENT "BPF ${name}: compiling ${source}"
    VERBATIM)

  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${BPFTOOL} gen skeleton ${obj} name ${name} > ${skel}
    DEPENDS ${obj}
    COMMENT "BPF ${name}: generating skeleton"
    VERBATIM)

  add_custom_target(${name}_skel_gen DEPENDS ${skel})
  add_library(${name}_skel INTERFACE)
  add_dependencies(${name}_skel ${name}_skel_gen)
  target_include_directories(${name}_skel INTERFACE ${out_dir} ${CMAKE_SOURCE_DIR}/bpf)
  target_link_libraries(${name}_skel INTERFACE PkgConfig::LIBBPF)
  set_property(TARGET ${name}_skel PROPERTY BPF_OBJECT ${obj})
endfunction()
