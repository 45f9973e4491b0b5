"""Golden file for AdamW with bf16 optimizer state (--optimizer_state_dtype bfloat16): ten steps on
CPU, written in NumPy from the specification alone (optim/state_rounding.h and the AdamW element
update of optim/adamw_functor.h), not from the C++ code.

The specification:
  * The step is torch.optim.AdamW's single-tensor step in fp32, operation by operation:
      p = p * (1 - lr wd);  m = lerp(m, g, 1 - beta1) (torch's two lerp forms);
      v = v beta2 + ((1 - beta2) g) g;  d = sqrt(v) / sqrt(1 - beta2^t) + eps;
      p = p + (-lr / (1 - beta1^t) m) / d
    with every per-step scalar computed in double and rounded to fp32. The moments are read from
    bf16 exactly (the upper half of the fp32 pattern); the parameter update uses the fp32 moments.
  * The moments are stored in bf16 rounded stochastically: (bits(x) + r) >> 16, NaN -> 0x7FC0, with
    r the low 16 bits (first moment) or the high 16 bits (second moment) of
    lowbias32(i ^ key), i the element's index in the full parameter (flattened, mod 2^32),
    key = low 32 bits of splitmix64(splitmix64(seed) ^ (step << 32) ^ parameter),
    parameter = the tensor's index among the optimizer's parameters (here: its index among its
    group's cases in sorted name order, as the C++ test builds one optimizer per group).
  * Unbiasedness, checked below: over many elements the rounded values average to the fp32 ones.

Layout (every value a tensor, for torch::pickle_load):
  lrs (steps,) f64; meta.seed () int64; meta.eps () f64
  meta.weight_decay () f64 (applied to the cases with NAME.decay = 1)
  NAME.group () int64 (0: betas (0.9, 0.999), 1: betas (0.3, 0.95)); NAME.parameter () int64;
  NAME.decay () int64
  NAME.initial (shape) f32; NAME.grads (steps, *shape) f32
  NAME.final (shape) f32: the parameter after the last step
  NAME.exp_avg, NAME.exp_avg_sq (shape) f32: the bf16 moments after the last step, widened

Regenerate from the repository root:
  ~/.cache/llama-trainer/venv-torch-2.11.0/bin/python tests/golden/make_adamw_bf16_state_golden.py
"""
import math
import pathlib

import numpy as np
import torch

STEPS = 10
SEED = 1234
EPS = 1e-8
MASK64 = (1 << 64) - 1
WEIGHT_DECAY = 0.1
# One optimizer per group: both of torch's lerp forms (beta1 0.9 and 0.3).
GROUPS = [(0.9, 0.999), (0.3, 0.95)]
# name -> (shape, group, decay). Sizes around the vector widths and tails (7, 17, 1023), a shape
# whose rows split unevenly over 3 ranks (37 x 5).
CASES = {
    "matrix_37x5": ((37, 5), 0, True),
    "matrix_64x33": ((64, 33), 0, False),
    "vec_1023": ((1023,), 0, True),
    "vec_7": ((7,), 1, False),
    "wide_4x17": ((4, 17), 1, True),
    "wide_3x40": ((3, 40), 1, True),
}


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def rounding_key(seed, step, parameter):
    return splitmix64(splitmix64(seed) ^ ((step << 32) & MASK64) ^ parameter) & 0xFFFFFFFF


def lowbias32(x):
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def rounding_bits(key, count):
    index = np.arange(count, dtype=np.uint64).astype(np.uint32)  # mod 2^32
    return lowbias32(index ^ np.uint32(key))


