// Who may connect to kplegd's socket: another user cannot (0600), a member of --socket-group
// can (0660). Needs root to act as other users.
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "api_test_support.h"
#include "run_command.h"
#include "support/privileged.h"

namespace kpleg::apitest {
namespace {

// connect() to `path` as uid/gid (no supplementary groups) in a forked child; returns 0 or
// the errno it failed with.
int connect_as(const std::string& path, uid_t uid, gid_t gid) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls: the parent runs gRPC threads.
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(200);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) _exit(201);
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    _exit(rc == 0 ? 0 : errno);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

struct User {
  uid_t uid;
  gid_t gid;
};

bool lookup(const char* name, User* u) {
  passwd* pw = getpwnam(name);
  if (pw == nullptr) return false;
  *u = {pw->pw_uid, pw->pw_gid};
  return true;
}

class SocketAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KPLEG_REQUIRE_OR_SKIP(geteuid() == 0, "acting as another user needs root");
    ASSERT_TRUE(lookup("nobody", &nobody_)) << "no user nobody";
    ASSERT_TRUE(lookup("daemon", &other_)) << "no user daemon";
    ASSERT_NE(nobody_.gid, other_.gid);
  }
  User nobody_{}, other_{};
};

TEST_F(SocketAccessTest, AnotherUserCannotConnectToTheOwnerOnlySocket) {
  ServerHarness h;
  // Let others traverse the directory, so that only the socket's own mode decides.
  ASSERT_EQ(chmod(h.dir.path().c_str(), 0755), 0);
  ASSERT_TRUE(h.start().ok());

  EXPECT_EQ(connect_as(h.socket_path, nobody_.uid, nobody_.gid), EACCES);

  auto r = run_command({KPLEGCTL_BIN, "--socket", h.socket_path, "health"}, 20s,
                       RunAs{nobody_.uid, nobody_.gid, {}});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("kplegctl: permission denied on " + h.socket_path, 0), 0u) << r.err;

  // Control: the same user gets in once the mode allows it, so the refusal above was the
  // socket's mode and not something else in the way.
  ASSERT_EQ(chmod(h.socket_path.c_str(), 0666), 0);
  EXPECT_EQ(connect_as(h.socket_path, nobody_.uid, nobody_.gid), 0);
  auto ok = run_command({KPLEGCTL_BIN, "--socket", h.socket_path, "health"}, 20s,
                        RunAs{nobody_.uid, nobody_.gid, {}});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(SocketAccessTest, SocketGroupLetsItsMembersIn) {
  group* g = getgrgid(nobody_.gid);
  ASSERT_NE(g, nullptr);
  ServerHarness h(api::ApiServerOptions{.socket_group = g->gr_name});
  ASSERT_EQ(chmod(h.dir.path().c_str(), 0755), 0);
  ASSERT_TRUE(h.start().ok());

  EXPECT_EQ(connect_as(h.socket_path, nobody_.uid, nobody_.gid), 0) << "a member of the group";
  EXPECT_EQ(connect_as(h.socket_path, other_.uid, other_.gid), EACCES) << "not a member";
  auto r = run_command({KPLEGCTL_BIN, "--socket", h.socket_path, "health"}, 20s,
                       RunAs{nobody_.uid, nobody_.gid, {}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace kpleg::apitest
