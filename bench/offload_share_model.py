"""The four offload modes (`--offload_step host|speculative|device`, `--offload_delayed_update`),
unit by unit, for llama_1b and llama_7b in bf16 pure at one rank, with fp32 or bf16 AdamW state.
Usage: python3 bench/offload_share_model.py [--pcie GBS] [--check | --variants]
(docs/offload.md, "Which mode to pick", prints its tables). Extends
shared/reference/gpu_speed/offload_sim.py (same event model: one host worker, one D2H and
one H2D copy engine, units embed, L layers, head; k micro-batches of 8x1024 tokens a step, only the
first forward waits for updated rows and only the last backward hands gradients over).
Every figure it prints is a PREDICTION, not a measurement.

Assumptions (each with its source):
  host step bandwidth  HOST_GBS = 130 GB/s: gpu_speed/README.md section 4 (0.37-0.39 s measured
                       for about 38 B/param x 1.34 G params on the H200 machine's 16 cores).
  host step bytes      28 B/param with fp32 state, 20 with bf16 state (bf16 gradient at one rank
                       in pure bf16, clip folded in): memory/estimate_fit.h, docs/offload.md.
  speculative step     AdamW steps out of place (reads the kept master and state, writes the second
                       set): the exact step's bytes. Other rules copy first: + 2 x (4 master +
                       state) B/param (variant 'copy', --variants).
  PCIe                 PCIE_GBS = 50 GB/s each way, both ways at once (Gen5 x16 class): the
                       reference sim's default and README section 4; `--pcie 25` for the
                       estimate's `--pcie_gbs` default (Gen4 class).
  bus bytes            host/speculative/delayed: gradient D2H 2 B/param (bf16), rows H2D 2 B/param.
                       device: state H2D and D2H 4 + 8 (fp32) or 4 + 4 (bf16) B/param each way,
                       gradient and rows stay on the device; two units' state windows on the device.
  device AdamW kernel  28 B/param at 3.3 TB/s on the compute stream (README section 2's HBM figure).
  GPU time, llama_1b   per 8x1024 micro-batch: F 0.174 s, B 0.264 s, per-step rest 0.016 s, measured
                       on the H200 (docs/gpu-results.md, call 5); "after the MFU levers":
                       F 0.055, B 0.085, rest 0.006 (README section 4, a prediction).
  GPU time, llama_7b   41.25 GFLOP/token (flops.py's count) at 34 % MFU of 989 TFLOP/s (torchtitan's
                       eager Llama 3.1 8B on H100, peers.md): 1.005 s per 8x1024, split F:B = 1:2;
                       per-step rest 0.016 s x 6.74/1.34 (scaled by parameters).
  baseline             the same GPU work without offload (no waits); 7b without offload does not
                       fit one GPU: the share is against the GPU work alone.
"""
import argparse

MODELS = {  # embed, per-layer, head parameters (configs/llama_*.json), layers, head FLOP share
    'llama_1b': (65.536e6, 50.333696e6, 65.538e6, 24),
    'llama_7b': (131.072e6, 202.38336e6, 131.076e6, 32),
}
SPEEDS = {  # per micro-batch of 8x1024 tokens: forward, backward, per-step rest (s)
    'llama_1b today (H200, measured)': ('llama_1b', 0.174, 0.264, 0.016),
    'llama_1b after the MFU levers (predicted)': ('llama_1b', 0.055, 0.085, 0.006),
    'llama_7b at 34 % MFU (assumed)': ('llama_7b', 1.005 / 3, 2 * 1.005 / 3, 0.016 * 6.7384 / 1.3391),
}
STATE = {'fp32': dict(step=28, copy=24, dev=8), 'bf16': dict(step=20, copy=16, dev=4)}  # dev: moment bytes


def unit_times(model, fwd, bwd):
    L = MODELS[model][3]
    if model == 'llama_1b':  # the reference sim's split, calibrated on the H200 run
        return [0.0005] + [(fwd - 0.0065) / L] * L + [0.006], [0.001] + [(bwd - 0.006) / L] * L + [0.005]
    hf = 6 * 32000 * 4096 / 41.25e9  # lm_head's share of the FLOPs; embed gather ~0
    return ([0.0005] + [fwd * (1 - hf) / L] * L + [fwd * hf],
            [0.001] + [bwd * (1 - hf) / L] * L + [bwd * hf])


