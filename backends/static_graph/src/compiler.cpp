// compiler.cpp - MLIR pass pipeline + JIT (see compiler.h).
#include "compiler.h"
#include "schedule.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/TargetParser/Host.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"

namespace touchstone::static_graph {
namespace {

// Stage 1: TOSA -> linalg on tensors. The named tosa-to-linalg-pipeline is not
// used: it validates with a profile that rejects f32 and lacks tosa-to-scf
// (needed for tosa.scatter, the KV write at a runtime position).
const char* kStage1 =
    "func.func(tosa-optional-decompositions),canonicalize,"
    "func.func(tosa-infer-shapes,tosa-make-broadcastable,tosa-to-linalg-named,tosa-to-scf),"
    "canonicalize,"
    "func.func(tosa-layerwise-constant-fold,tosa-make-broadcastable),"
    "func.func(tosa-to-linalg,tosa-to-tensor,tosa-to-arith),canonicalize,cse";

// Stage 2 (after the transform-dialect schedule): bufferize with the KV caches
// updated in place, results written to caller-allocated out-params.
// drop-equivalent-buffer-results and buffer-results-to-out-params skip public
// functions in MLIR 22, so the step function is made private just for those
// passes (run_stage2 below).
const char* kStage2a =
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "canonicalize,func.func(buffer-loop-hoisting)";
const char* kStage2Drop = "drop-equivalent-buffer-results";
const char* kStage2b =
    "buffer-results-to-out-params{hoist-static-allocs},canonicalize,"
    "buffer-deallocation-pipeline,convert-bufferization-to-memref";

// Stage 3: loops -> LLVM dialect. convert-vector-to-scf (unrolled) runs before
// convert-scf-to-cf: it lowers the n-D vector transfers of the matmul tiles.
// kStage3Parallel first (CompileOptions::parallel): the matmuls' scf.forall
// strips become omp.parallel + omp.wsloop; canonicalize right after
// convert-scf-to-openmp inlines the memref.alloca_scope it wraps the loop body
// in (else convert-scf-to-cf splits that region into several blocks, which
// alloca_scope rejects); convert-openmp-to-llvm at the end.
const char* kStage3Parallel =
    "func.func(scf-forall-to-parallel),convert-scf-to-openmp,canonicalize,";
const char* kStage3 =
    "func.func(convert-linalg-to-loops),convert-vector-to-scf{full-unroll=true},lower-affine,"
    "convert-scf-to-cf,canonicalize,cse,convert-vector-to-llvm,"
    "expand-strided-metadata,lower-affine,convert-math-to-llvm,convert-arith-to-llvm,convert-index-"
    "to-llvm,"
    "finalize-memref-to-llvm,convert-ub-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,"
    "RECONCILE";
const char* kStage3End = "reconcile-unrealized-casts";
const char* kStage3ParallelEnd = "convert-openmp-to-llvm,reconcile-unrealized-casts";

std::string stage3(bool parallel) {
  std::string s = std::string(parallel ? kStage3Parallel : "") + kStage3;
  s.replace(s.find("RECONCILE"), 9, parallel ? kStage3ParallelEnd : kStage3End);
  return s;
}

std::once_flag g_init_once;
void init_llvm() {
  std::call_once(g_init_once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    mlir::registerAllPasses();
  });
}

std::unique_ptr<mlir::MLIRContext> make_context() {
  mlir::DialectRegistry registry;
  mlir::registerAllDialects(registry);
  mlir::registerAllExtensions(registry);
  mlir::registerAllToLLVMIRTranslations(registry);
  auto ctx = std::make_unique<mlir::MLIRContext>(registry, mlir::MLIRContext::Threading::DISABLED);
  ctx->loadAllAvailableDialects();
  return ctx;
}

// Collects diagnostics into a string while alive.
class DiagCollector {
 public:
  explicit DiagCollector(mlir::MLIRContext* ctx)
      : handler_(ctx->getDiagEngine().registerHandler([this](mlir::Diagnostic& d) {
          llvm::raw_string_ostream os(text_);
          os << d.getLocation() << ": " << d << "\n";
          for (auto& n : d.getNotes()) os << "  note: " << n << "\n";
          return mlir::success();
        })),
        ctx_(ctx) {}
  ~DiagCollector() { ctx_->getDiagEngine().eraseHandler(handler_); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  mlir::DiagnosticEngine::HandlerID handler_;
  mlir::MLIRContext* ctx_;
};

[[noreturn]] void fail(const std::string& what, const DiagCollector& diags) {
  std::string t = diags.text();
  if (t.size() > 4000) t = t.substr(0, 4000) + "...";
  throw std::runtime_error("static_graph: " + what + "\n" + t);
}

void dump(mlir::ModuleOp module, const std::string& name) {
  const char* dir = std::getenv("TOUCHSTONE_STATIC_GRAPH_DUMP");
  if (!dir || !*dir) return;
  std::error_code ec;
  llvm::raw_fd_ostream os(std::string(dir) + "/" + name + ".mlir", ec);
  if (!ec) module->print(os);
}

void run_pipeline(mlir::ModuleOp module, const char* pipeline, const char* stage,
                  const DiagCollector& diags) {
  dump(module, std::string("before_") + stage);
  mlir::PassManager pm(module->getContext(), mlir::ModuleOp::getOperationName());
  std::string err;
  llvm::raw_string_ostream es(err);
  if (mlir::failed(mlir::parsePassPipeline(pipeline, pm, es))) {
    throw std::runtime_error(std::string("static_graph: bad pass pipeline (") + stage +
                             "): " + err);
  }
  if (mlir::failed(pm.run(module))) fail(std::string("pass pipeline failed at ") + stage, diags);
}

void set_public(mlir::ModuleOp module, bool pub) {
  module->walk([&](mlir::func::FuncOp f) {
    if (!f.isExternal())
      f.setVisibility(pub ? mlir::SymbolTable::Visibility::Public
                          : mlir::SymbolTable::Visibility::Private);
  });
}

void run_stage2(mlir::ModuleOp module, const DiagCollector& diags) {
  run_pipeline(module, kStage2a, "stage2a", diags);
  set_public(module, false);
  run_pipeline(module, kStage2Drop, "stage2drop", diags);
  run_pipeline(module, kStage2b, "stage2b", diags);
  set_public(module, true);
}

mlir::OwningOpRef<mlir::ModuleOp> parse(mlir::MLIRContext* ctx, const std::string& text,
                                        const DiagCollector& diags) {
  mlir::OwningOpRef<mlir::ModuleOp> m = mlir::parseSourceString<mlir::ModuleOp>(text, ctx);
  if (!m) fail("cannot parse the graph module", diags);
  return m;
}

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string runner_utils_path() {
  for (const char* p : {"/usr/lib/llvm-22/lib/libmlir_c_runner_utils.so",
                        "/usr/lib/llvm-22/lib/libmlir_c_runner_utils.so.22.1"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return {};
}

using SetThreadsFn = void (*)(int);
SetThreadsFn g_set_threads = nullptr;

}  // namespace

const std::string& openmp_runtime() {
  static const std::string path = [] {
    if (const char* off = std::getenv("TOUCHSTONE_STATIC_GRAPH_NO_OPENMP"); off && *off)
      return std::string();
    for (const char* p : {"/usr/lib/llvm-22/lib/libomp.so.5", "/usr/lib/llvm-22/lib/libomp.so",
                          "/usr/lib/x86_64-linux-gnu/libomp.so.5", "libomp.so.5"}) {
      if (p[0] == '/' && !std::filesystem::exists(p)) continue;
      std::string err;
      auto lib = llvm::sys::DynamicLibrary::getPermanentLibrary(p, &err);
      if (!lib.isValid()) continue;
      void* f = lib.getAddressOfSymbol("omp_set_num_threads");
      if (!f || !lib.getAddressOfSymbol("__kmpc_fork_call")) continue;
      g_set_threads = reinterpret_cast<SetThreadsFn>(f);
      return std::string(p);
    }
    return std::string();
  }();
  return path;
}

void set_num_threads(int n) {
  if (openmp_runtime().empty() || !g_set_threads) return;
  g_set_threads(n);
}

namespace {

class EngineGraph : public CompiledGraph {
 public:
  std::unique_ptr<mlir::ExecutionEngine> engine;
  void (*fn)(void**) = nullptr;
  void call(void** args) const override { fn(args); }
};

class OrcGraph : public CompiledGraph {
 public:
  std::unique_ptr<llvm::orc::LLJIT> jit;
  void (*fn)(void**) = nullptr;
  void call(void** args) const override { fn(args); }
};

llvm::orc::JITTargetMachineBuilder host_tmb() {
  auto tmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!tmb)
    throw std::runtime_error("static_graph: cannot detect the host target: " +
                             llvm::toString(tmb.takeError()));
  tmb->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  return std::move(*tmb);
}

std::unique_ptr<CompiledGraph> load_cached(const std::string& path, const std::string& symbol) {
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf) return nullptr;
  auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(host_tmb()).create();
  if (!jit) {
    llvm::consumeError(jit.takeError());
    return nullptr;
  }
  const std::string rt = runner_utils_path();
  if (!rt.empty()) llvm::sys::DynamicLibrary::LoadLibraryPermanently(rt.c_str());
  (void)openmp_runtime();  // loaded permanently: the process generator finds __kmpc_*
  auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      (*jit)->getDataLayout().getGlobalPrefix());
  if (!gen) {
    llvm::consumeError(gen.takeError());
    return nullptr;
  }
  (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
  if (auto err = (*jit)->addObjectFile(std::move(*buf))) {
    llvm::consumeError(std::move(err));
    return nullptr;
  }
  auto sym = (*jit)->lookup(symbol);
  if (!sym) {
    llvm::consumeError(sym.takeError());
    return nullptr;
  }
  auto g = std::make_unique<OrcGraph>();
  g->fn = sym->toPtr<void (*)(void**)>();
  g->jit = std::move(*jit);
  return g;
}

// The cached object of a graph (nullptr when absent or unusable).
std::unique_ptr<CompiledGraph> load_from_cache(const std::string& cache_path,
                                               const std::string& symbol, const char* key,
                                               std::chrono::steady_clock::time_point t0) {
  int nargs = -1;
  {
    std::ifstream meta(cache_path + ".nargs");
    meta >> nargs;
  }
  if (nargs <= 0) return nullptr;
  std::unique_ptr<CompiledGraph> g = load_cached(cache_path, symbol);
  if (!g) return nullptr;
  g->lowered_num_args = nargs;
  g->from_cache = true;
  g->cache_key = key;
  g->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

// Exclusive flock(2) on a graph's lock file in the cache directory while it is
// compiled and written (no lock when the file cannot be opened).
class CacheLock {
 public:
  CacheLock(const std::string& dir, const std::string& path) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~CacheLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

std::string host_cpu_name() { return llvm::sys::getHostCPUName().str(); }

std::string pipeline_description(const CompileOptions& opt) {
  std::string s = std::string("stage1: ") + kStage1 + "\n";
  s += schedule_description(opt);
  const bool par = opt.parallel && opt.vectorize;
  s += std::string("stage2: ") + kStage2a + ", [func private]," + kStage2Drop + "," + kStage2b +
       ",[func public]" + "\nstage3: " + stage3(par) + "\nllvm: O3, host target machine" +
       (par ? ", OpenMP runtime (omp_set_num_threads per call)" : "") + "\n";
  return s;
}

void verify_module_text(const std::string& text) {
  init_llvm();
  auto ctx = make_context();
  DiagCollector diags(ctx.get());
  auto m = parse(ctx.get(), text, diags);
  if (mlir::failed(mlir::verify(m->getOperation()))) fail("module does not verify", diags);
}

std::string lower_to_buffers(const std::string& text, const CompileOptions& opt) {
  init_llvm();
  auto ctx = make_context();
  DiagCollector diags(ctx.get());
  auto m = parse(ctx.get(), text, diags);
  run_pipeline(*m, kStage1, "stage1", diags);
  if (std::string err = apply_schedule(*m, opt); !err.empty()) fail(err, diags);
  run_stage2(*m, diags);
  std::string out;
  llvm::raw_string_ostream os(out);
  m->print(os);
  return out;
}

namespace {

// The object cache key of a graph: its text, the pipeline and the host CPU
// with every feature it has (an object compiled for one CPU never loads on another).
std::string graph_cache_key(const std::string& text, const CompileOptions& opt) {
  std::string cpu = host_cpu_name();
  llvm::StringMap<bool> f = llvm::sys::getHostCPUFeatures();
  std::vector<std::string> on;
  for (auto& kv : f)
    if (kv.second) on.push_back(kv.first().str());
  std::sort(on.begin(), on.end());
  for (auto& s : on) cpu += "," + s;
  char key[32];
  std::snprintf(key, sizeof key, "%016llx",
                static_cast<unsigned long long>(
                    fnv1a(text, fnv1a(pipeline_description(opt) + cpu + "llvm22"))));
  return key;
}

// The lowered module optimised (O3) and compiled for the host by MLIR's
// ExecutionEngine, with the runner utilities and, for parallel graphs, OpenMP.
std::unique_ptr<mlir::ExecutionEngine> jit_for_host(mlir::Operation* module,
                                                    const CompileOptions& opt, bool keep_object) {
  auto tmb = host_tmb();
  auto tm = tmb.createTargetMachine();
  if (!tm) throw std::runtime_error("static_graph: cannot create the host target machine");
  auto transformer = mlir::makeOptimizingTransformer(3, 0, tm->get());
  mlir::ExecutionEngineOptions eo;
  eo.transformer = transformer;
  eo.jitCodeGenOptLevel = llvm::CodeGenOptLevel::Aggressive;
  const std::string rt = runner_utils_path();
  llvm::SmallVector<llvm::StringRef, 2> libs;
  if (!rt.empty()) libs.push_back(rt);
  if (opt.parallel) libs.push_back(openmp_runtime());
  eo.sharedLibPaths = libs;
  eo.enableObjectDump = keep_object;
  auto engine = mlir::ExecutionEngine::create(module, eo, std::move(*tm));
  if (!engine) {
    throw std::runtime_error("static_graph: ExecutionEngine::create failed: " +
                             llvm::toString(engine.takeError()));
  }
  return std::move(*engine);
}

// Writes the compiled object (and the lowered argument count) to the cache,
// atomically (a temporary file renamed), for other processes to load.
void store_in_cache(mlir::ExecutionEngine& engine, const std::string& cache_dir,
                    const std::string& cache_path, int lowered_args) {
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  const std::string tmp = cache_path + ".tmp" + std::to_string(::getpid());
  std::ofstream(cache_path + ".nargs") << lowered_args << "\n";
  engine.dumpToObjectFile(tmp);
  std::filesystem::rename(tmp, cache_path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

std::unique_ptr<CompiledGraph> compile_graph(const std::string& text, const std::string& func_name,
                                             const CompileOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  init_llvm();
  CompileOptions opt = options;
  opt.parallel = opt.parallel && opt.vectorize && !openmp_runtime().empty();
  const std::string symbol = "_mlir__mlir_ciface_" + func_name;
  const std::string key = graph_cache_key(text, opt);
  std::string cache_path;
  std::unique_ptr<CacheLock> lock;
  if (!opt.cache_dir.empty()) {
    cache_path = opt.cache_dir + "/" + func_name + "-" + key + ".o";
    if (auto g = load_from_cache(cache_path, symbol, key.c_str(), t0)) return g;
    // Another process (ctest -j, parallel parity runs) may be compiling the
    // same graph right now: wait for it and load its object instead of
    // compiling the graph a second time.
    lock = std::make_unique<CacheLock>(opt.cache_dir, cache_path + ".lock");
    if (auto g = load_from_cache(cache_path, symbol, key.c_str(), t0)) return g;
  }

  auto ctx = make_context();
  DiagCollector diags(ctx.get());
  auto m = parse(ctx.get(), text, diags);
  auto lap = [t = std::chrono::steady_clock::now()]() mutable {
    const auto now = std::chrono::steady_clock::now();
    const double d = std::chrono::duration<double>(now - t).count();
    t = now;
    return d;
  };
  double times[5] = {};
  run_pipeline(*m, kStage1, "stage1", diags);
  times[0] = lap();
  if (std::string err = apply_schedule(*m, opt); !err.empty()) fail(err, diags);
  times[1] = lap();
  run_stage2(*m, diags);
  times[2] = lap();
  int lowered_args = -1;
  m->walk([&](mlir::func::FuncOp f) {
    if (f.getSymName() == func_name) lowered_args = static_cast<int>(f.getNumArguments());
  });
  const std::string s3 = stage3(opt.parallel);
  run_pipeline(*m, s3.c_str(), "stage3", diags);
  // Inline the step function into its C-interface wrapper: otherwise the
  // wrapper calls it with every memref descriptor expanded to scalars (~5000
  // arguments on the 4-bit path), and LLVM's instruction selection of that one
  // call took most of the compile time (12 s of 15 s on the 4-bit path).
  m->walk([&](mlir::LLVM::LLVMFuncOp f) {
    if (f.getSymName() == func_name) f.setAlwaysInline(true);
  });
  times[3] = lap();

  std::unique_ptr<mlir::ExecutionEngine> engine = jit_for_host(*m, opt, !cache_path.empty());
  auto fn = engine->lookupPacked("_mlir_ciface_" + func_name);
  times[4] = lap();
  if (const char* v = std::getenv("TOUCHSTONE_STATIC_GRAPH_VERBOSE"); v && *v) {
    std::fprintf(stderr,
                 "static_graph: compile stages: stage1 %.2f s, schedule %.2f s, stage2 %.2f s, "
                 "stage3 %.2f s, LLVM (O3 + codegen) %.2f s\n",
                 times[0], times[1], times[2], times[3], times[4]);
  }
  if (!fn)
    throw std::runtime_error("static_graph: lookup failed: " + llvm::toString(fn.takeError()));
  auto g = std::make_unique<EngineGraph>();
  g->fn = *fn;
  g->engine = std::move(engine);
  g->cache_key = key;
  g->lowered_num_args = lowered_args;
  if (!cache_path.empty()) store_in_cache(*g->engine, opt.cache_dir, cache_path, lowered_args);
  g->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

}  // namespace touchstone::static_graph
