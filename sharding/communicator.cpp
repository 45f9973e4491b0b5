// Argument checks shared by every backend, the world-of-one backend and the MPI backend.
// The NCCL backend lives in nccl_communicator.cpp, compiled only with CUDA.
#include "sharding/communicator.h"

#include <mpi.h>

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "common/collective_log.h"
#include "common/errors.h"

namespace llm {
namespace {

std::string where(const char* collective, const Communicator& communicator) {
  return std::string(collective) + " (" + communicator.backend_name() + " communicator)";
}

bool is_supported_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kLong;
}

// True when the byte ranges of a and b intersect.
bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const auto* a_begin = static_cast<const char*>(a.data_ptr());
  const auto* b_begin = static_cast<const char*>(b.data_ptr());
  return a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

}  // namespace

std::string reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "average"; }

at::Tensor gather_rows(Communicator& communicator, const std::vector<int64_t>& row) {
  at::Tensor table = at::zeros({communicator.world_size(), static_cast<int64_t>(row.size())}, at::kLong);
  table[communicator.rank()].copy_(at::tensor(row, at::kLong));
  if (communicator.world_size() == 1) return table;
  at::Tensor on_device = table.to(communicator.device());
  communicator.all_reduce(on_device, ReduceOp::sum);
  return on_device.to(at::kCPU);
}

// --- what each collective carried: traffic and the collective log -------------------------------

namespace {

// LLM_DEBUG_DELAY_COLLECTIVE=RANK:LABEL:NUMBER:SECONDS (tests): world rank RANK sleeps SECONDS before
// collective NUMBER of its communicator labelled LABEL (NUMBER 0: before each of them), as a rank held
// back would arrive late: a straggler (every one), or a stall past --collective_timeout (one).
struct CollectiveDelay {
  int rank = -1;
  std::string label;
  int64_t number = 0;
  double seconds = 0;
};

const CollectiveDelay& collective_delay() {
  static const CollectiveDelay delay = [] {
    CollectiveDelay d;
    const char* text = std::getenv("LLM_DEBUG_DELAY_COLLECTIVE");
    if (text == nullptr || *text == '\0') return d;
    std::istringstream fields(text);
    std::string rank, number, seconds;
    if (std::getline(fields, rank, ':') && std::getline(fields, d.label, ':') && std::getline(fields, number, ':') &&
        std::getline(fields, seconds)) {
      d.rank = std::stoi(rank);
      d.number = std::stoll(number);
      d.seconds = std::stod(seconds);
    }
    return d;
  }();
  return delay;
}

}  // namespace

void Communicator::set_label(std::string label) {
  label_ = std::move(label);
  log_name_ = label_ + " (ranks ";
  for (size_t i = 0; i < world_ranks_.size(); ++i) log_name_ += (i ? ", " : "") + std::to_string(world_ranks_[i]);
  log_name_ += ")";
}

class Communicator::Record {
 public:
  Record(Communicator& communicator, const char* kind, int64_t bytes)
      : communicator_(communicator), started_(std::chrono::steady_clock::now()), bytes_(bytes) {
    if (communicator.label_.empty()) return;
    const CollectiveDelay& delay = collective_delay();
    const int64_t number = ++communicator.collectives_begun_;
    if (delay.rank == communicator.world_ranks_[static_cast<size_t>(communicator.rank_)] &&
        delay.label == communicator.label_ && (delay.number == 0 || delay.number == number)) {
      std::this_thread::sleep_for(std::chrono::duration<double>(delay.seconds));
      started_ = std::chrono::steady_clock::now();  // held back outside the collective
    }
    slot_ = CollectiveLog::begin(communicator.log_name_, communicator.world_ranks_, kind, bytes);
  }
  ~Record() {
    LinkTraffic& traffic = communicator_.traffic_;
    traffic.bytes_sent += bytes_;
    traffic.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    traffic.collectives += 1;
    if (slot_ != kNone) CollectiveLog::end(slot_);
  }
  Record(const Record&) = delete;
  Record& operator=(const Record&) = delete;

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  Communicator& communicator_;
  std::chrono::steady_clock::time_point started_;
  int64_t bytes_;
  size_t slot_ = kNone;
};

