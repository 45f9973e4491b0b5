// `trainer`: the one binary. `trainer --config FILE [flags]` trains (one process, or one rank per GPU
// under mpirun); `trainer prepare ...` turns text into a token file; `trainer report RUN_DIR...`
// aggregates run folders' memory ledgers; `trainer estimate --config FILE [flags] --world_size N`
// predicts peak memory per rank; `trainer export --from CHECKPOINT --to DIR` writes a checkpoint as a
// transformers folder. Exit codes: 0 done (or preempted by SIGTERM, SIGINT or SIGUSR1 with the step
// saved), 2 bad input (config, flags, data, checkpoint, run folders), 3 training diverged,
// 4 a stall (no progress for --collective_timeout seconds: trainer/watchdog.h), 128 + the signal's
// number when preempted without --save_dir (143 for SIGTERM: the steps are lost), 1 anything else.
// Under mpirun a failure on any rank aborts the whole job with the message, so no rank is left
// waiting in a collective.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include "common/device.h"
#include "common/errors.h"
#include "common/host_memory.h"
#include "common/log.h"
#include "optim/host_threads.h"
#include "sharding/communicator.h"
#include "sharding/world.h"
#include "trainer/checkpoint.h"
#include "trainer/cli.h"
#include "trainer/config.h"
#include "trainer/data/prepare.h"
#include "trainer/interchange/export.h"
#include "trainer/interchange/pretrained.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/report.h"
#include "trainer/memory/techniques.h"
#include "trainer/memory/startup_check.h"
#include "trainer/preemption.h"
#include "trainer/train_loop.h"

namespace {

int run_command(const llm::Command& command, const llm::World& world) {
  using Kind = llm::Command::Kind;
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
  if (command.kind == Kind::estimate) {
    llm::validate_run_config(run, model, command.estimate.world_size);
    if (world.rank == 0) std::cout << llm::run_estimate_command(model, run, command.estimate) << std::flush;
    return 0;
  }
  llm::validate_run_config(run, model, world.world_size);
  if (run.logging.print_config) {
    if (world.rank == 0) std::cout << llm::resolved_config_json(model, run).dump(2) << std::endl;
    return 0;
  }
  llm::create_run_dir(run.logging.run_dir);
  // Before the model is built: --continue_from resolves to an intact checkpoint of this model, and
  // --save_dir can be written and holds no other run's checkpoints.
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
  // --init_from: the folder's config.json and tensors are checked here, before anything is built.
  const std::unique_ptr<llm::PretrainedFolder> init_from =
      llm::open_init_from(run.checkpoint.init_from, model, world.rank == 0);
  context.init_from = init_from.get();
  context.rank = world.rank;
  context.world_size = world.world_size;
  const bool over_mpi = run.sharding.communicator == llm::CommunicatorChoice::mpi;
  context.device = llm::select_device(run.device, world.local_rank);
  if (run.sharding.communicator == llm::CommunicatorChoice::nccl && !context.device.is_cuda())
    throw llm::UserError("--communicator nccl: NCCL carries GPU tensors, and this rank runs on " + context.device.str() +
                         "; use --communicator auto or mpi on CPUs");
  if (world.world_size > 1 && !over_mpi) {
    // Before NCCL starts: its own refusal of a shared GPU names neither the ranks nor the fix.
    const std::string gpu = context.device.is_cuda() ? world.host + " " + llm::gpu_bus_id(context.device) : "";
    if (const std::optional<std::string> shared = llm::ranks_sharing_a_gpu(llm::all_gather_text(gpu)))
      throw llm::UserError("--device: " + *shared);
  }
  // Every allocation, context and handle of this rank on its own GPU, not on GPU 0 (common/device.h).
  llm::make_current_device(context.device);
  // Before anything large exists: a run that cannot fit stops here with the numbers (exit 2).
  if (!run.skip_memory_check)
    llm::check_memory_before_training(model, run, world.rank, world.world_size, world.local_size, context.device);
  llm::process_identity().device = context.device.str();
  std::unique_ptr<llm::Communicator> communicator = llm::make_communicator(world, context.device, over_mpi);
  context.communicator = communicator.get();
  // Host tensors never go to NCCL: a GPU rank has a host communicator beside it (train_loop.h).
  std::unique_ptr<llm::Communicator> host_communicator;
  if (!context.device.is_cpu()) host_communicator = llm::make_communicator(world, c10::Device(c10::kCPU));
  context.host_communicator = host_communicator ? host_communicator.get() : communicator.get();
  llm::install_preemption_handlers();  // from here a signal stops the run at a step boundary
  llm::start_preemption_deadline(run.preemption_grace_seconds);
  const llm::TrainingOutcome outcome = llm::train(model, run, context);
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
  llm::log::info("done: {} steps, final loss {:.4f}, final eval loss {:.4f}", outcome.steps,
                 outcome.final_loss, outcome.final_eval_loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First, before any tensor exists: the memory ledger counts LibTorch's CPU allocations from here,
  // and freed host memory stays in the process for the next step's buffers.
  llm::keep_freed_host_memory();
  llm::install_host_memory_tracking();
  llm::World world = llm::start_world(&argc, &argv);
  llm::log::configure(world.rank, world.world_size);
  // Each rank takes its share of the node's cores for LibTorch's threads and the offloaded host step
  // (optim/host_threads.h), so ranks on one node do not each start a thread per core; an explicit
  // OMP_NUM_THREADS wins.
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    at::set_num_threads(llm::default_host_step_threads(world.local_size));
  return llm::run_reporting_failures(
      world, [&] { return run_command(llm::parse_command_line(argc, argv), world); });
}
