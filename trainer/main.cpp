// `trainer`: the one binary. `trainer --config FILE [flags]` trains (one process, or one rank per GPU
// under mpirun); `trainer prepare ...` turns text into a token file; `trainer report RUN_DIR...`
// aggregates run folders' memory ledgers; `trainer estimate --config FILE [flags] --world_size N`
// predicts peak memory per rank; `trainer export --from CHECKPOINT --to DIR` writes a checkpoint as a
// transformers folder. Exit codes: 0 done (or preempted by SIGTERM, SIGINT or SIGUSR1 with the step
// saved), 2 bad input (config, flags, data, checkpoint, run folders), 3 training diverged,
// 4 a stall (no progress for --collective_timeout seconds: common/watchdog.h), 128 + the signal's
// number when preempted without --save_dir (143 for SIGTERM: the steps are lost), 1 anything else.
// Under mpirun a failure on any rank aborts the whole job with the message, so no rank is left
// waiting in a collective.
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <vector>

#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include "common/device.h"
#include "common/errors.h"
#include "common/folder_lock.h"
#include "common/host_memory.h"
#include "common/log.h"
#include "common/output_files.h"
#include "optim/host_threads.h"
#include "sharding/communicator.h"
#include "sharding/world.h"
#include "checkpoint/checkpoint.h"
#include "trainer/cli.h"
#include "config/config.h"
#include "data/prepare.h"
#include "checkpoint/interchange/export.h"
#include "checkpoint/interchange/pretrained.h"
#include "memory/estimate.h"
#include "memory/estimate_fit.h"
#include "memory/report.h"
#include "memory/techniques.h"
#include "memory/startup_check.h"
#include "trainer/preemption.h"
#include "sharding/topology.h"
#include "trainer/train_loop.h"
#include "common/watchdog.h"

