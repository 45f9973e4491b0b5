#include "trainer/model/units.h"

namespace llm {

std::vector<ModelUnit> split_into_units(LlamaForCausalLM& model, UnitContext& context) {
  std::vector<ModelUnit> units;
  LlamaForCausalLMImpl* impl = model.get();
  units.push_back({"embed", named_parameters_with_prefix(*impl->model->embed_tokens, "model.embed_tokens."),
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
                     named_parameters_with_prefix(*layer, "model.layers." + std::to_string(i) + "."),
                     [layer, &context](const at::Tensor& hidden) {
                       return layer->forward(hidden, context.cos.to(hidden.scalar_type()),
                                             context.sin.to(hidden.scalar_type()));
                     }});
  }
  units.push_back({"head", impl->head_parameters(), [impl](const at::Tensor& hidden) {
                     return impl->lm_head(impl->model->norm(hidden));  // (B, T, vocab)
                   }});
  return units;
}

}  // namespace llm
