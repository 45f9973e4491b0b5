// The C++ LLaMA against transformers' LlamaForCausalLM: logits, loss and every parameter's gradient,
// element-wise, in fp32 and in pure bf16.
//
// The golden files are made by tests/golden/make_llama_golden.py, which lives beside this test
// (llm.c's test_gpt2 pattern): the micro config, fixed weights (norm gains perturbed away from 1 so a
// norm that drops its weight shows), a (2, 23) batch holding the pad id, and HF's outputs. We load the
// same weights by HF name, run forward, causal_lm_loss on the shifted logits, backward, and compare.
// The tolerances, and why they are what they are, are kFp32Tolerance and kBf16Tolerance. A test perturbs
// the model on purpose and checks that the comparison notices, so a loose tolerance cannot hide.
//
// Also here: the HF name mapping is one to one, and init_weights gives N(0, 0.02) matrices, unit norm
// gains and a zero padding row.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <torch/serialize.h>

#include "common/errors.h"
#include "config/config.h"
#include "model/llama.h"
#include "tests/test_util.h"

namespace llm::model_golden_test {
namespace {

using Golden = std::map<std::string, at::Tensor>;

std::filesystem::path golden_path(const std::string& file) {
  return testing::source_dir() / "tests" / "golden" / file;
}

// The flat dict written by torch.save: name -> tensor (views of one storage per dtype).
Golden load_golden(const std::string& file) {
  const std::filesystem::path path = golden_path(file);
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw std::runtime_error("cannot open " + path.string() +
                                        " (regenerate with tests/golden/make_llama_golden.py)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  Golden golden;
  for (const auto& entry : torch::pickle_load(bytes).toGenericDict())
    golden[entry.key().toStringRef()] = entry.value().toTensor();
  return golden;
}

const at::Tensor& entry(const Golden& golden, const std::string& name) {
  auto found = golden.find(name);
  if (found == golden.end()) throw std::runtime_error("golden file has no entry " + name);
  return found->second;
}

// The values of configs/llama_micro.json, written out so this test does not depend on the config
// loader. GoldenConfigMatches checks the script used the same.
ModelConfig micro_config() {
  ModelConfig config;
  config.name = "llama_micro";
  config.vocab_size = 128;
  config.hidden_size = 32;
  config.intermediate_size = 88;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 2;
  config.num_hidden_layers = 2;
  config.max_position_embeddings = 64;
  config.rms_norm_eps = 1e-6;
  config.rope_theta = 10000.0;
  config.initializer_range = 0.02;
  config.tie_word_embeddings = false;
  config.pad_token_id = -1;
  config.bos_token_id = 0;
  config.eos_token_id = 1;
  return config;
}

// The golden "param.<name>" entries, keyed by HF name.
std::map<std::string, at::Tensor> golden_params(const Golden& golden) {
  std::map<std::string, at::Tensor> params;
  for (const auto& [name, tensor] : golden)
    if (name.rfind("param.", 0) == 0) params[name.substr(6)] = tensor;
  return params;
}

// |actual - expected| <= rtol * |expected| + scale_atol * max|expected|, element by element.
// The absolute part is relative to the tensor's largest element because the tensors span four
// orders of magnitude (q/k gradients ~3e-4, embedding gradients ~1e-1): one absolute atol would be
// either meaningless for q/k or too tight for the rest.
struct Tolerance {
  double rtol;
  double scale_atol;
};

// fp32: same operations on the same CPU kernels; the only differences allowed for are summation
// order (threads, matmul blocking), fp32 rounding being 6e-8 relative. Through two layers, softmax
// and backward that stays near 1e-6; rtol 1e-4 plus 1e-5 x max|HF| is 100x that, yet a dropped norm
// weight, a wrong rope base or eps, or one weight off by 1% is caught
// (LlamaGolden.ToleranceCatchesModelErrors checks). Measured: bit-identical on x86 CPU.
constexpr Tolerance kFp32Tolerance{1e-4, 1e-5};
// Pure bf16: weights, activations and gradients all bf16, 8 bits of mantissa, so one rounding is up
// to 2^-9 relative and one ulp at a tensor's largest element is 2^-8..2^-7 of it. A different
// summation order (another CPU's kernels) can flip a rounding early in the forward and move later
// tensors by about an ulp of their scale, so the bound is 2^-7 of max|HF| plus 2^-7 of each element
// (~2 ulps). That still catches the dtype-placement bugs measured with the script's model, which
// move some tensor by 1.5 to 2.3% of its scale: RMSNorm in bf16 instead of fp32, the norm weight
// applied before the cast back, or computing in fp32 with bf16 weights (checked below). It does not
// see rope frequencies rounded to bf16 (0.65%, what transformers itself does after model.to(bf16);
// see the script): that needs ulp-level agreement, which another CPU's bf16 kernels need not give.
// Measured: bit-identical on x86 CPU.
constexpr Tolerance kBf16Tolerance{1.0 / 128, 1.0 / 128};

struct Comparison {
  int64_t violations = 0;
  double max_abs_diff = 0;     // largest |actual - expected|
  double max_scaled_diff = 0;  // largest |actual - expected| / max|expected|
  std::string worst;           // where and what, for the failure message
};

Comparison compare(const at::Tensor& actual_in, const at::Tensor& expected_in, Tolerance tol) {
  at::Tensor actual = actual_in.detach().to(at::kDouble).contiguous().reshape({-1});
  at::Tensor expected = expected_in.detach().to(at::kDouble).contiguous().reshape({-1});
  at::Tensor diff = (actual - expected).abs();
  const double scale = std::max(expected.abs().max().item<double>(), 1e-30);
  at::Tensor allowed = tol.rtol * expected.abs() + tol.scale_atol * scale;
  Comparison result;
  result.violations = (diff > allowed).sum().item<int64_t>();
  const int64_t worst = (diff - allowed).argmax().item<int64_t>();
  result.max_abs_diff = diff.max().item<double>();
  result.max_scaled_diff = result.max_abs_diff / scale;
  std::ostringstream where;
  where << "flat index " << worst << ": ours " << actual[worst].item<double>() << ", HF "
        << expected[worst].item<double>() << ", allowed diff " << allowed[worst].item<double>()
        << " (max|HF| " << scale << ")";
  result.worst = where.str();
  return result;
}

// Compares and reports under the tensor's name; returns the largest scaled difference seen.
double expect_close(const std::string& name, const at::Tensor& actual, const at::Tensor& expected,
                    Tolerance tol) {
  if (actual.sizes() != expected.sizes()) {
    ADD_FAILURE() << name << ": shape " << actual.sizes() << " vs golden " << expected.sizes();
    return INFINITY;
  }
  Comparison c = compare(actual, expected, tol);
  EXPECT_EQ(c.violations, 0) << name << ": " << c.violations << " of " << expected.numel()
                             << " elements out of tolerance (rtol " << tol.rtol << ", atol "
                             << tol.scale_atol << " x max|HF|); worst at " << c.worst
                             << "; max |diff| " << c.max_abs_diff;
  return c.max_scaled_diff;
}

struct Outputs {
  at::Tensor logits;       // (B, T, V) in the model dtype
  at::Tensor loss;         // 0-d fp32
  at::Tensor loss_masked;  // 0-d fp32, labels with -100
  std::map<std::string, at::Tensor> grads;
};

// Our model with the golden weights: forward, HF's shifted loss, backward.
Outputs run_ours(const Golden& golden, const ModelConfig& config, at::ScalarType dtype) {
  LlamaForCausalLM model(config);
  if (dtype != at::kFloat) model->to(dtype);
  load_named_tensors(*model, golden_params(golden), "golden file");

  const at::Tensor input_ids = entry(golden, "input_ids");  // (B, T) int64
  const int64_t T = input_ids.size(1);
  Outputs out;
  out.logits = model->forward(input_ids);
  at::Tensor shifted = out.logits.slice(1, 0, T - 1);
  out.loss = causal_lm_loss(shifted, input_ids.slice(1, 1, T));
  out.loss.backward();
  {
    at::NoGradGuard no_grad;
    out.loss_masked = causal_lm_loss(shifted, entry(golden, "labels_masked").slice(1, 1, T));
  }
  for (auto& [name, param] : named_parameters_in_order(*model)) out.grads[name] = param.grad();
  return out;
}

// Runs ours against one golden file; prints the largest differences so tolerances can be judged.
void check_against_golden(const std::string& file, at::ScalarType dtype, Tolerance tol,
                          double loss_rtol) {
  const Golden golden = load_golden(file);
  const Outputs ours = run_ours(golden, micro_config(), dtype);
  ASSERT_EQ(ours.logits.scalar_type(), dtype);

  double worst_logits = expect_close("logits", ours.logits, entry(golden, "logits"), tol);
  const double hf_loss = entry(golden, "loss").item<double>();
  const double hf_loss_masked = entry(golden, "loss_masked").item<double>();
  EXPECT_NEAR(ours.loss.item<double>(), hf_loss, loss_rtol * hf_loss) << "loss";
  EXPECT_NEAR(ours.loss_masked.item<double>(), hf_loss_masked, loss_rtol * hf_loss_masked)
      << "loss with -100 labels";

  double worst_grad = 0;
  std::string worst_grad_name;
  for (const auto& [name, grad] : ours.grads) {
    SCOPED_TRACE("grad." + name);
    ASSERT_TRUE(grad.defined()) << name << " got no gradient";
    EXPECT_EQ(grad.scalar_type(), dtype) << name;
    double scaled = expect_close("grad." + name, grad, entry(golden, "grad." + name), tol);
    if (scaled > worst_grad) worst_grad = scaled, worst_grad_name = name;
  }
  // The pad id is in input_ids; nn.Embedding's padding_idx keeps its row's gradient exactly zero.
  const int64_t pad_row = micro_config().vocab_size - 1;
  EXPECT_EQ(ours.grads.at("model.embed_tokens.weight")[pad_row].count_nonzero().item<int64_t>(), 0)
      << "the padding row of the embedding received a gradient";

  std::printf("[ golden ] %s: max|diff|/max|HF| logits %.3g, worst grad %.3g (%s); loss ours %.7f "
              "HF %.7f (rel %.3g)\n",
              file.c_str(), worst_logits, worst_grad, worst_grad_name.c_str(),
              ours.loss.item<double>(), hf_loss, std::abs(ours.loss.item<double>() - hf_loss) / hf_loss);
}

TEST(LlamaGolden, GoldenConfigMatches) {
  // The script and this test must describe the same model; a drift would make every other test
  // here compare two different models.
  const ModelConfig config = micro_config();
  for (const char* file : {"llama_micro_fp32.pt", "llama_micro_bf16.pt"}) {
    SCOPED_TRACE(file);
    const Golden golden = load_golden(file);
    auto as_int = [&](const std::string& key) { return entry(golden, "config." + key).item<int64_t>(); };
    auto as_double = [&](const std::string& key) { return entry(golden, "config." + key).item<double>(); };
    EXPECT_EQ(as_int("vocab_size"), config.vocab_size);
    EXPECT_EQ(as_int("hidden_size"), config.hidden_size);
    EXPECT_EQ(as_int("intermediate_size"), config.intermediate_size);
    EXPECT_EQ(as_int("num_attention_heads"), config.num_attention_heads);
    EXPECT_EQ(as_int("num_key_value_heads"), config.num_key_value_heads);
    EXPECT_EQ(as_int("num_hidden_layers"), config.num_hidden_layers);
    EXPECT_EQ(as_int("max_position_embeddings"), config.max_position_embeddings);
    EXPECT_EQ(as_int("pad_token_id"), config.pad_token_id);
    EXPECT_EQ(as_int("bos_token_id"), config.bos_token_id);
    EXPECT_EQ(as_int("eos_token_id"), config.eos_token_id);
    EXPECT_EQ(as_int("tie_word_embeddings"), config.tie_word_embeddings ? 1 : 0);
    EXPECT_DOUBLE_EQ(as_double("rms_norm_eps"), config.rms_norm_eps);
    EXPECT_DOUBLE_EQ(as_double("rope_theta"), config.rope_theta);
    EXPECT_DOUBLE_EQ(as_double("initializer_range"), config.initializer_range);
    const at::Tensor& input_ids = entry(golden, "input_ids");
    EXPECT_EQ(input_ids.sizes(), (std::vector<int64_t>{2, 23}));
    EXPECT_EQ(input_ids.scalar_type(), at::kLong);
  }
}

TEST(LlamaGolden, NamesMapOneToOne) {
  // Every HF parameter of the golden file is a parameter of ours with the same shape, and ours has
  // no other: checkpoints and golden files load by name with nothing left over or made up.
  const Golden golden = load_golden("llama_micro_fp32.pt");
  const std::map<std::string, at::Tensor> hf = golden_params(golden);
  LlamaForCausalLM model(micro_config());
  const auto ours = named_parameters_in_order(*model);

  std::set<std::string> our_names;
  for (const auto& [name, param] : ours) {
    EXPECT_TRUE(our_names.insert(name).second) << "duplicate parameter name " << name;
    auto found = hf.find(name);
    if (found == hf.end()) {
      ADD_FAILURE() << "our parameter " << name << " is not in transformers' model";
      continue;
    }
    EXPECT_EQ(param.sizes(), found->second.sizes()) << name;
    EXPECT_TRUE(golden.count("grad." + name)) << name;
  }
  for (const auto& [name, tensor] : hf)
    EXPECT_TRUE(our_names.count(name)) << "transformers' parameter " << name << " is not in ours";
  EXPECT_EQ(ours.size(), hf.size());
  EXPECT_EQ(hf.size(), 3u + 9u * 2u);  // embed, norm, lm_head; 9 per layer (4 attn, 3 mlp, 2 norms)

  // load_named_tensors refuses a missing and an unexpected name rather than skipping them.
  auto missing = hf;
  missing.erase("model.norm.weight");
  EXPECT_THROW(load_named_tensors(*model, missing, "golden"), UserError);
  auto extra = hf;
  extra["model.layers.2.mlp.up_proj.weight"] = at::zeros({88, 32});
  EXPECT_THROW(load_named_tensors(*model, extra, "golden"), UserError);
}

TEST(LlamaGolden, Fp32MatchesTransformers) {
  // Loss: one fp32 mean of 44 cross entropies, ~1e-7 apart for another summation order.
  check_against_golden("llama_micro_fp32.pt", at::kFloat, kFp32Tolerance, 1e-5);
}

TEST(LlamaGolden, Bf16MatchesTransformers) {
  // Loss: fp32 from bf16 logits; one logit an ulp off moves it by ~1e-5 relative, so rtol 1e-4.
  check_against_golden("llama_micro_bf16.pt", at::kBFloat16, kBf16Tolerance, 1e-4);
}

TEST(LlamaGolden, ToleranceCatchesModelErrors) {
  // The fp32 tolerance must be tight enough to see realistic bugs. Each mutation below is one a
  // model could plausibly get wrong; each must put some golden comparison out of tolerance.
  const Golden golden = load_golden("llama_micro_fp32.pt");
  auto count_violations = [&](const Outputs& out, const Golden& reference = {},
                              Tolerance tol = kFp32Tolerance) {
    const Golden& ref = reference.empty() ? golden : reference;
    int64_t total = compare(out.logits, entry(ref, "logits"), tol).violations;
    for (const auto& [name, grad] : out.grads)
      total += compare(grad, entry(ref, "grad." + name), tol).violations;
    return total;
  };
  ASSERT_EQ(count_violations(run_ours(golden, micro_config(), at::kFloat)), 0);

  ModelConfig wrong_theta = micro_config();
  wrong_theta.rope_theta = 500000.0;  // a rope base off (the LLaMA-3 value)
  EXPECT_GT(count_violations(run_ours(golden, wrong_theta, at::kFloat)), 0) << "rope_theta";

  ModelConfig wrong_eps = micro_config();
  wrong_eps.rms_norm_eps = 1e-2;  // eps in the wrong place shows as a larger eps
  EXPECT_GT(count_violations(run_ours(golden, wrong_eps, at::kFloat)), 0) << "rms_norm_eps";

  Golden unit_norms = golden;  // a norm that ignores its weight
  unit_norms["param.model.norm.weight"] = at::ones({32});
  EXPECT_GT(count_violations(run_ours(unit_norms, micro_config(), at::kFloat)), 0) << "norm weight";

  Golden nudged = golden;  // one q weight off by 1% of the init scale
  at::Tensor q = golden.at("param.model.layers.1.self_attn.q_proj.weight").clone();
  q[3][7] += 2e-4;
  nudged["param.model.layers.1.self_attn.q_proj.weight"] = q;
  EXPECT_GT(count_violations(run_ours(nudged, micro_config(), at::kFloat)), 0) << "one q weight";

  // bf16: a model that keeps fp32 activations (bf16 weights, results rounded to bf16 at the end) is
  // not pure bf16 and must not pass for it.
  const Golden bf16 = load_golden("llama_micro_bf16.pt");
  Outputs fp32_compute = run_ours(bf16, micro_config(), at::kFloat);  // bf16 values, fp32 params
  fp32_compute.logits = fp32_compute.logits.to(at::kBFloat16);
  for (auto& [name, grad] : fp32_compute.grads) grad = grad.to(at::kBFloat16);
  EXPECT_GT(count_violations(fp32_compute, bf16, kBf16Tolerance), 0) << "fp32 compute as bf16";
}

TEST(LlamaGolden, InitWeights) {
  ModelConfig config = micro_config();
  config.hidden_size = 64;  // more elements per matrix: the sample std is then within a few percent
  config.intermediate_size = 176;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 4;
  LlamaForCausalLM model(config);
  model->init_weights(/*seed=*/42);
  const int64_t pad_row = config.vocab_size - 1;  // pad_token_id -1

  for (const auto& [name, param] : named_parameters_in_order(*model)) {
    SCOPED_TRACE(name);
    if (param.dim() == 1) {
      EXPECT_TRUE(param.eq(1).all().item<bool>()) << name << ": norm gains must be ones";
      continue;
    }
    at::Tensor values = param.detach();
    if (name == "model.embed_tokens.weight") {
      EXPECT_EQ(values[pad_row].count_nonzero().item<int64_t>(), 0) << "padding row not zero";
      values = values.slice(0, 0, pad_row);  // the other rows are N(0, 0.02)
      EXPECT_EQ(values.eq(0).sum().item<int64_t>(), 0) << "a non-pad embedding entry is zero";
    }
    // The smallest matrix has 4096 elements: the sample std's relative standard error is
    // 1/sqrt(2n) ~ 1.1%, so 6% is > 5 sigma; the mean's standard error is 0.02/64 ~ 3e-4.
    const double std = values.std().item<double>();
    const double mean = values.mean().item<double>();
    EXPECT_NEAR(std, 0.02, 0.06 * 0.02) << name << ": std " << std;
    EXPECT_NEAR(mean, 0.0, 2e-3) << name << ": mean " << mean;
  }

  // Deterministic in the seed, and the seed matters.
  LlamaForCausalLM same(config), other(config);
  same->init_weights(42);
  other->init_weights(43);
  const auto a = named_parameters_in_order(*model), b = named_parameters_in_order(*same),
             c = named_parameters_in_order(*other);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first << " differs for one seed";
    if (a[i].second.dim() == 2) {
      EXPECT_FALSE(at::equal(a[i].second, c[i].second)) << a[i].first << " same for two seeds";
    }
  }

  // An explicit pad id zeroes that row instead.
  ModelConfig explicit_pad = micro_config();
  explicit_pad.pad_token_id = 3;
  LlamaForCausalLM padded(explicit_pad);
  padded->init_weights(42);
  at::Tensor embedding = padded->model->embed_tokens->weight.detach();
  EXPECT_EQ(embedding[3].count_nonzero().item<int64_t>(), 0);
  EXPECT_GT(embedding[explicit_pad.vocab_size - 1].count_nonzero().item<int64_t>(), 0);
}

}  // namespace
}  // namespace llm::model_golden_test
