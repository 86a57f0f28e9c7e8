// schedule.cpp - the transform-dialect matmul schedule (see schedule.h).
#include "schedule.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "llvm/TargetParser/Host.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Transform/IR/TransformDialect.h"
#include "mlir/Dialect/Transform/Interfaces/TransformInterfaces.h"
#include "mlir/Dialect/Transform/Transforms/TransformInterpreterUtils.h"
#include "mlir/Parser/Parser.h"

namespace touchstone::static_graph {
namespace {

// Transform-dialect schedule applied between stages 1 and 2 of compiler.cpp
// (generated per module by make_schedule() below, see docs/backends/static_graph.md):
//
// * every linalg.batch_matmul with M > 1 whose shapes fit a register tile is
//   tiled (scf.for over b, n, m, k: the n strip of the weights stays in cache
//   while the m tiles run over it), vectorized to vector.contract, unit dims
//   dropped, the accumulator hoisted out of the k loop (it stays in
//   registers) and the contraction lowered to vector.outerproduct (one FMA per
//   k, k in order: each output is the sequential sum over k);
// * the 4-bit/8-bit matmuls: see kScheduleQuant;
// * any other batch matmul (M = 1 on the fp32 path, shapes that do not tile)
//   keeps the fallback: generalize + interchange to (b, m, k, n), the
//   innermost loop over contiguous output columns, mul/add marked `contract`
//   so that LLVM fuses them into the same FMA as the tiled code.
//
// Bump whenever make_schedule()'s choices (tile sizes, fusion) change: it is
// part of the on-disk cache key (the templates below are too).
//
// With CompileOptions::parallel, every matmul is first tiled with
// scf.forall over independent output column strips (and the batch dim of the
// attention matmuls); the strips run on OpenMP threads (compiler.cpp). The
// strip width is fixed at compile time and every output is still the same
// sequential FMA chain over k, so results do not depend on the thread count.
const char* kScheduleVersion = "v6 forall-omp gemv-vec2";

const char* kScheduleHead = R"mlir(
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %f = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
)mlir";

// One tile configuration (all matmuls tagged sg_tile = ID).
const char* kScheduleTile = R"mlir(
    %mmID = transform.structured.match ops{["linalg.batch_matmul"]} attributes {sg_tile = ID : i64} in %root : (!transform.any_op) -> !transform.any_op
    PARTILE%tID, %lID:4 = transform.structured.tile_using_for %mmPID tile_sizes [1, MT, NT, KT] interchange = ORDER : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %tID {create_named_contraction} : !transform.any_op
    transform.apply_patterns to %f {
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    HOIST
)mlir";

// One quantized matmul (sg_qmm = ID, rewritten by block_matmul() below), its
// dequantization chain tagged sg_dq = ID: tile over (b, n, block) [or
// (block, b, n) for M = 1], fuse the dequantization into that loop (one
// block x NT columns dequantized into a small buffer, never the whole
// matrix), tile the block's matmul into MT x NT register tiles, drop the unit
// dims, vectorize both.
const char* kScheduleQuant = R"mlir(
    %qID = transform.structured.match ops{["linalg.generic"]} attributes {sg_qmm = ID : i64} in %root : (!transform.any_op) -> !transform.any_op
    %dqID = transform.structured.match attributes {sg_dq = ID : i64} in %root : (!transform.any_op) -> !transform.any_op
    PARTILE%qtID, %qlID:3 = transform.structured.tile_using_for %qPID tile_sizes OUTER interchange = OORDER : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    %fuID, %flID = transform.structured.fuse_into_containing_op %dqPID into %qlID#2 : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
    %itID, %ilID:NLOOPS = transform.structured.tile_using_for %qtID tile_sizes INNER interchange = IORDER : (!transform.any_op) -> (!transform.any_op, LOOPTYPES)
    transform.apply_patterns to %ilID#LAST {
      transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices
    } : !transform.any_op
    %ivID = transform.structured.match ops{["linalg.generic"]} in %ilID#LAST : (!transform.any_op) -> !transform.any_op
    transform.structured.vectorize %ivID : !transform.any_op
    transform.structured.vectorize %fuID : !transform.any_op
    transform.apply_patterns to %f {
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.tensor.fold_tensor_empty
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    HOIST
)mlir";

