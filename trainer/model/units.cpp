#include "trainer/model/units.h"

namespace llm {
namespace {

std::vector<std::pair<std::string, at::Tensor>> prefixed(torch::nn::Module& module,
                                                         const std::string& prefix) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    named.emplace_back(prefix + item.key(), item.value());
  return named;
}

}  // namespace

std::vector<ModelUnit> split_into_units(LlamaForCausalLM& model, UnitContext& context) {
  std::vector<ModelUnit> units;
  LlamaForCausalLMImpl* impl = model.get();
  units.push_back({"embed", prefixed(*impl->model->embed_tokens, "model.embed_tokens."),
                   [impl, &context](const at::Tensor& input_ids) {
                     at::Tensor hidden = impl->model->embed_tokens(input_ids);  // (B, T, hidden)
                     std::tie(context.cos, context.sin) =
                         impl->rotary_tables(input_ids.size(1), hidden.scalar_type(), hidden.device());
                     return hidden;
                   }});
  const auto& layers = *impl->model->layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    auto layer = layers[i]->as<DecoderLayerImpl>();
    units.push_back({"layer." + std::to_string(i),
                     prefixed(*layer, "model.layers." + std::to_string(i) + "."),
                     [layer, &context](const at::Tensor& hidden) {
                       return layer->forward(hidden, context.cos.to(hidden.scalar_type()),
                                             context.sin.to(hidden.scalar_type()));
                     }});
  }
  auto head_parameters = prefixed(*impl->model->norm, "model.norm.");
  for (auto& named : prefixed(*impl->lm_head, "lm_head.")) head_parameters.push_back(named);
  units.push_back({"head", head_parameters, [impl](const at::Tensor& hidden) {
                     return impl->lm_head(impl->model->norm(hidden));  // (B, T, vocab)
                   }});
  return units;
}

}  // namespace llm
