// http_client.h - a bounded HTTP/1.1 client (libcurl) for the http:// backend.
//
// Every request has a connect and a total time limit, and the client refuses
// to send more than max_requests requests in all, so a server that stalls,
// closes the connection or loops can cost the harness at most
// max_requests * total_timeout_s. Transport failures throw BackendCrash
// naming the URL, the request number and what went wrong; an answer is
// returned whatever its status (the caller judges it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace touchstone::http {

struct ClientOptions {
  double connect_timeout_s = 10.0;
  double total_timeout_s = 300.0;  // per request
  int64_t max_requests = 1'000'000;
};

struct Response {
  long status = 0;
  std::string body;
  int64_t number = 0;  // this request's number (1 = first)
  std::string url;
};

class Client {
 public:
  // base_url: "http://HOST:PORT" (no trailing '/'); throws Error when curl cannot start.
  Client(std::string base_url, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Response get(const std::string& path);
  Response post_json(const std::string& path, const std::string& body);
  // Every body POSTed to `path` at once, each on its own connection (a server
  // with parallel slots answers them together); answers in the bodies' order,
  // numbered in that order. Each request has the same limits as post_json; the
  // first transport failure throws BackendCrash once all have ended.
  std::vector<Response> post_json_concurrent(const std::string& path,
                                             const std::vector<std::string>& bodies);
  const std::string& base_url() const { return base_; }
  int64_t requests() const { return n_; }

 private:
  Response perform(const std::string& path, const std::string* body);
  Response next_response(const std::string& path);  // numbered, within the budget
  std::string base_;
  ClientOptions o_;
  int64_t n_ = 0;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace touchstone::http