// A quantized matrix-vector product (M = 1, decode): loops over (block row,
// [nibble half,] b, n tile), n innermost, the dequantization chain fused into
// the n loop and the whole tile (one half-block x NT columns) vectorized at
// once, so that the dequantized values go from the producer's vectors straight
// into the FMAs (no tile buffer: the transfer_write/transfer_read pair folds).
// Consecutive n tiles are independent FMA chains that the core overlaps.
const char* kScheduleQuantVec = R"mlir(
    %qID = transform.structured.match ops{["linalg.generic"]} attributes {sg_qmm = ID : i64} in %root : (!transform.any_op) -> !transform.any_op
    %dqID = transform.structured.match attributes {sg_dq = ID : i64} in %root : (!transform.any_op) -> !transform.any_op
    PARTILE%qtID, %qlID:NLOOPS = transform.structured.tile_using_for %qPID tile_sizes OUTER interchange = OORDER : (!transform.any_op) -> (!transform.any_op, LOOPTYPES)
    %fuID, %flID = transform.structured.fuse_into_containing_op %dqPID into %qlID#LAST : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.apply_patterns to %qlID#LAST {
      transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices
    } : !transform.any_op
    %ivID = transform.structured.match ops{["linalg.generic"]} in %qlID#LAST : (!transform.any_op) -> !transform.any_op
    transform.structured.vectorize %ivID : !transform.any_op
    transform.apply_patterns to %f {
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.tensor.fold_tensor_empty
      transform.apply_patterns.canonicalization
    } : !transform.any_op
)mlir";

const char* kScheduleTail = R"mlir(
    transform.apply_patterns to %f {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.lower_transpose
      transform.apply_patterns.canonicalization
    } : !transform.any_op
FALLBACK    %rest = transform.structured.match ops{["linalg.batch_matmul"]} attributes {sg_fallback} in %root : (!transform.any_op) -> !transform.any_op
    %g = transform.structured.generalize %rest : (!transform.any_op) -> !transform.any_op
    %i = transform.structured.interchange %g iterator_interchange = [0, 1, 3, 2] : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
)mlir";

// Parallel column strips (CompileOptions::parallel): the op matched by %mmID
// is tiled with scf.forall (tile sizes PSIZES: the output's n dim in strips,
// the batch dim of the attention matmuls by 1); the rest of the schedule
// works on the tile (%mmPID). Only parallel dims are tiled: no reduction is
// split.
const char* kScheduleForall = R"mlir(
    %mmPID, %mmFID = transform.structured.tile_using_forall %mmID tile_sizes PSIZES : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
)mlir";

// The same for a quantized matmul, whose dequantization chain is first fused
// into the strip loop (then into the block loop inside it, as without
// strips): each thread dequantizes its own tiles.
const char* kScheduleQuantForall = R"mlir(
    %qPID, %qFID = transform.structured.tile_using_forall %qID tile_sizes PSIZES : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %dqPID, %qF2ID = transform.structured.fuse_into_containing_op %dqID into %qFID : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
)mlir";

// Fallback matmuls (sg_fbpar = ID) tiled into column strips before they are
// generalized (the tiled op keeps its sg_fallback tag).
const char* kScheduleFallbackForall = R"mlir(
    %fbID = transform.structured.match ops{["linalg.batch_matmul"]} attributes {sg_fbpar = ID : i64} in %root : (!transform.any_op) -> !transform.any_op
    %fbtID, %fbfID = transform.structured.tile_using_forall %fbID tile_sizes PSIZES : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
)mlir";

// Number of parallel strips aimed at: the host's hardware threads (at least
// 2). Part of the cache key (schedule_description).
int64_t strip_count() { return std::max<int64_t>(2, int64_t(std::thread::hardware_concurrency())); }

