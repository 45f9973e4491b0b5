// Bandwidth of the Communicator's collectives, in the manner of nccl-tests' all_reduce_perf:
// one row per (collective, size) with time, algorithm bandwidth, bus bandwidth and a count of
// wrong elements from a run on inputs whose result is known exactly.
//
// Conventions (nccl-tests' doc/PERFORMANCE.md): "size" is the whole buffer, the gathered output
// for all_gather, the input for reduce_scatter, the tensor for all_reduce. algbw = size / time.
// busbw corrects algbw for the data a ring must move, so it can be compared against the hardware's
// link bandwidth whatever the collective and rank count: busbw = algbw * 2(n-1)/n for all_reduce,
// algbw * (n-1)/n for all_gather and reduce_scatter. Time is the mean over the timed iterations
// of the slowest rank (with --apart, over iterations timed one at a time).
//
// On CPU the backend is MPI (shared memory within a host), on GPUs NCCL, for one rank the world
// of one (a copy), unless --backend says otherwise.
//
//   mpirun -np 4 build/communicator_bench [--min-bytes 1K] [--max-bytes 64M] [--step-factor 4]
//          [--iters 20] [--warmup 5] [--dtype float32|bfloat16] [--op sum|average]
//          [--collectives all_gather,reduce_scatter,all_reduce] [--backend auto|single|mpi|nccl]
//          [--compute_ms MS] [--jsonl FILE] [--cold_bytes 64M] [--group_size G [--groups_strided]]
//          [--apart]
//
// --jsonl FILE also writes each row as a JSON line (collective, bytes, ranks, seconds, busbw_gbs,
// wrong, backend, device, dtype, ranks_on_host): the table `trainer estimate --collective_table FILE`
// reads for the step time's collectives inside a node (memory/collective_table.h).
//
// --apart times each iteration on its own, every rank starting it after a barrier over the world, and
// takes the mean over the iterations of the slowest rank's time in each, instead of a loop run back to
// back, where one iteration's tail overlaps the next: training's collectives come one at a time between
// compute, and on a link shaped by a token bucket, back-to-back reduce-scatters across two nodes ran
// up to 1.5x slower than the same ones inside a run (docs/memory.md). The JSON rows then also carry
// iteration_seconds, each iteration's time. A mean, not a median: where ranks share cores an iteration
// may wait a scheduler's tick or more for a descheduled rank, and the run's collectives pay those too.
//
// --compute_ms MS adds the wait row, what training's collectives meet beyond their bandwidth: each
// rank computes MS milliseconds of its own CPU time, then all-reduces 4 bytes, --iters times. When the
// ranks of a host outnumber its cores they take turns on them, and each collective also waits for the
// ranks that are descheduled when it starts; the row reports that wait: the iteration's time less the
// compute stretched by ranks / cores (the step-time model's stretch, memory/step_time.h), per
// collective.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "common/errors.h"
#include "common/log.h"
#include "sharding/communicator.h"
#include "sharding/world.h"

namespace {

using llm::Communicator;
using llm::ReduceOp;

struct Options {
  std::string min_bytes = "1K";
  std::string max_bytes = "64M";
  int step_factor = 4;
  int iters = 20;
  int warmup = 5;
  std::string dtype = "float32";
  std::string op = "sum";
  std::vector<std::string> collectives = {"all_gather", "reduce_scatter", "all_reduce"};
  std::string backend = "auto";
  double compute_ms = 0;  // > 0: the wait row (below)
  std::string jsonl;      // non-empty: the rows as JSON lines too
  std::string cold_bytes;  // non-empty: cycle through buffers of at least this many bytes a rank
  int group_size = 0;       // > 0: groups of this many ranks, each running the collectives at once
  bool groups_strided = false;
  bool apart = false;  // each iteration after a barrier, the mean of the slowest rank's times
};

// "4096", "4K", "64M", "1G" (binary units).
int64_t parse_bytes(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    int64_t value = std::stoll(text, &used);
    const std::string unit = text.substr(used);
    if (unit == "K" || unit == "k") value <<= 10;
    else if (unit == "M" || unit == "m") value <<= 20;
    else if (unit == "G" || unit == "g") value <<= 30;
    else if (!unit.empty()) throw std::invalid_argument(unit);
    if (value < 1) throw std::invalid_argument(text);
    return value;
  } catch (const std::exception&) {
    throw llm::UserError(flag + ": '" + text + "' is not a size; write 4096, 4K, 64M or 1G");
  }
}

