// Names the calling thread (at most 15 characters, the kernel's limit), so that `top -H`,
// `ps -L`, perf and /proc/<pid>/task/*/comm tell kplegd's threads apart.
#pragma once

#include <string>

namespace kpleg {

void set_thread_name(const char* name);
// The calling thread's name.
std::string thread_name();

}  // namespace kpleg