// Width of the parallel column strips of an N-column output: the widest
// multiple of `unit` that divides N into at least strip_count() strips, else
// `unit` itself; 0 when `unit` does not divide N (no strips: the matmul stays
// sequential). Wide strips matter for the matrix-vector (decode) matmuls: a
// strip reads each weight row as one contiguous run of its width (32-column
// strips made the fp32 decode 2x slower on one thread).
int64_t strip_width(int64_t N, int64_t unit) {
  if (unit <= 0 || N % unit != 0) return 0;
  for (int64_t c = (N / strip_count()) / unit * unit; c > unit; c -= unit) {
    if (N % c == 0) return c;
  }
  return unit;
}

// Float lanes of the host's widest vector register (AVX-512: 16, else 8).
int64_t host_vector_floats() {
  const llvm::StringMap<bool> f = llvm::sys::getHostCPUFeatures();
  auto it = f.find("avx512f");
  return it != f.end() && it->second ? 16 : 8;
}

struct TileSizes {
  int64_t m = 0, n = 0, k = 0;
  bool k_outer = false;  // loops (b, m, k, n) instead of (b, n, m, k)
  int64_t strip = 0;     // parallel column strip width (0: no scf.forall)
  bool batch = false;    // the batch dim is > 1 (tiled by 1 in the forall too)
  bool operator<(const TileSizes& o) const {
    return std::tie(m, n, k, k_outer, strip, batch) <
           std::tie(o.m, o.n, o.k, o.k_outer, o.strip, o.batch);
  }
};

// The k-loop unroll: the largest of 4, 2, 1 that divides K and is < K (0: none).
int64_t k_unroll(int64_t K) {
  for (int64_t c : {4, 2, 1}) {
    if (K % c == 0 && K > c) return c;
  }
  return 0;
}

// Register tile for y[M,N] += x[M,K] . w[K,N]: mT rows x nT columns of
// accumulators (at most `regs` vector registers), kT-fold unrolled k loop.
// m = 0 when the shapes do not fit (fallback schedule).
TileSizes pick_tiles(int64_t M, int64_t N, int64_t K, int64_t vw) {
  const int64_t regs = vw == 16 ? 16 : 8;  // accumulators: half the register file
  TileSizes t;
  if (M <= 0 || N <= 0 || K <= 0 || N % vw != 0) return t;
  if (M == 1) {
    // Matrix-vector (decode): memory bound. k outer, n inner, so that the kT
    // weight rows are read as contiguous streams; the accumulator row stays in
    // L1/L2. Only with TOUCHSTONE_STATIC_GRAPH_SCHEDULE=gemv (slower than the
    // fallback in our measurements, see the docs).
    t.m = 1;
    t.k_outer = true;
    for (int64_t c = 4 * vw; c >= vw; c -= vw) {
      if (N % c == 0) {
        t.n = c;
        break;
      }
    }
    t.k = k_unroll(K);
    if (t.k == 0) t.m = 0;
    return t;
  }
  for (int64_t c : {8, 6, 4, 3, 2, 1}) {
    if (c <= regs / 2 && M % c == 0) {
      t.m = c;
      break;
    }
  }
  for (int64_t c = regs / t.m * vw; c >= vw; c -= vw) {
    if (N % c == 0) {
      t.n = c;
      break;
    }
  }
  t.k = k_unroll(K);
  if (t.n == 0 || t.k == 0) t.m = 0;
  return t;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
}