LinkTraffic Communicator::take_traffic() {
  const LinkTraffic taken = traffic_;
  traffic_ = LinkTraffic{};
  return taken;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  LLM_REQUIRE(color >= 0, "split (" + backend_name() + " communicator)", "color",
              "must be >= 0 (got " + std::to_string(color) + ")");
  // Every rank's (color, key) and world rank, on this communicator's device (NCCL gathers CUDA tensors).
  at::Tensor mine = at::tensor(std::vector<int64_t>{color, key, world_ranks_[static_cast<size_t>(rank_)]}, at::kLong);
  at::Tensor all = at::zeros({3 * static_cast<int64_t>(world_size_)}, at::kLong);
  if (world_size_ > 1) {
    const at::Tensor on_device = all.to(device_);
    all_gather(mine.to(device_), on_device);
    all = on_device.to(at::kCPU);
  } else {
    all.copy_(mine);
  }
  std::vector<std::pair<int64_t, int>> order;  // (key, rank here) of this rank's group
  for (int r = 0; r < world_size_; ++r)
    if (all[3 * r].item<int64_t>() == color) order.emplace_back(all[3 * r + 1].item<int64_t>(), r);
  std::sort(order.begin(), order.end());
  std::vector<int> members, world_ranks;
  for (const auto& [group_key, r] : order) {
    members.push_back(r);
    world_ranks.push_back(static_cast<int>(all[3 * r + 2].item<int64_t>()));
  }
  std::unique_ptr<Communicator> split;
  if (world_size_ > 1) split = run_split(color, key, members);  // collective: every rank takes part
  if (members.size() == 1) split = make_single_rank_communicator(device_);
  split->set_world_ranks(std::move(world_ranks));
  return split;
}

// --- argument checks ---------------------------------------------------------------------------

void Communicator::check_tensor(const char* collective, const char* argument,
                                const at::Tensor& tensor) const {
  LLM_REQUIRE(tensor.defined(), where(collective, *this), argument, "the tensor is undefined");
  LLM_REQUIRE(tensor.is_contiguous(), where(collective, *this), argument,
              "the tensor is not contiguous (sizes " + c10::str(tensor.sizes()) + ", strides " +
                  c10::str(tensor.strides()) + "); pass tensor.contiguous() or a flat buffer");
  LLM_REQUIRE(is_supported_dtype(tensor.scalar_type()), where(collective, *this), argument,
              std::string("dtype ") + c10::toString(tensor.scalar_type()) +
                  " is not supported; use float32, bfloat16 or int64");
  LLM_REQUIRE(tensor.device() == device_, where(collective, *this), argument,
              "the tensor is on " + tensor.device().str() + " but this communicator works on " +
                  device_.str() + "; move it there or make a communicator for its device");
}

void Communicator::check_stream(const char* collective, const CollectiveStream& stream) const {
  if (!stream) return;
  LLM_REQUIRE(device_.is_cuda(), where(collective, *this), "stream",
              "a stream was given but this communicator works on " + device_.str() +
                  ", where collectives are blocking; pass no stream");
  LLM_REQUIRE(stream->device() == device_, where(collective, *this), "stream",
              "the stream belongs to " + stream->device().str() + " but the communicator to " +
                  device_.str());
}

void Communicator::check_reduce_op(const char* collective, const at::Tensor& tensor,
                                   ReduceOp op) const {
  LLM_REQUIRE(op != ReduceOp::average || at::isFloatingType(tensor.scalar_type()),
              where(collective, *this), "op",
              std::string("average of ") + c10::toString(tensor.scalar_type()) +
                  " would round each quotient; use sum and divide where you need the mean");
}

