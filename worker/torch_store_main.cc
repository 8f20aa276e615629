// Test helper: hosts a TorchStoreServer on 127.0.0.1, prints "port N" on stdout, and runs until
// stdin closes (or reaches end of file) or SIGTERM / SIGINT; then prints the stored keys
// ("key K", one a line) and exits 0.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>

#include "glog/logging.h"
#include "worker/torch_store.h"

int main(int argc, char** argv) {
  (void)argc;
  google::InitGoogleLogging(argv[0]);
  // SIGTERM and SIGINT are read from a signalfd: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  int signal_fd = signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd < 0) {
    perror("signalfd");
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ringmaster::worker::TorchStoreServer>> server =
      ringmaster::worker::TorchStoreServer::Start({});
  if (!server.ok()) {
    fprintf(stderr, "torch_store_main: %s\n", server.status().ToString().c_str());
    return 1;
  }
  printf("port %d\n", (*server)->port());
  fflush(stdout);
  for (;;) {
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) continue;  // EINTR
    if (fds[1].revents != 0) break;
    if (fds[0].revents != 0) {
      char buf[256];
      if (read(STDIN_FILENO, buf, sizeof(buf)) <= 0) break;
    }
  }
  (*server)->Stop();
  for (const std::string& key : (*server)->Keys()) printf("key %s\n", key.c_str());
  printf("connections %lld\n", static_cast<long long>((*server)->connections_accepted()));
  return 0;
}