double bus_factor(const std::string& collective, int ranks) {
  const double n = ranks;
  return collective == "all_reduce" ? 2.0 * (n - 1) / n : (n - 1) / n;
}

// --- exactly predictable inputs (the scheme of tests/mpi/communicator_test.cpp) ------------------

// Element i of rank r is r * stride + i % stride; the stride keeps every sum over ranks an
// integer that the dtype holds exactly (2^24 for float32, 2^8 for bfloat16).
int64_t pattern_stride(at::ScalarType dtype, int ranks) {
  const int64_t limit = dtype == at::kBFloat16 ? int64_t{1} << 8 : int64_t{1} << 24;
  return std::max<int64_t>(1, std::min<int64_t>(limit / (int64_t{ranks} * (ranks + 1) / 2),
                                                int64_t{1} << 20));
}

at::Tensor pattern_values(int rank, int64_t offset, int64_t count, int64_t stride) {
  return at::arange(offset, offset + count, at::kLong).remainder(stride) + rank * stride;
}

at::Tensor sum_over_ranks(int ranks, int64_t offset, int64_t count, int64_t stride) {
  at::Tensor total = at::zeros({count}, at::kLong);
  for (int rank = 0; rank < ranks; ++rank) total += pattern_values(rank, offset, count, stride);
  return total.to(at::kDouble);
}

int64_t count_wrong(const at::Tensor& actual, const at::Tensor& expected, double relative) {
  const at::Tensor got = actual.to(at::kCPU).to(at::kDouble).flatten();
  return (got - expected).abs().le(expected.abs() * relative).logical_not().sum().item<int64_t>();
}

// --- one row -------------------------------------------------------------------------------------

struct Buffers {
  at::Tensor input, output;  // all_reduce uses input only (in place)
};

struct Row {
  int64_t bytes = 0, count = 0;
  double seconds = 0;
  std::vector<double> iteration_seconds;  // --apart: the slowest rank's time in each iteration
  int64_t wrong = 0;
};

class Bench {
 public:
  Bench(Communicator& comm, at::ScalarType dtype, ReduceOp op, int iters, int warmup, int64_t cold_bytes,
        bool apart)
      : comm_(comm), dtype_(dtype), op_(op), iters_(iters), warmup_(warmup), cold_bytes_(cold_bytes),
        apart_(apart) {}

  Row measure(const std::string& collective, int64_t bytes) {
    const int ranks = comm_.world_size();
    const int64_t element_size = static_cast<int64_t>(c10::elementSize(dtype_));
    // The whole buffer in elements, a multiple of the rank count so that it splits evenly.
    const int64_t count = std::max<int64_t>(ranks, bytes / element_size / ranks * ranks);
    const int64_t per_rank = count / ranks;
    Row row;
    row.count = count;
    row.bytes = count * element_size;

    // --cold_bytes: enough sets of buffers, used in turn, that each collective finds its data out of
    // the caches, as training's do (a unit's shard was last touched a whole pass ago).
    const int64_t set_bytes = row.bytes + (collective == "all_reduce" ? 0 : row.bytes / ranks);
    const int64_t sets = std::clamp<int64_t>((cold_bytes_ + set_bytes - 1) / set_bytes, 1, 256);
    std::vector<Buffers> all;
    for (int64_t s = 0; s < sets; ++s) all.push_back(allocate(collective, count, per_rank));
    Buffers& buffers = all.front();
    int64_t next = 0;
    const auto run_once = [&] { run(collective, all[static_cast<size_t>(next++ % sets)]); };
    for (int i = 0; i < std::max<int64_t>(warmup_, sets); ++i) run_once();
    synchronize();
    if (apart_) {
      row.iteration_seconds = time_apart(run_once);
      for (double each : row.iteration_seconds) row.seconds += each / static_cast<double>(iters_);
    } else {
      row.seconds = time_back_to_back(run_once);
    }

    int64_t wrong = check(collective, buffers, count, per_rank);
    LLM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    row.wrong = wrong;
    return row;
  }

 private:
  at::Tensor empty(int64_t count) const {
    return at::empty({count}, at::TensorOptions().dtype(dtype_).device(comm_.device()));
  }
  at::Tensor pattern(int64_t count) const {
    const int64_t stride = pattern_stride(dtype_, comm_.world_size());
    return pattern_values(comm_.rank(), 0, count, stride).to(comm_.device(), dtype_);
  }

  Buffers allocate(const std::string& collective, int64_t count, int64_t per_rank) const {
    if (collective == "all_gather") return {pattern(per_rank), empty(count)};
    if (collective == "reduce_scatter") return {pattern(count), empty(per_rank)};
    return {pattern(count), at::Tensor()};
  }

