// touchstone/harness/multimodal.h - multimodal.serving: image-bearing sequences under
// the serving calls (ABI v6 step_batch / fork_session with ABI v8 input embeddings;
// docs/vision.md). The failure it is built for: a serving engine that keys cached or
// batched image state by the placeholder tokens (the same for every image), so one
// request's image leaks into another's (vLLM's multimodal prefix-cache hash), or loses
// the image rows of a sequence when it is batched or forked.
#pragma once

#include "touchstone/golden/golden.h"
#include "touchstone/harness/parity.h"
#include "touchstone/harness/serving.h"
#include "touchstone/runtime/backend.h"

namespace touchstone {

// Two image cases with the same text prompt and different images (a, b). Each is run
// alone: its prompt with the image (prefill_case_prompt), then up to `steps` decodes
// teacher-forced on its golden continuation. Then:
//   - batched: both prompts prefilled, then the same decodes as entries of one
//     step_batch call per step, beside a text-only filler (a's prompt without its image
//     tokens, decoding a's continuation): each image sequence's rows against its own
//     alone run;
//   - forked (a backend with its own fork_session): a's session rewound to its prompt's
//     end and forked there, the fork decoding a's continuation while the source decodes
//     other tokens at the same positions, each right after the fork's step: the fork's
//     rows against a's alone run.
// The two images' alone rows must differ (else nothing could be told apart: FAIL).
// Bits where opt claims them (batch_invariant for the batch, fork_bitwise for the
// fork), else the profile. One CaseResult, "multimodal.serving". Backend errors
// propagate (BackendError).
CaseResult check_multimodal_serving(const BackendModel& model, const GoldenCase& a,
                                    const GoldenCase& b, const Profile& profile,
                                    const ServingOptions& opt, int steps = 8);

// multimodal.consistency: an image the family attends causally (Idefics3; not a
// bidirectional block, which must be one call) split across more prefill_embeddings
// calls than its frames. The case's prompt is run as the parity run gives it (each
// frame one call) and again with each frame's rows in calls of 1, 3 and 7 rows (the
// text between frames as before), then `steps` decodes teacher-forced on its golden
// continuation: the rows at each frame's end, the prompt's end and each decode must
// agree within the profile (the computation order legitimately differs, as in
// consistency.chunked_prefill) and keep the argmax unless the top-2 margin is a near
// tie. The failure it is built for: an engine that loses an image's positions or KV
// rows when the image is cut into batches (positions restarted per call, a chunk's
// rows not attending the image's earlier rows). Golden-free: the golden gives only the
// image's embeddings and the continuation. One CaseResult, "multimodal.consistency";
// Error for a case without an image or with a bidirectional one.
CaseResult check_image_split(const BackendModel& model, const GoldenCase& g, const Profile& profile,
                             const BackendSessionOptions& so, int steps = 4);

}  // namespace touchstone
