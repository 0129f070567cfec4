/* The test bed's pod sandbox process: holds the pod's namespaces open and does nothing else.
 * It is PID 1 of the sandbox, so it must reap orphans that a shared PID namespace hands it,
 * and it must stop cleanly on the runtime's SIGTERM (StopPodSandbox) instead of needing SIGKILL.
 * Built with `gcc -static` so the image needs no libc. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

static int install(int sig, void (*handler)(int), int flags) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sa.sa_flags = flags;
  sigemptyset(&sa.sa_mask);
  return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("kpleg-pause 1");
    return 0;
  }
  if (install(SIGINT, on_stop, 0) < 0 || install(SIGTERM, on_stop, 0) < 0 ||
      install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) pause();
}