  void run(const std::string& collective, const Buffers& buffers) {
    if (collective == "all_gather") comm_.all_gather(buffers.input, buffers.output);
    else if (collective == "reduce_scatter")
      comm_.reduce_scatter(buffers.input, buffers.output, op_);
    else comm_.all_reduce(buffers.input, op_);
  }

  void synchronize() const {
    if (comm_.device().is_cuda()) torch::cuda::synchronize(comm_.device().index());
  }

  // The mean over a loop of iterations run back to back, the slowest rank's.
  template <typename Once>
  double time_back_to_back(const Once& run_once) {
    comm_.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters_; ++i) run_once();
    synchronize();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters_;
    LLM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return seconds;
  }

  // --apart: each iteration after a barrier over the world (every group starts at once), timed on its
  // own; the slowest rank's time in each.
  template <typename Once>
  std::vector<double> time_apart(const Once& run_once) {
    std::vector<double> seconds(static_cast<size_t>(iters_));
    for (double& each : seconds) {
      LLM_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
      const auto start = std::chrono::steady_clock::now();
      run_once();
      synchronize();
      each = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    LLM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, seconds.data(), iters_, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return seconds;
  }

  // Runs the collective once more on fresh pattern inputs and counts wrong elements on this rank.
  int64_t check(const std::string& collective, Buffers& buffers, int64_t count, int64_t per_rank) {
    const int ranks = comm_.world_size();
    const int64_t stride = pattern_stride(dtype_, ranks);
    // Sums are exact by construction; an average may round (NCCL pre-multiplies by 1/n).
    const double unit_roundoff = dtype_ == at::kBFloat16 ? 1.0 / 128 : 1.0 / (1 << 23);
    const double relative = op_ == ReduceOp::average ? 4 * unit_roundoff : 0.0;
    const double divisor = op_ == ReduceOp::average ? ranks : 1.0;
    if (collective == "all_gather") {
      buffers.output.fill_(-1);
      run(collective, buffers);
      at::Tensor expected = at::empty({count}, at::kDouble);
      for (int from = 0; from < ranks; ++from)
        expected.narrow(0, from * per_rank, per_rank)
            .copy_(pattern_values(from, 0, per_rank, stride));
      return count_wrong(buffers.output, expected, 0.0);
    }
    if (collective == "reduce_scatter") {
      buffers.output.fill_(-1);
      run(collective, buffers);
      const at::Tensor expected =
          sum_over_ranks(ranks, comm_.rank() * per_rank, per_rank, stride) / divisor;
      return count_wrong(buffers.output, expected, relative);
    }
    buffers.input.copy_(pattern(count));
    run(collective, buffers);
    return count_wrong(buffers.input, sum_over_ranks(ranks, 0, count, stride) / divisor,
                       relative);
  }

  Communicator& comm_;
  at::ScalarType dtype_;
  ReduceOp op_;
  int iters_, warmup_;
  int64_t cold_bytes_;
  bool apart_;
};

std::unique_ptr<Communicator> make_backend(const std::string& backend, const llm::World& world,
                                           c10::Device device) {
  if (backend == "auto") return llm::make_communicator(world, device);
  if (backend == "single") return llm::make_single_rank_communicator(device);
  if (backend == "mpi") return llm::make_mpi_communicator(world);
  if (backend == "nccl") return llm::make_nccl_communicator(world, device);
  throw llm::UserError("--backend: '" + backend + "'; use auto, single, mpi or nccl");
}

