"""Golden files for tests/model_golden_test.cpp, from the reference implementation.

llm.c's test_gpt2 pattern: this script lives beside the test that reads its output. It builds
transformers' LlamaForCausalLM with a tiny config (configs/llama_micro.json's values, written out below
and checked against that file), gives it fixed weights, runs one forward
and backward pass on a fixed (2, 23) batch, and saves everything the C++ model must reproduce:

    tests/golden/llama_micro_fp32.pt   fp32 weights, fp32 forward and backward
    tests/golden/llama_micro_bf16.pt   the same weights cast to bf16, pure bf16 forward and backward
                                       (GaLore's --dtype bfloat16: model.to(torch.bfloat16))

Each file is a flat dict written by torch.save (readable by torch::pickle_load in C++), its tensors
views of one storage per dtype to keep the fp32 file under 300 KB:
    "config.<key>"   0-d tensors: int64 for sizes and token ids, float64 for eps and rope_theta
    "input_ids"      (2, 23) int64. Odd length on purpose (no power-of-two tail); holds the pad id
                     (vocab-1) so a missing padding_idx (no gradient to the pad row) shows.
    "logits"         (2, 23, 128) in the model dtype
    "loss"           0-d fp32: model(input_ids, labels=input_ids).loss, i.e. HF's shift inside:
                     logits[:, :-1] against input_ids[:, 1:], mean over tokens, computed in fp32
    "labels_masked"  (2, 23) int64: input_ids with some positions set to -100 (ignore_index)
    "loss_masked"    0-d fp32: HF's loss for labels_masked (same logits; checks ignore_index)
    "param.<name>"   every parameter, HF names, in the model dtype
    "grad.<name>"    its gradient of "loss", in the model dtype
The bf16 file keeps logits, params and grads in bf16: they are exactly the values the bf16 model
holds, and the C++ test upcasts both sides to fp32 before comparing. Losses are fp32 in both files
because HF (and our causal_lm_loss) compute the cross entropy in fp32.

Attention: attn_implementation="sdpa", because our model calls at::scaled_dot_product_attention, so
both sides run the same kernel and the bf16 comparison measures the model, not two attention
kernels' different rounding (eager's matmul + fp32 softmax rounds differently in bf16). In fp32
eager and sdpa agree to 5e-7 of each tensor's scale, far inside the test's tolerance.

bf16 rope: model.to(torch.bfloat16) also rounds transformers' rotary inv_freq buffer to bf16; the
script puts the fp32 one back (see main), as GaLore's model and ours build fp32 cos/sin tables.

Run from the repository root with the project venv's python (CPU only, deterministic):
    $VENV/bin/python tests/golden/make_llama_golden.py
"""

import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
MICRO_JSON = os.path.join(HERE, "..", "..", "configs", "llama_micro.json")

# configs/llama_micro.json, in HF LlamaConfig keys. pad_token_id -1 as in the GaLore configs, meaning
# vocab-1 (GaLore's HF version passed -1 to nn.Embedding as padding_idx, which resolves it so). The
# transformers we use warns about a negative id, so the HF model gets vocab-1 itself; the file
# records -1, the value our ModelConfig carries.
CONFIG = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=88,
    num_attention_heads=2,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    initializer_range=0.02,
    tie_word_embeddings=False,
    pad_token_id=-1,
    bos_token_id=0,
    eos_token_id=1,
)
BATCH, SEQ_LEN = 2, 23
WEIGHT_SEED, TOKEN_SEED = 1234, 5678


def check_against_config_file():
    """CONFIG must be configs/llama_micro.json (keys it omits take HF's defaults)."""
    with open(MICRO_JSON) as f:
        on_disk = json.load(f)
    defaults = {"rope_theta": 10000.0, "tie_word_embeddings": False,
                "num_key_value_heads": on_disk.get("num_attention_heads")}
    for key, value in CONFIG.items():
        assert on_disk.get(key, defaults.get(key)) == value, (key, on_disk.get(key), value)


