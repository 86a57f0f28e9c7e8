// touchstone/golden/golden.h - golden files: what the scalar reference recorded.
//
// A golden file is an HDF5 file (layout: docs/golden-format.md) holding, per
// prompt ("case"), the greedy continuation, the full logits of the first F
// steps and the top-K logits + log-sum-exp of every step, and per scoring
// passage the teacher-forced top-K / target logits. All I/O errors throw
// touchstone::Error naming the file and the HDF5 object.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/golden/manifest.h"

namespace touchstone {

// 2: cases may carry layer taps (tap_steps, taps); 3: cases may carry an image
// (image_*); 4: an image may be several frames at several places (image_frames,
// Idefics3's tiles). A file is written with the lowest version its content needs (2
// without images, 3 with one-frame images), so older goldens stay byte-identical.
// Version-1 files are still read.
inline constexpr int kGoldenFormatVersion = 4;
inline constexpr int kGoldenImageFormatVersion = 3;
inline constexpr int kGoldenTextFormatVersion = 2;
inline constexpr int kGoldenOldestFormatVersion = 1;
inline constexpr int kTapPoints = 3;  // attention output, FFN output, residual (TS_TAP_*)

struct GoldenCase {
  std::string name;
  std::string prompt_text;          // exact text given to the tokenizer (after chat templating)
  bool chat = false;                // prompt was built with the ChatML template
  std::vector<int32_t> prompt_ids;  // [P]
  std::vector<int32_t> greedy_ids;  // [G] greedy continuation
  std::string greedy_text;          // decoded bytes of greedy_ids (arbitrary bytes)
  int32_t n_vocab = 0;
  int32_t top_k = 0;               // K
  int32_t n_full_steps = 0;        // F <= G
  std::vector<float> full_logits;  // [F, n_vocab]: step s = logits that predicted greedy_ids[s]
  std::vector<int32_t> topk_ids;   // [G, K] per step, descending by logit, ties -> lower id
  std::vector<float> topk_logits;  // [G, K]
  std::vector<double> lse;         // [G] natural-log log-sum-exp of the full logits row
  // Layer taps (format 2, optional; empty = none): for each step s in tap_steps,
  // the reference's activations at the position whose logits are step s's
  // (the last prompt token for s = 0, else the position of greedy_ids[s-1]):
  // [T, tap_layers, kTapPoints, tap_dim] float32, point order TS_TAP_*.
  std::vector<int32_t> tap_steps;  // [T] strictly ascending, each < G
  int32_t tap_layers = 0, tap_dim = 0;
  std::vector<float> taps;
  // Floats of one step's record, tap_layers * kTapPoints * tap_dim.
  size_t tap_record_size() const { return size_t(tap_layers) * kTapPoints * size_t(tap_dim); }
  // Structured output (optional; grammar_kind "" = none, docs/structured-output.md):
  // greedy_ids is the constrained continuation (argmax over the allowed set; it
  // ends with a stop token, or where the grammar is complete, or at n_predict);
  // allowed_masks[s] is the grammar oracle's allowed set at step s, [G, W]
  // uint32, W = mask_words(): token t allowed <=> bit t % 32 of word t / 32.
  std::string grammar_kind;  // "json_schema" | "gbnf" | "regex"
  std::string grammar_text;
  std::vector<uint32_t> allowed_masks;
  bool has_grammar() const { return !grammar_kind.empty(); }
  size_t mask_words() const { return (size_t(n_vocab) + 31) / 32; }
  // Image input (format 3, optional; image_tokens 0 = none; docs/vision.md): the
  // prompt's positions [image_at, image_at + image_tokens) hold the image's embeddings
  // (the reference's vision tower and projector) in place of tokens: the image goes
  // before prompt_ids[image_at] (0 < image_at < P), so the sequence is P + image_tokens
  // long. bidirectional: the block attends both ways (Gemma 3).
  // image_frames (format 4, Idefics3: F > 1 frames, each image_tokens / F rows): frame f
  // goes before prompt_ids[image_frames[f]], non-decreasing, image_frames[0] = image_at;
  // empty for one frame. The sequence is still P + image_tokens long.
  int32_t image_at = 0, image_tokens = 0, image_dim = 0;
  int32_t image_bidirectional = 0;
  std::vector<int32_t> image_frames;
  std::vector<float> image_embeddings;  // [image_tokens, image_dim] float32
  std::string image_sha256;             // the image file's bytes
  std::string pixels_sha256;            // the processor's pixel tensor (float32 LE, 3 x H x W)
  std::string mmproj_sha256;            // the mmproj GGUF the tower came from
  bool has_image() const { return image_tokens > 0; }
  // Where each frame goes ({image_at} for one frame) and its rows.
  std::vector<int32_t> frame_positions() const {
    return image_frames.empty() ? std::vector<int32_t>{image_at} : image_frames;
  }
  int32_t frame_rows() const { return image_tokens / int32_t(frame_positions().size()); }
  // The format a file with this case needs.
  int needed_format() const {
    return image_frames.size() > 1 ? kGoldenFormatVersion
                                   : (has_image() ? kGoldenImageFormatVersion : 0);
  }
};

struct GoldenScoring {  // teacher-forced passage
  std::string name;
  std::string text;
  std::vector<int32_t> token_ids;  // [N]
  int32_t n_vocab = 0, top_k = 0;
  std::vector<int32_t>
      topk_ids;  // [N-1, K] row i = logits at position i (predicting token_ids[i+1])
  std::vector<float> topk_logits;    // [N-1, K]
  std::vector<double> lse;           // [N-1]
  std::vector<float> target_logits;  // [N-1] logit of token_ids[i+1] at position i
};

struct GoldenFile {
  int format_version = kGoldenTextFormatVersion;  // kGoldenFormatVersion with an image
  std::string model_name, model_sha256, reference_version, reference_revision;
  std::vector<GoldenCase> cases;
  std::vector<GoldenScoring> scoring;