std::string join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// A quantized matmul as the graph gives it: y = x . reshape(G) where G is the
// dequantized matrix in its block shape [g_0 .. g_{R-1}, N] (Q4: [nb, 2, 16, N],
// Q8_0: [nb, 32, N]) produced by elementwise linalg.generics, collapsed to
// [K, N] and expanded to [1, K, N]. Rewritten as one linalg.generic that
// contracts over the block dims directly (x expanded to [1, M, g_0 ..]), so
// that tiles of G are plain slices and the dequantization chain can be fused
// into the tiled loops. Iteration dims: (r_0 .. r_{R-2}, b, m, n, r_{R-1}).
// The k order (r_0, .., r_{R-1}) is the order of K: same sums as the matmul.
// Returns the new op (or null when the pattern does not match) and sets R.
mlir::linalg::GenericOp block_matmul(mlir::linalg::BatchMatmulOp mm, int64_t& R) {
  auto ex = mm.getDpsInputOperand(1)->get().getDefiningOp<mlir::tensor::ExpandShapeOp>();
  if (!ex) return {};
  auto co = ex.getSrc().getDefiningOp<mlir::tensor::CollapseShapeOp>();
  if (!co) return {};
  auto g = co.getSrc().getDefiningOp<mlir::linalg::GenericOp>();
  if (!g || g->getNumResults() != 1) return {};
  auto gt = llvm::dyn_cast<mlir::RankedTensorType>(g->getResult(0).getType());
  auto at = llvm::dyn_cast<mlir::RankedTensorType>(mm.getDpsInputOperand(0)->get().getType());
  if (!gt || !at || !gt.hasStaticShape() || !at.hasStaticShape() || gt.getRank() < 3 ||
      at.getRank() != 3 || at.getDimSize(0) != 1 || !gt.getElementType().isF32()) {
    return {};
  }
  R = gt.getRank() - 1;
  int64_t k = 1;
  for (int64_t i = 0; i < R; ++i) k *= gt.getDimSize(unsigned(i));
  if (k != at.getDimSize(2) || !ex->hasOneUse() || !co->hasOneUse()) return {};
  mlir::MLIRContext* ctx = mm->getContext();
  mlir::OpBuilder b(mm);
  const mlir::Location loc = mm.getLoc();
  llvm::SmallVector<int64_t> eshape{1, at.getDimSize(1)};
  mlir::ReassociationIndices last;
  for (int64_t i = 0; i < R; ++i) {
    eshape.push_back(gt.getDimSize(unsigned(i)));
    last.push_back(2 + i);
  }
  llvm::SmallVector<mlir::ReassociationIndices> re{{0}, {1}, last};
  auto xe = mlir::tensor::ExpandShapeOp::create(
      b, loc, mlir::RankedTensorType::get(eshape, at.getElementType()),
      mm.getDpsInputOperand(0)->get(), re);
  const int64_t D = R + 3, bd = R - 1, md = R, nd = R + 1, jd = R + 2;
  auto dim = [&](int64_t i) { return mlir::getAffineDimExpr(unsigned(i), ctx); };
  llvm::SmallVector<mlir::AffineExpr> am{dim(bd), dim(md)}, gm, cm{dim(bd), dim(md), dim(nd)};
  for (int64_t i = 0; i + 1 < R; ++i) {
    am.push_back(dim(i));
    gm.push_back(dim(i));
  }
  am.push_back(dim(jd));
  gm.push_back(dim(jd));
  gm.push_back(dim(nd));
  llvm::SmallVector<mlir::AffineMap> maps{mlir::AffineMap::get(unsigned(D), 0, am, ctx),
                                          mlir::AffineMap::get(unsigned(D), 0, gm, ctx),
                                          mlir::AffineMap::get(unsigned(D), 0, cm, ctx)};
  llvm::SmallVector<mlir::utils::IteratorType> it(size_t(D), mlir::utils::IteratorType::reduction);
  it[size_t(bd)] = it[size_t(md)] = it[size_t(nd)] = mlir::utils::IteratorType::parallel;
  auto gen = mlir::linalg::GenericOp::create(
      b, loc, mm->getResultTypes(), mlir::ValueRange{xe.getResult(), g->getResult(0)},
      mlir::ValueRange{mm.getDpsInitOperand(0)->get()}, maps, it, "", "",
      [](mlir::OpBuilder& nb, mlir::Location l, mlir::ValueRange args) {
        mlir::Value p = mlir::arith::MulFOp::create(nb, l, args[0], args[1]);
        mlir::Value s = mlir::arith::AddFOp::create(nb, l, args[2], p);
        mlir::linalg::YieldOp::create(nb, l, s);
      });
  mm->getResult(0).replaceAllUsesWith(gen->getResult(0));
  mm->erase();
  ex->erase();
  co->erase();
  return gen;
}

// Tags the elementwise producers of `op` (transitively, single-use ones only:
// they are fused into the consumer's loops) with sg_dq = id.
void tag_producers(mlir::Operation* op, mlir::IntegerAttr id) {
  for (mlir::Value v : op->getOperands()) {
    auto p = v.getDefiningOp<mlir::linalg::GenericOp>();
    if (!p || !p->hasOneUse() || p->hasAttr("sg_dq") ||
        p.getNumParallelLoops() != p.getNumLoops()) {
      continue;
    }
    p->setAttr("sg_dq", id);
    tag_producers(p, id);
  }
}

