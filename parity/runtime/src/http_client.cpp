#include "http_client.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <cmath>

#include "touchstone/runtime/backend_channel.h"

namespace touchstone::http {
namespace {

constexpr size_t kMaxBody = size_t{64} << 20;  // an answer larger than this is refused

struct Sink {
  std::string* out;
  bool too_large = false;
};

size_t write_body(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<Sink*>(user);
  if (s->out->size() + size * n > kMaxBody) {
    s->too_large = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  s->out->append(data, size * n);
  return size * n;
}

// What a curl error means for a user reading the FAIL row.
std::string transport_error(CURLcode rc, double total_s, const char* detail) {
  std::string what;
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
      what = fmt::format("no complete answer within {:g} s (server stalled)", total_s);
      break;
    case CURLE_GOT_NOTHING:
      what = "the server closed the connection without answering";
      break;
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
      what = "the server closed the connection in the middle of the answer";
      break;
    case CURLE_COULDNT_CONNECT:
      what = "connection refused (is the server running?)";
      break;
    default:
      what = curl_easy_strerror(rc);
  }
  if (detail && *detail) what += fmt::format(" (curl: {})", detail);
  return what;
}

}  // namespace

struct Client::Impl {
  CURL* curl = nullptr;
  ~Impl() {
    if (curl) curl_easy_cleanup(curl);
  }
};

Client::Client(std::string base_url, ClientOptions options)
    : base_(std::move(base_url)), o_(options), impl_(std::make_unique<Impl>()) {
  static const bool global_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  if (!global_ok || !(impl_->curl = curl_easy_init())) {
    throw Error("http: libcurl could not be initialised");
  }
}

Client::~Client() = default;

Response Client::get(const std::string& path) { return perform(path, nullptr); }

Response Client::post_json(const std::string& path, const std::string& body) {
  return perform(path, &body);
}

Response Client::next_response(const std::string& path) {
  Response r;
  r.url = base_ + path;
  r.number = ++n_;
  if (r.number > o_.max_requests) {
    throw BackendCrash(fmt::format("{} request #{}: the run's request budget ({}) is spent", r.url,
                                   r.number, o_.max_requests));
  }
  return r;
}

namespace {

// One request on one easy handle: its options, its answer, its verdict.
struct Transfer {
  Response r;
  Sink sink{&r.body};
  char err[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;

  explicit Transfer(Response response) : r(std::move(response)) {}
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer() { curl_slist_free_all(headers); }

  void setup(CURL* c, const ClientOptions& o, const std::string* body) {
    curl_easy_setopt(c, CURLOPT_URL, r.url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, long(std::ceil(o.connect_timeout_s * 1000)));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, long(std::ceil(o.total_timeout_s * 1000)));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    if (body) {
      headers = curl_slist_append(headers, "Content-Type: application/json");
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, body->data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body->size()));
    }
  }

  // The answer, or BackendCrash naming the request and the transport failure.
  Response finish(CURL* c, CURLcode rc, const ClientOptions& o) {
    if (sink.too_large) {
      throw BackendCrash(fmt::format("{} request #{}: answer larger than {} MiB", r.url, r.number,
                                     kMaxBody >> 20));
    }
    if (rc != CURLE_OK) {
      throw BackendCrash(fmt::format("{} request #{}: {}", r.url, r.number,
                                     transport_error(rc, o.total_timeout_s, err)));
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    return std::move(r);
  }
};

}  // namespace

Response Client::perform(const std::string& path, const std::string* body) {
  Transfer t(next_response(path));
  CURL* c = impl_->curl;
  curl_easy_reset(c);
  t.setup(c, o_, body);
  return t.finish(c, curl_easy_perform(c), o_);
}

namespace {

// Owns a multi handle and its easy handles.
struct Multi {
  CURLM* m = curl_multi_init();
  std::vector<CURL*> easy;
  ~Multi() {
    for (CURL* e : easy) {
      curl_multi_remove_handle(m, e);
      curl_easy_cleanup(e);
    }
    if (m) curl_multi_cleanup(m);
  }
};

}  // namespace

std::vector<Response> Client::post_json_concurrent(const std::string& path,
                                                   const std::vector<std::string>& bodies) {
  Multi multi;
  std::vector<std::unique_ptr<Transfer>> ts;
  for (const std::string& body : bodies) {
    ts.push_back(std::make_unique<Transfer>(next_response(path)));
    CURL* e = curl_easy_init();
    if (!multi.m || !e) throw Error("http: libcurl could not start {} requests", bodies.size());
    multi.easy.push_back(e);
    ts.back()->setup(e, o_, &body);
    curl_multi_add_handle(multi.m, e);
  }
  int running = 1;
  while (running > 0) {
    if (const CURLMcode mc = curl_multi_perform(multi.m, &running); mc != CURLM_OK)
      throw BackendCrash(fmt::format("{}{}: {}", base_, path, curl_multi_strerror(mc)));
    if (running > 0) curl_multi_poll(multi.m, nullptr, 0, 100, nullptr);
  }
  std::vector<CURLcode> rcs(ts.size(), CURLE_OK);
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi.m, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    for (size_t i = 0; i < multi.easy.size(); ++i)
      if (multi.easy[i] == msg->easy_handle) rcs[i] = msg->data.result;
  }
  std::vector<Response> out;
  for (size_t i = 0; i < ts.size(); ++i) out.push_back(ts[i]->finish(multi.easy[i], rcs[i], o_));
  return out;
}

}  // namespace touchstone::http
