// Names threads (at most 15 characters, the kernel's limit), so that `top -H`, `ps -L`, perf
// and /proc/<pid>/task/*/comm tell kplegd's threads apart.
#pragma once

#include <string>
#include <thread>
#include <utility>

namespace kpleg {

// Names the calling thread.
void set_thread_name(const char* name);
// Names `t` from another thread.
void set_thread_name(std::thread& t, const char* name);
// The calling thread's name.
std::string thread_name();

// Runs `fn` on a new thread called `name`. The name is set twice: by the caller before this
// returns, so that whoever looks at the process after its start-up (a test, `top -H` after
// "ready") sees it; and by the thread itself before `fn`, so that its first log line carries it
// whichever of the two runs first.
template <class F>
std::thread named_thread(std::string name, F&& fn) {
  std::thread t([name, fn = std::forward<F>(fn)]() mutable {
    set_thread_name(name.c_str());
    fn();
  });
  set_thread_name(t, name.c_str());
  return t;
}

}  // namespace kpleg