struct Quant {
  mlir::linalg::GenericOp op;
  int64_t R, M;
  TileSizes t;
};

// PARTILE of a quantized matmul's block: its parallel column strips
// (scf.forall, the dequantization chain fused into it) or plain handles.
std::string quant_partile(const Quant& Q) {
  const int64_t D = Q.R + 3, nd = Q.R + 1;
  if (Q.t.strip <= 0) {
    return "    %qPID = transform.merge_handles %qID : !transform.any_op\n"
           "    %dqPID = transform.merge_handles %dqID : !transform.any_op\n";
  }
  std::vector<int64_t> ps(size_t(D), 0);
  ps[size_t(nd)] = Q.t.strip;
  std::string par = kScheduleQuantForall;
  replace_all(par, "PSIZES", join(ps));
  // The template's %qF2ID becomes %qF2<q>, which for q = 0..9 is the same
  // name as %qFID of matmul 20..29 ("redefinition of SSA value '%qF20'"):
  // a module with more than 20 quantized matmuls (several layer signatures,
  // or the thread_order_reduction fault's split matmuls) broke the parallel
  // schedule. Renamed here, not in the template, which is part of the
  // object cache key (schedule_description).
  replace_all(par, "%qF2ID", "%qFusedID");
  return par;
}

std::string any_ops(size_t n) {
  std::string types;
  for (size_t i = 0; i < n; ++i) types += (i ? ", " : "") + std::string("!transform.any_op");
  return types;
}

// Matrix-vector (M = 1) block, kScheduleQuantVec: loops (r_0 .. r_{R-2}, b, n)
// with tile 1 each and NT columns; r_{R-1} (16 or 32 rows) and m stay whole.
std::string quant_block_vec(const Quant& Q, size_t q) {
  const int64_t R = Q.R, D = R + 3, bd = R - 1, nd = R + 1;
  std::vector<int64_t> outer(size_t(D), 0), order;
  for (int64_t i = 0; i + 1 < R; ++i) {
    outer[size_t(i)] = 1;
    order.push_back(i);
  }
  outer[size_t(bd)] = 1;
  outer[size_t(nd)] = Q.t.n;
  order.push_back(bd);
  order.push_back(nd);
  const size_t n_loops = order.size();
  for (int64_t i = 0; i < D; ++i)
    if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
  std::string block = kScheduleQuantVec;
  replace_all(block, "PARTILE", quant_partile(Q));
  replace_all(block, "ID", std::to_string(q));
  replace_all(block, "OUTER", join(outer));
  replace_all(block, "OORDER", join(order));
  replace_all(block, "NLOOPS", std::to_string(n_loops));
  replace_all(block, "LOOPTYPES", any_ops(n_loops));
  replace_all(block, "LAST", std::to_string(n_loops - 1));
  return block;
}

