// touchstone/vision/resample.h - image resizing bit for bit as Pillow's
// Image.resize(size, resample) for 8-bit "L" and "RGB" images (reducing_gap=None,
// the whole image as the box), which is what Hugging Face's image processors
// call (transformers.image_transforms.resize on a uint8 image).
//
// Source: Pillow src/libImaging/Resample.c (precompute_coeffs,
// normalize_coeffs_8bpc, ImagingResampleHorizontal_8bpc / Vertical_8bpc,
// ImagingResampleInner), unchanged in its arithmetic from Pillow 4.3 to 11:
//   scale = in / out, filterscale = max(scale, 1), support = filter support * filterscale;
//   output pixel i: center = (i + 0.5) * scale, taps xmin = max(int(center - support + 0.5), 0)
//   .. xmax = min(int(center + support + 0.5), in), weights w_x = filter((x - center + 0.5) /
//   filterscale) in double, divided by their sum, then fixed point k_x = int(w_x * 2^22 +- 0.5)
//   (rounded away from zero); pixel = clamp((2^21 + sum_x k_x * p_x) >> 22, 0, 255) in int32.
// Two passes: horizontal first (over the source rows the vertical pass reads), then
// vertical; a pass whose size does not change is skipped. The filters (support):
//   box (0.5): 1 on (-0.5, 0.5];  bilinear (1): 1 - |x|;
//   hamming (1): sin(pi x)/(pi x) * (0.54f + 0.46f cos(pi x));
//   bicubic (2): Keys' cubic with a = -0.5;  lanczos (3): sinc(x) sinc(x/3).
#pragma once

#include <string>

#include "touchstone/vision/image.h"

namespace touchstone::vision {

enum class Filter { Box, Bilinear, Hamming, Bicubic, Lanczos };

// "box", "bilinear", "hamming", "bicubic", "lanczos"; throws Error naming the others.
Filter parse_filter(const std::string& name);
const char* filter_name(Filter f);
// PIL.Image.Resampling's numbers, as processor configs store them ("resample": 2):
// LANCZOS 1, BILINEAR 2, BICUBIC 3, BOX 4, HAMMING 5; NEAREST (0) and others throw Error.
Filter filter_from_pil(int code);

// `in` resized to width x height (both >= 1) with filter f, bit for bit as
// Pillow. Throws Error for a size < 1 or an image that is not 1 or 3 channels.
Image resize(const Image& in, int width, int height, Filter f);

}  // namespace touchstone::vision
