// Two runs that must differ by rounding only (a CUDA run against the same run on CPU, a padded run
// against an unpadded one, bf16 against fp32), compared with bounds derived from the arithmetic, not
// picked: tight enough that a wrong update fails them, which tests/rounding_bounds_test.cpp shows on CPU
// with LLM_DEBUG_PERTURB_UPDATE (optim/shard_optimizer.cpp).
//
// The derivation (u: the unit roundoff of what rounds most in the run, 2^-8 when anything is bf16,
// 2^-24 in fp32; S: the sum of the steps' learning rates, read from the train records):
//   - loss: at step 1 the weights are equal and only the forward rounds (a floor: one rounding of each
//     logit, about 2 u max|z| per token, averaged over the tokens); later the loss moves because the
//     weights move, and each weight's update is computed to about u relative, so the loss's movement
//     is too: |dL_t| <= K u |L_t - L_1| + floor;
//   - the gradient norm: |d norm| <= K u norm;
//   - weights: Adam's step-1 update is lr * sign(g), so an element whose gradient is within rounding of
//     zero may flip and move 2 lr the other way (measured: 0.1 to 0.8 % of elements); every other
//     element moves by about u relative per step, so the per-tensor median and 90th percentile of
//     |dW| are bounded by K u S, and the maximum only by 4 S (a guard against garbage);
//   - exp_avg_sq is a sum of squares, rounded relatively: |dv| / v <= K u (median, 90th percentile);
//   - exp_avg is a signed sum that may cancel: its rounding is relative to the sum of its terms'
//     magnitudes, at most C_T sqrt(v) by Cauchy-Schwarz (C_T from beta1, beta2 and the steps T), so
//     median |dm| / (C_T sqrt v) <= K u.
// The constants K were measured on CPU (bf16 mixed and pure against fp32: one bf16 rounding's worth;
// fp32 at 1 and 2 ranks, padded and not: another order of the sums) and set at about twice the
// measured value for one side, since a CUDA run and a CPU run are two sides' worth of rounding.
#pragma once

#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "tests/run_comparison.h"

namespace llm::testing {

// The run tests/gpu_paths_test.cpp's CUDA runs and their CPU references make, and the one the bounds
// are shown on here: llama_micro, 4 steps of 8 sequences of 32 tokens, lr 3e-3 after 1 warm-up step,
// --grad_clipping 0.5 (the flags after the binary, without --device, --run_dir and --save_dir).
std::string four_step_micro_flags();

// What one run left: each train step's loss, gradient norm and lr, and its last checkpoint.
struct RunRecord {
  std::vector<double> loss, grad_norm, lr;
  Checkpoint last;
};
RunRecord read_run(const std::filesystem::path& run_dir, const std::filesystem::path& last_checkpoint);

// The steps (1-based) clipping changed, by the trainer's own rule (trainer/train_step.cpp:
// max_norm / (norm + 1e-6) below 1), and how far the nearest norm sits from max_norm, relative: a step
// within rounding of the threshold may clip in one run and not in the other.
struct ClippedSteps {
  std::vector<int> fired, held;
  double margin = std::numeric_limits<double>::infinity();
};
ClippedSteps clipped_steps(const std::vector<double>& norms, double max_norm);
// A run meant to clip on some steps and not on others, clearly: both sets non-empty, and no norm within
// `margin` (relative) of the threshold.
void expect_clips_on_some_steps(const std::vector<double>& norms, double max_norm, double margin = 1e-3);

// --offload_step speculative with --offload_trace: on each rank, each step's verdict follows its norm
// by the trainer's rule ("norm_restep" where clipping fired, "norm_adopt" where it held), no unit is
// adopted on a step that clipped and none stepped again on one that did not.
void expect_speculative_verdicts(const std::filesystem::path& run_dir, int ranks, const std::vector<double>& norms,
                                 double max_norm);

// The bounds above, in units of u (the header's derivation).
struct RoundingBounds {
  double u = 0;
  double loss_k = 0, loss_floor = 0;     // |dL_t| <= loss_k u |L_t - L_1| + loss_floor
  double norm_k = 0;                     // |d norm_t| <= norm_k u norm_t
  double weight_q50_k = 0, weight_q90_k = 0;  // per tensor: quantile(|dW|) <= k u S
  double v_q50_k = 0, v_q90_k = 0;       // per tensor: quantile(|dv| / v over v > 0) <= k u
  double m_q50_k = 0;                    // per tensor: median(|dm| / (C_T sqrt v)) <= k u
  bool moments = true;                   // false: GaLore (its projected moments may differ in sign)
};
RoundingBounds bf16_bounds();
RoundingBounds fp32_bounds();
// GaLore: the solver's singular vectors are defined up to sign (LAPACK and cuSOLVER may pick others),
// so the projected moments and projector may differ; the update P^T (m / sqrt v) does not: weights,
// loss and norm only.
RoundingBounds galore_bounds(const RoundingBounds& of);
// Every constant halved: one side's rounding (bf16 against fp32 on CPU) must fit within half of what
// two sides' (CUDA against CPU) may use.
RoundingBounds halved(RoundingBounds bounds);

// One line per bound `got` breaks against `want`, each starting with its quantity and a space ("steps",
// "loss", "grad_norm", "clipped", "weights", "exp_avg_sq", "exp_avg"); empty when the two runs differ by
// rounding only. Prints each quantity's worst ratio to its bound ("[rounding] loss: worst 0.31 of its
// bound"), what a GPU run records to confirm the constants. grad_clipping: the runs' --grad_clipping
// (0: none); both must clip on the same steps, and no norm may sit within rounding of it.
std::vector<std::string> rounding_differences(const RunRecord& want, const RunRecord& got, const RoundingBounds& bounds,
                                              double grad_clipping);
// Whether one of rounding_differences' lines is about `quantity`.
bool names_quantity(const std::vector<std::string>& lines, const std::string& quantity);
std::string joined_lines(const std::vector<std::string>& lines);

}  // namespace llm::testing