// Block of a quantized matmul with M > 1 (kScheduleQuant): register tiles of
// MT rows inside (b, n, block) loops, the dequantized tile in a small buffer.
std::string quant_block_tiled(const Quant& Q, size_t q) {
  const int64_t R = Q.R, D = R + 3, bd = R - 1, md = R, nd = R + 1, jd = R + 2;
  std::vector<int64_t> outer(size_t(D), 0), inner(size_t(D), 0), oorder, iorder;
  outer[0] = 1;  // one block row of the matrix per iteration
  outer[size_t(bd)] = 1;
  outer[size_t(nd)] = Q.t.n;
  // M = 1: block rows outer (each block's NT-column slices are contiguous
  // streams); else columns outer (the accumulator [M, NT] stays in cache).
  oorder = Q.M == 1 ? std::vector<int64_t>{0, bd, nd} : std::vector<int64_t>{bd, nd, 0};
  inner[size_t(md)] = Q.t.m;
  iorder.push_back(md);
  for (int64_t i = 1; i + 1 < R; ++i) {
    inner[size_t(i)] = 1;
    iorder.push_back(i);
  }
  inner[size_t(jd)] = Q.t.k;
  iorder.push_back(jd);
  const size_t n_inner = iorder.size();
  for (int64_t i = 0; i < D; ++i) {
    if (std::find(oorder.begin(), oorder.end(), i) == oorder.end()) oorder.push_back(i);
    if (std::find(iorder.begin(), iorder.end(), i) == iorder.end()) iorder.push_back(i);
  }
  std::string hoist;
  // The accumulator is invariant in every inner loop but the m loop.
  for (size_t i = n_inner; i-- > 1;) {
    hoist += "transform.loop.hoist_loop_invariant_subsets %il" + std::to_string(q) + "#" +
             std::to_string(i) + " : !transform.any_op\n    ";
  }
  std::string block = kScheduleQuant;
  replace_all(block, "PARTILE", quant_partile(Q));
  replace_all(block, "ID", std::to_string(q));
  replace_all(block, "OUTER", join(outer));
  replace_all(block, "OORDER", join(oorder));
  replace_all(block, "INNER", join(inner));
  replace_all(block, "IORDER", join(iorder));
  replace_all(block, "NLOOPS", std::to_string(n_inner));
  replace_all(block, "LOOPTYPES", any_ops(n_inner));
  replace_all(block, "LAST", std::to_string(n_inner - 1));
  replace_all(block, "HOIST", hoist);
  return block;
}

// TOUCHSTONE_STATIC_GRAPH_SCHEDULE (experiments, part of the cache key):
// "interchange" = every matmul takes the fallback schedule; "gemv" = the
// matrix-vector (M = 1) ones are tiled too (k outer), which measured slower than
// the fallback (LLVM's own vectorization of the contiguous n loop), hence off.
std::string schedule_variant() {
  const char* v = std::getenv("TOUCHSTONE_STATIC_GRAPH_SCHEDULE");
  return v ? v : "";
}

// The dequantizing matmuls (a block-quantized weight feeding a batch matmul):
// each tagged sg_qmm = its index, with the tile sizes of its schedule.
std::vector<Quant> tag_quantized(mlir::ModuleOp module, int64_t vw, const std::string& variant,
                                 bool parallel) {
  std::vector<Quant> quants;
  if (variant == "interchange" || variant == "no-fuse") return quants;
  mlir::MLIRContext* ctx = module->getContext();
  llvm::SmallVector<mlir::linalg::BatchMatmulOp> mms;
  module->walk([&](mlir::linalg::BatchMatmulOp mm) { mms.push_back(mm); });
  for (auto mm : mms) {
    auto at = llvm::dyn_cast<mlir::RankedTensorType>(mm.getDpsInputOperand(0)->get().getType());
    auto bt = llvm::dyn_cast<mlir::RankedTensorType>(mm.getDpsInputOperand(1)->get().getType());
    if (!at || !bt || !at.hasStaticShape() || !bt.hasStaticShape()) continue;
    const int64_t M = at.getDimSize(1), N = bt.getDimSize(2);
    TileSizes t = pick_tiles(M, N, at.getDimSize(2), vw);
    // The dequantized tile (one block x NT columns) is a vector of 32 * NT
    // floats, lowered fully unrolled: NT = one vector register keeps the LLVM
    // code (and compile time) small. M = 1: one row per register tile.
    if (M == 1) t = TileSizes{1, N % vw == 0 ? vw : 0, 0};
    if (t.n > vw && N % vw == 0) {
      t.m = std::min<int64_t>(t.m * t.n / vw, 8);
      while (M % t.m) --t.m;
      t.n = vw;
    }
    if (t.m == 0 || t.n == 0) continue;
    // M = 1: two vector widths of columns per tile (two independent FMA
    // chains per iteration): 1.03 s CPU per 64 decoded tokens vs 1.25 s
    // (one width) and 1.12 s (four), 2026-11-26.
    const int64_t wide = variant == "qvec1" ? 1 : variant == "qvec4" ? 4 : 2;
    if (M == 1 && N % (wide * vw) == 0) t.n = wide * vw;
    if (parallel) t.strip = strip_width(N, t.n);
    int64_t R = 0;
    mlir::linalg::GenericOp g = block_matmul(mm, R);
    if (!g) continue;
    auto last = llvm::dyn_cast<mlir::RankedTensorType>(g->getOperand(1).getType());
    t.k = last.getDimSize(unsigned(R - 1)) % 4 == 0 ? 4 : 1;  // unroll of the innermost block dim
    const auto id = mlir::IntegerAttr::get(mlir::IntegerType::get(ctx, 64), int64_t(quants.size()));
    g->setAttr("sg_qmm", id);
    tag_producers(g, id);
    quants.push_back(Quant{g, R, M, t});
  }
  return quants;
}

