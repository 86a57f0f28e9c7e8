// export.cpp - see export.h.
#include "export.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine.h"

namespace touchstone::static_graph {
namespace {

std::string npy_descr(const std::string& elem) {
  if (elem == "f32") return "<f4";
  if (elem == "f16") return "<f2";
  if (elem == "i8") return "|i1";
  if (elem == "i32") return "<i4";
  throw std::logic_error("npy: " + elem);
}

void write_npy(const std::string& path, const void* data, const std::vector<int64_t>& shape,
               const std::string& elem) {
  std::string shp = "(";
  size_t n = 1;
  for (int64_t d : shape) {
    shp += std::to_string(d) + ",";
    n *= size_t(d);
  }
  if (shape.size() > 1) shp.pop_back();
  shp += ")";
  std::string header =
      "{'descr': '" + npy_descr(elem) + "', 'fortran_order': False, 'shape': " + shp + ", }";
  const size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("export: cannot write " + path);
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&hl), 2);
  f << header;
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n * elem_size(elem)));
}

nlohmann::json arg_json(const ArgInfo& a) {
  return nlohmann::json{{"name", a.name}, {"shape", a.shape}, {"dtype", a.elem}};
}

// check/: one decode step after a short prompt, its inputs (the KV caches and
// RoPE tables before the step, the token, position and tap row) and the JIT's
// logits, for running the exported decode module elsewhere and comparing.
void write_reference_io(GraphModel& model, WeightMode mode, const std::string& out_dir,
                        const ExportOptions& opt) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(out_dir) / "check");
  GraphSession s(model, mode, opt.capacity, 1);
  s.buckets.windows.clear();
  s.buckets.prefill.clear();  // token by token: only the decode graph is compiled
  const std::vector<int32_t> prompt{1, 504, 3458, 282, 253};
  std::vector<float> logits(size_t(model.dims.n_vocab));
  s.prefill(prompt.data(), int32_t(prompt.size()), false, logits.data());
  const int32_t pos = s.position(), tok = 2115;
  const auto dump = [&](const std::string& n, const void* p, const std::vector<int64_t>& shape,
                        const std::string& e) {
    write_npy((fs::path(out_dir) / "check" / n).string(), p, shape, e);
  };
  const int64_t L = model.dims.n_layer, KVH = model.dims.n_head_kv, hd = model.dims.head_dim;
  const int64_t per_layer = KVH * hd * opt.capacity;  // floats of one layer's K (and V) cache
  for (int64_t l = 0; l < L; ++l) {
    dump("k_cache." + std::to_string(l) + ".npy", s.k_cache() + l * per_layer, {1, per_layer, 1},
         "f32");
    dump("v_cache." + std::to_string(l) + ".npy", s.v_cache() + l * per_layer,
         {1, KVH * opt.capacity, hd}, "f32");
  }
  const int64_t half = model.dims.rot() / 2;
  for (size_t k = 0; k < model.rope_tables.size(); ++k) {
    const std::string sfx = k == 0 ? "" : "." + std::to_string(k);
    dump("rope_cos" + sfx + ".npy", s.rope_cos(k), {1, opt.capacity, half}, "f32");
    dump("rope_sin" + sfx + ".npy", s.rope_sin(k), {1, opt.capacity, half}, "f32");
  }
  const int32_t tap_row = 0;  // the decode step's only row
  dump("tap_row.npy", &tap_row, {1, 1}, "i32");
  dump("tokens.npy", &tok, {1, 1}, "i32");
  dump("pos.npy", &pos, {1, 1}, "i32");
  s.decode(tok, logits.data());
  dump("expected_logits.npy", logits.data(), {1, model.dims.n_vocab}, "f32");
}

}  // namespace

void export_modules(const std::string& model_path, const std::string& out_dir,
                    const ExportOptions& opt) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(out_dir) / "weights");
  std::unique_ptr<GraphModel> model = load_model(model_path);
  const WeightMode mode = opt.quantized ? WeightMode::Quantized : WeightMode::FullPrecision;
  const WeightSet& ws = model->weights(mode);
  BucketConfig buckets;
  buckets.windows.clear();
  nlohmann::json man;
  man["model"] = fs::path(model_path).filename().string();
  man["weights"] = opt.quantized ? "quantized" : "full_precision";
  man["capacity"] = opt.capacity;
  man["dialects"] = "func + tosa (TOSA 1.0 syntax, MLIR 22)";
  man["modules"] = nlohmann::json::array();
  std::vector<int32_t> Ts{1};
  if (opt.with_prefill)
    for (int32_t t : buckets.prefill)
      if (t <= opt.capacity) Ts.push_back(t);
  for (int32_t T : Ts) {
    GraphSpec spec = ws.spec_template;
    spec.T = T;
    spec.W = opt.capacity;
    spec.capacity = opt.capacity;
    BuiltGraph g = build_step_graph(model->dims, spec, "step");
    verify_module_text(g.mlir);
    const std::string file = T == 1 ? "decode.mlir" : "prefill_" + std::to_string(T) + ".mlir";
    std::ofstream(fs::path(out_dir) / file) << g.mlir;
    nlohmann::json mj{
        {"file", file}, {"function", "step"}, {"tokens", T}, {"window", opt.capacity}};
    mj["args"] = nlohmann::json::array();
    for (const ArgInfo& a : g.args) {
      nlohmann::json aj = arg_json(a);
      if (ws.tensors.count(a.name)) aj["file"] = "weights/" + a.name + ".npy";
      mj["args"].push_back(aj);
    }
    mj["results"] = nlohmann::json::array();
    for (const ArgInfo& r : g.results) mj["results"].push_back(arg_json(r));
    man["modules"].push_back(mj);
  }
  for (const auto& [name, t] : ws.tensors) {
    write_npy((fs::path(out_dir) / "weights" / (name + ".npy")).string(), t.data.get(), t.shape,
              t.elem);
  }
  if (opt.with_reference_io) write_reference_io(*model, mode, out_dir, opt);
  std::ofstream(fs::path(out_dir) / "manifest.json") << man.dump(2) << "\n";
}

}  // namespace touchstone::static_graph