void run_bench(const Options& options, const llm::World& world) {
  const int64_t min_bytes = parse_bytes("--min-bytes", options.min_bytes);
  const int64_t max_bytes = parse_bytes("--max-bytes", options.max_bytes);
  LLM_REQUIRE(min_bytes <= max_bytes, "communicator_bench", "--min-bytes",
              "must not exceed --max-bytes");
  LLM_REQUIRE(options.dtype == "float32" || options.dtype == "bfloat16", "communicator_bench",
              "--dtype", "'" + options.dtype + "'; use float32 or bfloat16");
  LLM_REQUIRE(options.op == "sum" || options.op == "average", "communicator_bench", "--op",
              "'" + options.op + "'; use sum or average");
  for (const std::string& collective : options.collectives)
    LLM_REQUIRE(collective == "all_gather" || collective == "reduce_scatter" ||
                    collective == "all_reduce",
                "communicator_bench", "--collectives",
                "'" + collective + "'; use all_gather, reduce_scatter and/or all_reduce");
  const at::ScalarType dtype = options.dtype == "float32" ? at::kFloat : at::kBFloat16;
  const ReduceOp op = options.op == "sum" ? ReduceOp::sum : ReduceOp::average;

  const bool use_gpu = options.backend == "nccl" ||
                       (options.backend != "mpi" && torch::cuda::is_available());
  const c10::Device device =
      use_gpu ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank))
              : c10::Device(c10::kCPU);
  llm::process_identity().device = device.str();
  const std::unique_ptr<Communicator> world_comm = make_backend(options.backend, world, device);
  // --group_size G: the world split into groups of G that run each collective at once, as hybrid
  // sharding's groups do (consecutive ranks: the groups inside the nodes; --groups_strided: ranks r,
  // r + W / G, ...: the rings across the groups).
  std::unique_ptr<Communicator> group_comm;
  if (options.group_size > 0) {
    LLM_REQUIRE(options.group_size >= 2 && world.world_size % options.group_size == 0, "communicator_bench",
                "--group_size", "must be at least 2 and divide the " + std::to_string(world.world_size) + " ranks");
    const int groups = world.world_size / options.group_size;
    group_comm = world_comm->split(options.groups_strided ? world.rank % groups : world.rank / options.group_size,
                                   world.rank);
  }
  Communicator* const comm = group_comm ? group_comm.get() : world_comm.get();
  comm->set_label("bench");  // named in stall messages; LLM_DEBUG_DELAY_COLLECTIVE=RANK:bench:N:S holds a rank back
  const int ranks = comm->world_size();

  std::vector<int64_t> sizes;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= options.step_factor)
    sizes.push_back(bytes);

  if (world.rank == 0) {
    std::printf("# communicator_bench: backend %s, %d rank(s), %d on this host, device %s; each collective over %d "
                "rank(s), %d group(s) at once%s\n",
                comm->backend_name().c_str(), world.world_size, world.local_size, device.str().c_str(), ranks,
                world.world_size / ranks, options.groups_strided ? " (strided)" : "");
    std::printf("# dtype %s, op %s, %d warm-up + %d timed iterations per row; time is the "
                "slowest rank's %s\n",
                options.dtype.c_str(), options.op.c_str(), options.warmup, options.iters,
                options.apart ? "mean over iterations run apart (--apart)" : "mean over iterations back to back");
    std::printf("# busbw = algbw * 2(n-1)/n (all_reduce), algbw * (n-1)/n (all_gather, "
                "reduce_scatter); #wrong must be 0\n#\n");
    std::printf("# %-15s %12s %12s %9s %8s %11s %11s %11s %8s\n", "collective", "size(B)",
                "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    std::fflush(stdout);
  }
  std::ofstream jsonl;
  if (world.rank == 0 && !options.jsonl.empty()) {
    jsonl.open(options.jsonl, std::ios::trunc);
    LLM_REQUIRE(jsonl.good(), "communicator_bench", "--jsonl", "cannot write '" + options.jsonl + "'");
  }
  Bench bench(*comm, dtype, op, options.iters, options.warmup,
              options.cold_bytes.empty() ? 0 : parse_bytes("--cold_bytes", options.cold_bytes), options.apart);
  std::map<std::string, std::pair<double, int>> bus_bandwidth_sum;  // collective -> (sum, rows)
  int64_t total_wrong = 0;
  for (const std::string& collective : options.collectives) {
    for (int64_t bytes : sizes) {
      const Row row = bench.measure(collective, bytes);
      const double algbw = static_cast<double>(row.bytes) / row.seconds / 1e9;
      const double busbw = algbw * bus_factor(collective, ranks);
      bus_bandwidth_sum[collective].first += busbw;
      bus_bandwidth_sum[collective].second += 1;
      total_wrong += row.wrong;
      if (world.rank == 0) {
        std::printf("  %-15s %12lld %12lld %9s %8s %11.1f %11.3f %11.3f %8lld\n",
                    collective.c_str(), static_cast<long long>(row.bytes),
                    static_cast<long long>(row.count), options.dtype.c_str(),
                    collective == "all_gather" ? "none" : options.op.c_str(), row.seconds * 1e6,
                    algbw, busbw, static_cast<long long>(row.wrong));
        std::fflush(stdout);
        if (jsonl.is_open()) {
          nlohmann::json line{{"collective", collective},        {"bytes", row.bytes},
                              {"ranks", ranks},                  {"seconds", row.seconds},
                              {"busbw_gbs", busbw},              {"wrong", row.wrong},
                              {"backend", comm->backend_name()}, {"device", device.str()},
                              {"dtype", options.dtype},          {"ranks_on_host", world.local_size},
                              {"groups", world.world_size / ranks}};
          if (options.apart) line["iteration_seconds"] = row.iteration_seconds;
          jsonl << line.dump() << "\n" << std::flush;
        }
      }
    }
  }
  if (options.compute_ms > 0) {
    const at::Tensor flag = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(device));
    const auto spin = [&] {  // MS ms of this thread's own CPU time, however long that takes on the clock
      timespec start{}, now{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
      double used = 0;
      volatile uint64_t sink = 0;
      for (uint64_t x = 0; used < options.compute_ms * 1e-3; ++x) {
        sink = x;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
        used = static_cast<double>(now.tv_sec - start.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec - start.tv_nsec);
      }
      (void)sink;
    };
    for (int i = 0; i < options.warmup; ++i) {
      spin();
      comm->all_reduce(flag, op);
    }
    comm->barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iters; ++i) {
      spin();
      comm->all_reduce(flag, op);
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / options.iters;
    LLM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const double stretch = std::max(1.0, static_cast<double>(world.local_size) / cores);
    if (world.rank == 0)
      std::printf("# collective wait: %.1f us a collective (%.1f ms of compute each, %d rank(s) on %d core(s): "
                  "%.1f ms an iteration against %.1f ms stretched)\n",
                  (seconds - options.compute_ms * 1e-3 * stretch) * 1e6, options.compute_ms, world.local_size, cores,
                  seconds * 1e3, options.compute_ms * stretch);
  }
  if (world.rank == 0) {
    for (const auto& [collective, sum_and_rows] : bus_bandwidth_sum)
      std::printf("# Avg bus bandwidth (%s): %.3f GB/s\n", collective.c_str(),
                  sum_and_rows.first / sum_and_rows.second);
    std::printf("# Wrong elements in total: %lld%s\n", static_cast<long long>(total_wrong),
                total_wrong == 0 ? "" : "  <-- RESULTS ARE WRONG");
  }
  if (total_wrong != 0)
    throw llm::SystemError("communicator_bench: " + std::to_string(total_wrong) +
                           " wrong elements (see the #wrong column)");
}

}  // namespace