namespace {

// One job per folder (common/folder_lock.h): rank 0 locks --run_dir, --save_dir and --tensorboard_dir
// for the job's life, and every rank learns whether it could before any rank writes there; a second job on either
// is exit 2 naming the folder and the holder.
std::vector<std::unique_ptr<llm::FolderLock>> lock_run_folders(const llm::RunConfig& run, const llm::World& world) {
  std::vector<std::unique_ptr<llm::FolderLock>> locks;
  if (world.rank == 0) try {
      locks.push_back(std::make_unique<llm::FolderLock>(run.logging.run_dir, "--run_dir"));
      const std::string& save_dir = run.checkpoint.save_dir;
      std::error_code error;
      if (!save_dir.empty()) {
        llm::refuse_unless_absent_or(save_dir, llm::OutputKind::folder, "--save_dir");
        error = llm::create_folders_durably(save_dir);  // one it cannot make: the checks below say so
        // A folder it cannot write: check_checkpoints_at_start says so, as for a run without locks.
        if (!error && llm::folder_write_problem(save_dir).empty() &&
            !std::filesystem::equivalent(save_dir, run.logging.run_dir, error))
          locks.push_back(std::make_unique<llm::FolderLock>(save_dir, "--save_dir"));
      }
      // Two jobs' event files in one --tensorboard_dir show as one run's curves, mixed (issue 44): the
      // lock is beside the folder (FolderLock::output), so nothing is created in it before the writer.
      const std::string& tensorboard_dir = run.logging.tensorboard_dir;
      if (!tensorboard_dir.empty()) {
        const std::filesystem::path normal = std::filesystem::absolute(tensorboard_dir).lexically_normal();
        const std::filesystem::path folder = normal.has_filename() ? normal : normal.parent_path();
        // A folder above it that cannot be made: the writer says so, as before.
        if (!llm::create_folders_durably(folder.parent_path()))
          locks.push_back(llm::FolderLock::output(tensorboard_dir, "--tensorboard_dir"));
      }
    } catch (const llm::UserError&) {
      if (world.world_size == 1) throw;
      // Rank 0 reports its own message; the others learn it was refused (below).
      locks.clear();
      llm::all_gather_text("refused");
      throw;
    }
  if (world.world_size > 1 && !llm::all_gather_text("").front().empty())
    llm::fail_after_another_rank("the run's folders are in use by another job: rank 0's message names the folder and its holder");
  return locks;
}

// --device as this rank's device, and the refusals that come before any communicator starts:
// --communicator nccl on a CPU rank, and two ranks on one GPU over NCCL.
c10::Device rank_device(const llm::RunConfig& run, const llm::World& world) {
  const c10::Device device = llm::select_device(run.device, world.local_rank);
  if (run.sharding.communicator == llm::CommunicatorChoice::nccl && !device.is_cuda())
    throw llm::UserError("--communicator nccl: NCCL carries GPU tensors, and this rank runs on " + device.str() +
                         "; use --communicator auto or mpi on CPUs");
  if (world.world_size > 1 && run.sharding.communicator != llm::CommunicatorChoice::mpi) {
    // Before NCCL starts: its own refusal of a shared GPU names neither the ranks nor the fix.
    const std::string gpu = device.is_cuda() ? world.host + " " + llm::gpu_bus_id(device) : "";
    if (const std::optional<std::string> shared = llm::ranks_sharing_a_gpu(llm::all_gather_text(gpu)))
      throw llm::UserError("--device: " + *shared);
  }
  return device;
}

// The job's exit status, with its last line: 0 for a run that ended or saved its preempted step,
// 128 + the signal for a preemption that lost steps.
int exit_status(const llm::TrainingOutcome& outcome, const llm::RunConfig& run, const llm::World& world) {
  if (outcome.preempted_before_first_step) {
    const char* signal = llm::signal_name(outcome.preempted_by);
    const bool saved_before = !run.checkpoint.save_dir.empty();
    if (world.rank == 0)
      llm::log::info("preempted by {} during start-up, before step {}: nothing was trained since {}, so nothing is lost; "
                     "start the job again{}; exit status {}", signal, outcome.steps + 1,
                     outcome.steps == 0 ? std::string("the start") : "step " + std::to_string(outcome.steps),
                     outcome.steps > 0 ? " with the same --continue_from" : std::string(),
                     saved_before ? 0 : 128 + outcome.preempted_by);
    return saved_before ? 0 : 128 + outcome.preempted_by;
  }
  if (outcome.preempted_by != 0) {
    const char* signal = llm::signal_name(outcome.preempted_by);
    if (outcome.preemption_checkpoint.empty()) {
      if (world.rank == 0)
        llm::log::error("preempted by {} at step {}: nothing was saved (no --save_dir), so the steps are lost; "
                        "exit status {}", signal, outcome.steps, 128 + outcome.preempted_by);
      return 128 + outcome.preempted_by;
    }
    if (world.rank == 0)
      llm::log::info("preempted by {} at step {}: saved {}; resume with the same flags and --continue_from {}",
                     signal, outcome.steps, outcome.preemption_checkpoint, run.checkpoint.save_dir);
    return 0;
  }
  if (!outcome.stopped_by.empty()) {
    if (world.rank == 0)
      llm::log::info("stopped after step {} of {} ({}): {}", outcome.steps, run.num_training_steps, outcome.stopped_by,
                     outcome.preemption_checkpoint.empty()
                         ? std::string("nothing was saved (no --save_dir)")
                         : "saved " + outcome.preemption_checkpoint + "; go on with the same flags and --continue_from " +
                               run.checkpoint.save_dir);
    return 0;
  }
  llm::log::info("done: {} steps, final loss {:.4f}, final eval loss {:.4f}", outcome.steps,
                 outcome.final_loss, outcome.final_eval_loss);
  return 0;
}

// Training, from a validated configuration: the run folders locked, the stall watchdog started, the
// checkpoints and --init_from checked, the device, the memory check and the communicators, in that
// order, each before anything that needs it.
int train_command(const llm::ModelConfig& model, const llm::RunConfig& run, const llm::World& world) {
  llm::set_write_failure_policy(run.logging.on_write_error == "warn" ? llm::WriteFailurePolicy::warn
                                                                       : llm::WriteFailurePolicy::stop);
  llm::create_run_dir(run.logging.run_dir);
  const auto locks = lock_run_folders(run, world);
  // From here to the end a rank that stops making progress ends the job, naming the phase
  // (common/watchdog.h); a single process has no collective to wait in.
  const std::unique_ptr<llm::StallWatchdog> watchdog = llm::watch_for_stalls(run, world.rank, world.world_size, world.host);
  // Before the model is built: --continue_from resolves to an intact checkpoint of this model, and
  // --save_dir can be written and holds no other run's checkpoints.
  watchdog->progress("start-up: checking --continue_from and --save_dir");
  const llm::CheckpointStart checkpoints = llm::check_checkpoints_at_start(run, model, world.rank == 0);
  if (!checkpoints.resume_folder.empty() && checkpoints.resume_step == run.num_training_steps) {
    // Exit 0: a requeued job that always passes --continue_from has nothing left to do, which is success.
    if (world.rank == 0)
      llm::log::info("{}: already finished at step {}; nothing to do (raise --num_training_steps to train on)",
                     checkpoints.resume_folder, checkpoints.resume_step);
    return 0;
  }
  llm::RuntimeContext context;
  context.resume_folder = checkpoints.resume_folder;
  context.data_identity = checkpoints.data_identity;
  context.watchdog = watchdog.get();
  watchdog->progress("start-up: reading --init_from");
  // --init_from: the folder's config.json and tensors are checked here, before anything is built.
  const std::unique_ptr<llm::PretrainedFolder> init_from =
      llm::open_init_from(run.checkpoint.init_from, model, world.rank == 0);
  context.init_from = init_from.get();
  context.rank = world.rank;
  context.world_size = world.world_size;
  context.device = rank_device(run, world);
  // Every allocation, context and handle of this rank on its own GPU, not on GPU 0 (common/device.h).
  llm::make_current_device(context.device);
  // Before anything large exists: a run that cannot fit stops here with the numbers (exit 2).
  watchdog->progress("start-up: the memory check");
  if (!run.skip_memory_check)
    llm::check_memory_before_training(model, run, world.rank, world.world_size, world.local_size, context.device);
  llm::process_identity().device = context.device.str();
  watchdog->progress("start-up: starting the communicator");
  const bool over_mpi = run.sharding.communicator == llm::CommunicatorChoice::mpi;
  std::unique_ptr<llm::Communicator> communicator = llm::make_communicator(world, context.device, over_mpi);
  context.communicator = communicator.get();
  // Host tensors never go to NCCL: a GPU rank has a host communicator beside it (train_loop.h).
  std::unique_ptr<llm::Communicator> host_communicator;
  if (!context.device.is_cpu()) host_communicator = llm::make_communicator(world, c10::Device(c10::kCPU));
  context.host_communicator = host_communicator ? host_communicator.get() : communicator.get();
  communicator->set_label("world");
  if (host_communicator) host_communicator->set_label("host");
  // Hybrid sharding: this rank's group and the replicas across the groups (sharding/topology.h).
  llm::HybridCommunicators hybrid;
  std::unique_ptr<llm::Communicator> host_group, host_replicas;
  if (llm::is_hybrid(run.sharding.strategy)) {
    context.topology = llm::make_topology(world, run.sharding.group_size);
    hybrid = llm::split_hybrid(*communicator, context.topology);
    if (host_communicator) host_group = host_communicator->split(context.topology.group, context.topology.shard);
    context.shard_communicator = hybrid.group.get();
    context.replicas = hybrid.across.get();
    context.host_shard_communicator = host_group ? host_group.get() : hybrid.group.get();
    if (host_communicator && run.sharding.optimizer_across_groups) {  // a host block's all-gather
      host_replicas = host_communicator->split(context.topology.shard, context.topology.group);
      context.host_replicas = host_replicas.get();
    }
  }
  // The optimizer over every rank in its layout's order (rank k G + g), --shard_optimizer_across_groups.
  std::unique_ptr<llm::Communicator> optimizer_communicator, host_optimizer_communicator;
  if (run.sharding.optimizer_across_groups) {
    optimizer_communicator = communicator->split(0, context.topology.world_shard());
    optimizer_communicator->set_label("optimizer");
    context.optimizer_communicator = optimizer_communicator.get();
    if (host_communicator) {  // the offloaded optimizer's, for host tensors
      host_optimizer_communicator = host_communicator->split(0, context.topology.world_shard());
      context.host_optimizer_communicator = host_optimizer_communicator.get();
    }
  }
  // full_shard's backward gathers inside a node (--backward_gather_size): the node's ranks, by host.
  std::unique_ptr<llm::Communicator> backward_gather;
  if (run.sharding.backward_gather_size > 0) {
    const llm::ShardTopology node = llm::make_topology(world, run.sharding.backward_gather_size, "--backward_gather_size");
    backward_gather = communicator->split(node.group, node.shard);
    backward_gather->set_label("node");
    context.backward_gather = backward_gather.get();
  }
  llm::start_preemption_deadline(run.preemption_grace_seconds);
  return exit_status(llm::train(model, run, context), run, world);
}

int run_command(const llm::Command& command, const llm::World& world) {
  using Kind = llm::Command::Kind;
  // Only training stops at a step boundary on a signal; every other command ends as a signal says.
  if (command.kind != Kind::train || command.run.logging.print_config) llm::restore_default_signal_actions();
  if (world.rank == 0)
    for (const std::string& warning : command.warnings) llm::log::warn(warning);
  if (command.kind == Kind::help) {
    if (world.rank == 0) std::cout << command.help_text;
    return 0;
  }
  llm::refuse_launch_without_mpi(world);  // torchrun or srun without PMIx: N worlds of one
  if (command.kind == Kind::prepare) {
    if (world.rank == 0) llm::prepare_token_file(command.prepare);
    return 0;
  }
  if (command.kind == Kind::export_model) {
    if (world.rank == 0) llm::export_checkpoint(command.export_options);
    return 0;
  }
  if (command.kind == Kind::report) {
    if (world.rank == 0 && command.report.techniques)
      llm::write_techniques_report(command.report.run_dirs, command.report.context_sweep, command.report.out);
    else if (world.rank == 0)
      llm::write_memory_report(command.report.run_dirs, command.report.out);
    return 0;
  }
  llm::RunConfig run = command.run;
  const llm::ModelConfig model = llm::load_model_config(run.config_path);
  // A hybrid strategy's group size by default: the ranks of one node (the estimate's: --ranks_per_node,
  // else every rank on one node).
  if (llm::is_hybrid(run.sharding.strategy) && run.sharding.group_size == 0) {
    if (command.kind == Kind::estimate)
      run.sharding.group_size =
          command.estimate.ranks_per_node > 0 ? command.estimate.ranks_per_node : command.estimate.world_size;
    else if ((run.sharding.group_size = llm::ranks_per_node(world)) == 0)
      llm::fail_user(llm::kCommandLine, "--shard_group_size",
                     "the nodes hold different numbers of ranks, so there is no default group (the ranks of one "
                     "node): give --shard_group_size");
  }
  if (command.kind == Kind::estimate) {
    llm::validate_run_config(run, model, command.estimate.world_size);
    if (world.rank == 0)
      std::cout << (command.estimate.fit ? llm::run_fit_command(model, run, command.estimate)
                                         : llm::run_estimate_command(model, run, command.estimate))
                << std::flush;
    return 0;
  }
  llm::validate_run_config(run, model, world.world_size);
  if (run.logging.print_config) {
    if (world.rank == 0) std::cout << llm::resolved_config_json(model, run).dump(2) << std::endl;
    return 0;
  }
  return train_command(model, run, world);
}

}  // namespace