// The plain batch matmuls: tagged sg_tile = id of their tile configuration, or
// sg_fallback (with sg_fbpar = id of its parallel strip configuration).
struct MatmulConfigs {
  std::map<TileSizes, int64_t> tiles;
  std::map<std::pair<int64_t, bool>, int64_t> fallbacks;  // (strip, batch) -> id
};

MatmulConfigs tag_matmuls(mlir::ModuleOp module, int64_t vw, const std::string& variant,
                          bool parallel) {
  MatmulConfigs c;
  mlir::MLIRContext* ctx = module->getContext();
  module->walk([&](mlir::linalg::BatchMatmulOp mm) {
    auto a = llvm::dyn_cast<mlir::RankedTensorType>(mm.getDpsInputOperand(0)->get().getType());
    auto b = llvm::dyn_cast<mlir::RankedTensorType>(mm.getDpsInputOperand(1)->get().getType());
    TileSizes t;
    if (a && b && a.hasStaticShape() && b.hasStaticShape())
      t = pick_tiles(a.getDimSize(1), b.getDimSize(2), a.getDimSize(2), vw);
    if (variant == "interchange" || (variant != "gemv" && t.k_outer)) t.m = 0;
    const bool batch = a && a.hasStaticShape() && a.getDimSize(0) > 1;
    if (t.m == 0) {
      mm->setAttr("sg_fallback", mlir::UnitAttr::get(ctx));
      const int64_t strip =
          parallel && b && b.hasStaticShape() ? strip_width(b.getDimSize(2), vw) : 0;
      if (strip > 0 || (parallel && batch)) {
        const auto key = std::make_pair(strip, batch);
        auto it = c.fallbacks.emplace(key, int64_t(c.fallbacks.size())).first;
        mm->setAttr("sg_fbpar",
                    mlir::IntegerAttr::get(mlir::IntegerType::get(ctx, 64), it->second));
      }
      return;
    }
    if (parallel) {
      t.strip = strip_width(b.getDimSize(2), t.n);
      t.batch = batch;
    }
    auto it = c.tiles.emplace(t, int64_t(c.tiles.size())).first;
    mm->setAttr("sg_tile", mlir::IntegerAttr::get(mlir::IntegerType::get(ctx, 64), it->second));
  });
  return c;
}

// The transform script of one tile configuration.
std::string tile_block(const TileSizes& t, int64_t id) {
  std::string block = kScheduleTile;
  std::string par = "    %mmPID = transform.merge_handles %mmID : !transform.any_op\n";
  if (t.strip > 0 || t.batch) {
    par = kScheduleForall;
    replace_all(par, "PSIZES", join({t.batch ? 1 : 0, 0, t.strip}));
  }
  replace_all(block, "PARTILE", par);
  replace_all(block, "ID", std::to_string(id));
  replace_all(block, "MT", std::to_string(t.m));
  replace_all(block, "NT", std::to_string(t.n));
  replace_all(block, "KT", std::to_string(t.k));
  replace_all(block, "ORDER", t.k_outer ? "[0, 1, 3, 2]" : "[0, 2, 1, 3]");
  // k innermost: the accumulator tile is loop-invariant there (registers).
  replace_all(block, "HOIST",
              t.k_outer ? ""
                        : "transform.loop.hoist_loop_invariant_subsets %l" + std::to_string(id) +
                              "#3 : !transform.any_op");
  return block;
}

