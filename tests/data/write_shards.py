#!/usr/bin/env python3
"""The reference writer of the token shards --data reads (data/token_file.h), for the data tests.

Each format is written here the way its own project writes it, not the way our reader reads it, so
a reader test compares our C++ with the published layouts:
  npy       numpy.save of a 1-D array (OLMo's token arrays): '<u2', '<u4' (or '<i4', which we refuse).
  llmc      llm.c's dev/data/data_common.py write_datafile: a 256 x int32 header [20240520, 1, count]
            then uint16 ids (GPT-2), or [20240801, 7, count] then uint32 ids (LLaMA 3).
  megatron  Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py, _IndexWriter):
            PATH.bin the ids end to end; PATH.idx: b"MMIDIDX\\x00\\x00", <Q version 1, <B dtype code
            (8 uint16, 4 int32), <Q sequence count, <Q document count, int32 sequence lengths, int64
            byte pointers, int64 document indices ([0] then the sequence count at each document's end,
            as IndexedDatasetBuilder keeps them). One sequence per document (--docs gives the lengths).
  olmo      OLMo's headerless token arrays (dolma's tokenizer output, read by OLMo's MemMapDataset with
            data.memmap_dtype): numpy.memmap(path, dtype, mode="w+", shape=(count,)) filled with the ids,
            nothing else in the file: uint16 or uint32.
  trainer   ours (data/token_file.h): a 64-byte header "LLMTOKv1", <I version 1, <I bytes per token,
            <Q token count, <Q vocabulary size, zeros; then the ids.

The ids come from --tokens (a comma-separated list), --tokens-file (ids separated by commas or white
space) or --count N --seed S --vocab V (uniform in [0, V), with V - 1 and 0 placed at the ends and a run
of ids from the top tenth of the vocabulary in the middle). --sparse writes --count zeros as a hole (a
sparse file: a corpus of 10^9 tokens costs no disk), for tests that a reader opens by headers alone.

--damage writes a bad shard, one thing wrong, for the error tests:
  wrong_magic      the first bytes (ours, llm.c, npy) or the .idx's magic (megatron) changed
  wrong_version    ours 2, llm.c 3, megatron .idx 2
  wrong_dtype      npy '<i8'; megatron .idx dtype code 5 (int64)
  big_endian       npy '>u2' / '>u4'
  two_dimensional  npy of shape (2, count / 2)
  truncate         the last id cut off (megatron: the .bin's)
  truncate_header  the file cut in half of its header (megatron: the .idx cut in half)
  trailing_bytes   one byte more than the header promises (megatron: one id more in the .bin)
  id_above_vocab   the id at --damage_at (default the middle) becomes --bad_id (default --vocab)
  idx_sizes        megatron: the last sequence length one more than the .bin holds (pointers agree)
  idx_pointers     megatron: the second sequence's pointer two bytes on (not end to end)
  idx_documents    megatron: the document indices do not end at the sequence count
  missing_idx      megatron: no .idx beside the .bin

Prints one JSON line: the format, the files written, dtype, token count, documents, damage; with
--print_ids also the ids (as written, before any damage).

  write_shards.py npy  DIR/a.npy --tokens 1,2,3
  write_shards.py llmc DIR/train_000.bin --count 5000 --seed 1 --vocab 50257
  write_shards.py megatron DIR/web --count 5000 --seed 2 --vocab 128256 --dtype int32 --docs 1000,4000
  write_shards.py trainer DIR/bad.tok --tokens-file ids.txt --vocab 128 --damage id_above_vocab --damage_at 7
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

FORMATS = ("npy", "llmc", "megatron", "trainer", "olmo")
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4"), "int32": np.dtype("<i4")}
# The widths each format can hold (the first is its default for a vocabulary up to 65536).
FORMAT_DTYPES = {
    "npy": ("uint16", "uint32", "int32"),
    "llmc": ("uint16", "uint32"),
    "megatron": ("uint16", "int32"),
    "trainer": ("uint16", "uint32"),
    "olmo": ("uint16", "uint32"),
}
LLMC_HEADERS = {"uint16": (20240520, 1), "uint32": (20240801, 7)}  # llm.c's HEADERS_INFO
MEGATRON_DTYPE_CODES = {"uint16": 8, "int32": 4}  # Megatron's DType enum
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
TRAINER_MAGIC = b"LLMTOKv1"
DAMAGES = ("wrong_magic", "wrong_version", "wrong_dtype", "big_endian", "two_dimensional", "truncate",
           "truncate_header", "trailing_bytes", "id_above_vocab", "idx_sizes", "idx_pointers",
           "idx_documents", "missing_idx")
DAMAGE_FORMATS = {
    "wrong_dtype": ("npy", "megatron"),
    "big_endian": ("npy",),
    "two_dimensional": ("npy",),
    "idx_sizes": ("megatron",),
    "idx_pointers": ("megatron",),
    "idx_documents": ("megatron",),
    "missing_idx": ("megatron",),
}


class UsageError(Exception):
    pass


def parse_ids(text, what):
    pieces = text.replace(",", " ").split()
    try:
        return [int(piece) for piece in pieces]
    except ValueError as error:
        raise UsageError(f"{what}: {error}") from None


def generated_ids(count, seed, vocab):
    """Uniform ids with the top of the vocabulary present: V - 1 first, 0 last, and a run from the top
    tenth in the middle (the ids a narrowing or sign bug would break)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=count, dtype=np.int64)
    top = rng.integers(max(0, vocab - max(1, vocab // 10)), vocab, size=min(count, 64), dtype=np.int64)
    middle = count // 2
    ids[middle:middle + len(top)] = top[:count - middle]
    if count > 0:
        ids[0] = vocab - 1
    if count > 1:
        ids[-1] = 0
    return ids


def choose_dtype(args, ids_max):
    allowed = FORMAT_DTYPES[args.format]
    if args.dtype is not None:
        if args.dtype not in allowed:
            raise UsageError(f"--dtype {args.dtype}: {args.format} holds {' or '.join(allowed)}")
        return args.dtype
    largest = max(ids_max, (args.vocab or 0) - 1)
    if largest < 65536:
        return allowed[0]
    return allowed[1]


def check_ids_fit(ids, dtype, vocab, damage):
    if len(ids) == 0:
        return
    info = np.iinfo(DTYPES[dtype])
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high > info.max:
        raise UsageError(f"ids from {low} to {high} do not fit {dtype}")
    if vocab is not None and high >= vocab:
        raise UsageError(f"id {high} is not below --vocab {vocab} (use --damage id_above_vocab for a bad shard)")


def megatron_prefix(path):
    for suffix in (".bin", ".idx"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def document_lengths(args, count):
    if args.docs is None:
        return [count] if count > 0 else []
    lengths = parse_ids(args.docs, "--docs")
    if any(length <= 0 for length in lengths) or sum(lengths) != count:
        raise UsageError(f"--docs {args.docs}: lengths must be positive and add up to the {count} tokens")
    return lengths


def write_sparse_ids(file, count, itemsize):
    """Extends `file` by count * itemsize zero bytes without writing them (a hole)."""
    file.seek(count * itemsize - 1, os.SEEK_CUR)
    file.write(b"\x00")


def poke_id(path, payload_offset, itemsize, index, value, dtype):
    info = np.iinfo(DTYPES[dtype])
    if not info.min <= value <= info.max:
        raise UsageError(f"--bad_id {value} does not fit {dtype}")
    with open(path, "r+b") as file:
        file.seek(payload_offset + index * itemsize)
        file.write(np.array([value], dtype=DTYPES[dtype]).tobytes())


def write_npy_header(file, numpy_dtype, shape, text, version):
    """A header of format `version` ("1.0", "2.0", "3.0") as NumPy writes it, or the dict `text` as
    given ({count} replaced by the ids' count) in format 1.0, padded as NumPy pads."""
    if text is None:
        header = {"descr": np.lib.format.dtype_to_descr(numpy_dtype), "fortran_order": False, "shape": shape}
        if version == "1.0":
            np.lib.format.write_array_header_1_0(file, header)
        elif version == "2.0":
            np.lib.format.write_array_header_2_0(file, header)
        else:  # 3.0 (a UTF-8 header): numpy.save writes it for a dtype whose description needs it
            impl = getattr(np.lib.format, "_write_array_header", None)
            if impl is None:
                from numpy.lib import _format_impl
                impl = _format_impl._write_array_header
            impl(file, header, (3, 0))
        return
    body = text.replace("{count}", str(shape[0])).encode("latin1")
    padding = -(10 + len(body) + 1) % 64
    body += b" " * padding + b"\n"
    file.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body)


def write_npy(path, ids, dtype, count, sparse, damage, npy_header=None, npy_version=None):
    """numpy.save, as OLMo writes its token arrays; returns the byte offset of the first id."""
    numpy_dtype = DTYPES[dtype]
    if damage == "wrong_dtype":
        numpy_dtype = np.dtype("<i8")
    elif damage == "big_endian":
        numpy_dtype = numpy_dtype.newbyteorder(">")
    shape = (2, count // 2) if damage == "two_dimensional" else (count,)
    if damage == "two_dimensional" and count % 2:
        raise UsageError("--damage two_dimensional needs an even token count")
    with open(path, "wb") as file:
        if npy_header is not None or npy_version is not None:
            write_npy_header(file, numpy_dtype, shape, npy_header, npy_version)
            payload = file.tell()
            file.write(ids.astype(numpy_dtype).tobytes())
            return [path], payload, numpy_dtype.itemsize
        if sparse:
            np.lib.format.write_array_header_1_0(
                file, {"descr": np.lib.format.dtype_to_descr(numpy_dtype), "fortran_order": False, "shape": shape})
            payload = file.tell()
            write_sparse_ids(file, count, numpy_dtype.itemsize)
        else:
            np.save(file, ids.astype(numpy_dtype).reshape(shape), allow_pickle=False)
    if not sparse:  # numpy.save writes the header, then the data and nothing after it
        payload = os.path.getsize(path) - count * numpy_dtype.itemsize
    if damage == "wrong_magic":
        with open(path, "r+b") as file:
            file.write(b"\x93NUMPX")
    elif damage == "wrong_version":
        with open(path, "r+b") as file:
            file.seek(6)
            file.write(bytes([9, 0]))
    return [path], payload, numpy_dtype.itemsize


def write_llmc(path, ids, dtype, count, sparse, damage):
    """llm.c's write_datafile: header = np.zeros(256, int32) with magic, version, count; then the ids."""
    magic, version = LLMC_HEADERS[dtype]
    if count >= 2**31:
        raise UsageError(f"llm.c's header counts tokens in an int32: {count} is too many")  # as llm.c asserts
    header = np.zeros(256, dtype="<i4")
    header[0] = magic + (1 if damage == "wrong_magic" else 0)
    header[1] = 3 if damage == "wrong_version" else version
    header[2] = count
    with open(path, "wb") as file:
        file.write(header.tobytes())
        if sparse:
            write_sparse_ids(file, count, DTYPES[dtype].itemsize)
        else:
            file.write(ids.astype(DTYPES[dtype]).tobytes())
    return [path], header.nbytes, DTYPES[dtype].itemsize


def write_olmo(path, ids, dtype, count, sparse, damage):
    """OLMo's (dolma's) memmap: the ids and nothing else; the reader is told the dtype."""
    if sparse:
        with open(path, "wb") as file:
            write_sparse_ids(file, count, DTYPES[dtype].itemsize)
    else:
        array = np.memmap(path, dtype=DTYPES[dtype], mode="w+", shape=(count,))
        array[:] = ids
        array.flush()
        del array
    return [path], 0, DTYPES[dtype].itemsize


def write_trainer(path, ids, dtype, count, sparse, damage, vocab):
    """Ours: the 64-byte header of data/token_file.h, then the ids."""
    itemsize = DTYPES[dtype].itemsize
    magic = b"LLMTOKv0" if damage == "wrong_magic" else TRAINER_MAGIC
    version = 2 if damage == "wrong_version" else 1
    header = magic + struct.pack("<IIQQ", version, itemsize, count, vocab)
    header += b"\x00" * (64 - len(header))
    with open(path, "wb") as file:
        file.write(header)
        if sparse:
            write_sparse_ids(file, count, itemsize)
        else:
            file.write(ids.astype(DTYPES[dtype]).tobytes())
    return [path], len(header), itemsize


def write_megatron(prefix, ids, dtype, count, sparse, damage, lengths):
    """Megatron-LM's _IndexWriter and IndexedDatasetBuilder: one sequence per document."""
    bin_path, idx_path = prefix + ".bin", prefix + ".idx"
    itemsize = DTYPES[dtype].itemsize
    with open(bin_path, "wb") as file:
        if sparse:
            if count > 0:
                write_sparse_ids(file, count, itemsize)
        else:
            file.write(ids.astype(DTYPES[dtype]).tobytes())
    if damage == "missing_idx":
        return [bin_path], 0, itemsize

    sequence_lengths = list(lengths)
    pointers, position = [], 0
    for length in sequence_lengths:  # _IndexWriter._sequence_pointers
        pointers.append(position)
        position += length * itemsize
    document_indices = list(range(len(sequence_lengths) + 1))  # [0], then one per document's end
    if damage == "idx_sizes":
        sequence_lengths[-1] += 1
    elif damage == "idx_pointers":
        if len(pointers) < 2:
            raise UsageError("--damage idx_pointers needs two documents or more (--docs)")
        pointers[1] += itemsize
    elif damage == "idx_documents":
        document_indices[-1] += 1

    with open(idx_path, "wb") as file:
        file.write(b"MMIDIDY\x00\x00" if damage == "wrong_magic" else MEGATRON_MAGIC)
        file.write(struct.pack("<Q", 2 if damage == "wrong_version" else 1))
        file.write(struct.pack("<B", 5 if damage == "wrong_dtype" else MEGATRON_DTYPE_CODES[dtype]))
        file.write(struct.pack("<Q", len(sequence_lengths)))
        file.write(struct.pack("<Q", len(document_indices)))
        file.write(np.array(sequence_lengths, dtype="<i4").tobytes())
        file.write(np.array(pointers, dtype="<i8").tobytes())
        file.write(np.array(document_indices, dtype="<i8").tobytes())
    return [bin_path, idx_path], 0, itemsize


def apply_length_damage(path, damage, itemsize, header_bytes):
    """truncate: the last id cut off; truncate_header: the file cut inside its header (half of it);
    trailing_bytes: one byte more, or one id more in a file without a header (a Megatron .bin)."""
    size = os.path.getsize(path)
    if damage == "truncate":
        os.truncate(path, size - itemsize)
    elif damage == "truncate_header":
        os.truncate(path, header_bytes // 2)
    elif damage == "trailing_bytes":
        with open(path, "ab") as file:
            file.write(b"\x00" * (1 if header_bytes > 0 else itemsize))


def write(args):
    if args.tokens is not None:
        ids = np.array(parse_ids(args.tokens, "--tokens"), dtype=np.int64)
    elif args.tokens_file is not None:
        with open(args.tokens_file) as file:
            ids = np.array(parse_ids(file.read(), args.tokens_file), dtype=np.int64)
    else:
        if args.count is None or args.vocab is None:
            raise UsageError("give --tokens, --tokens-file, or --count with --vocab")
        ids = np.zeros(0, dtype=np.int64) if args.sparse else generated_ids(args.count, args.seed, args.vocab)
    count = args.count if args.sparse else len(ids)
    if args.sparse and (args.count is None or args.tokens is not None or args.tokens_file is not None):
        raise UsageError("--sparse writes --count zeros; it takes no --tokens")
    damage = args.damage
    if damage in DAMAGE_FORMATS and args.format not in DAMAGE_FORMATS[damage]:
        raise UsageError(f"--damage {damage} applies to {' and '.join(DAMAGE_FORMATS[damage])} only")
    if args.docs is not None and args.format != "megatron":
        raise UsageError("--docs: only megatron records documents (the others mark them with an end token)")
    if args.format == "trainer" and args.vocab is None:
        raise UsageError("trainer: --vocab is the header's vocabulary size")
    dtype = choose_dtype(args, int(ids.max()) if len(ids) else 0)
    check_ids_fit(ids, dtype, args.vocab, damage)

    if args.format == "npy":
        files, payload, itemsize = write_npy(args.path, ids, dtype, count, args.sparse, damage, args.npy_header,
                                             args.npy_version)
    elif args.format == "llmc":
        files, payload, itemsize = write_llmc(args.path, ids, dtype, count, args.sparse, damage)
    elif args.format == "olmo":
        files, payload, itemsize = write_olmo(args.path, ids, dtype, count, args.sparse, damage)
    elif args.format == "trainer":
        files, payload, itemsize = write_trainer(args.path, ids, dtype, count, args.sparse, damage, args.vocab)
    else:
        files, payload, itemsize = write_megatron(megatron_prefix(args.path), ids, dtype, count, args.sparse,
                                                  damage, document_lengths(args, count))

    if damage == "id_above_vocab":
        if args.vocab is None and args.bad_id is None:
            raise UsageError("--damage id_above_vocab: give --vocab or --bad_id")
        at = count // 2 if args.damage_at is None else args.damage_at
        if not 0 <= at < count:
            raise UsageError(f"--damage_at {at} is outside the {count} tokens")
        bad = args.vocab if args.bad_id is None else args.bad_id
        poke_id(files[0], payload, itemsize, at, bad, dtype)
    elif damage in ("truncate", "truncate_header", "trailing_bytes"):
        if args.format == "megatron" and damage == "truncate_header":
            apply_length_damage(files[1], damage, itemsize, os.path.getsize(files[1]))  # the .idx
        else:
            apply_length_damage(files[0], damage, itemsize, payload)

    report = {"format": args.format, "files": files, "dtype": dtype, "tokens": count,
              "documents": len(document_lengths(args, count)) if args.format == "megatron" else None,
              "damage": damage}
    if args.print_ids:
        report["ids"] = [int(i) for i in ids]
    print(json.dumps(report))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("format", choices=FORMATS)
    parser.add_argument("path", help="the file to write (megatron: the prefix, or PREFIX.bin / PREFIX.idx)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--tokens", help="the ids, comma-separated: 1,2,3")
    source.add_argument("--tokens-file", "--tokens_file", dest="tokens_file",
                        help="a file of ids separated by commas or white space")
    parser.add_argument("--count", type=int, help="generate this many ids (with --vocab and --seed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, help="the vocabulary: ids are below it (ours records it)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="the id width (default: the format's "
                        "narrowest that holds --vocab)")
    parser.add_argument("--docs", help="megatron: document lengths L1,L2,... adding up to the tokens")
    parser.add_argument("--sparse", action="store_true", help="--count zeros as a hole in a sparse file")
    parser.add_argument("--damage", choices=DAMAGES, help="write a bad shard (see below)")
    parser.add_argument("--damage-at", "--damage_at", dest="damage_at", type=int,
                        help="id_above_vocab: the token index (default the middle)")
    parser.add_argument("--bad-id", "--bad_id", dest="bad_id", type=int,
                        help="id_above_vocab: the id written (default --vocab)")
    parser.add_argument("--npy-header", "--npy_header", dest="npy_header",
                        help="npy: write this dict as the header ({count}: the ids' count), format 1.0")
    parser.add_argument("--npy-version", "--npy_version", dest="npy_version", choices=("1.0", "2.0", "3.0"),
                        help="npy: the header format NumPy writes (default: numpy.save's choice)")
    parser.add_argument("--print-ids", "--print_ids", dest="print_ids", action="store_true",
                        help="include the ids in the JSON line")
    args = parser.parse_args(argv)
    try:
        write(args)
    except UsageError as error:
        parser.exit(2, f"write_shards.py: error: {error}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