void Communicator::all_gather(const at::Tensor& input, const at::Tensor& output,
                              CollectiveStream stream) {
  constexpr const char* kName = "all_gather";
  check_tensor(kName, "input", input);
  check_tensor(kName, "output", output);
  check_stream(kName, stream);
  LLM_REQUIRE(input.scalar_type() == output.scalar_type(), where(kName, *this), "output",
              std::string("dtype ") + c10::toString(output.scalar_type()) +
                  " differs from the input's " + c10::toString(input.scalar_type()));
  LLM_REQUIRE(output.numel() == world_size_ * input.numel(), where(kName, *this), "output",
              "holds " + std::to_string(output.numel()) + " elements; it must hold world_size (" +
                  std::to_string(world_size_) + ") * input elements (" +
                  std::to_string(input.numel()) + ") = " +
                  std::to_string(world_size_ * input.numel()));
  bool in_place = false;
  if (input.numel() > 0 && overlaps(input, output)) {
    const auto* own_slice = static_cast<const char*>(output.data_ptr()) + rank_ * input.nbytes();
    in_place = input.data_ptr() == own_slice;
    LLM_REQUIRE(in_place, where(kName, *this), "input",
                "overlaps the output but is not this rank's slice of it (output[rank * n : "
                "(rank + 1) * n]); use separate buffers or exactly that slice");
  }
  if (input.numel() == 0) return;
  const Record record(*this, kName, (world_size_ - 1) * static_cast<int64_t>(input.nbytes()));
  run_all_gather(input, output, in_place, stream);
}

void Communicator::reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                  CollectiveStream stream) {
  constexpr const char* kName = "reduce_scatter";
  check_tensor(kName, "input", input);
  check_tensor(kName, "output", output);
  check_stream(kName, stream);
  check_reduce_op(kName, input, op);
  LLM_REQUIRE(input.scalar_type() == output.scalar_type(), where(kName, *this), "output",
              std::string("dtype ") + c10::toString(output.scalar_type()) +
                  " differs from the input's " + c10::toString(input.scalar_type()));
  LLM_REQUIRE(input.numel() == world_size_ * output.numel(), where(kName, *this), "input",
              "holds " + std::to_string(input.numel()) + " elements; it must hold world_size (" +
                  std::to_string(world_size_) + ") * output elements (" +
                  std::to_string(output.numel()) + ") = " +
                  std::to_string(world_size_ * output.numel()));
  LLM_REQUIRE(output.numel() == 0 || !overlaps(input, output), where(kName, *this), "output",
              "overlaps the input; reduce_scatter needs separate buffers");
  if (output.numel() == 0) return;
  const Record record(*this, kName, (world_size_ - 1) * static_cast<int64_t>(output.nbytes()));
  run_reduce_scatter(input, output, op, stream);
}

void Communicator::all_reduce(const at::Tensor& tensor, ReduceOp op, CollectiveStream stream) {
  constexpr const char* kName = "all_reduce";
  check_tensor(kName, "tensor", tensor);
  check_stream(kName, stream);
  check_reduce_op(kName, tensor, op);
  if (tensor.numel() == 0) return;
  const Record record(*this, kName, 2 * (world_size_ - 1) * static_cast<int64_t>(tensor.nbytes()) / world_size_);
  run_all_reduce(tensor, op, stream);
}

void Communicator::broadcast(const at::Tensor& tensor, int root, CollectiveStream stream) {
  constexpr const char* kName = "broadcast";
  check_tensor(kName, "tensor", tensor);
  check_stream(kName, stream);
  LLM_REQUIRE(root >= 0 && root < world_size_, where(kName, *this), "root",
              std::to_string(root) + " is not a rank of this world (0 to " +
                  std::to_string(world_size_ - 1) + ")");
  if (tensor.numel() == 0) return;
  const Record record(*this, kName, (world_size_ - 1) * static_cast<int64_t>(tensor.nbytes()) / world_size_);
  run_broadcast(tensor, root, stream);
}

void Communicator::barrier() {
  const Record record(*this, "barrier", 0);
  run_barrier();
}

// --- a world of one ------------------------------------------------------------------------------

namespace {

// Every collective over one rank is the identity; only the two whose input and output are
// different buffers need a copy. The copy runs on the given stream when there is one, so a CUDA
// caller sees the same ordering as with NCCL.
class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(c10::Device device) : Communicator(0, 1, device) {}
  std::string backend_name() const override { return "single"; }