def stochastic_round(values, random16):
    """fp32 -> bf16 bits (uint16)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + random16.astype(np.uint64)) >> np.uint64(16)).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded


def widen(bits16):
    return (bits16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def adamw_step(p, g, m_bits, v_bits, lr, betas, wd, t, key):
    f32 = np.float32
    beta1, beta2 = betas
    bias_correction1 = 1.0 - beta1 ** t
    bias_correction2 = 1.0 - beta2 ** t
    decay_factor = f32(1.0 - lr * wd)
    weight = f32(1.0 - beta1)
    from_start = abs(weight) < f32(0.5)
    coefficient = weight if from_start else f32(weight - f32(1.0))
    m, v = widen(m_bits), widen(v_bits)
    decayed = p * decay_factor
    m_new = (m if from_start else g) + coefficient * (g - m)
    v_new = v * f32(beta2) + (f32(1.0 - beta2) * g) * g
    denominator = np.sqrt(v_new) / f32(math.sqrt(bias_correction2)) + f32(EPS)
    p_new = decayed + (f32(-(lr / bias_correction1)) * m_new) / denominator
    bits = rounding_bits(key, p.size)
    m_out = stochastic_round(m_new, bits & np.uint32(0xFFFF))
    v_out = stochastic_round(v_new, bits >> np.uint32(16))
    for array in (decayed, m_new, v_new, denominator, p_new):
        assert array.dtype == np.float32
    return p_new, m_out, v_out


def self_check():
    # The hash: lowbias32 of 0 and 1, and its inverse-free bijection on a sample.
    sample = lowbias32(np.arange(1 << 16, dtype=np.uint32))
    assert len(np.unique(sample)) == 1 << 16
    # Unbiased: 1 + 2^-9 (a quarter of the way between two bf16 neighbours, 2^-7 apart) rounds up a
    # quarter of the time, and the mean of the rounded values is the value (4.5 standard errors).
    count = 1 << 20
    values = np.full(count, 1.0 + 2.0 ** -9, dtype=np.float32)
    rounded = widen(stochastic_round(values, rounding_bits(rounding_key(7, 1, 0), count) & np.uint32(0xFFFF)))
    assert abs(float(np.mean(rounded > 1.0)) - 0.25) < 0.002
    assert abs(float(np.mean(rounded, dtype=np.float64)) - (1.0 + 2.0 ** -9)) < 1.5e-5
    # Exact values stay, NaN is canonical, infinities stay.
    special = np.array([1.0, -2.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    out = stochastic_round(special, np.full(5, 0xFFFF, dtype=np.uint32))
    assert list(out) == [0x3F80, 0xC000, 0x7F80, 0xFF80, 0x7FC0], out


def main():
    self_check()
    rng = np.random.default_rng(20261126)
    lrs = [1e-3 * (1.0 + 0.5 * math.sin(step)) for step in range(STEPS)]
    golden = {"lrs": torch.tensor(lrs, dtype=torch.float64), "meta.seed": torch.tensor(SEED, dtype=torch.int64),
              "meta.eps": torch.tensor(EPS, dtype=torch.float64),
              "meta.weight_decay": torch.tensor(WEIGHT_DECAY, dtype=torch.float64)}
    for name in sorted(CASES):
        shape, group, decay = CASES[name]
        betas = GROUPS[group]
        wd = WEIGHT_DECAY if decay else 0.0
        parameter = [other for other in sorted(CASES) if CASES[other][1] == group].index(name)
        count = int(np.prod(shape))
        p = rng.standard_normal(count).astype(np.float32)
        grads = [(rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 1)).astype(np.float32) for _ in range(STEPS)]
        golden[name + ".initial"] = torch.from_numpy(p.reshape(shape).copy())
        golden[name + ".grads"] = torch.from_numpy(np.stack(grads).reshape((STEPS,) + shape))
        m = np.zeros(count, dtype=np.uint16)
        v = np.zeros(count, dtype=np.uint16)
        for step in range(STEPS):
            t = step + 1
            p, m, v = adamw_step(p, grads[step], m, v, lrs[step], betas, wd, t, rounding_key(SEED, t, parameter))
        golden[name + ".group"] = torch.tensor(group, dtype=torch.int64)
        golden[name + ".parameter"] = torch.tensor(parameter, dtype=torch.int64)
        golden[name + ".decay"] = torch.tensor(int(decay), dtype=torch.int64)
        golden[name + ".final"] = torch.from_numpy(p.reshape(shape).copy())
        golden[name + ".exp_avg"] = torch.from_numpy(widen(m).reshape(shape).copy())
        golden[name + ".exp_avg_sq"] = torch.from_numpy(widen(v).reshape(shape).copy())
    out = pathlib.Path(__file__).with_name("adamw_bf16_state_golden.pt")
    torch.save(golden, out)
    print(f"wrote {out} ({len(CASES)} cases, {STEPS} steps)")


if __name__ == "__main__":
    main()
