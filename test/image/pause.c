/*
 * The sandbox ("pause") process of the containerd e2e's locally built image: it holds the pod's
 * namespaces, reaps children it inherits (it is PID 1 of the pod), and exits 0 on SIGTERM or
 * SIGINT. As PID 1 the default actions of those signals would be ignored, hence the handlers.
 * Built static by hack/build-sandbox-image.sh, so the image needs nothing but this file.
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction sa = {0};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_stop;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sa.sa_handler = on_child;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
}
