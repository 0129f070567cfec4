#include "common/thread_name.h"

#include <pthread.h>

namespace kpleg {

void set_thread_name(const char* name) {
  char buf[16] = {};
  for (size_t i = 0; i < sizeof(buf) - 1 && name[i] != '\0'; ++i) buf[i] = name[i];
  (void)pthread_setname_np(pthread_self(), buf);  // only fails for names over 15 characters
}

std::string thread_name() {
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) return {};
  return buf;
}

}  // namespace kpleg