// Tags every batch matmul with its tile configuration (sg_tile = id) or
// sg_fallback and returns the transform script for the module.
std::string make_schedule(mlir::ModuleOp module, bool parallel) {
  const int64_t vw = host_vector_floats();
  const std::string variant = schedule_variant();
  const std::vector<Quant> quants = tag_quantized(module, vw, variant, parallel);
  const MatmulConfigs c = tag_matmuls(module, vw, variant, parallel);
  std::string script = kScheduleHead;
  for (const auto& [t, id] : c.tiles) script += tile_block(t, id);
  for (size_t q = 0; q < quants.size(); ++q)
    script += quants[q].M == 1 && variant != "gemv-tiled" ? quant_block_vec(quants[q], q)
                                                          : quant_block_tiled(quants[q], q);
  std::string fallback;
  for (const auto& [key, id] : c.fallbacks) {
    std::string block = kScheduleFallbackForall;
    replace_all(block, "PSIZES", join({key.second ? 1 : 0, 0, key.first}));
    replace_all(block, "ID", std::to_string(id));
    fallback += block;
  }
  std::string tail = kScheduleTail;
  replace_all(tail, "FALLBACK", fallback);
  return script + tail;
}

}  // namespace

std::string apply_schedule(mlir::ModuleOp module, const CompileOptions& opt) {
  if (!opt.vectorize) return {};
  mlir::MLIRContext* ctx = module->getContext();
  const std::string text = make_schedule(module, opt.parallel);
  mlir::OwningOpRef<mlir::ModuleOp> script = mlir::parseSourceString<mlir::ModuleOp>(text, ctx);
  if (!script) return "cannot parse the transform schedule";
  mlir::transform::TransformOpInterface entry = mlir::transform::detail::findTransformEntryPoint(
      script->getOperation(), *script,
      mlir::transform::TransformDialect::kTransformEntryPointSymbolName);
  if (!entry) return "transform schedule has no entry point";
  mlir::transform::TransformOptions topts;
  if (mlir::failed(mlir::transform::applyTransformNamedSequence(
          module.getOperation(), entry.getOperation(), *script, topts))) {
    return "transform schedule failed";
  }
  // The fallback matmuls' multiply-add may contract to an FMA: every matmul
  // then rounds like the tiled ones (fma(x, w, acc), k in order), so a row
  // gives the same bits whether it runs in a prefill bucket or alone in the
  // decode graph (StaticGraphModel.RewindReproducesLogits).
  const auto contract =
      mlir::arith::FastMathFlagsAttr::get(ctx, mlir::arith::FastMathFlags::contract);
  // (structured.generalize drops the sg_fallback tag: match the interchanged
  // (b, m, k, n) form instead.)
  using IT = mlir::utils::IteratorType;
  const llvm::SmallVector<IT> fallback_iters{IT::parallel, IT::parallel, IT::reduction,
                                             IT::parallel};
  module->walk([&](mlir::linalg::GenericOp g) {
    if (llvm::SmallVector<IT>(g.getIteratorTypesArray()) != fallback_iters) return;
    g.getRegion().walk([&](mlir::Operation* op) {
      if (auto m = llvm::dyn_cast<mlir::arith::MulFOp>(op)) m.setFastmathAttr(contract);
      if (auto a = llvm::dyn_cast<mlir::arith::AddFOp>(op)) a.setFastmathAttr(contract);
    });
  });
  if (const char* dir = std::getenv("TOUCHSTONE_STATIC_GRAPH_DUMP"); dir && *dir) {
    std::ofstream(std::string(dir) + "/schedule.mlir") << text;
  }
  return {};
}

std::string schedule_description(const CompileOptions& opt) {
  if (!opt.vectorize) return {};
  return std::string("transform (") + kScheduleVersion + " " + schedule_variant() +
         (opt.parallel ? " parallel strips >= " + std::to_string(strip_count()) : " sequential") +
         ", per tile configuration, host vector " + std::to_string(host_vector_floats()) +
         " floats): " + kScheduleHead + kScheduleTile + kScheduleQuant + kScheduleQuantVec +
         kScheduleTail +
         (opt.parallel
              ? std::string(kScheduleForall) + kScheduleQuantForall + kScheduleFallbackForall
              : std::string()) +
         "\n";
}

}  // namespace touchstone::static_graph