 protected:
  void run_all_gather(const at::Tensor& input, const at::Tensor& output, bool in_place,
                      CollectiveStream stream) override {
    if (in_place) return;
    c10::OptionalStreamGuard guard(stream);
    output.view({-1}).copy_(input.view({-1}));
  }
  void run_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp,
                          CollectiveStream stream) override {
    c10::OptionalStreamGuard guard(stream);
    output.view({-1}).copy_(input.view({-1}));  // sum and average of one term are the term
  }
  void run_all_reduce(const at::Tensor&, ReduceOp, CollectiveStream) override {}
  void run_broadcast(const at::Tensor&, int, CollectiveStream) override {}
  void run_barrier() override {}
  std::unique_ptr<Communicator> run_split(int, int, const std::vector<int>&) override {
    return std::make_unique<SingleRankCommunicator>(device());  // (a world of one splits into itself)
  }
};

// --- MPI, for CPU tensors ------------------------------------------------------------------------

// bfloat16 reductions: MPI has no bfloat16, so we register a 2-byte datatype and a user-defined
// MPI_Op that adds pairs through fp32 and rounds back to nearest-even. Chosen over fp32 staging
// (convert, reduce fp32, convert back) because it moves half the bytes, needs no staging buffers
// (which the memory ledger would have to count and which double a reduce-scatter's footprint), and
// rounds once per hop like NCCL's bf16 sum, so CPU and GPU runs reduce alike. The sum is exact
// whenever every partial sum is representable in bf16 (the tests rely on that).
void add_bfloat16_pairs(void* input, void* inout, int* length, MPI_Datatype*) {
  const auto* in = static_cast<const c10::BFloat16*>(input);
  auto* accumulator = static_cast<c10::BFloat16*>(inout);
  const int count = *length;
  for (int i = 0; i < count; ++i)
    accumulator[i] = c10::BFloat16(static_cast<float>(in[i]) + static_cast<float>(accumulator[i]));
}

