"""Why bf16 training is slow on a CPU without AVX-512: times the three GEMMs of the LM head of
llama_20m's step (1024 tokens x hidden 256 x vocab 32000) in fp32 and bf16 with PyTorch on this
machine, the best of 3 after a warm-up. docs/techniques.md's bf16 tokens/s on CPU measure these.

  $VENV/bin/python bench/cpu_bf16_gemm.py [--tokens 1024 --hidden 256 --vocab 32000]
"""
import argparse
import time

import torch


def best_ms(fn, repeats=3):
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    flags = open("/proc/cpuinfo").read().split()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"avx512f={'avx512f' in flags} avx512_bf16={'avx512_bf16' in flags} amx_bf16={'amx_bf16' in flags}")
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(args.tokens, args.hidden, dtype=dtype)
        w = torch.randn(args.vocab, args.hidden, dtype=dtype)
        g = torch.randn(args.tokens, args.vocab, dtype=dtype)
        print(f"{str(dtype):15s} logits x @ w.T {best_ms(lambda: x @ w.t()):9.1f} ms | "
              f"input grad g @ w {best_ms(lambda: g @ w):9.1f} ms | weight grad g.T @ x {best_ms(lambda: g.t() @ x):9.1f} ms")


if __name__ == "__main__":
    main()
