"""A run's TensorBoard events (--tensorboard_dir) into a Weights & Biases run.

  python launch/tensorboard_to_wandb.py RUN_DIR/tensorboard [--project P] [--entity E]
  WANDB_MODE=offline python launch/tensorboard_to_wandb.py ...   # kept local; `wandb sync` it later

`wandb sync --sync-tensorboard DIR` does this in wandb 0.29 and older; wandb 0.30 removed the option
("The following options have been removed: --sync-tensorboard", wandb 0.31.0). This reads the files
with TensorBoard's own reader (so a resumed run's restart markers apply: no stale step is sent),
and logs every scalar at its step. The run takes the trainer's --name and --tags and its whole
configuration from the `config` text of the events (GaLore's wandb name and tags, as GaLore's
torchrun_main.py sets them). Prints the W&B run's folder and the number of scalars sent.
"""
import argparse
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", help="the --tensorboard_dir folder")
    parser.add_argument("--project", default="llama-trainer")
    parser.add_argument("--entity", default=None)
    parser.add_argument("--dir", default=None, help="where wandb keeps its files (default: the current folder)")
    args = parser.parse_args()
    import wandb  # after the arguments: --help works without it

    accumulator = event_accumulator.EventAccumulator(args.events, size_guidance={event_accumulator.SCALARS: 0,
                                                                                 event_accumulator.TENSORS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    if not tags["scalars"]:
        sys.exit(f"tensorboard_to_wandb: no scalars in {args.events}: is it a --tensorboard_dir?")
    config, name, run_tags = {}, None, None
    if "config" in tags["tensors"]:
        text = accumulator.Tensors("config")[-1].tensor_proto.string_val[0].decode()
        config = json.loads(text.removeprefix("```json\n").removesuffix("\n```"))
        name = config.get("run", {}).get("name") or None
        run_tags = config.get("run", {}).get("tags") or None
    by_step = {}
    for tag in tags["scalars"]:
        for event in accumulator.Scalars(tag):
            by_step.setdefault(event.step, {})[tag] = event.value
    run = wandb.init(project=args.project, entity=args.entity, name=name, tags=run_tags, config=config, dir=args.dir)
    sent = 0
    for step in sorted(by_step):
        run.log(by_step[step], step=step)
        sent += len(by_step[step])
    print(json.dumps({"wandb_dir": run.dir, "name": name, "tags": run_tags, "steps": len(by_step), "scalars": sent}))
    run.finish()


if __name__ == "__main__":
    main()
