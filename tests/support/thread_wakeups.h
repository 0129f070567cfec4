// How often each thread of a process has been scheduled in, from
// /proc/<pid>/task/<tid>/schedstat (its third field: the timeslices run so far). Tests of an
// idle process compare two samples: a thread whose count moved was woken.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace kpleg::testing {

// "comm/tid" -> times scheduled in, for every thread of `pid` ("self": this process).
inline std::map<std::string, long> scheduled_in(const std::string& pid = "self") {
  std::map<std::string, long> out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + pid + "/task", ec)) {
    std::ifstream c(t.path() / "comm");
    std::string name;
    std::getline(c, name);
    std::ifstream s(t.path() / "schedstat");
    long run = 0, wait = 0, slices = 0;
    if (s >> run >> wait >> slices) out[name + "/" + t.path().filename().string()] = slices;
  }
  return out;
}

// The threads named `comm` in a sample: how many, and their counts summed.
struct NamedThreads {
  int threads = 0;
  long scheduled_in = 0;
};
inline NamedThreads threads_named(const std::map<std::string, long>& sample,
                                  const std::string& comm) {
  NamedThreads out;
  for (const auto& [key, n] : sample)
    if (key.size() > comm.size() && key.compare(0, comm.size(), comm) == 0 &&
        key[comm.size()] == '/') {
      ++out.threads;
      out.scheduled_in += n;
    }
  return out;
}

}  // namespace kpleg::testing
