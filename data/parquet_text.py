#!/usr/bin/env python3
"""`trainer prepare`'s Parquet reader (FineWeb, Dolma's and the HF hub's Parquet exports): one column
of a Parquet file as JSON Lines on stdout, through pyarrow (the maintained reader; no Parquet is
parsed in the trainer). Started by the trainer (data/text_input.h), batch by batch, so a file of
any size streams in bounded memory.

    python3 data/parquet_text.py FILE COLUMN

Each row's COLUMN becomes {"COLUMN": value}, one line a row, nulls included ({"COLUMN": null}): the
trainer's JSON Lines reader then applies its one rule to both formats (a record's text is a string; a
null is refused naming its row, data/text_input.cpp). A column that holds no strings (numbers, bytes,
lists) is refused here, by its type, before any row. A file pyarrow cannot read, or one without the
column, is a message on stderr and exit status 3.
"""
import json
import sys


def main():
    path, column = sys.argv[1], sys.argv[2]
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        sys.stderr.write(f"pyarrow is not importable from {sys.executable} ({error}); install it there "
                         "(pip install pyarrow) or point TRAINER_PYTHON at a Python that has it")
        sys.exit(3)
    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:  # pyarrow's own errors: not Parquet, damaged footer
        sys.stderr.write(f"is not a Parquet file pyarrow reads ({error})")
        sys.exit(3)
    names = parquet.schema_arrow.names
    if column not in names:
        sys.stderr.write(f"has no column \"{column}\" (its columns: {', '.join(names[:8])}"
                         f"{', ...' if len(names) > 8 else ''}); pass --text_key with the column that holds the text")
        sys.exit(3)
    import pyarrow as pa
    kind = parquet.schema_arrow.field(column).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or
            (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(kind))):
        sys.stderr.write(f"its column \"{column}\" holds {kind}, not strings: each row's text must be a string "
                         "(as each JSON Lines record's); pass --text_key with the column that holds the text")
        sys.exit(3)
    out = sys.stdout
    try:
        for batch in parquet.iter_batches(columns=[column], batch_size=4096):
            for value in batch.column(0).to_pylist():
                out.write(json.dumps({column: value}, ensure_ascii=False))
                out.write("\n")
    except BrokenPipeError:
        sys.exit(0)  # the trainer stopped reading (an error of its own): nothing to add
    except Exception as error:
        sys.stderr.write(f"is damaged: pyarrow stopped reading it ({error})")
        sys.exit(3)
    out.flush()


if __name__ == "__main__":
    main()
