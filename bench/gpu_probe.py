"""One short GPU check (about a minute on an H100/H200) of the assumptions in the team's GPU-speed
reading (../shared/reference/gpu_speed/README.md, where this script comes from; the kit's probe stage
runs it: launch/gpu/run.sh):

  1. which SDPA backend torch 2.11 picks for our bf16 call (cuDNN or flash), and its speed;
  2. the MLP GEMMs of llama_1b at intermediate 5461 (as configured) against 5504 (zero-padded to a
     multiple of 128), forward and both backward products, with the cuBLAS kernel names;
  3. one HF-equivalent eager decoder layer (the ops of model/llama.cpp) forward + backward at 5461,
     at 5504, and at 5504 with torch.rms_norm (the fused CUDA kernel), so the step can be projected:
     24 layers x (layer ms) + head + optimizer;
  4. the composed RMSNorm and rotary against their fused / cheaper forms, alone.

Usage (device):  python3 bench/gpu_probe.py --out $OUT/gpu_probe.json
Dry run (CPU, tiny shapes, checks the script only):  python3 bench/gpu_probe.py --dry
"""
import argparse, json, math, time

import torch
import torch.nn.functional as F


def timed(fn, reps, device):
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = math.inf
        for _ in range(reps):
            start.record(); fn(); end.record(); end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t)
    return best


def kernel_names(fn, device):
    if device != "cuda":
        return []
    from torch.profiler import profile, ProfilerActivity
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(); torch.cuda.synchronize()
    return sorted({e.name[:120] for e in prof.events() if e.device_type.name == "CUDA"})