def build_model():
    hf_keys = {k: v for k, v in CONFIG.items() if k not in ("rope_theta", "pad_token_id")}
    config = LlamaConfig(
        **hf_keys,
        pad_token_id=CONFIG["vocab_size"] - 1,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": CONFIG["rope_theta"]},
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    vocab = CONFIG["vocab_size"]
    assert model.model.embed_tokens.padding_idx == vocab - 1, model.model.embed_tokens.padding_idx

    # Fixed weights drawn here (not HF's init) so the file depends only on this seed. Norm gains are
    # 1 + N(0, 0.1) rather than ones, so a norm that drops or misplaces its weight shows in the test.
    generator = torch.Generator().manual_seed(WEIGHT_SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(CONFIG["initializer_range"] * torch.randn(param.shape, generator=generator))
        # As GaLore's (HF's) init: the padding row of the input embedding is zero.
        model.model.embed_tokens.weight[vocab - 1].zero_()
    return model


def make_inputs():
    vocab = CONFIG["vocab_size"]
    generator = torch.Generator().manual_seed(TOKEN_SEED)
    input_ids = torch.randint(0, vocab, (BATCH, SEQ_LEN), generator=generator)
    input_ids[0, 5] = vocab - 1   # the pad id as an input (its embedding row gets no gradient)
    input_ids[1, 0] = vocab - 1   # ... and at position 0 of the other row
    input_ids[1, 17] = 0          # bos/id 0 somewhere too
    labels_masked = input_ids.clone()
    labels_masked[0, 3] = -100
    labels_masked[0, 10:14] = -100
    labels_masked[1, 22] = -100   # the last label is dropped by the shift anyway
    return input_ids, labels_masked


def golden(model, input_ids, labels_masked):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    with torch.no_grad():
        loss_masked = model(input_ids=input_ids, labels=labels_masked).loss

    record = {}
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "num_hidden_layers", "max_position_embeddings",
                "pad_token_id", "bos_token_id", "eos_token_id"):
        record[f"config.{key}"] = torch.tensor(CONFIG[key], dtype=torch.int64)
    for key in ("rms_norm_eps", "rope_theta", "initializer_range"):
        record[f"config.{key}"] = torch.tensor(CONFIG[key], dtype=torch.float64)
    record["config.tie_word_embeddings"] = torch.tensor(int(CONFIG["tie_word_embeddings"]))
    record["input_ids"] = input_ids.clone()
    record["logits"] = out.logits.detach().clone()
    record["loss"] = out.loss.detach().float().clone()
    record["labels_masked"] = labels_masked.clone()
    record["loss_masked"] = loss_masked.detach().float().clone()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        record[f"param.{name}"] = param.detach().clone()
        record[f"grad.{name}"] = param.grad.detach().clone()
    return record


def share_storage(record):
    """Views of one storage per dtype, so the zip holds 3 records instead of ~120.

    torch.save writes each storage as its own 64-byte-aligned zip record with two headers; with
    ~120 small tensors that overhead alone would push the fp32 file over its 300 KB budget.
    torch::pickle_load rebuilds views (storage offset, sizes, strides) like any other tensor.
    """
    packed = {}
    for dtype in {t.dtype for t in record.values()}:
        names = [n for n, t in record.items() if t.dtype == dtype]
        flat = torch.cat([record[n].reshape(-1) for n in names])
        offset = 0
        for n in names:
            numel = record[n].numel()
            packed[n] = flat[offset:offset + numel].view(record[n].shape)
            offset += numel
    return {n: packed[n] for n in record}


def main():
    check_against_config_file()
    torch.set_num_threads(1)  # reduction order fixed: the file is reproducible bit for bit
    input_ids, labels_masked = make_inputs()
    model = build_model()
    inv_freq_fp32 = model.model.rotary_emb.inv_freq.clone()

    for dtype, filename in ((torch.float32, "llama_micro_fp32.pt"),
                            (torch.bfloat16, "llama_micro_bf16.pt")):
        model = model.to(dtype)  # fp32 -> bf16 is a cast of the same weights
        # model.to() also casts the rotary inv_freq buffer, so this transformers would build its
        # bf16 rope angles from bf16-rounded frequencies (0.1001 for 0.1: angles off by up to 1e-2
        # rad at position 22). GaLore's modeling_llama computes its cos/sin tables in fp32 at
        # construction and only then casts them, as our model does (fp32 tables cast to the model
        # dtype), so the reference keeps inv_freq in fp32.
        model.model.rotary_emb.inv_freq = inv_freq_fp32.clone()
        record = golden(model, input_ids, labels_masked)
        pad_grad = record["grad.model.embed_tokens.weight"][CONFIG["vocab_size"] - 1]
        assert torch.count_nonzero(pad_grad) == 0, "padding row received a gradient"
        path = os.path.join(HERE, filename)
        torch.save(share_storage(record), path)
        reloaded = torch.load(path, weights_only=True)
        assert all(torch.equal(reloaded[n], t) for n, t in record.items()), "round trip"
        print(f"{filename}: {len(record)} entries, {os.path.getsize(path) / 1024:.1f} KiB, "
              f"loss {record['loss'].item():.6f}, loss_masked {record['loss_masked'].item():.6f}, "
              f"logits {tuple(record['logits'].shape)} {record['logits'].dtype}")


if __name__ == "__main__":
    main()
