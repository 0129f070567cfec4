#include "common/thread_name.h"

#include <pthread.h>

namespace kpleg {

namespace {

void set_name(pthread_t t, const char* name) {
  char buf[16] = {};
  for (size_t i = 0; i < sizeof(buf) - 1 && name[i] != '\0'; ++i) buf[i] = name[i];
  (void)pthread_setname_np(t, buf);  // only fails for names over 15 characters
}

}  // namespace

void set_thread_name(const char* name) { set_name(pthread_self(), name); }

void set_thread_name(std::thread& t, const char* name) { set_name(t.native_handle(), name); }

std::string thread_name() {
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) return {};
  return buf;
}

}  // namespace kpleg
