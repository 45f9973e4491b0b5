"""transformers' side of tests/export_test.cpp: loads `trainer export` folders as a user would.

For each folder: LlamaForCausalLM.from_pretrained(DIR) with no argument but the folder, its loading
report (missing, unexpected, mismatched keys), its dtype, every parameter against the checkpoint's
(read with the README's recipe, from its ranks' safetensors parts), and the loss on one window of
tokens (inputs window[:-1], labels window[1:], mean cross entropy in fp32): the test compares it with
the loss the trainer computed on the same window with the same weights. Prints one JSON object per
folder, one per line; the C++ test holds the tolerances.

    python tests/export_check.py README.md CHECKPOINT "3,17,42,..." DIR [DIR ...]
"""

import json
import re
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaForCausalLM


def read_checkpoint(readme, folder):
    """Runs the README's Python block that reads a checkpoint (the one that reads manifest.json), with
    its example folder replaced by `folder`; returns the `model` it reads."""
    text = open(readme).read()
    blocks = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "manifest.json" in block]
    assert len(blocks) == 1, f"expected one ```python block reading manifest.json in {readme}, found {len(blocks)}"
    example = re.search(r'read_checkpoint\("([^"]*)"\)', blocks[0]).group(1)
    scope = {}
    exec(blocks[0].replace(f'"{example}"', repr(folder.rstrip("/"))), scope)
    return scope["model"]


def check(folder, reference, window):
    model = LlamaForCausalLM.from_pretrained(folder)
    _, info = LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
    state = model.state_dict()
    max_diff = 0.0
    for name, tensor in reference.items():
        ours = state[name].to(torch.float32)
        max_diff = max(max_diff, (ours - tensor.to(torch.float32)).abs().max().item())
    ids = torch.tensor([window], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits.to(torch.float32)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)).item()
    return {
        "dir": folder,
        "loss": loss,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "mismatched": [str(entry) for entry in info["mismatched_keys"]],
        "parameters": len(state),
        "checkpoint_tensors": len(reference),
        "max_abs_diff_vs_checkpoint": max_diff,
        "transformers_version": transformers.__version__,
    }


def main():
    readme, checkpoint, tokens, folders = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    reference = read_checkpoint(readme, checkpoint)
    window = [int(token) for token in tokens.split(",")]
    for folder in folders:
        print(json.dumps(check(folder, reference, window)), flush=True)


if __name__ == "__main__":
    main()