def rms_composed(x, w, eps):          # model/llama.cpp RMSNormImpl::forward (HF's)
    x32 = x.to(torch.float32)
    var = x32.pow(2).mean(-1, keepdim=True)
    return w * (x32 * torch.rsqrt(var + eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_composed(x, cos, sin):     # model/llama.cpp apply_rotary
    return x * cos + rotate_half(x) * sin


def rotary_roll(x, cos, sin_signed):  # the same products and sum (negation is exact): bitwise equal
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


def rotary_addcmul(x, cos, sin_signed):  # one rounding fewer in bf16 (addcmul rounds once): not bitwise
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


class Layer(torch.nn.Module):
    def __init__(self, h, I, heads, fused_norm, dtype, device):
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(h, h, **kw) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(h, I, **kw), torch.nn.Linear(h, I, **kw)
        self.down = torch.nn.Linear(I, h, **kw)
        self.n1 = torch.nn.Parameter(torch.ones(h, dtype=dtype, device=device))
        self.n2 = torch.nn.Parameter(torch.ones(h, dtype=dtype, device=device))
        self.heads, self.fused = heads, fused_norm

    def norm(self, x, w):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6) if self.fused else rms_composed(x, w, 1e-6)

    def forward(self, x, cos, sin):
        B, T, h = x.shape
        D = h // self.heads
        n = self.norm(x, self.n1)
        q = self.q(n).view(B, T, self.heads, D).transpose(1, 2)
        k = self.k(n).view(B, T, self.heads, D).transpose(1, 2)
        v = self.v(n).view(B, T, self.heads, D).transpose(1, 2)
        q, k = rotary_composed(q, cos, sin), rotary_composed(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, h))
        n = self.norm(x, self.n2)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    device = "cpu" if args.dry else "cuda"
    dt = torch.bfloat16
    B, T, h, heads, L = (2, 64, 128, 2, 24) if args.dry else (8, 1024, 2048, 32, 24)
    widths = (171, 176) if args.dry else (5461, 5504)
    reps = 2 if args.dry else 10
    N, D = B * T, h // heads
    out = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    if device == "cuda":
        out["device"] = torch.cuda.get_device_name(0)

    # 1. SDPA backend for our call: q, k as the rotary's outputs of transposed views
    x = torch.randn(B, T, h, device=device, dtype=dt)
    q = rotary_composed(x.view(B, T, heads, D).transpose(1, 2), torch.ones(T, D, device=device, dtype=dt),
                        torch.zeros(T, D, device=device, dtype=dt)).requires_grad_()
    k = q.detach().clone().requires_grad_(); v = x.view(B, T, heads, D).transpose(1, 2).detach().requires_grad_()
    if device == "cuda":
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True)
        out["sdpa_choice"] = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}.get(choice, choice)

        def sdpa():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        out["sdpa_fwd_bwd_ms"] = 1e3 * timed(sdpa, reps, device)
        out["sdpa_kernels"] = kernel_names(sdpa, device)
        from torch.nn.attention import sdpa_kernel, SDPBackend
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    out[f"sdpa_{name}_fwd_bwd_ms"] = 1e3 * timed(sdpa, reps, device)
            except RuntimeError as error:
                out[f"sdpa_{name}_fwd_bwd_ms"] = f"not available: {str(error)[:80]}"

    # 2. The MLP GEMMs at both widths: forward (x W^T), dX (dY W), dW (dY^T X)
    gemms = {}
    xin = torch.randn(N, h, device=device, dtype=dt)
    for I in widths:
        w_up = torch.randn(I, h, device=device, dtype=dt)           # gate/up weight (I, h)
        w_down = torch.randn(h, I, device=device, dtype=dt)         # down weight (h, I)
        mid = torch.randn(N, I, device=device, dtype=dt)
        dy = torch.randn(N, h, device=device, dtype=dt)
        cases = {"gate_fwd x@Wg^T": lambda: xin @ w_up.t(),
                 "gate_dX dG@Wg": lambda: mid @ w_up,
                 "gate_dW dG^T@X": lambda: mid.t() @ xin,
                 "down_fwd P@Wd^T": lambda: mid @ w_down.t(),
                 "down_dX dY@Wd": lambda: dy @ w_down,
                 "down_dW dY^T@P": lambda: dy.t() @ mid}
        for name, fn in cases.items():
            s = timed(fn, reps, device)
            gemms[f"{I} {name}"] = {"ms": 1e3 * s, "tflops": 2 * N * h * I / s / 1e12}
        gemms[f"{I} kernels"] = kernel_names(lambda: (xin @ w_up.t(), mid @ w_down.t(), dy.t() @ mid), device)
    sq = torch.randn(N, h, device=device, dtype=dt); wq = torch.randn(h, h, device=device, dtype=dt)
    s = timed(lambda: sq @ wq.t(), reps, device)
    gemms["q_proj x@Wq^T"] = {"ms": 1e3 * s, "tflops": 2 * N * h * h / s / 1e12}
    out["gemms"] = gemms

    # 3. One decoder layer, forward + backward, three ways
    cos = torch.randn(T, D, device=device, dtype=dt); sin = torch.randn(T, D, device=device, dtype=dt)
    layers = {}
    for label, I, fused in ((f"I={widths[0]} composed norm", widths[0], False),
                            (f"I={widths[1]} composed norm", widths[1], False),
                            (f"I={widths[1]} torch.rms_norm", widths[1], True)):
        layer = Layer(h, I, heads, fused, dt, device)
        xl = torch.randn(B, T, h, device=device, dtype=dt, requires_grad=True)

        def step():
            layer(xl, cos, sin).sum().backward()
        s = timed(step, reps, device)
        layers[label] = {"layer_fwd_bwd_ms": 1e3 * s, "x24_layers_ms": 24e3 * s}
    out["layer"] = layers

    # 4. RMSNorm and rotary alone (forward + backward)
    xn = torch.randn(B, T, h, device=device, dtype=dt, requires_grad=True)
    wn = torch.ones(h, device=device, dtype=dt, requires_grad=True)
    g = torch.randn(B, T, h, device=device, dtype=dt)
    out["rmsnorm_composed_fwd_bwd_ms"] = 1e3 * timed(lambda: rms_composed(xn, wn, 1e-6).backward(g), reps, device)
    out["rmsnorm_fused_fwd_bwd_ms"] = 1e3 * timed(lambda: F.rms_norm(xn, (h,), wn, 1e-6).backward(g), reps, device)
    out["rmsnorm_fused_kernels"] = kernel_names(lambda: F.rms_norm(xn, (h,), wn, 1e-6).backward(g), device)
    xq = torch.randn(B, T, heads, D, device=device, dtype=dt).transpose(1, 2).requires_grad_()
    gq = torch.randn(B, heads, T, D, device=device, dtype=dt)
    half = D // 2
    sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), -1)
    out["rotary_composed_fwd_bwd_ms"] = 1e3 * timed(lambda: rotary_composed(xq, cos, sin).backward(gq), reps, device)
    out["rotary_roll_fwd_bwd_ms"] = 1e3 * timed(lambda: rotary_roll(xq, cos, sin_signed).backward(gq), reps, device)
    out["rotary_addcmul_fwd_bwd_ms"] = 1e3 * timed(lambda: rotary_addcmul(xq, cos, sin_signed).backward(gq), reps, device)
    with torch.no_grad():
        ref = rotary_composed(xq, cos, sin)
        out["rotary_roll_bitwise_equal_to_composed"] = bool(torch.equal(ref, rotary_roll(xq, cos, sin_signed)))
        out["rotary_addcmul_bitwise_equal_to_composed"] = bool(torch.equal(ref, rotary_addcmul(xq, cos, sin_signed)))
    # 5. The bus offload crosses (issue 43): page-locked host <-> device copies of 256 MiB, each way,
    # the bound the offloaded step's gradient and parameter copies run against.
    if device == "cuda":
        n = 128 * 1024 * 1024  # bf16 elements: 256 MiB
        host = torch.empty(n, dtype=torch.bfloat16).pin_memory()
        dev = torch.empty(n, dtype=torch.bfloat16, device=device)
        nbytes = 2 * n
        out["pcie_host_to_device_gb_per_s"] = nbytes / timed(lambda: dev.copy_(host, non_blocking=True), 5, device) / 1e9
        out["pcie_device_to_host_gb_per_s"] = nbytes / timed(lambda: host.copy_(dev, non_blocking=True), 5, device) / 1e9
        del host, dev
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