  // The lowest format_version its cases need (kGoldenTextFormatVersion without images).
  int needed_format() const {
    int v = kGoldenTextFormatVersion;
    for (const GoldenCase& c : cases) v = std::max(v, c.needed_format());
    return v;
  }
  // nullptr when absent.
  const GoldenCase* find_case(std::string_view name) const;
  const GoldenScoring* find_scoring(std::string_view name) const;
};

// Checks every shape against the others (sizes == G*K etc., F <= G,
// 0 <= K <= n_vocab, ids in [0, n_vocab)), names valid as HDF5 group names
// (non-empty, no '/', not "." or ".."), no duplicate names. Throws Error
// prefixed with `where` naming the case and field. Used by write and read.
void validate_golden(const GoldenFile& g, const std::string& where);

// Builds the whole file in memory (HDF5 core driver), stamps the header, then
// writes it crash-safely: "<dir>/.<name>.tmp-<pid>", write, fsync, close,
// rename over `path`, fsync the directory. ENOSPC, EIO or a kill leave `path`
// as it was; errors name the file and the errno text. Never touches libhdf5's
// file I/O, so a failed write cannot crash libhdf5's exit-time cleanup.
void write_golden_file(const std::string& path, const GoldenFile& g);

// Removes temp files of killed writers next to `path` (".<name>.tmp-<pid>"
// and the older "<name>.tmp.<pid>" whose pid is not running); returns them.
std::vector<std::string> remove_stale_golden_temps(const std::string& path);

// Reads the whole file, checks its header (512-byte user block: size and
// sha256 of the rest) and only then parses the bytes in memory with libhdf5.
// Without `trust`, a file without a valid header (damaged magic, truncated,
// written by another tool) is refused before libhdf5 sees a byte. A header
// that is present but does not match the content is refused even with
// `trust`. Throws Error naming the file and the dataset/attribute (and
// expected vs actual shape/dtype) on anything malformed.
GoldenFile read_golden_file(const std::string& path, bool trust = false);

// The same on bytes already in memory; `where` names them in errors.
GoldenFile parse_golden_bytes(const std::string& where, const std::string& bytes,
                              bool trust = false);

// The golden of `model` (manifest.resolve(model.golden)), checked against the
// manifest's pin before anything else: the file's sha256 must equal
// model.golden_sha256, else Error naming the file, both hashes and the fix
// (re-record with `touchstone golden`, or --trust-goldens). A model without a
// pin is refused too. `trust` skips the pin and the header requirement
// (as read_golden_file).
GoldenFile read_pinned_golden(const Manifest& manifest, const ManifestModel& model, bool trust);

// Lower-case hex sha256 (OpenSSL).
std::string sha256_hex(std::string_view bytes);

// `bytes` (an HDF5 file with a 512-byte user block) with the header stamped
// into the user block. For tools and fuzzers that build golden bytes.
std::string stamp_golden_header(std::string bytes);

// Bit-for-bit comparison used by `touchstone golden --check`: human-readable
// differences, empty = identical. Compares every field (floats by bit
// pattern), naming case + field + first differing index.
std::vector<std::string> diff_golden(const GoldenFile& committed, const GoldenFile& fresh);

}  // namespace touchstone
