"""Golden values for tests/window_order_test.cpp: the window order of data/window_order.h, written
again from its specification alone (Python integers, no shared code with the C++), so the C++ order
is checked against the specification and a change of either fails the test.

The order is part of a run's replayability: a change here changes which windows every recorded run
reads. Run from the repository root with any Python 3 and paste the printed lines into the test:
  python3 tests/golden/window_order_reference.py
"""
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
ROUNDS = 8


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def epoch_keys(seed, epoch):
    state = mix64(seed) ^ mix64((epoch + GOLDEN) & MASK64)
    keys = []
    for _ in range(ROUNDS):
        state = (state + GOLDEN) & MASK64
        keys.append(mix64(state))
    return keys


def half_bits(n):
    return max(1, ((n - 1).bit_length() + 1) // 2)


def feistel(x, keys, h):
    mask = (1 << h) - 1
    left, right = x >> h, x & mask
    for key in keys:
        left, right = right, left ^ (mix64(key ^ right) & mask)
    return (left << h) | right


def window(n, seed, epoch, index):
    keys, h = epoch_keys(seed, epoch), half_bits(n)
    x = feistel(index, keys, h)
    while x >= n:
        x = feistel(x, keys, h)
    return x


# (n, seed, epoch, first positions): small, odd-bit and even-bit domains, a 10^12-token corpus in
# windows of 1025 (975609756 windows), a 10^12 domain, and the largest n.
CASES = [
    (10, 1234, 0, 10),
    (10, 1234, 1, 10),
    (1000, 0, 0, 8),
    (1 << 20, 42, 3, 8),
    (975609756, 1234, 0, 8),
    (10**12, 7, 2, 8),
    (MASK64, 1, 0, 4),
]


def main():
    assert sorted(window(10, 1234, 0, i) for i in range(10)) == list(range(10))
    print(f"mix64(0x0123456789abcdef) = {mix64(0x0123456789ABCDEF):#x}")
    print("epoch_keys(1234, 5) = {" + ", ".join(f"{k:#x}" for k in epoch_keys(1234, 5)) + "}")
    for n, seed, epoch, count in CASES:
        values = ", ".join(str(window(n, seed, epoch, i)) for i in range(count))
        print(f"{{{n}ULL, {seed}, {epoch}, {{{values}}}}},")


if __name__ == "__main__":
    main()
