// touchstone/vision/image_splitting.h - Idefics3 / SmolVLM's image processor: an image
// resized, split into tiles of the vision encoder's size plus a global view.
//
// Source: transformers models/idefics3/image_processing_pil_idefics3.py
// (Idefics3ImageProcessorPil, the PIL backend; every resize is PIL's on uint8 RGB,
// touchstone/vision/resample.h), for one image:
//  1. resize so that the longest edge is `longest_edge` (size["longest_edge"]):
//     aspect = w / h (double); w >= h: w' = L, h' = int(w' / aspect), + 1 if odd; else
//     h' = L, w' = int(h' * aspect), + 1 if odd; each at least 1; then scaled below 4096
//     the same way without the evening (_resize_output_size_scale_below_upper_bound);
//  2. resize to multiples of the tile size M (max_image_size["longest_edge"],
//     resize_for_vision_encoder): w >= h: w'' = ceil(w' / M) M, h'' = ceil(int(w'' /
//     aspect') / M) M (aspect' = w' / h'); else symmetrically;
//  3. if h'' > M or w'' > M: the (h'' / M) x (w'' / M) tiles, row by row, then the whole
//     image resized to M x M (the global view, last); else the image itself;
//  4. each frame rescaled and normalised (preprocess.h's rescale_normalize).
// The filter is the processor's (LANCZOS by default). One image needs no padding (every
// frame is M x M).
#pragma once

#include <vector>

#include "touchstone/vision/image.h"
#include "touchstone/vision/preprocess.h"

namespace touchstone::vision {

struct SplittingProcessor {
  int longest_edge = 4 * 364;  // size["longest_edge"]
  int tile = 364;              // max_image_size["longest_edge"]: the encoder's image size
  Filter resample = Filter::Lanczos;
  double rescale_factor = 0.00392156862745098;
  std::array<double, 3> mean{0.5, 0.5, 0.5}, std{0.5, 0.5, 0.5};
};

// The frames of one image (after convert_to_rgb): tiles row by row, then the global view
// (or the one resized image when it fits one tile), each 3 x tile x tile. Throws Error
// for a tile or longest edge below 1.
std::vector<PixelValues> split_image(const Image& image, const SplittingProcessor& p);

// split_image's frames with the grid they came from: rows x cols tiles, then the global
// view; rows = cols = 0 when the image is one frame (HF's image_inputs["rows"], ["cols"],
// which Idefics3Processor's prompt needs: touchstone/vision/image_prompt.h).
struct SplitImage {
  std::vector<PixelValues> frames;
  int rows = 0, cols = 0;
};
SplitImage split_image_grid(const Image& image, const SplittingProcessor& p);

}  // namespace touchstone::vision
