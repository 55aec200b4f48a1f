// launch_env.h - what a worker learns about its place in the job from the
// environment its launcher set.
//
// torchrun (and the course's ddprun) set RANK, WORLD_SIZE, LOCAL_RANK, ...
// Jobs started by SLURM's srun or by mpirun (OpenMPI's or MPICH's) get
// their own names for the same facts; we read those when torchrun's are
// absent, so the same binary runs under all of them. Started by hand, a program is one process.
#ifndef COURSE_LAUNCH_ENV_H
#define COURSE_LAUNCH_ENV_H

#include <stdbool.h>
#include <stdlib.h>

#include "check.h"

typedef struct {
    int rank, world_size;             // global
    int local_rank, local_world_size; // within this node
    int group_rank;                   // which node
    int restart_count, max_restarts;  // set by ddprun --max_restarts
    bool launched;                    // false: started by hand, one process
    const char *source;               // which variables told us
} launch_env_t;

// Reads an integer variable; returns fallback when unset; dies on garbage,
// because a mistyped RANK would otherwise hang the whole job.
static inline int launch_env_int(const char *name, int fallback) {
    const char *text = getenv(name);
    if (!text || !text[0]) return fallback;
    char *end;
    long v = strtol(text, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000)
        die("environment variable %s='%s' is not a valid non-negative integer", name, text);
    return (int)v;
}

static inline bool launch_env_has(const char *name) {
    const char *text = getenv(name);
    return text && text[0];
}

// Was this process started by an MPI launcher, one whose job MPI_Init can
// join? Such a launcher serves the job and says so: PMIx (OpenMPI's mpirun,
// srun --mpi=pmix) sets PMIX_RANK, PMI (MPICH's hydra, srun --mpi=pmi2) sets
// PMI_SIZE, OpenMPI's mpirun before PMIx sets OMPI_MCA_orte_hnp_uri.
// OMPI_COMM_WORLD_* alone, set by hand, name the ranks and no server: there
// MPI_Init would start a job of its own for each process (forking an orted),
// every rank would be MPI rank 0 of 1, and the course reads the ranks from
// those variables instead, as it reads SLURM's.
static inline bool launch_env_by_mpi(void) {
    return launch_env_has("PMIX_RANK") || launch_env_has("PMI_SIZE") ||
           launch_env_has("OMPI_MCA_orte_hnp_uri");
}

static inline void launch_env_read_names(launch_env_t *e, const char *rank, const char *world,
                                         const char *local_rank, const char *local_world) {
    e->rank = launch_env_int(rank, 0);
    e->world_size = launch_env_int(world, 1);
    e->local_rank = launch_env_int(local_rank, e->rank);
    e->local_world_size = local_world ? launch_env_int(local_world, e->world_size) : e->world_size;
}

// SLURM_TASKS_PER_NODE reads like "4(x2),3": 4 tasks on each of the first
// two nodes, then 3. Returns the count of node `node`, or 0 if unknown.
static inline int launch_env_slurm_tasks(const char *spec, int node) {
    int index = 0;
    while (spec && *spec) {
        char *end;
        long tasks = strtol(spec, &end, 10), repeat = 1;
        if (end == spec || tasks < 1) return 0;
        if (!strncmp(end, "(x", 2)) {
            repeat = strtol(end + 2, &end, 10);
            if (*end++ != ')' || repeat < 1) return 0;
        }
        if (node < index + repeat) return (int)tasks;
        index += (int)repeat;
        spec = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static inline launch_env_t launch_env_read(void) {
    launch_env_t e = {0, 1, 0, 1, 0, 0, 0, false, "none"};
    if (launch_env_has("RANK") || launch_env_has("WORLD_SIZE")) {
        launch_env_read_names(&e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
        e.source = "torchrun variables (RANK, WORLD_SIZE, ...)";
    } else if (launch_env_has("SLURM_PROCID") && launch_env_has("SLURM_NTASKS")) {
        launch_env_read_names(&e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL);
        e.group_rank = launch_env_int("SLURM_NODEID", 0);
        // Nodes may hold different numbers of tasks: ask for this node's.
        int here = launch_env_slurm_tasks(getenv("SLURM_TASKS_PER_NODE"), e.group_rank);
        if (here > 0) e.local_world_size = here;
        e.source = "SLURM variables (SLURM_PROCID, SLURM_NTASKS, ...)";
    } else if (launch_env_has("OMPI_COMM_WORLD_RANK")) {
        launch_env_read_names(&e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
        // OpenMPI names no node index (OMPI_COMM_WORLD_NODE_RANK is something
        // else); with the same number of ranks on every node, it is this:
        e.group_rank = e.local_world_size > 0 ? e.rank / e.local_world_size : 0;
        e.source = "OpenMPI variables (OMPI_COMM_WORLD_*)";
    } else if (launch_env_has("PMI_RANK") && launch_env_has("PMI_SIZE")) {   // MPICH's mpirun (hydra)
        launch_env_read_names(&e, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
        e.group_rank = e.local_world_size > 0 ? e.rank / e.local_world_size : 0;
        e.source = "MPICH variables (PMI_RANK, PMI_SIZE, ...)";
    } else {
        return e;
    }
    e.launched = true;
    e.group_rank = launch_env_int("GROUP_RANK", e.group_rank);
    e.restart_count = launch_env_int("TORCHELASTIC_RESTART_COUNT", 0);
    e.max_restarts = launch_env_int("TORCHELASTIC_MAX_RESTARTS", 0);
    if (e.world_size < 1) die("world size must be at least 1 (from %s)", e.source);
    if (e.rank >= e.world_size)
        die("rank %d is not below world size %d (from %s)", e.rank, e.world_size, e.source);
    if (e.local_rank >= e.local_world_size && e.local_world_size > 0)
        die("local rank %d is not below local world size %d (from %s)", e.local_rank,
            e.local_world_size, e.source);
    return e;
}

#endif