MPI_Comm duplicate_world() {
  MPI_Comm comm = MPI_COMM_NULL;
  LLM_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return comm;
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  LLM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  LLM_CHECK_MPI(MPI_Comm_size(comm, &size));
  return size;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const World&) : MpiCommunicator(duplicate_world()) {}
  // Takes `comm` (freed with the communicator).
  explicit MpiCommunicator(MPI_Comm comm)
      : Communicator(comm_rank(comm), comm_size(comm), c10::Device(c10::kCPU)), comm_(comm) {
    LLM_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    LLM_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &bfloat16_type_));
    LLM_CHECK_MPI(MPI_Type_commit(&bfloat16_type_));
    LLM_CHECK_MPI(MPI_Op_create(&add_bfloat16_pairs, /*commute=*/1, &bfloat16_sum_));
  }

  ~MpiCommunicator() override {
    if (!mpi_is_live()) return;  // MPI_Finalize already released everything
    MPI_Op_free(&bfloat16_sum_);
    MPI_Type_free(&bfloat16_type_);
    MPI_Comm_free(&comm_);
  }

  std::string backend_name() const override { return "mpi"; }

 protected:
  void run_all_gather(const at::Tensor& input, const at::Tensor& output, bool in_place,
                      CollectiveStream) override {
    const int count = mpi_count("all_gather", input.numel());
    mpi_count("all_gather", output.numel());
    const MPI_Datatype type = datatype(input);
    if (in_place) {
      LLM_CHECK_MPI(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, output.data_ptr(), count,
                                  type, comm_));
    } else {
      LLM_CHECK_MPI(MPI_Allgather(input.data_ptr(), count, type, output.data_ptr(), count, type,
                                  comm_));
    }
  }

  void run_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                          CollectiveStream) override {
    const int count = mpi_count("reduce_scatter", output.numel());
    mpi_count("reduce_scatter", input.numel());
    LLM_CHECK_MPI(MPI_Reduce_scatter_block(input.data_ptr(), output.data_ptr(), count,
                                           datatype(input), sum_op(input), comm_));
    if (op == ReduceOp::average) output.div_(world_size());
  }

  void run_all_reduce(const at::Tensor& tensor, ReduceOp op, CollectiveStream) override {
    LLM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(),
                                mpi_count("all_reduce", tensor.numel()), datatype(tensor),
                                sum_op(tensor), comm_));
    if (op == ReduceOp::average) tensor.div_(world_size());
  }

  void run_broadcast(const at::Tensor& tensor, int root, CollectiveStream) override {
    LLM_CHECK_MPI(MPI_Bcast(tensor.data_ptr(), mpi_count("broadcast", tensor.numel()),
                            datatype(tensor), root, comm_));
  }

  void run_barrier() override { LLM_CHECK_MPI(MPI_Barrier(comm_)); }

  std::unique_ptr<Communicator> run_split(int color, int key, const std::vector<int>& members) override {
    MPI_Comm part = MPI_COMM_NULL;
    LLM_CHECK_MPI(MPI_Comm_split(comm_, members.size() == 1 ? MPI_UNDEFINED : color, key, &part));
    if (part == MPI_COMM_NULL) return nullptr;  // alone: split() makes a single one
    return std::make_unique<MpiCommunicator>(part);
  }

 private:
  MPI_Datatype datatype(const at::Tensor& tensor) const {
    switch (tensor.scalar_type()) {
      case at::kFloat: return MPI_FLOAT;
      case at::kBFloat16: return bfloat16_type_;
      default: return MPI_INT64_T;  // check_tensor admits nothing else
    }
  }
  MPI_Op sum_op(const at::Tensor& tensor) const {
    return tensor.scalar_type() == at::kBFloat16 ? bfloat16_sum_ : MPI_SUM;
  }
  // MPI counts are int. Splitting larger calls would cost a derived datatype per size; shards of
  // 2^31 elements per rank do not occur on the CPU path, so say so clearly instead.
  int mpi_count(const char* collective, int64_t elements) const {
    LLM_REQUIRE(elements <= INT_MAX, where(collective, *this), "tensor",
                std::to_string(elements) + " elements exceed MPI's int count (" +
                    std::to_string(INT_MAX) + "); split the call into smaller pieces");
    return static_cast<int>(elements);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Datatype bfloat16_type_ = MPI_DATATYPE_NULL;
  MPI_Op bfloat16_sum_ = MPI_OP_NULL;
};

}  // namespace

// --- factories -----------------------------------------------------------------------------------

std::unique_ptr<Communicator> make_single_rank_communicator(c10::Device device) {
  LLM_REQUIRE(!device.is_cuda() || device.has_index(), "make_communicator", "device",
              "'" + device.str() + "' names no GPU; give its index, e.g. cuda:0");
  return std::make_unique<SingleRankCommunicator>(device);
}

std::unique_ptr<Communicator> make_mpi_communicator(const World& world) {
  return std::make_unique<MpiCommunicator>(world);
}

#ifndef TRAINER_HAVE_CUDA
std::unique_ptr<Communicator> make_nccl_communicator(const World&, c10::Device device) {
  throw UserError("make_communicator: device: " + device.str() +
                  " needs the NCCL backend, but this build has no CUDA; rebuild on a machine with "
                  "the CUDA toolkit or run on cpu");
}
#endif

std::unique_ptr<Communicator> make_communicator(const World& world, c10::Device device, bool prefer_mpi) {
  LLM_REQUIRE(device.is_cpu() || device.is_cuda(), "make_communicator", "device",
              "'" + device.str() + "' is neither cpu nor cuda");
  if (world.world_size == 1) return make_single_rank_communicator(device);
  const char* stage = std::getenv("LLM_DEBUG_STAGE_MPI");
  const bool stage_cpu = stage != nullptr && std::string(stage) == "1";
  if (device.is_cuda()) return prefer_mpi ? make_staged_mpi_communicator(world, device) : make_nccl_communicator(world, device);
  return prefer_mpi && stage_cpu ? make_staged_mpi_communicator(world, device) : make_mpi_communicator(world);
}

}  // namespace llm
