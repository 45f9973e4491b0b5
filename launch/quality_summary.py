"""What the training-quality studies read from a run (launch/quality_runs.sh): its records, and its
final figures: the mean of the last 20 steps' training losses (one step's loss is noisy) and the last
evaluation loss."""
import json
import pathlib
import statistics


def events(folder, kind):
    """The run's metrics.jsonl records of one kind, in order."""
    with open(pathlib.Path(folder, "metrics.jsonl")) as lines:
        return [r for r in map(json.loads, lines) if r.get("event") == kind]


def final_losses(folder):
    """(final training loss, final evaluation loss)."""
    train, evals = events(folder, "train"), events(folder, "eval")
    return statistics.fmean(r["loss"] for r in train[-20:]), evals[-1]["eval_loss"]
