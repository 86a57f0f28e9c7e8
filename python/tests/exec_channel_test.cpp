// exec: backends from the harness side: BackendLibrary::spawn("exec:CMD ...")
// runs a Python child (python/tests/fake_child.py, misbehaving_child.py) over
// the child-process protocol. The Python side must be indistinguishable from
// the runner: same identity fields, same statuses and messages, and every way
// a child can misbehave ends in BackendCrash or Error, never a crash or a hang.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "touchstone/runtime/backend.h"

namespace touchstone {
namespace {

const std::string kPython = TOUCHSTONE_PYTHON;
const std::string kTests = PYTHON_TESTS_DIR;

std::string fake(const std::string& engine = "FakeEngine") {
  return "exec:" + kPython + " " + kTests + "/fake_child.py " + engine;
}
std::string bad(const std::string& mode) {
  return "exec:" + kPython + " " + kTests + "/misbehaving_child.py " + mode;
}

ChildOptions quick() { return ChildOptions{20.0, ""}; }

template <class E = Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

TEST(ExecCommand, SplitsOnWhitespace) {
  EXPECT_EQ(exec_command("exec:python3  -m\tpkg.mod "),
            (std::vector<std::string>{"python3", "-m", "pkg.mod"}));
  EXPECT_TRUE(is_exec_backend("exec:x"));
  EXPECT_FALSE(is_exec_backend("reference"));
  EXPECT_EQ(resolve_backend_path("exec:x y"), "exec:x y");
  EXPECT_NE(error_of([] { exec_command("exec: \t"); }).find("no command after 'exec:'"),
            std::string::npos);
}

TEST(ExecBackend, InProcessIsRefused) {
  const std::string msg = error_of([] { BackendLibrary::load(fake()); });
  EXPECT_NE(msg.find("is a command, not a library: it runs only as a child process"),
            std::string::npos)
      << msg;
}

TEST(ExecBackend, MissingProgramIsNamed) {
  std::string msg =
      error_of([] { BackendLibrary::spawn("exec:no-such-program-ts14 -x", quick()); });
  EXPECT_NE(msg.find("program 'no-such-program-ts14' not found on PATH"), std::string::npos) << msg;
  msg = error_of([] { BackendLibrary::spawn("exec:/nonexistent/python3", quick()); });
  EXPECT_NE(msg.find("'/nonexistent/python3' is not executable"), std::string::npos) << msg;
}

TEST(ExecBackend, HelloCarriesTheEngineAndTheCommandLine) {
  auto lib = BackendLibrary::spawn(fake(), quick());
  EXPECT_EQ(lib->name(), "fake");
  EXPECT_EQ(lib->version(), "1.2.3");
  EXPECT_EQ(lib->api_version(), uint32_t{TS_BACKEND_API_VERSION});
  EXPECT_EQ(lib->device_name(), "fake device");
  EXPECT_EQ(lib->path(), kPython + " " + kTests + "/fake_child.py FakeEngine");
  EXPECT_TRUE(lib->channel().info().declares_models);
  EXPECT_EQ(lib->channel().info().architectures, "llama");
  EXPECT_FALSE(lib->has_device_greedy());
  EXPECT_FALSE(lib->has_taps());
  const ts_capabilities c = lib->capabilities();
  EXPECT_EQ(c.flags, uint32_t{TS_CAP_ALL_POSITION_LOGITS});
  EXPECT_EQ(c.max_context, 32);
  ASSERT_EQ(c.n_shape_buckets, 1);
  EXPECT_EQ(c.shape_buckets[0], 4);
}

// The child gets fds 0-3 and nothing else of the harness's, close-on-exec or not.
TEST(ExecBackend, ChildGetsOnlyStdioAndTheSocket) {
  const int null_fd = ::open("/dev/null", O_RDONLY);
  const int leak = ::fcntl(null_fd, F_DUPFD, 10);  // no FD_CLOEXEC
  ::close(null_fd);
  ASSERT_GE(leak, 10);
  auto lib = BackendLibrary::spawn(fake("FdEngine"), quick());
  ::close(leak);
  std::vector<int> fds;
  std::stringstream ss(lib->device_name().substr(4));
  for (std::string f; std::getline(ss, f, ',');) fds.push_back(std::stoi(f));
  for (int fd : {0, 1, 2, 3}) EXPECT_NE(std::find(fds.begin(), fds.end(), fd), fds.end()) << fd;
  EXPECT_EQ(std::find(fds.begin(), fds.end(), leak), fds.end())
      << "fd " << leak << " leaked into the child: " << lib->device_name();
}

TEST(ExecBackend, SessionCallsAndTheSharedChecks) {
  auto lib = BackendLibrary::spawn(fake(), quick());
  BackendModel model(lib, "model.gguf");
  ASSERT_EQ(model.n_vocab(), 8);
  BackendSessionOptions o;
  o.max_context = 6;
  BackendSession s(model, o);
  const std::vector<int32_t> t = {3, 4};
  const std::vector<float> last = s.prefill(t);
  ASSERT_EQ(last.size(), 8u);
  EXPECT_FLOAT_EQ(last[0], 5.0f);  // token 4 at position 1
  EXPECT_FLOAT_EQ(last[7], 5.007f);
  EXPECT_EQ(s.prefill_all(t).size(), 16u);
  std::vector<float> row(8);
  s.decode(1, row);
  EXPECT_FLOAT_EQ(row[0], 5.0f);
  EXPECT_EQ(s.position(), 5);
  auto status_of = [](auto&& f) {
    try {
      f();
    } catch (const BackendError& e) {
      return std::make_pair(e.status(), e.detail().empty() ? std::string(e.what()) : e.detail());
    }
    return std::make_pair(TS_OK, std::string());
  };
  const std::vector<int32_t> bad_token = {1, 8};
  auto [st, msg] = status_of([&] { s.prefill(bad_token); });
  EXPECT_EQ(st, TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("token #1 = 8 outside [0, 8)"), std::string::npos) << msg;
  std::tie(st, msg) = status_of([&] { s.prefill(t); });
  EXPECT_EQ(st, TS_ERR_CONTEXT_FULL);
  EXPECT_NE(msg.find("position 5 + 2 tokens exceeds max context 6"), std::string::npos) << msg;
  std::tie(st, msg) = status_of([&] { s.rewind(9); });
  EXPECT_EQ(st, TS_ERR_INVALID_ARGUMENT);
  s.rewind(1);
  EXPECT_EQ(s.position(), 1);
  std::tie(st, msg) = status_of([&] {
    BackendSessionOptions f;
    f.fault = "no_such_fault";
    BackendSession x(model, f);
  });
  EXPECT_EQ(st, TS_ERR_UNSUPPORTED);
  EXPECT_NE(msg.find("unknown fault 'no_such_fault'"), std::string::npos) << msg;
}

TEST(ExecBackend, PythonExceptionsBecomeStatuses) {
  auto lib = BackendLibrary::spawn(fake(), quick());
  auto load = [&](const std::string& path) -> std::pair<ts_status, std::string> {
    try {
      BackendModel m(lib, path);
    } catch (const BackendError& e) {
      return {e.status(), e.what()};
    }
    return {TS_OK, ""};
  };
  auto [st, msg] = load("x.missing");
  EXPECT_EQ(st, TS_ERR_IO);
  EXPECT_NE(msg.find("backend 'fake': load_model: TS_ERR_IO: x.missing: no such file"),
            std::string::npos)
      << msg;
  std::tie(st, msg) = load("x.boom");
  EXPECT_EQ(st, TS_ERR_INTERNAL);
  EXPECT_NE(msg.find("ValueError: deliberate failure in load_model (fake_engines.py:"),
            std::string::npos)
      << msg;
  std::tie(st, msg) = load("x.oom");
  EXPECT_EQ(st, TS_ERR_OUT_OF_MEMORY);
  EXPECT_TRUE(lib->alive());  // errors are replies, not crashes
}

TEST(ExecBackend, GreedyAndTapsAreDeclaredFromTheSessionClass) {
  auto lib = BackendLibrary::spawn(fake("GreedyTapsEngine"), quick());
  EXPECT_TRUE(lib->has_device_greedy());
  EXPECT_TRUE(lib->has_taps());
  BackendModel model(lib, "model.gguf");
  BackendSession s(model, BackendSessionOptions{});
  s.set_taps(true);
  const std::vector<int32_t> t = {1, 2};
  EXPECT_EQ(s.prefill_greedy(t), 7);
  EXPECT_EQ(s.read_taps(6), std::vector<float>(6, 2.0f));
}

// ABI v6 through an exec: child: step_batch and fork reach the engine; a
// step_batch reply of the wrong size is a protocol violation.
TEST(ExecBackend, StepBatchAndForkAndTheReplySizeCheck) {
  auto lib = BackendLibrary::spawn(fake("ServingEngine"), quick());
  EXPECT_TRUE(lib->channel().info().step_batch);
  EXPECT_TRUE(lib->has_fork());
  EXPECT_EQ(lib->capabilities().max_batch, 3);
  BackendModel model(lib, "model.gguf");
  BackendSession a(model, {}), b(model, {});
  a.prefill(std::vector<int32_t>{1, 2});
  const std::vector<int32_t> ta = {3}, tb = {4, 5};
  std::vector<float> la(8), lb(16);
  BackendSession::step_batch(
      std::vector<BackendSession::Step>{{&a, ta, false, la}, {&b, tb, true, lb}});
  EXPECT_FLOAT_EQ(la[0], 5.0f);  // token 3 at position 2
  EXPECT_FLOAT_EQ(lb[8], 6.0f);  // token 5 at position 1
  EXPECT_EQ(a.position(), 3);
  auto f = a.fork(1);
  EXPECT_EQ(f->position(), 1);
  EXPECT_FLOAT_EQ(f->prefill(ta)[0], 4.0f);  // token 3 at position 1

  auto extra = BackendLibrary::spawn(fake("BatchExtraFloat"), quick());
  BackendModel m2(extra, "model.gguf");
  BackendSession c(m2, {});
  std::vector<float> lc(8);
  const std::string msg = error_of<BackendCrash>([&] {
    BackendSession::step_batch(std::vector<BackendSession::Step>{{&c, ta, false, lc}});
  });
  EXPECT_NE(msg.find("protocol violation in step_batch: 36 bytes of logits, expected 32"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(extra->channel().alive());
}

TEST(ExecBackend, AnEngineThatCannotStartIsALoadError) {
  const std::string msg = error_of([] { BackendLibrary::spawn(fake("FailingEngine"), quick()); });
  EXPECT_NE(msg.find("engine cannot start: RuntimeError: cannot find the accelerator"),
            std::string::npos)
      << msg;
}

TEST(ExecBackend, DeathAtStartIsACrashNamingTheExit) {
  const std::string msg =
      error_of<BackendCrash>([] { BackendLibrary::spawn(bad("exit_at_start"), quick()); });
  EXPECT_NE(msg.find("the backend process exited with status 3 during hello"), std::string::npos)
      << msg;
}

TEST(ExecBackend, MalformedHelloIsAProtocolViolation) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg =
      error_of<BackendCrash>([] { BackendLibrary::spawn(bad("bad_hello"), quick()); });
  EXPECT_NE(msg.find("protocol violation in hello"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));  // no waiting
}

// A decode that never returns is killed at the deadline (BackendCrash naming
// the call); restart() gives a fresh child that works.
TEST(ExecBackend, HangIsKilledAndTheChildRestarts) {
  const std::string state = ::testing::TempDir() + "exec_channel_hang.state";
  std::remove(state.c_str());
  auto lib = BackendLibrary::spawn(bad("hang_in_decode " + state), ChildOptions{2.0, ""});
  const std::vector<int32_t> t = {1};
  std::vector<float> row(49152);
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  {
    BackendModel model(lib, "m.gguf");
    BackendSession s(model, BackendSessionOptions{});
    s.prefill(t);  // prefill #1
    s.decode(2, row);
    s.prefill(t);  // prefill #2 arms the hang
    msg = error_of<BackendCrash>([&] { s.decode(2, row); });
  }
  EXPECT_NE(msg.find("timed out after 2 s in decode (process killed)"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  EXPECT_FALSE(lib->alive());
  lib->restart();
  ASSERT_TRUE(lib->alive());
  BackendModel model(lib, "m.gguf");
  BackendSession s(model, BackendSessionOptions{});
  s.prefill(t);  // prefill #3: behaves
  s.decode(2, row);
  EXPECT_EQ(s.position(), 2);
  std::remove(state.c_str());
}

}  // namespace
}  // namespace touchstone
