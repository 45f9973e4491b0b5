// How many threads one rank's host work (the CPU optimizer step) should use, so that R ranks on one
// node share its cores instead of each starting a thread per core (R x cores threads, each rank's
// step then waits on the others' time slices).
//
// A launcher either leaves every rank the whole machine or binds each to a part of it (Open MPI
// binds to a core for up to two ranks, to a socket or NUMA node beyond). The rank's affinity mask
// (M CPUs of the N online) tells which: R ranks with masks of M CPUs each share each mask among
// ceil(R * M / N) of them when they are spread evenly, so a rank takes M / ceil(R * M / N) threads.
// Unbound (M = N) that is N / R; bound to a core, 1; 4 ranks bound to the sockets of a 2 x 8-core
// node, 4. The ranks per node come from the launcher's environment, so no MPI call is needed and a
// plain process counts as one rank. Not seen: a container's CPU quota (its mask is the host's CPUs).
#pragma once

namespace llm {

// CPUs this process may run on (its affinity mask; the online CPU count where none is readable).
int cores_available();

// Processes of this job on this node, from the launcher's environment: OMPI_COMM_WORLD_LOCAL_SIZE
// (Open MPI), MPI_LOCALNRANKS (MPICH / Hydra), SLURM_NTASKS_PER_NODE (srun), LOCAL_WORLD_SIZE
// (torchrun); 1 when none is set or readable.
int local_ranks_from_environment();

// Threads for this rank's host step: cores_available() / ceil(local_ranks * cores_available() /
// online CPUs), at least 1 (above). local_ranks <= 0 reads it with local_ranks_from_environment();
// a caller that knows it (World::local_size) passes it.
int default_host_step_threads(int local_ranks = 0);

}  // namespace llm
