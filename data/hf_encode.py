#!/usr/bin/env python3
"""`trainer prepare --tokenizer tokenizer.json`'s encoder: a Hugging Face tokenizer (LLaMA 3, GPT-2,
Qwen, ...) through the `tokenizers` library, driven by the trainer over a pipe (data/hf_tokenizer.h).

    python3 data/hf_encode.py TOKENIZER_JSON      # started by the trainer, not by hand

Protocol (little-endian): on start it writes b"HFOK", the vocabulary size (uint32, added tokens
included) and the end-of-document id (int32, -1 when the tokenizer has none of </s>,
<|end_of_text|>, <|endoftext|>, <eos>), or b"HFER", a uint32 length and a UTF-8 message, and exits.
Then, per batch: it reads a uint32 count (0: the end) and count texts, each a uint32 length and its
UTF-8 bytes; it encodes them together (encode_batch_fast where the library has it, 0.21 on: the same
ids as encode_batch without the character offsets prepare never reads; parallel in the library, no
special tokens added) and writes, per text, a uint32 id count and the ids as uint32.
"""
import array
import struct
import sys

END_OF_DOCUMENT = ["</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"]


def fail(out, message):
    data = message.encode("utf-8")
    out.write(b"HFER" + struct.pack("<I", len(data)) + data)
    out.flush()
    sys.exit(3)


def read_exactly(stream, size):
    data = stream.read(size)
    if len(data) != size:
        sys.exit(0)  # the trainer went away: nothing to answer
    return data


def main():
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    if len(sys.argv) != 2:
        fail(out, "usage: hf_encode.py TOKENIZER_JSON")
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        fail(out, f"the tokenizers library is not importable from {sys.executable} ({error}); install it there "
                  "(pip install tokenizers) or point TRAINER_PYTHON at a Python that has it")
    try:
        tokenizer = Tokenizer.from_file(sys.argv[1])
    except Exception as error:  # the library's own errors: serde, io
        fail(out, f"is not a Hugging Face tokenizer.json the tokenizers library reads ({error})")
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    eos = next((tokenizer.token_to_id(t) for t in END_OF_DOCUMENT if tokenizer.token_to_id(t) is not None), -1)
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    out.write(b"HFOK" + struct.pack("<Ii", vocab, eos))
    out.flush()
    while True:
        (count,) = struct.unpack("<I", read_exactly(inp, 4))
        if count == 0:
            return
        texts = []
        for _ in range(count):
            (size,) = struct.unpack("<I", read_exactly(inp, 4))
            texts.append(read_exactly(inp, size).decode("utf-8", errors="replace"))
        parts = []
        for encoding in encode(texts, add_special_tokens=False):
            ids = array.array("I", encoding.ids)
            parts.append(struct.pack("<I", len(ids)))
            parts.append(ids.tobytes())
        out.write(b"".join(parts))
        out.flush()


if __name__ == "__main__":
    main()
