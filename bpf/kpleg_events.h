/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The event ABI between kpleg's BPF programs and userspace. Included by both sides: by the BPF
 * programs (after vmlinux.h) and by C++ (after <linux/types.h>). Fixed-width types only, explicit
 * padding, numbered enums; every record starts with struct kpleg_event_header. The C++ side
 * static_asserts every size and offset (userspace/kernel/kernel_event.h).
 *
 * Bump KPLEG_ABI_VERSION on any layout change: the loader refuses an object whose baked-in
 * version differs from the one it was compiled with.
 */
#ifndef KPLEG_EVENTS_H
#define KPLEG_EVENTS_H

#define KPLEG_ABI_VERSION 7

#define KPLEG_CGROUP_PATH_MAX 512 /* systemd paths of nested nodes exceed 256 */
#define KPLEG_COMM_MAX 16
#define KPLEG_FILENAME_MAX 128
#define KPLEG_ROOT_NAME_MAX 32
#define KPLEG_MAX_ROOT_NAMES 4
#define KPLEG_ID_LEN 64 /* a container's or sandbox's id: 64 lowercase hex digits */
#define KPLEG_RMDIR_PATH_MAX 256 /* a longer path given to rmdir is not looked at */

enum kpleg_event_type {
	KPLEG_EVENT_CGROUP_MKDIR = 1,
	KPLEG_EVENT_CGROUP_RMDIR = 2,
	KPLEG_EVENT_EXEC = 3,
	KPLEG_EVENT_EXIT = 4,
	KPLEG_EVENT_OOM = 5,
	KPLEG_EVENT_REMOVAL_HINT = 6,
	KPLEG_EVENT_TYPE_MAX = 7, /* one past the last valid type */
};

/* Header flags. */
enum kpleg_event_flags {
	KPLEG_FLAG_PATH_TRUNCATED = 1 << 0, /* cgroup path did not fit KPLEG_CGROUP_PATH_MAX */
	KPLEG_FLAG_CORE_DUMPED = 1 << 1,    /* exit: the process dumped core */
	KPLEG_FLAG_OOM_KILLED = 1 << 2,     /* exit: the OOM killer killed this process */
	KPLEG_FLAG_UNTRACKED = 1 << 3,      /* mkdir: the cgroup belongs to a tracked root but the
					     * tracked-cgroup map is full: nothing in it is seen */
	KPLEG_FLAG_OVER_BUDGET = 1 << 4,    /* mkdir: the cgroup's pod is over its budget
					     * (cgroups tracked, or mkdirs per second): the cgroup
					     * is not tracked. At most one such record per pod and
					     * second; the others are counted in `pod_budgets` */
};

/* Per-CPU counters, indices into the `counters` array map. */
enum kpleg_counter {
	KPLEG_CNT_EMITTED = 0,         /* records committed to the ring buffer */
	KPLEG_CNT_FILTERED = 1,        /* hook invocations outside tracked cgroups */
	KPLEG_CNT_RINGBUF_DROPS = 2,   /* records lost because the ring buffer was full */
	KPLEG_CNT_HELPER_FAILURES = 3, /* a BPF helper returned an error */
	KPLEG_CNT_EXEC_REPEATED = 4,   /* execs in a tracked cgroup after its first (not emitted) */
	KPLEG_CNT_EXIT_IGNORED = 5,    /* exits in a tracked cgroup that are not its init's death */
	KPLEG_CNT_TRACK_FULL = 6,      /* a cgroup could not be tracked: the map is full */
	KPLEG_CNT_DROPS_MKDIR = 7,     /* ring-buffer drops by event type ... */
	KPLEG_CNT_DROPS_RMDIR = 8,
	KPLEG_CNT_DROPS_EXEC = 9,
	KPLEG_CNT_DROPS_EXIT = 10,
	KPLEG_CNT_DROPS_OOM = 11,      /* (the removal hint's drops: KPLEG_CNT_DROPS_REMOVAL_HINT) */
	KPLEG_CNT_EXEC_REEXEC = 12,    /* a runtime re-executing itself (runc's memfd), not claimed */
	KPLEG_CNT_EXEC_HOOK = 13,      /* an exec by a child of a process in the same cgroup before
					* the entrypoint (an OCI hook), not claimed */
	KPLEG_CNT_DROPS_REMOVAL_HINT = 14,
	KPLEG_CNT_OVER_BUDGET = 15,    /* mkdirs refused because their pod was over its budget */
	KPLEG_CNT_MAX = 16,
};

/* The programs, for the `helper_failures` map: failures are counted by program and errno, at
 * index prog * KPLEG_ERRNO_SLOTS + errno (errno >= KPLEG_ERRNO_SLOTS - 1 in the last slot). */
enum kpleg_prog {
	KPLEG_PROG_CGROUP_MKDIR = 0,
	KPLEG_PROG_CGROUP_RMDIR = 1,
	KPLEG_PROG_EXEC = 2,
	KPLEG_PROG_EXIT = 3,
	KPLEG_PROG_OOM = 4,
	KPLEG_PROG_REMOVAL_HINT = 5,
	KPLEG_PROG_MAX = 6,
};
#define KPLEG_ERRNO_SLOTS 64

