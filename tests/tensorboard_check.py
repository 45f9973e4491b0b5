"""Reads a run's TensorBoard events with TensorBoard's own reader and checks them against its
metrics.jsonl (tests/tensorboard_test.cpp runs the trainer, then this).

  tensorboard_check.py --run_dir RUN [--events DIR] --steps N [--resumed_at S] --ranks R [--proto FILE]

--events defaults to RUN/tensorboard. EventAccumulator applies TensorBoard's restart rule (a
SessionLog START drops what earlier files hold at its step and later), as `tensorboard --logdir` does.
Every train/* scalar must have steps 1..N once, each equal (as float32) to the last train record of
that step in metrics.jsonl, i.e. the resumed run's where a step was trained twice. --proto: the
message and field numbers of trainer/tensorboard.proto equal the package's own descriptors.
Exit 0 when all hold; otherwise the failures, one per line, and exit 1.
"""
import argparse
import json
import os
import re
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)


def f32(value):
    return struct.unpack("f", struct.pack("f", value))[0]


def check_proto(path):
    """Each message of our .proto: its fields' numbers as the package's messages have them."""
    text = open(path).read()
    package = {"Event": event_pb2.Event, "SessionLog": event_pb2.SessionLog, "Summary": summary_pb2.Summary,
               "Value": summary_pb2.Summary.Value, "SummaryMetadata": summary_pb2.SummaryMetadata,
               "PluginData": summary_pb2.SummaryMetadata.PluginData, "TensorProto": tensor_pb2.TensorProto,
               "TensorShapeProto": tensor_shape_pb2.TensorShapeProto, "Dim": tensor_shape_pb2.TensorShapeProto.Dim}
    current = []
    for line in text.splitlines():
        line = line.split("//")[0].strip()
        opened = re.match(r"message (\w+) \{", line)
        if opened:
            current.append(opened.group(1))
            continue
        if line.startswith("enum "):
            current.append(None)
            continue
        if line == "}" and current:
            current.pop()
            continue
        field = re.match(r"(?:repeated )?[\w.]+ (\w+) = (\d+);", line)
        if field and current and current[-1] is not None:
            message = package[current[-1]]
            theirs = message.DESCRIPTOR.fields_by_name.get(field.group(1))
            check(theirs is not None and theirs.number == int(field.group(2)),
                  f"{current[-1]}.{field.group(1)} = {field.group(2)}: the package has "
                  f"{theirs.number if theirs else 'no such field'}")
    check(event_pb2.SessionLog.START == 1 and tensor_pb2.TensorProto.DESCRIPTOR.fields_by_name["dtype"].number == 1,
          "SessionLog.START or TensorProto.dtype moved")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_dir", required=True)
    parser.add_argument("--events")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--resumed_at", type=int, default=0)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--proto")
    args = parser.parse_args()
    events = args.events or os.path.join(args.run_dir, "tensorboard")
    if args.proto:
        check_proto(args.proto)

    records = [json.loads(line) for line in open(os.path.join(args.run_dir, "metrics.jsonl")) if line.strip()]
    train = {}  # step -> the last train record of that step (the resumed run's where it trained twice)
    evals = {}
    for record in records:
        if record.get("event") == "train":
            train[record["step"]] = record
        elif record.get("event") == "eval":
            evals[record["step"]] = record

    accumulator = event_accumulator.EventAccumulator(events, size_guidance={event_accumulator.SCALARS: 0,
                                                                            event_accumulator.TENSORS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = set(tags["scalars"])
    wanted = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
              "train/tokens_per_s": "tokens_per_s", "train/mfu": "mfu", "train/step_time_s": "step_time_s",
              "train/tokens_seen": "tokens_seen", "memory/peak_rss_bytes": "peak_rss_bytes"}
    for phase in ("forward", "backward", "collectives", "optimizer", "other"):
        wanted[f"time/{phase}_s"] = ("phase_s", phase)
    for tag, key in wanted.items():
        if tag not in scalars:
            check(False, f"no scalar {tag} (scalars: {sorted(scalars)})")
            continue
        events_of_tag = accumulator.Scalars(tag)
        steps = [e.step for e in events_of_tag]
        check(steps == list(range(1, args.steps + 1)), f"{tag}: steps {steps}, expected 1..{args.steps} once each")
        for e in events_of_tag:
            record = train.get(e.step)
            if record is None:
                continue
            expected = record[key[0]][key[1]] if isinstance(key, tuple) else record[key]
            check(e.value == f32(expected), f"{tag} at step {e.step}: {e.value}, metrics.jsonl {expected}")
    check(all(0 < train[s]["mfu"] <= 1 for s in train), "an mfu of 0 (the CPU peak was not found) or above 1 in metrics.jsonl")

    if evals:
        eval_steps = [e.step for e in accumulator.Scalars("eval/loss")] if "eval/loss" in scalars else []
        check(eval_steps == sorted(evals), f"eval/loss steps {eval_steps}, metrics.jsonl {sorted(evals)}")
        for e in accumulator.Scalars("eval/loss") if "eval/loss" in scalars else []:
            check(e.value == f32(evals[e.step]["eval_loss"]), f"eval/loss at {e.step}: {e.value}")

    categories = ["parameters", "gradients", "optimizer_device", "optimizer_host", "activations", "other"]
    for scope in ("rank0", "max_over_ranks"):
        for name in ["peak_tracked"] + categories:
            tag = f"memory/{scope}/{name}_bytes"
            check(tag in scalars, f"no scalar {tag}")
    if {"memory/rank0/peak_tracked_bytes", "memory/max_over_ranks/peak_tracked_bytes"} <= scalars:
        rank0 = {e.step: e.value for e in accumulator.Scalars("memory/rank0/peak_tracked_bytes")}
        largest = {e.step: e.value for e in accumulator.Scalars("memory/max_over_ranks/peak_tracked_bytes")}
        check(sorted(rank0) == list(range(1, args.steps + 1)), f"memory steps {sorted(rank0)}")
        check(all(largest[s] >= rank0[s] > 0 for s in rank0), f"max over ranks below rank 0's: {largest} {rank0}")

    texts = set(tags["tensors"])
    check("config" in texts, f"no config text (tensors: {sorted(texts)})")
    if "config" in texts:
        config = json.loads(accumulator.Tensors("config")[-1].tensor_proto.string_val[0].decode()
                            .removeprefix("```json\n").removesuffix("\n```"))
        check(config["world_size"] == args.ranks, f"config world_size {config['world_size']}")
        start = [record for record in records if record.get("event") == "start"][-1]
        check((config.get("peak_flops"), config.get("peak_flops_source")) == (start["peak_flops"], start["peak_flops_source"]),
              f"the config text's MFU peak {config.get('peak_flops')} ({config.get('peak_flops_source')}) is not the "
              f"start record's {start['peak_flops']} ({start['peak_flops_source']})")
        if args.resumed_at:
            check(config["run"]["name"] == "tb-test" and config["run"]["tags"] == ["a", "b"],
                  f"--name/--tags not in the config text: {config['run'].get('name')} {config['run'].get('tags')}")
    if args.resumed_at:
        check("checkpoints" in texts, "no checkpoints text")
        if "checkpoints" in texts:
            saved = [e.step for e in accumulator.Tensors("checkpoints")]
            check(args.resumed_at in saved, f"checkpoint steps {saved}: no {args.resumed_at}")

    for failure in failures:
        print(failure)
    print(json.dumps({"ok": not failures, "scalars": len(scalars), "steps": args.steps}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