int main(int argc, char** argv) {
  const llm::World world = llm::start_world(&argc, &argv);
  llm::log::configure(world.rank, world.world_size);

  Options options;
  CLI::App app{"Bandwidth of all_gather, reduce_scatter and all_reduce (nccl-tests style)"};
  app.add_option("--min-bytes", options.min_bytes, "smallest buffer, e.g. 1K");
  app.add_option("--max-bytes", options.max_bytes, "largest buffer, e.g. 64M");
  app.add_option("--step-factor", options.step_factor, "size multiplier between rows")
      ->check(CLI::Range(2, 1024));
  app.add_option("--iters", options.iters, "timed iterations per row")->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed iterations per row")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dtype", options.dtype, "float32 or bfloat16");
  app.add_option("--op", options.op, "sum or average (reduce_scatter, all_reduce)");
  app.add_option("--collectives", options.collectives, "which collectives, comma-separated")
      ->delimiter(',');
  app.add_option("--backend", options.backend, "auto, single, mpi or nccl");
  app.add_option("--group_size", options.group_size,
                 "split the ranks into groups of this many, each running every collective at once (hybrid "
                 "sharding's groups): consecutive ranks, or with --groups_strided ranks r, r + W/G, ...");
  app.add_flag("--groups_strided", options.groups_strided, "--group_size's groups across the consecutive ones");
  app.add_flag("--apart", options.apart,
               "time each iteration on its own after a barrier (the slowest rank's) and report their mean, as "
               "training's collectives come one at a time, instead of a loop's; the JSON rows add iteration_seconds");
  app.add_option("--cold_bytes", options.cold_bytes,
                 "cycle through enough buffers, at least this many bytes a rank (e.g. 64M, past the last-level "
                 "cache), that each collective reads its data from memory as training's do");
  app.add_option("--jsonl", options.jsonl,
                 "also write the rows as JSON lines to FILE (trainer estimate --collective_table FILE)");
  app.add_option("--compute_ms", options.compute_ms,
                 "the wait row: MS ms of CPU time per rank between 4-byte all-reduces (see the header)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = world.rank == 0 ? app.exit(error) : error.get_exit_code();
    llm::stop_world();
    return code;
  }

  return llm::run_reporting_failures(world, [&] {
    run_bench(options, world);
    return 0;
  });
}