def simulate(model, fwd, bwd, coll, mode, state='fp32', k=1, clip=False, host_gbs=130e9,
             pcie=50e9, sync=0.002, steps=12, variant=''):
    emb, lay, head, L = MODELS[model]
    params = [emb] + [lay] * L + [head]
    n = len(params)
    f, b = unit_times(model, fwd, bwd)
    B = STATE[state]
    hs = [B['step'] * p / host_gbs for p in params]                   # host AdamW per unit
    hs_spec = [(B['step'] + B['copy']) * p / host_gbs for p in params]  # copy, then step the copy
    d2h = [2 * p / pcie for p in params]                              # bf16 gradient
    h2d = [2 * p / pcie for p in params]                              # bf16 rows
    st = [(4 + B['dev']) * p / pcie for p in params]                  # device mode: master + moments, each way
    gk = [28 * p / 3.3e12 for p in params]                            # device mode: the AdamW kernel
    ready = [0.0] * n
    queued, prev_read = [], [0.0] * n
    slot_free = [0.0, 0.0]        # device mode: the two state windows
    eng_in = eng_out = 0.0        # device mode: H2D / D2H engines (state)
    t, host, starts = 0.0, 0.0, []
    for step in range(steps):
        starts.append(t)
        for mb in range(k):
            for u in range(n):
                if mb == 0 and mode == 'device':  # H2D state into a free window, step on the GPU, D2H back
                    w = u % 2
                    eng_in = max(eng_in, slot_free[w]) + st[u]
                    t = max(t, eng_in) + gk[u]
                    eng_out = max(eng_out, t) + st[u]
                    slot_free[w] = eng_out
                elif mb == 0:
                    t = max(t, ready[u])
                t += f[u]
            land, engine = [0.0] * n, 0.0
            for u in reversed(range(n)):
                t += b[u]
                if mb == k - 1 and mode == 'delayed':
                    t = max(t, prev_read[u])   # gradient_ready waits until the worker read the landing buffer
                if mb == k - 1:
                    engine = max(engine, t) + d2h[u]
                    land[u] = engine
        t += coll + sync          # the loss and norm reads: the clipping coefficient is known
        norm = t
        new = [0.0] * n
        if mode in ('none', 'device'):
            pass
        elif mode == 'host':      # today: after the norm, in forward order
            host = max(host, norm)
            for u in range(n):
                host = max(host, land[u]) + hs[u]; new[u] = host + h2d[u]
        elif mode == 'speculative':  # as built (offload/optimizer_offload.cpp): a FIFO worker
            # each unit is queued for a speculative step (c = 1) as its gradient lands, stepped out of
            # place for AdamW (read the kept set, write the second: the exact step's bytes; variant
            # 'copy': the other rules, which copy first); a unit the worker has not begun when the
            # norm comes is stepped after it as without speculation. step() then resolves in forward
            # order: adopt (pointer swap, H2D) or, when clipping fired, step again from the kept set.
            host = max(host, norm - coll - sync - sum(b))
            done = [0.0] * n
            spec = hs_spec if variant == 'copy' else hs
            for u in reversed(range(n)):
                if max(host, land[u]) >= norm:
                    break                        # not begun: left to the norm
                host = max(host, land[u]) + spec[u]; done[u] = host
            host = max(host, norm); eng = norm
            for u in range(n):
                if clip or done[u] == 0.0:      # stepped again, or stepped for the first time, now
                    host = max(host, land[u]) + hs[u]; done[u] = host
                eng = max(eng, done[u], host if clip else 0.0) + h2d[u]; new[u] = eng
        elif mode == 'delayed':   # step t's update feeds step t+2's forward
            host = max(host, norm)   # as built: forward order; variant 'arrival' (not built): head first
            for u in (reversed(range(n)) if variant == 'arrival' else range(n)):
                host = max(host, land[u]) + hs[u]; new[u] = host + h2d[u]; prev_read[u] = host
            queued.append(new)
            new = queued.pop(0) if len(queued) > 1 else [0.0] * n
        ready = new
    return (t - starts[4]) / (steps - 4)


def table(pcie):
    modes = [('host', 'host', False), ('speculative, never clips', 'speculative', False),
             ('speculative, clips every step', 'speculative', True), ('device', 'device', False),
             ('delayed', 'delayed', False)]
    print(f"PCIe {pcie/1e9:.0f} GB/s each way, host step 130 GB/s; share of the no-offload tokens/s kept (PREDICTED)\n")
    print("| GPU speed | state | tokens a step | " + " | ".join(m[0] for m in modes) + " |")
    print("|---|---|---:|" + "---:|" * len(modes))
    for label, (model, fw, bw, coll) in SPEEDS.items():
        for state in ('fp32', 'bf16'):
            for k in (1, 4, 16):
                base = simulate(model, fw, bw, coll, 'none', state, k, pcie=pcie)
                cells = [f"{100 * base / simulate(model, fw, bw, coll, m, state, k, clip=c, pcie=pcie):.0f} %"
                         for _, m, c in modes]
                print(f"| {label} | {state} | {8 * k}k | " + " | ".join(cells) + " |")


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--pcie', type=float, default=50, help='GB/s each way')
    ap.add_argument('--check', action='store_true', help='the reference calibration (65 %% measured)')
    ap.add_argument('--variants', action='store_true', help='the speculative step of the rules that copy first, and the delayed update in arrival order (not built)')
    a = ap.parse_args()
    if a.check:
        base = simulate('llama_1b', 0.174, 0.264, 0.016, 'none')
        # the measured run: fp32 state, fp32 gradient, separate clip pass = 38 B/param -> 0.394 s
        STATE['old'] = dict(step=38, copy=24, dev=8)
        s = simulate('llama_1b', 0.174, 0.264, 0.016, 'host', 'old')
        print(f"calibration: host, 38 B/param: step {s:.3f} s, {100*base/s:.0f} % of {base:.3f} s (measured 0.70-0.71 s, 64-66 %)")
    elif a.variants:
        print("| GPU speed | state | tokens a step | speculative (AdamW, out of place) | speculative, rules that copy first | delayed as built | delayed, arrival order |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for label, (model, fw, bw, coll) in SPEEDS.items():
            for state in ('fp32', 'bf16'):
                for k in (1, 4):
                    base = simulate(model, fw, bw, coll, 'none', state, k, pcie=a.pcie * 1e9)
                    cells = [f"{100 * base / simulate(model, fw, bw, coll, m, state, k, pcie=a.pcie * 1e9, variant=v):.0f} %"
                             for m, v in [('speculative', ''), ('speculative', 'copy'), ('delayed', ''), ('delayed', 'arrival')]]
                    print(f"| {label} | {state} | {8 * k}k | " + " | ".join(cells) + " |")
    else:
        table(a.pcie * 1e9)