/* Kind of a tracked cgroup, the value type of the `tracked_cgroups` map. */
enum kpleg_tracked_kind {
	KPLEG_TRACKED_ROOT = 1,       /* a tracked root (kubepods, kubepods.slice, ...) */
	KPLEG_TRACKED_DESCENDANT = 2, /* any other cgroup below a tracked root */
	KPLEG_TRACKED_QOS = 3,        /* a level between a root and its pods, below a root or
				       * another level: a QoS level (burstable, besteffort,
				       * *-burstable.slice, *-besteffort.slice), or kubepods,
				       * kubepods.slice below a root of another name */
};

/* exec_seen: 0 not yet, 1 claimed by the exec program, 2 running before the loader (seeded). */
#define KPLEG_EXEC_CLAIMED 1
#define KPLEG_EXEC_SEEDED 2

struct kpleg_tracked_cgroup {
	__u32 kind;        /* enum kpleg_tracked_kind */
	__u32 init_tgid;   /* tgid of the first exec'd process, 0 until then */
	__u64 exec_seen;   /* KPLEG_EXEC_* once the start is known (claimed through the claims map) */
	__u64 exit_seen;   /* 1 once the init's death was claimed */
	__u64 parent_id;   /* the parent cgroup's id (0 for a root): userspace finds a cgroup whose
			    * mkdir record it lost from its parent's directory */
	__u64 pod_id;      /* the pod-level cgroup (a child of a root or of a QoS level) this one
			    * is, or is below: whose budget it counts against. 0 for roots and QoS
			    * levels */
};

/*
 * A pod's budget, the value type of the `pod_budgets` map (keyed by the pod-level cgroup's id):
 * what one workload may cost the node's shared map and ring buffer. Only cgroups below the pod
 * cgroup count; one over budget is not tracked (the pod's own containers, made before, stay
 * tracked), and nothing in it costs a record.
 */
struct kpleg_pod_budget {
	__u64 tracked;          /* cgroups below the pod cgroup in `tracked_cgroups` */
	__u64 window_start_ns;  /* start of the current one-second window */
	__u64 window_mkdirs;    /* mkdirs admitted in that window */
	__u64 refused;          /* mkdirs refused since the pod cgroup was made */
	__u64 noticed_ns;       /* when the last KPLEG_FLAG_OVER_BUDGET record was emitted */
};

struct kpleg_event_header {
	__u16 type;  /* enum kpleg_event_type */
	__u16 flags; /* enum kpleg_event_flags */
	__u32 size;  /* size of the whole record, header included */
	__u64 ktime_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
};

/* KPLEG_EVENT_CGROUP_MKDIR and KPLEG_EVENT_CGROUP_RMDIR (cgroup2 hierarchy only). */
struct kpleg_cgroup_event {
	struct kpleg_event_header hdr;
	__u64 cgroup_id;        /* cgroup2 id == inode of its directory */
	__u64 parent_cgroup_id;
	__u32 level;            /* depth below the cgroup2 root */
	__u32 path_len;         /* bytes of path[] used, without the NUL */
	char path[KPLEG_CGROUP_PATH_MAX]; /* relative to the cgroup2 root, starts with '/' */
};

/* KPLEG_EVENT_EXEC: the first exec in a tracked cgroup ("container started"). */
struct kpleg_exec_event {
	struct kpleg_event_header hdr;
	__u64 cgroup_id;
	__u32 pid;  /* tgid */
	__u32 tid;
	__u32 ppid;
	__u32 _pad0;
	char comm[KPLEG_COMM_MAX];
	char filename[KPLEG_FILENAME_MAX];
};

/* KPLEG_EVENT_EXIT: the death of a tracked cgroup's init ("container died"). */
struct kpleg_exit_event {
	struct kpleg_event_header hdr;
	__u64 cgroup_id;
	__u32 pid; /* tgid */
	__u32 exit_code; /* exit status (0..255) when signal == 0 */
	__u32 signal;    /* terminating signal, 0 on a normal exit */
	__u32 _pad0;
};

/* KPLEG_EVENT_OOM: the OOM killer chose a victim in a tracked cgroup. */
struct kpleg_oom_event {
	struct kpleg_event_header hdr;
	__u64 cgroup_id;
	__u32 victim_pid;
	__u32 _pad0;
};

/*
 * KPLEG_EVENT_REMOVAL_HINT: a directory named by a watched id (the `removal_watch` map, filled by
 * userspace with exited containers and sandboxes) is being removed. Runtimes keep a directory per
 * container named by its id and remove it on RemoveContainer/RemovePodSandbox: containerd's CRI
 * plugin its root and state directories, CRI-O its storage's. Once per arming: the program
 * disarms the entry, userspace re-arms it when the removal turned out not to be one yet.
 */
struct kpleg_removal_hint_event {
	struct kpleg_event_header hdr;
	char id[KPLEG_ID_LEN]; /* not NUL-terminated */
};

#endif /* KPLEG_EVENTS_H */