int main(int argc, char** argv) {
  // First of all: a scheduler's signal (or mpirun's SIGUSR1) that comes during start-up is recorded,
  // and the run stops before its first step, instead of the signal's default action killing the rank
  // with no word (trainer/preemption.h). Again after MPI starts, in case it set handlers of its own.
  llm::install_preemption_handlers();
  // Then LibTorch's CUDA half, where a GPU could be used (common/device.h), before anything asks
  // LibTorch about CUDA and before the host allocator is counted: as when it was loaded with the binary.
  llm::load_cuda_runtime();
  // Then, before any tensor exists: the memory ledger counts LibTorch's CPU allocations from here,
  // and freed host memory stays in the process for the next step's buffers.
  llm::keep_freed_host_memory();
  llm::install_host_memory_tracking();
  llm::World world = llm::start_world(&argc, &argv);
  llm::install_preemption_handlers();
  llm::log::configure(world.rank, world.world_size);
  // Each rank takes its share of the node's cores for LibTorch's threads and the offloaded host step
  // (optim/host_threads.h), so ranks on one node do not each start a thread per core; an explicit
  // OMP_NUM_THREADS wins.
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    at::set_num_threads(llm::default_host_step_threads(world.local_size));
  const int exit_code = llm::run_reporting_failures(
      world, [&] { return run_command(llm::parse_command_line(argc, argv), world); });
  // The command has closed what it wrote (files, threads, the TensorBoard writer) and MPI is
  // finalized: the process ends here without its static destructors, whose undoing of LibTorch's
  // operator registrations alone costs 60 ms of CPU in every rank of every run (0.20 -> 0.14 s for a
  // program that only loads LibTorch). What stdio and the logger hold is flushed first.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(exit_code);
}
