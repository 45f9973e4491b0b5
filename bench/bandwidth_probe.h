// The bound of bench/adamw_bench: AdamW's memory streams (four arrays read, three written back in
// place) with no arithmetic to speak of, measured three ways so that the bound is the best known way
// to move those bytes on this machine, not a weaker one. A header of the bench only: the AVX2
// function's target attribute changes no code shared with the library.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include <ATen/ATen.h>

namespace llm::bench {

// The bound's ordinary-store pass over [begin, end) with AVX2, for CPUs that have it (a function of
// this program only: the target attribute changes no code shared with the library). prefetch: one
// software prefetch per line and array, 1 KiB ahead, as our kernel does.
__attribute__((target("avx2"))) static void pass_block_avx2(float* p, float* m, float* v, const float* g,
                                                     int64_t begin, int64_t end, bool prefetch) {
  const __m256 scale = _mm256_set1_ps(1e-7f);
  const auto ahead = [](const float* at) {
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(at) + 1024), _MM_HINT_T0);
  };
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (prefetch) {
      ahead(p + i);
      ahead(m + i);
      ahead(v + i);
      ahead(g + i);
    }
    for (int64_t j = i; j < i + 16; j += 8) {
      const __m256 step = _mm256_mul_ps(scale, _mm256_loadu_ps(g + j));
      _mm256_storeu_ps(p + j, _mm256_add_ps(_mm256_loadu_ps(p + j), step));
      _mm256_storeu_ps(m + j, _mm256_add_ps(_mm256_loadu_ps(m + j), step));
      _mm256_storeu_ps(v + j, _mm256_add_ps(_mm256_loadu_ps(v + j), step));
    }
  }
  for (; i < end; ++i) {
    const float step = 1e-7f * g[i];
    p[i] += step;
    m[i] += step;
    v[i] += step;
  }
}

// The bound: AdamW's memory streams without its arithmetic. Four arrays of n floats; p, m, v are
// read and written in place, g only read; each thread streams one contiguous block, as ours does.
class BandwidthProbe {
 public:
  explicit BandwidthProbe(int64_t n) : n_(n) {
    for (at::Tensor* array : {&param_, &exp_avg_, &exp_avg_sq_, &grad_}) *array = at::empty({n});
    // First touch by the threads (and blocks) that will stream the pages.
    float* arrays[4] = {param_.data_ptr<float>(), exp_avg_.data_ptr<float>(),
                        exp_avg_sq_.data_ptr<float>(), grad_.data_ptr<float>()};
    run([&](int64_t begin, int64_t end) {
      for (float* array : arrays) std::fill(array + begin, array + end, 0.25f);
    });
  }

  // One pass with ordinary stores, each thread one contiguous block (STREAM's way): 32-byte vectors
  // where the CPU has AVX2 (as wide as our kernel, so the bound is not held back by instruction
  // count), else the baseline's.
  void pass() {
    run([&](int64_t begin, int64_t end) { block(begin, end, /*prefetch=*/false); });
  }

  // The same in 64 Ki-element chunks handed out dynamically, with software prefetch: the way our
  // kernel streams (so the bound is the best known way to move these bytes, not a weaker one).
  void pass_chunked_prefetch() {
    constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t begin = 0; begin < n_; begin += kChunk)
      block(begin, std::min(n_, begin + kChunk), /*prefetch=*/true);
  }

  // One pass whose stores bypass the caches (movntps): no line is kept for a reuse that never
  // comes. Each array's 64-byte line is written whole before the next array's (four 16-byte
  // stores in a row): interleaving partial lines of three arrays makes the CPU flush its
  // write-combining buffers half full (measured 2 GB/s on the 2-core EPYC). Blocks start on lines
  // and the arrays are 64-byte aligned, so every store is aligned.
  void pass_non_temporal() {
    float* p = param_.data_ptr<float>();
    float* m = exp_avg_.data_ptr<float>();
    float* v = exp_avg_sq_.data_ptr<float>();
    const float* g = grad_.const_data_ptr<float>();
    run([&](int64_t begin, int64_t end) {
      const __m128 scale = _mm_set1_ps(1e-7f);
      int64_t i = begin;
      for (; i + 16 <= end; i += 16) {
        __m128 step[4];
        for (int k = 0; k < 4; ++k) step[k] = _mm_mul_ps(scale, _mm_load_ps(g + i + 4 * k));
        for (float* array : {p, m, v})
          for (int k = 0; k < 4; ++k)
            _mm_stream_ps(array + i + 4 * k, _mm_add_ps(_mm_load_ps(array + i + 4 * k), step[k]));
      }
      for (; i < end; ++i) {
        const float step = 1e-7f * g[i];
        p[i] += step;
        m[i] += step;
        v[i] += step;
      }
      _mm_sfence();
    });
  }

 private:
  void block(int64_t begin, int64_t end, bool prefetch) {
    float* p = param_.data_ptr<float>();
    float* m = exp_avg_.data_ptr<float>();
    float* v = exp_avg_sq_.data_ptr<float>();
    const float* g = grad_.const_data_ptr<float>();
    if (avx2_) {
      pass_block_avx2(p, m, v, g, begin, end, prefetch);
      return;
    }
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float step = 1e-7f * g[i];
      p[i] += step;
      m[i] += step;
      v[i] += step;
    }
  }

  // body(begin, end) on every thread of the team, blocks of whole 64-byte lines.
  template <typename Body>
  void run(Body&& body) {
    const int64_t lines = (n_ + 15) / 16;
#pragma omp parallel
    {
      const int64_t size = omp_get_num_threads(), me = omp_get_thread_num();
      const int64_t begin = std::min(n_, lines * me / size * 16);
      const int64_t end = std::min(n_, lines * (me + 1) / size * 16);
      if (begin < end) body(begin, end);
    }
  }

  int64_t n_;
  bool avx2_ = __builtin_cpu_supports("avx2");
  at::Tensor param_, exp_avg_, exp_avg_sq_, grad_;
};

}  // namespace llm::bench
