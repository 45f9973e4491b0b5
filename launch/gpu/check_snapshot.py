"""Reads a --memory_snapshot pickle as pytorch.org/memory_viz does, with torch's own loader.

    python3 launch/gpu/check_snapshot.py RUN_DIR/memory_snapshot.rank0.pickle

Prints the segments, blocks and trace events it holds and the sizes of the two HTML views torch
makes from it (torch.cuda._memory_viz.trace_plot and segment_plot); exit 1 if any is empty.
"""
import pickle
import sys

from torch.cuda import _memory_viz


def main(path):
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    segments = snapshot.get("segments", [])
    blocks = sum(len(segment.get("blocks", [])) for segment in segments)
    events = sum(len(trace) for trace in snapshot.get("device_traces", []))
    trace_html = _memory_viz.trace_plot(snapshot)
    segment_html = _memory_viz.segment_plot(snapshot)
    print(f"{path}: {len(segments)} segments, {blocks} blocks, {events} trace events; "
          f"memory_viz trace_plot {len(trace_html)} bytes, segment_plot {len(segment_html)} bytes")
    return 0 if segments and events and trace_html and segment_html else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
