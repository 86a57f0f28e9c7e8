// BackendLibrary::load refuses every malformed backend with a message naming the problem.
#include <gtest/gtest.h>

#include <cstdlib>

#include "touchstone/runtime/backend.h"

namespace touchstone {
namespace {

std::string fake(const char* variant) {
  return std::string(FAKE_BACKEND_DIR) + "/libfake_backend_" + variant + ".so";
}

std::string load_error(const std::string& what) {
  try {
    BackendLibrary::load(what);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Loader, LoadsAWellFormedBackendByPath) {
  auto lib = BackendLibrary::load(fake("ok"));
  EXPECT_EQ(lib->name(), "fake");
  EXPECT_EQ(lib->device_name(), "fake device");
  EXPECT_EQ(lib->capabilities().weight_types, TS_WEIGHT_TYPE_BIT(0));
}

TEST(Loader, BackendErrorsCarryStatusAndMessage) {
  auto lib = BackendLibrary::load(fake("ok"));
  try {
    BackendModel m(lib, "x.gguf");
    FAIL() << "fake load_model succeeded";
  } catch (const BackendError& e) {
    EXPECT_EQ(e.status(), TS_ERR_DEVICE);
    EXPECT_NE(std::string(e.what()).find("nothing is implemented"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TS_ERR_DEVICE"), std::string::npos) << e.what();
  }
}

TEST(Loader, RefusesApiVersionMismatchNamingBothVersions) {
  const std::string msg = load_error(fake("v999"));
  EXPECT_NE(msg.find("api_version 999"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(TS_BACKEND_API_VERSION)), std::string::npos) << msg;
}

// Version 1 tables are accepted; members appended in version 2 are not read.
TEST(Loader, AcceptsVersion1WithoutReadingVersion2Members) {
  auto lib = BackendLibrary::load(fake("v1"));
  EXPECT_EQ(lib->api_version(), 1u);
  EXPECT_FALSE(lib->has_device_greedy());
}

// Version 2 tables load; the version-3 members (architectures, model_features)
// are not read: nothing is declared, so load_model decides.
TEST(Loader, AcceptsVersion2WithoutReadingVersion3Members) {
  auto lib = BackendLibrary::load(fake("v2"));
  EXPECT_EQ(lib->api_version(), 2u);
  EXPECT_FALSE(lib->channel().info().declares_models);
  EXPECT_EQ(lib->channel().info().architectures, "");
}

// Version 3 tables load; the version-4 members (set_taps, read_taps: traps
// that abort here) are neither read nor called.
TEST(Loader, AcceptsVersion3WithoutReadingVersion4Members) {
  auto lib = BackendLibrary::load(fake("v3"));
  EXPECT_EQ(lib->api_version(), 3u);
  EXPECT_TRUE(lib->channel().info().declares_models);
  EXPECT_FALSE(lib->has_taps());
}

TEST(Loader, AcceptsVersion4CapabilitiesWithoutTopN) {
  auto lib = BackendLibrary::load(fake("v4"));
  EXPECT_EQ(lib->api_version(), 4u);
  const ts_capabilities c = lib->capabilities();  // passed the v4 struct size
  EXPECT_EQ(c.flags & TS_CAP_TOP_N_LOGPROBS, 0u);
  EXPECT_EQ(c.top_n, 0);
}

TEST(Loader, Version5TopNReachesTheHarness) {
  auto lib = BackendLibrary::load(fake("top_n"));
  const ts_capabilities c = lib->capabilities();
  EXPECT_NE(c.flags & TS_CAP_TOP_N_LOGPROBS, 0u);
  EXPECT_EQ(c.top_n, 8);
  // Through the child process too: the protocol carries top_n.
  auto child = BackendLibrary::spawn(fake("top_n"), ChildOptions{});
  EXPECT_EQ(child->capabilities().top_n, 8);
  auto old = BackendLibrary::spawn(fake("v4"), ChildOptions{});
  EXPECT_EQ(old->capabilities().top_n, 0);
}

// Version 5 tables load; the version-6 members (step_batch, fork_session: traps
// that abort here) are neither read nor called, and the bits 2, 3 and 7 its
// capabilities set (looser or no meaning before ABI v6) do not reach the harness.
TEST(Loader, AcceptsVersion5WithoutReadingVersion6Members) {
  auto lib = BackendLibrary::load(fake("v5"));
  EXPECT_EQ(lib->api_version(), 5u);
  EXPECT_FALSE(lib->channel().info().step_batch);
  EXPECT_FALSE(lib->has_fork());
  EXPECT_EQ(lib->batch_mode(), BatchMode::kHarness);
  const uint32_t v6 = TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY | TS_CAP_BATCH_INVARIANT;
  EXPECT_EQ(lib->capabilities().flags & v6, 0u);
  // Through the child process too.
  auto child = BackendLibrary::spawn(fake("v5"), ChildOptions{});
  EXPECT_FALSE(child->channel().info().step_batch);
  EXPECT_FALSE(child->has_fork());
  EXPECT_EQ(child->capabilities().flags & v6, 0u);
  EXPECT_THROW(child->channel().fork_session(1, 0), Error);
}

TEST(Loader, Version6FlagsNeedTheirMembers) {
  auto ok = BackendLibrary::load(fake("ok"));
  EXPECT_FALSE(ok->channel().info().step_batch);
  EXPECT_FALSE(ok->has_fork());
  std::string msg = load_error(fake("fork_null"));
  EXPECT_NE(msg.find("TS_CAP_KV_PREFIX_COPY"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fork_session is NULL"), std::string::npos) << msg;
  msg = load_error(fake("batched_null"));
  EXPECT_NE(msg.find("TS_CAP_BATCHED_SESSIONS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step_batch is NULL"), std::string::npos) << msg;
  // The runner loads with the same checks: the hello carries the refusal.
  try {
    BackendLibrary::spawn(fake("fork_null"), ChildOptions{});
    ADD_FAILURE() << "the runner loaded a table the loader refuses";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fork_session is NULL"), std::string::npos) << e.what();
  }
}

// ABI v7: a version-6 table's entries past fork_session (traps that abort here)
// are neither read nor called, and its stray bit 9 does not reach the harness.
TEST(Loader, AcceptsVersion6WithoutReadingVersion7Members) {
  auto lib = BackendLibrary::load(fake("v6"));
  EXPECT_EQ(lib->api_version(), 6u);
  EXPECT_FALSE(lib->has_grammar());
  EXPECT_EQ(lib->capabilities().flags & TS_CAP_STRUCTURED_OUTPUT, 0u);
  auto child = BackendLibrary::spawn(fake("v6"), ChildOptions{});
  EXPECT_FALSE(child->has_grammar());
  EXPECT_EQ(child->capabilities().flags & TS_CAP_STRUCTURED_OUTPUT, 0u);
  EXPECT_THROW(child->channel().set_grammar(1, nullptr), Error);
}

TEST(Loader, Version7StructuredOutputNeedsItsMembers) {
  const std::string msg = load_error(fake("grammar_null"));
  EXPECT_NE(msg.find("TS_CAP_STRUCTURED_OUTPUT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set_grammar is NULL"), std::string::npos) << msg;
  try {
    BackendLibrary::spawn(fake("grammar_null"), ChildOptions{});
    ADD_FAILURE() << "the runner loaded a table the loader refuses";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_grammar is NULL"), std::string::npos) << e.what();
  }
}

TEST(Loader, AcceptsVersion7WithoutReadingVersion8Members) {
  for (const auto& lib :
       {BackendLibrary::load(fake("v7")), BackendLibrary::spawn(fake("v7"), ChildOptions{})}) {
    EXPECT_EQ(lib->api_version(), 7u);
    EXPECT_FALSE(lib->has_embeddings());
    EXPECT_FALSE(lib->has_vision());
    EXPECT_EQ(lib->capabilities().flags & (TS_CAP_EMBEDDING_INPUT | TS_CAP_MULTIMODAL), 0u);
    EXPECT_THROW(lib->channel().load_vision(1, "x.gguf"), Error);
  }
}

TEST(Loader, Version8MultimodalNeedsItsMembers) {
  const std::string msg = load_error(fake("multimodal_null"));
  EXPECT_NE(msg.find("TS_CAP_EMBEDDING_INPUT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("prefill_embeddings is NULL"), std::string::npos) << msg;
  try {
    BackendLibrary::spawn(fake("multimodal_null"), ChildOptions{});
    ADD_FAILURE() << "the runner loaded a table the loader refuses";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prefill_embeddings is NULL"), std::string::npos)
        << e.what();
  }
}

TEST(Loader, AcceptsVersion8WithoutReadingVersion9Members) {
  for (const auto& lib :
       {BackendLibrary::load(fake("v8")), BackendLibrary::spawn(fake("v8"), ChildOptions{})}) {
    EXPECT_EQ(lib->api_version(), 8u);
    EXPECT_FALSE(lib->has_preprocess());
    EXPECT_FALSE(lib->has_vision_options());
    EXPECT_THROW(lib->channel().preprocess_image(1, std::vector<uint8_t>(3), 1, 1), Error);
    EXPECT_THROW(lib->channel().set_vision_options(1, ""), Error);
  }
}

TEST(Loader, Version9PreprocessNeedsTheTower) {
  const std::string msg = load_error(fake("preprocess_orphan"));
  EXPECT_NE(msg.find("without load_vision"), std::string::npos) << msg;
  try {
    BackendLibrary::spawn(fake("preprocess_orphan"), ChildOptions{});
    ADD_FAILURE() << "the runner loaded a table the loader refuses";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without load_vision"), std::string::npos) << e.what();
  }
}

TEST(Loader, LayerTapsNeedBothEntries) {
  EXPECT_FALSE(BackendLibrary::load(fake("ok"))->has_taps());
  const std::string msg = load_error(fake("taps_half"));
  EXPECT_NE(msg.find("read_taps"), std::string::npos) << msg;
}

TEST(Loader, Version4DeclaresArchitecturesAndFeatures) {
  auto lib = BackendLibrary::load(fake("ok"));
  EXPECT_EQ(lib->api_version(), uint32_t{TS_BACKEND_API_VERSION});
  EXPECT_TRUE(lib->channel().info().declares_models);
  EXPECT_EQ(lib->channel().info().architectures, "llama");
  EXPECT_EQ(lib->channel().info().model_features, "");
}

TEST(Loader, DeviceGreedyNeedsTheCapabilityAndTheEntry) {
  EXPECT_FALSE(BackendLibrary::load(fake("ok"))->has_device_greedy());
  EXPECT_TRUE(BackendLibrary::load(fake("greedy"))->has_device_greedy());
  const std::string msg = load_error(fake("greedy_null"));
  EXPECT_NE(msg.find("TS_CAP_DEVICE_GREEDY"), std::string::npos) << msg;
}

TEST(Loader, RefusesNullEntryAndMissingFunctions) {
  EXPECT_NE(load_error(fake("null_entry")).find("returned NULL"), std::string::npos);
  EXPECT_NE(load_error(fake("missing_fn")).find("NULL"), std::string::npos);
}

TEST(Loader, RefusesLibrariesWithoutTheEntrySymbol) {
  const std::string msg = load_error("libm.so.6");
  EXPECT_FALSE(msg.empty());
}

TEST(Loader, UnknownNameListsThePlacesSearched) {
  setenv("TOUCHSTONE_BACKEND_PATH", "/nonexistent-a:/nonexistent-b", 1);
  const std::string msg = load_error("no_such_backend");
  unsetenv("TOUCHSTONE_BACKEND_PATH");
  EXPECT_NE(msg.find("/nonexistent-a/libtouchstone_backend_no_such_backend.so"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("/nonexistent-b/"), std::string::npos) << msg;
}

TEST(Loader, FindsBackendsByNameThroughTheSearchPath) {
  setenv("TOUCHSTONE_BACKEND_PATH", FAKE_BACKEND_DIR, 1);
  const std::string msg = load_error("fake_named");
  unsetenv("TOUCHSTONE_BACKEND_PATH");
  EXPECT_EQ(msg, "");
}

TEST(Loader, MissingPathIsAClearError) {
  EXPECT_NE(load_error("/nonexistent/libx.so").find("does not exist"), std::string::npos);
}

// The http:// channel without a server: refusals name the URL and the request.
TEST(HttpChannel, RefusesAPathAndNamesTheUnreachableServer) {
  EXPECT_THROW(http_base_url("http://127.0.0.1:8080/v1"), Error);
  EXPECT_EQ(http_base_url("http://127.0.0.1:8080/"), "http://127.0.0.1:8080");
  HttpOptions o;
  o.call_timeout_s = 2;
  try {
    open_http("http://127.0.0.1:1", o);
    ADD_FAILURE() << "no server on port 1, yet the channel opened";
  } catch (const BackendCrash& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("http://127.0.0.1:1/props request #1"), std::string::npos) << msg;
  }
}

TEST(HttpChannel, StopsAtTheRequestBudget) {
  HttpOptions o;
  o.max_requests = 0;
  try {
    open_http("http://127.0.0.1:1", o);
    ADD_FAILURE() << "a request past the budget was sent";
  } catch (const BackendCrash& e) {
    EXPECT_NE(std::string(e.what()).find("request budget (0) is spent"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace touchstone
