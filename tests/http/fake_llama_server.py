#!/usr/bin/env python3
"""A misbehaving llama-server for the http:// backend's robustness tests.

It answers /health, /props, /v1/models and /tokenize like llama-server 0.3.36
(vocabulary and model path from the command line), and /completion according
to MODE:
  close       closes the connection without answering
  truncated   announces 4096 bytes, sends 20, closes the connection
  malformed   HTTP 200 with a body that is not JSON
  http500     HTTP 500 with an error object
  stall       waits STALL seconds before answering (past the harness's --timeout)
  no_probs    HTTP 200 JSON without completion_probabilities
  wrong_vocab /v1/models says n_vocab = N_VOCAB - 1 (and /completion is fine)
  wrong_model /props names another GGUF file
  junk_props  /props answers HTTP 200 with a body that is not JSON
  typed_props /props answers JSON whose model_path is a number
  wrong_tokens /tokenize gives other ids than the golden's for every prompt
  mixed       answers every /completion 0.2 s late, for the prompt that arrived
              last: alone a request gets its own answer, concurrent ones
              (step_batch) get one another's
Every /completion request is counted in the file COUNT_FILE (one line each).
Usage: fake_llama_server.py MODE PORT_FILE MODEL_PATH N_VOCAB COUNT_FILE [STALL]
It binds 127.0.0.1 on a free port, writes the port to PORT_FILE and serves
until killed.
"""
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE, PORT_FILE, MODEL_PATH, N_VOCAB, COUNT_FILE = sys.argv[1:6]
N_VOCAB = int(N_VOCAB)
STALL = float(sys.argv[6]) if len(sys.argv) > 6 else 30.0
last_prompt = [None]
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send_json({"status": "ok"})
        elif self.path == "/props" and MODE == "junk_props":
            body = b"<html>not a llama-server</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/props":
            path = "/elsewhere/other-model.gguf" if MODE == "wrong_model" else MODEL_PATH
            path = 7 if MODE == "typed_props" else path
            self.send_json({"model_path": path, "build_info": "fake-" + MODE})
        elif self.path == "/v1/models":
            n = N_VOCAB - 1 if MODE == "wrong_vocab" else N_VOCAB
            self.send_json({"data": [{"id": MODEL_PATH, "meta": {"n_vocab": n, "n_ctx": 8192}}]})
        else:
            self.send_json({"error": "not found"}, 404)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/tokenize" and json.loads(body).get("content") == "a":
            self.send_json({"tokens": [64]})
            return
        if self.path == "/tokenize" and MODE == "wrong_tokens":
            self.send_json({"tokens": [1, 2, 3]})
            return
        if self.path == "/tokenize":
            self.send_json({"error": {"code": 501, "message": "fake server: no tokenizer"}}, 501)
            return
        if self.path != "/completion":
            self.send_json({"error": "not found"}, 404)
            return
        with open(COUNT_FILE, "a") as f:
            f.write("1\n")
        if MODE == "close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if MODE == "truncated":
            self.send_response(200)
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b'{"completion_probabili')
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if MODE == "malformed":
            payload = b'{"completion_probabilities": [{"top_logprobs": [ oops'
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if MODE == "http500":
            self.send_json({"error": {"code": 500, "message": "fake server: out of memory"}}, 500)
            return
        if MODE == "stall":
            time.sleep(STALL)
        if MODE == "no_probs":
            self.send_json({"content": "x", "tokens": [1]})
            return
        prompt = json.loads(body)["prompt"]
        if MODE == "mixed":
            with lock:
                last_prompt[0] = prompt
            time.sleep(0.2)
            with lock:
                prompt = last_prompt[0]
        top = [{"id": (prompt[-1] + i) % N_VOCAB, "logprob": -1.0 - i} for i in range(4)]
        self.send_json({"tokens_evaluated": len(prompt),
                        "completion_probabilities": [{"id": top[0]["id"], "top_logprobs": top}]})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os  # noqa: E402

os.replace(PORT_FILE + ".tmp", PORT_FILE)
server.serve_forever()
