// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * kpleg's kernel side: container start/stop signals from cgroup and process hooks, filtered in
 * the kernel so that only container transitions cost a ring-buffer record.
 *
 *  cgroup_mkdir   under a tracked root (kubepods, kubepods.slice, ...) -> track it, emit
 *                 (below a pod cgroup: only within the pod's budget, see budget__admit)
 *  cgroup_rmdir   of a tracked cgroup                                  -> emit, untrack
 *  sched_process_exec  first exec in a tracked cgroup  ("container started")
 *  sched_process_exit  death of that process's group   ("container died")
 *  oom:mark_victim     OOM kill in a tracked cgroup    (counted and traced; the death's own
 *                                                      OOM flag comes from the exit)
 *  syscalls:sys_enter_unlinkat/rmdir  of a directory named by a watched id ("removed, go and look")
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "kpleg_events.h"
#include "core_fixes.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Tunables, set by the loader before load. */
const volatile __u32 kpleg_abi_version = KPLEG_ABI_VERSION;
const volatile __u32 root_name_count = 2;
const volatile char root_names[KPLEG_MAX_ROOT_NAMES][KPLEG_ROOT_NAME_MAX] = {
	"kubepods", "kubepods.slice",
};
/* A pod's budget (struct kpleg_pod_budget); 0 turns that part off. */
const volatile __u32 max_cgroups_per_pod = 1024;
const volatile __u32 max_mkdirs_per_pod_per_sec = 100;

/*
 * Set by userspace while the program runs (the .data map, mmap'ed): 0 while the tracker has
 * learned that the runtime removes a container's cgroup right after its init dies (containerd
 * deletes the task, and runc the cgroup, before it records the exit). An exit then wakes
 * nobody: the rmdir that follows wakes the reader and brings it along, and the death costs
 * userspace one wakeup instead of two. An OOM kill still wakes. Userspace turns it back to 1
 * at the first death confirmed without its rmdir (userspace/pleg/exit_wakeup.h).
 */
volatile __u32 exit_wakes = 1;

/*
 * Set by userspace while the program runs (the .bss map, mmap'ed): how long after a
 * container's first exec, and after a tracked cgroup's rmdir, their record wakes the reader at
 * the latest; 0 wakes it at once. Userspace acts on neither at once: it looks at the runtime a learned lag after the
 * signal, or, while the runtime's event stream is live, waits for the runtime's event, which
 * follows the signal within milliseconds and wakes the reader anyway. Deferred, the record is
 * read with that event, or woken for by the wake timer (below) when userspace would act on it,
 * instead of waking the reader once for the record and once more for what it waits for. Only
 * programs loaded with timers (kernel 5.15+: bpf_timer) defer; the others wake at once.
 */
volatile __u64 exec_wake_after_ns = 0;
volatile __u64 rmdir_wake_after_ns = 0;

#define KPLEG_CLOCK_MONOTONIC 1

/*
 * The wake timer: one for all deferred records. `due_ns` is when the armed timer fires (0 while
 * none is armed); a record due later than that is woken for with it. When it fires, it wakes the
 * reader if anything is unread (wake__fire).
 */
struct wake_timer {
	struct bpf_timer timer;
	__u64 due_ns;
	__u64 ready; /* the timer was initialised and has its callback */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wake_timer);
} wake_timers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized by the loader */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resized by the loader */
	__type(key, __u64);         /* cgroup2 id */
	__type(value, struct kpleg_tracked_cgroup);
} tracked_cgroups SEC(".maps");

/* Ids of exited containers and sandboxes whose removal userspace waits for: 1 armed, 0 fired. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resized by the loader */
	__type(key, char[KPLEG_ID_LEN]);
	__type(value, __u64);
} removal_watch SEC(".maps");

/*
 * Claims: which of several CPUs racing on the same state emits the one event. The winner is
 * the one whose bpf_map_update_elem(BPF_NOEXIST) inserts the key (the hash map checks and
 * inserts under its bucket lock); a compare-and-swap on the map value would do the same, but
 * BPF_CMPXCHG needs Linux 5.12 and nodes run 5.10. Each claim is looked for only after its
 * state (exec_seen, exit_seen, the armed flag) said "not yet", so an LRU eviction can at worst
 * let a claim through that the state then rejects: none of these keys is read again once the
 * state changed.
 */
struct kpleg_claim_key {
	__u64 cgroup_id;
	__u32 kind; /* enum kpleg_claim */
	__u32 _pad;
};
enum kpleg_claim { KPLEG_CLAIM_EXEC = 1, KPLEG_CLAIM_EXIT = 2 };

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384); /* resized by the loader */
	__type(key, struct kpleg_claim_key);
	__type(value, __u8);
} claims SEC(".maps");

/* The removal hint's claims, per arming: userspace deletes an id's claim when it arms it. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384); /* resized by the loader */
	__type(key, char[KPLEG_ID_LEN]);
	__type(value, __u8);
} removal_claims SEC(".maps");

static __always_inline bool claim__cgroup(__u64 cgroup_id, enum kpleg_claim kind)
{
	struct kpleg_claim_key key = { .cgroup_id = cgroup_id, .kind = kind };
	__u8 one = 1;

	return bpf_map_update_elem(&claims, &key, &one, BPF_NOEXIST) == 0;
}

/*
 * Ids whose directory was removed while not armed, with the rmdir's bpf_ktime_get_ns(): the
 * runtime may remove it before userspace has confirmed the death and armed the id (a
 * RemoveContainer right after StopContainer). Userspace arms, then looks here: such a removal
 * is its hint. Only 64-character names that nobody armed come here.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, char[KPLEG_ID_LEN]);
	__type(value, __u64);
} removal_early SEC(".maps");

/* Per pod-level cgroup: what its workload costs (struct kpleg_pod_budget). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resized by the loader, as tracked_cgroups */
	__type(key, __u64);
	__type(value, struct kpleg_pod_budget);
} pod_budgets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KPLEG_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KPLEG_PROG_MAX * KPLEG_ERRNO_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} helper_failures SEC(".maps");

static __always_inline void counter__inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);

	if (v)
		*v += 1;
}

/* A helper of program `prog` returned `err` (negative errno): counted by program and errno. */
static __always_inline void helper__failed(__u32 prog, long err)
{
	__u32 e = err < 0 ? (__u32)-err : (__u32)err;

	if (e >= KPLEG_ERRNO_SLOTS)
		e = KPLEG_ERRNO_SLOTS - 1;
	__u32 idx = prog * KPLEG_ERRNO_SLOTS + e;
	__u64 *v = bpf_map_lookup_elem(&helper_failures, &idx);

	if (v)
		(*v)++;
	counter__inc(KPLEG_CNT_HELPER_FAILURES);
}

static __always_inline void *event__reserve(__u64 size, __u32 type)
{
	void *rec = bpf_ringbuf_reserve(&events, size, 0);

	if (!rec) {
		counter__inc(KPLEG_CNT_RINGBUF_DROPS);
		counter__inc(type == KPLEG_EVENT_REMOVAL_HINT
				     ? KPLEG_CNT_DROPS_REMOVAL_HINT
				     : KPLEG_CNT_DROPS_MKDIR + type - KPLEG_EVENT_CGROUP_MKDIR);
		return NULL;
	}
	struct kpleg_event_header *hdr = rec;

	hdr->type = type;
	hdr->flags = 0;
	hdr->size = size;
	hdr->ktime_ns = bpf_ktime_get_ns();
	return rec;
}

/*
 * Whom a record wakes. A cgroup's mkdir wakes nobody (BPF_RB_NO_WAKEUP): nothing is decided on
 * it alone, and what makes it matter (the exec that starts the container, the next mkdir's
 * exec) follows it and brings it along; userspace is woken once per container start instead
 * of twice. It does wake when it flags an untracked cgroup, and once the ring holds a quarter
 * of its size unread, so that the ring never fills with records nobody was woken for. An init's
 * exit wakes nobody either while `exit_wakes` is 0 (the rmdir after it does). Every other
 * record wakes the reader with BPF_RB_FORCE_WAKEUP: the default wakes only when the ring was
 * empty before the record, and an unread mkdir makes it not.
 */
static __always_inline void event__submit(void *rec, bool wake)
{
	__u64 flags = BPF_RB_FORCE_WAKEUP;

	if (!wake && bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) <
			     bpf_ringbuf_query(&events, BPF_RB_RING_SIZE) / 4)
		flags = BPF_RB_NO_WAKEUP;
	bpf_ringbuf_submit(rec, flags);
	counter__inc(KPLEG_CNT_EMITTED);
}

/* Wakes the reader now: an empty record, discarded, whose only effect is the wakeup. */
static __always_inline void event__wake_now(void)
{
	void *rec = bpf_ringbuf_reserve(&events, sizeof(struct kpleg_event_header), 0);

	if (rec)
		bpf_ringbuf_discard(rec, BPF_RB_FORCE_WAKEUP);
}

static int wake__fire(void *map, __u32 *key, struct wake_timer *w)
{
	/*
	 * due_ns is cleared with an exchange (fully ordered) before the ring is looked at, and a
	 * record is committed (an exchange too) before its program reads due_ns (wake__at): either
	 * that program saw 0 and armed the timer again, or the record is counted here.
	 */
	__sync_lock_test_and_set(&w->due_ns, 0);
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > 0)
		event__wake_now();
	return 0;
}

/* Makes sure the reader is woken `after_ns` from now at the latest. False when it cannot. */
static __always_inline bool wake__at(__u64 after_ns)
{
	__u32 key = 0;
	struct wake_timer *w = bpf_map_lookup_elem(&wake_timers, &key);

	if (!w)
		return false;
	if (!w->ready) {
		long err = bpf_timer_init(&w->timer, &wake_timers, KPLEG_CLOCK_MONOTONIC);

		if (err && err != -16 /* EBUSY: another CPU did */)
			return false;
		if (bpf_timer_set_callback(&w->timer, wake__fire))
			return false;
		w->ready = 1;
	}
	__u64 due = bpf_ktime_get_ns() + after_ns;
	__u64 armed = w->due_ns;

	if (armed != 0 && armed <= due)
		return true; /* it fires first, and the reader reads this record then */
	w->due_ns = due;
	if (bpf_timer_start(&w->timer, after_ns, 0)) {
		w->due_ns = 0;
		return false;
	}
	return true;
}

/*
 * Submits a record that wakes the reader `after_ns` later at the latest (event__submit's
 * `wake` when 0, or without timers). A ring that holds a quarter of its size unread wakes it
 * at once, as in event__submit.
 */
static __always_inline void event__submit_within(void *rec, __u64 after_ns, bool timers)
{
	if (!timers || after_ns == 0 ||
	    bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >=
		    bpf_ringbuf_query(&events, BPF_RB_RING_SIZE) / 4) {
		event__submit(rec, true);
		return;
	}
	bpf_ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
	counter__inc(KPLEG_CNT_EMITTED);
	if (!wake__at(after_ns))
		event__wake_now();
}

static __always_inline bool cgroup__is_v2(struct cgroup *cgrp)
{
	/* On hybrid hosts mkdir fires once per hierarchy; the cgroup2 (default) hierarchy is 0. */
	return BPF_CORE_READ(cgrp, root, hierarchy_id) == 0;
}

static __always_inline __u64 cgroup__id(struct cgroup *cgrp)
{
	return BPF_CORE_READ(cgrp, kn, id);
}

static __always_inline bool cgroup__name_is_root(struct cgroup *cgrp)
{
	char name[KPLEG_ROOT_NAME_MAX];
	const char *kn_name = BPF_CORE_READ(cgrp, kn, name);

	long err = bpf_probe_read_kernel_str(name, sizeof(name), kn_name);

	if (err < 0) {
		helper__failed(KPLEG_PROG_CGROUP_MKDIR, err);
		return false;
	}
	for (__u32 r = 0; r < KPLEG_MAX_ROOT_NAMES; r++) {
		if (r >= root_name_count)
			break;
		bool equal = true;

		for (__u32 i = 0; i < KPLEG_ROOT_NAME_MAX; i++) {
			if (name[i] != root_names[r][i]) {
				equal = false;
				break;
			}
			if (name[i] == '\0')
				break;
		}
		if (equal)
			return true;
	}
	return false;
}

static __always_inline void cgroup__emit(struct cgroup *cgrp, const char *path, __u32 type,
					 __u64 id, __u64 parent_id, __u16 flags, bool timers)
{
	struct kpleg_cgroup_event *e = event__reserve(sizeof(*e), type);

	if (!e)
		return;
	e->hdr.flags |= flags;
	e->cgroup_id = id;
	e->parent_cgroup_id = parent_id;
	e->level = BPF_CORE_READ(cgrp, level);
	long n = bpf_probe_read_kernel_str(e->path, sizeof(e->path), path);

	if (n < 0) {
		helper__failed(type - KPLEG_EVENT_CGROUP_MKDIR, n);
		e->path[0] = '\0';
		n = 1;
	}
	e->path_len = n - 1;
	if (n == sizeof(e->path))
		e->hdr.flags |= KPLEG_FLAG_PATH_TRUNCATED;
	if (type == KPLEG_EVENT_CGROUP_RMDIR)
		event__submit_within(e, rmdir_wake_after_ns, timers);
	else
		event__submit(e, flags & KPLEG_FLAG_UNTRACKED);
}

#define KPLEG_LEVEL_NAME_MAX 64

/* Whether the first `n` bytes of `a` and `b` are equal (n a constant: unrolled, fixed offsets). */
static __always_inline bool bytes__equal(const char *a, const char *b, int n)
{
	for (int i = 0; i < n; i++) {
		if (a[i] != b[i])
			return false;
	}
	return true;
}

/*
 * A level between a root and its pods: a QoS level, burstable, besteffort (cgroupfs) or
 * <root>-burstable.slice, ... (systemd), or the kubelet's own kubepods / kubepods.slice below a
 * root of another name (`kubelet --cgroup-root=/x` puts its pods at /x/kubepods/..., and a
 * `--cgroup-root x` here makes x the root). The suffix is read again from the name's end, at a
 * computed kernel address: stack reads at a variable offset are refused by verifiers before 5.12.
 */
static __always_inline bool cgroup__name_is_level(struct cgroup *cgrp)
{
	const char *kn_name = BPF_CORE_READ(cgrp, kn, name);
	char name[KPLEG_LEVEL_NAME_MAX];
	long n = bpf_probe_read_kernel_str(name, sizeof(name), kn_name);

	if (n <= 0 || n == sizeof(name)) /* unreadable, or longer than any level's name */
		return false;
	long len = n - 1;

	if (len == 8)
		return bytes__equal(name, "kubepods", 8);
	if (len == 14)
		return bytes__equal(name, "kubepods.slice", 14);
	if (len == 9)
		return bytes__equal(name, "burstable", 9);
	if (len == 10)
		return bytes__equal(name, "besteffort", 10);
	char tail[17];

	if (len >= 17 && bpf_probe_read_kernel(tail, 17, kn_name + len - 17) == 0 &&
	    bytes__equal(tail, "-besteffort.slice", 17))
		return true;
	return len >= 16 && bpf_probe_read_kernel(tail, 16, kn_name + len - 16) == 0 &&
	       bytes__equal(tail, "-burstable.slice", 16);
}

/*
 * Whether the pod `pod_id` may have one more tracked cgroup below it: within its count and its
 * mkdirs per second. When it may, the cgroup is counted; when not, the refusal is, and at most
 * once a second it is worth a record (KPLEG_FLAG_OVER_BUDGET) that names the pod to userspace.
 */
static __always_inline bool budget__admit(__u64 pod_id, bool *notice)
{
	struct kpleg_pod_budget *b = bpf_map_lookup_elem(&pod_budgets, &pod_id);

	if (!b) {
		struct kpleg_pod_budget fresh = {};

		bpf_map_update_elem(&pod_budgets, &pod_id, &fresh, BPF_NOEXIST);
		b = bpf_map_lookup_elem(&pod_budgets, &pod_id);
		if (!b)
			return true; /* no room to account: the tracked map's own limit holds */
	}
	__u64 now = bpf_ktime_get_ns();

	if (now - b->window_start_ns >= 1000000000ULL) {
		b->window_start_ns = now;
		b->window_mkdirs = 0;
	}
	if ((max_cgroups_per_pod && b->tracked >= max_cgroups_per_pod) ||
	    (max_mkdirs_per_pod_per_sec && b->window_mkdirs >= max_mkdirs_per_pod_per_sec)) {
		__sync_fetch_and_add(&b->refused, 1);
		counter__inc(KPLEG_CNT_OVER_BUDGET);
		if (now - b->noticed_ns >= 1000000000ULL) {
			b->noticed_ns = now;
			*notice = true;
		}
		return false;
	}
	__sync_fetch_and_add(&b->window_mkdirs, 1);
	__sync_fetch_and_add(&b->tracked, 1);
	return true;
}

/* A tracked cgroup below pod `pod_id` is gone (or was never tracked after all). */
static __always_inline void budget__release(__u64 pod_id)
{
	struct kpleg_pod_budget *b = bpf_map_lookup_elem(&pod_budgets, &pod_id);

	if (b && b->tracked > 0)
		__sync_fetch_and_add(&b->tracked, -1);
}

SEC("tp_btf/cgroup_mkdir")
int BPF_PROG(cgroup_mkdir, struct cgroup *cgrp, const char *path)
{
	if (!cgroup__is_v2(cgrp))
		return 0;

	struct cgroup *parent = kpleg__cgroup_parent(cgrp);
	__u64 parent_id = parent ? cgroup__id(parent) : 0;
	__u64 id = cgroup__id(cgrp);
	struct kpleg_tracked_cgroup t = {};
	struct kpleg_tracked_cgroup *pt = bpf_map_lookup_elem(&tracked_cgroups, &parent_id);

	if (pt) {
		t.kind = KPLEG_TRACKED_DESCENDANT;
		t.parent_id = parent_id;
		if ((pt->kind == KPLEG_TRACKED_ROOT || pt->kind == KPLEG_TRACKED_QOS) &&
		    cgroup__name_is_level(cgrp))
			t.kind = KPLEG_TRACKED_QOS;
		else if (pt->kind == KPLEG_TRACKED_ROOT || pt->kind == KPLEG_TRACKED_QOS)
			t.pod_id = id; /* a pod-level cgroup: its own budget */
		else
			t.pod_id = pt->pod_id;
	} else if (cgroup__name_is_root(cgrp)) {
		t.kind = KPLEG_TRACKED_ROOT;
	} else {
		counter__inc(KPLEG_CNT_FILTERED);
		return 0;
	}

	bool counted = t.pod_id != 0 && t.pod_id != id;

	if (counted) {
		bool notice = false;

		if (!budget__admit(t.pod_id, &notice)) {
			if (notice)
				cgroup__emit(cgrp, path, KPLEG_EVENT_CGROUP_MKDIR, id, parent_id,
					     KPLEG_FLAG_OVER_BUDGET | KPLEG_FLAG_UNTRACKED, false);
			return 0;
		}
	}

	__u16 flags = 0;

	long err = bpf_map_update_elem(&tracked_cgroups, &id, &t, BPF_ANY);

	if (err < 0) {
		/* Full (E2BIG): the cgroup and everything below it go unseen. Userspace is told at
		 * once. */
		counter__inc(KPLEG_CNT_TRACK_FULL);
		helper__failed(KPLEG_PROG_CGROUP_MKDIR, err);
		flags = KPLEG_FLAG_UNTRACKED;
		if (counted)
			budget__release(t.pod_id);
	}
	cgroup__emit(cgrp, path, KPLEG_EVENT_CGROUP_MKDIR, id, parent_id, flags, false);
	return 0;
}

/*
 * The rmdir and the exec programs come twice: with the wake timer (loaded on kernels that have
 * bpf_timer, 5.15+), and without it (`*_untimed`, whose records wake the reader at once). The
 * loader loads one of each pair.
 */
static __always_inline int cgroup__rmdir(struct cgroup *cgrp, const char *path, bool timers)
{
	if (!cgroup__is_v2(cgrp))
		return 0;

	__u64 id = cgroup__id(cgrp);
	struct kpleg_tracked_cgroup *t = bpf_map_lookup_elem(&tracked_cgroups, &id);

	if (!t) {
		counter__inc(KPLEG_CNT_FILTERED);
		return 0;
	}
	__u64 pod_id = t->pod_id;
	struct cgroup *parent = kpleg__cgroup_parent(cgrp);

	cgroup__emit(cgrp, path, KPLEG_EVENT_CGROUP_RMDIR, id, parent ? cgroup__id(parent) : 0, 0,
		     timers);
	bpf_map_delete_elem(&tracked_cgroups, &id);
	if (pod_id == id)
		bpf_map_delete_elem(&pod_budgets, &id); /* the pod is gone */
	else if (pod_id != 0)
		budget__release(pod_id);
	return 0;
}

SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(cgroup_rmdir, struct cgroup *cgrp, const char *path)
{
	return cgroup__rmdir(cgrp, path, true);
}

SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(cgroup_rmdir_untimed, struct cgroup *cgrp, const char *path)
{
	return cgroup__rmdir(cgrp, path, false);
}

/*
 * runc protects itself against overwrites of its binary (CVE-2019-5736) by re-executing
 * `runc init` from a sealed memfd, i.e. an exec of /dev/fd/N or /proc/self/fd/N (other runtimes
 * re-exec /proc/self/exe). When runc has already moved that process into the container's cgroup,
 * the re-exec would be the cgroup's first exec and claim "started" for the wrong process. No
 * container entrypoint is exec'd through such a path.
 */
static __always_inline bool exec__is_runtime_reexec(struct linux_binprm *bprm)
{
	char p[12] = {};

	if (bpf_probe_read_kernel_str(p, sizeof(p), BPF_CORE_READ(bprm, filename)) < 0)
		return false;
	if (p[0] == '/' && p[1] == 'd' && p[2] == 'e' && p[3] == 'v' && p[4] == '/' &&
	    p[5] == 'f' && p[6] == 'd' && p[7] == '/')
		return true;
	return p[0] == '/' && p[1] == 'p' && p[2] == 'r' && p[3] == 'o' && p[4] == 'c' &&
	       p[5] == '/' && p[6] == 's' && p[7] == 'e' && p[8] == 'l' && p[9] == 'f' &&
	       p[10] == '/';
}

/*
 * OCI createContainer/startContainer hooks (NVIDIA's CDI hook is a common one) run inside the
 * container's cgroup before the entrypoint, as children of the runtime's init process there. The
 * entrypoint is exec'd by that init itself, whose parent (the runtime, or the shim it was
 * reparented to) lives outside the container's cgroup; so does runc's, crun's and youki's.
 */
static __always_inline bool exec__parent_in_same_cgroup(struct task_struct *task, __u64 cgid)
{
	return BPF_CORE_READ(task, real_parent, cgroups, dfl_cgrp, kn, id) == cgid;
}

static __always_inline int process__exec(struct task_struct *task, struct linux_binprm *bprm,
					 bool timers)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct kpleg_tracked_cgroup *t = bpf_map_lookup_elem(&tracked_cgroups, &cgid);

	if (!t) {
		counter__inc(KPLEG_CNT_FILTERED);
		return 0;
	}
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	/*
	 * A cgroup seeded by the loader (KPLEG_EXEC_SEEDED) had processes before kpleg: a running
	 * container, or a created one whose runtime init waits for StartContainer. Only that
	 * init's own exec can still be the start (the runtime's init execs the entrypoint in
	 * place); anyone else's (a probe's, a child's) is not. A running container's init that
	 * execs again is claimed too, and the runtime, asked, says it is nothing new.
	 */
	__u64 from = t->exec_seen == KPLEG_EXEC_SEEDED && t->init_tgid == tgid ? KPLEG_EXEC_SEEDED : 0;

	if (t->exec_seen == from && exec__is_runtime_reexec(bprm)) {
		counter__inc(KPLEG_CNT_EXEC_REEXEC);
		return 0;
	}
	if (t->exec_seen == from && exec__parent_in_same_cgroup(task, cgid)) {
		counter__inc(KPLEG_CNT_EXEC_HOOK);
		return 0;
	}
	/* Claim the first exec once, even when two CPUs exec in the same cgroup at once. */
	if (t->exec_seen != from || !claim__cgroup(cgid, KPLEG_CLAIM_EXEC)) {
		counter__inc(KPLEG_CNT_EXEC_REPEATED);
		return 0;
	}
	t->exec_seen = KPLEG_EXEC_CLAIMED;
	t->init_tgid = tgid;

	struct kpleg_exec_event *e = event__reserve(sizeof(*e), KPLEG_EVENT_EXEC);

	if (!e)
		return 0;
	e->cgroup_id = cgid;
	e->pid = tgid;
	e->tid = (__u32)bpf_get_current_pid_tgid();
	e->ppid = BPF_CORE_READ(task, real_parent, tgid);
	e->_pad0 = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	long err = bpf_probe_read_kernel_str(e->filename, sizeof(e->filename),
					     BPF_CORE_READ(bprm, filename));

	if (err < 0) {
		helper__failed(KPLEG_PROG_EXEC, err);
		e->filename[0] = '\0';
	}
	event__submit_within(e, exec_wake_after_ns, timers);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sched_process_exec, struct task_struct *task, pid_t old_pid,
	     struct linux_binprm *bprm)
{
	return process__exec(task, bprm, true);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sched_process_exec_untimed, struct task_struct *task, pid_t old_pid,
	     struct linux_binprm *bprm)
{
	return process__exec(task, bprm, false);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *task)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct kpleg_tracked_cgroup *t = bpf_map_lookup_elem(&tracked_cgroups, &cgid);

	if (!t) {
		counter__inc(KPLEG_CNT_FILTERED);
		return 0;
	}
	__u32 tgid = BPF_CORE_READ(task, tgid);

	if (!t->exec_seen || t->init_tgid != tgid || !kpleg__task_group_dead(task) ||
	    t->exit_seen || !claim__cgroup(cgid, KPLEG_CLAIM_EXIT)) {
		counter__inc(KPLEG_CNT_EXIT_IGNORED);
		return 0;
	}
	t->exit_seen = 1;

	struct kpleg_exit_event *e = event__reserve(sizeof(*e), KPLEG_EVENT_EXIT);

	if (!e)
		return 0;
	/* exit_code holds the wait(2) status: (status << 8) | signal, 0x80 = core dumped. */
	__u32 code = BPF_CORE_READ(task, exit_code);

	e->cgroup_id = cgid;
	e->pid = tgid;
	e->exit_code = (code >> 8) & 0xff;
	e->signal = code & 0x7f;
	e->_pad0 = 0;
	if (code & 0x80)
		e->hdr.flags |= KPLEG_FLAG_CORE_DUMPED;
	/*
	 * The OOM kill is read off the dying init itself: oom:mark_victim runs in the context of
	 * the task whose allocation failed, which can be another container of the pod (a pod-level
	 * limit) or of the node, and a child's OOM kill does not end the container.
	 */
	if (kpleg__oom_victim(task, e->signal))
		e->hdr.flags |= KPLEG_FLAG_OOM_KILLED;
	event__submit(e, exit_wakes || (e->hdr.flags & KPLEG_FLAG_OOM_KILLED));
	return 0;
}

SEC("tracepoint/oom/mark_victim")
int oom_mark_victim(struct trace_event_raw_mark_victim *ctx)
{
	/*
	 * The OOM killer runs in the context of the task whose allocation failed; for a memory
	 * limit that task is in the limited cgroup, which is the container's.
	 */
	__u64 cgid = bpf_get_current_cgroup_id();

	if (!bpf_map_lookup_elem(&tracked_cgroups, &cgid)) {
		counter__inc(KPLEG_CNT_FILTERED);
		return 0;
	}
	struct kpleg_oom_event *e = event__reserve(sizeof(*e), KPLEG_EVENT_OOM);

	if (!e)
		return 0;
	e->cgroup_id = cgid;
	e->victim_pid = BPF_CORE_READ(ctx, pid);
	e->_pad0 = 0;
	event__submit(e, true);
	return 0;
}

/*
 * CRI RemoveContainer is metadata in the runtime, but every runtime keeps directories named by
 * the container's id and removes them then (containerd: .../io.containerd.grpc.v1.cri/
 * containers/<id> under its root and its state; CRI-O: .../overlay-containers/<id>). An rmdir of
 * a directory named by an id userspace watches tells it to go and look, so that it need not poll
 * for removals. Syscall tracepoints (classic ones, like the OOM hook: they need tracefs) see
 * the path as the caller gave it, whose last component is the name; an unlink of a file costs
 * one flag test, an rmdir one string read, and only 64-character names a map look-up. The
 * rmdir may still fail (a directory not empty yet): it is a hint, userspace looks.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, char[KPLEG_RMDIR_PATH_MAX]);
} rmdir_path SEC(".maps");

static __always_inline void removal__hint(const char *user_path)
{
	__u32 zero = 0;
	char *buf = bpf_map_lookup_elem(&rmdir_path, &zero);

	if (!buf)
		return;
	long n = bpf_probe_read_user_str(buf, KPLEG_RMDIR_PATH_MAX, user_path);

	if (n < 0) {
		helper__failed(KPLEG_PROG_REMOVAL_HINT, n);
		return;
	}
	/* n counts the NUL. The name is the last KPLEG_ID_LEN characters, after a '/' or alone. */
	long len = n - 1;

	if (len < KPLEG_ID_LEN || len > KPLEG_RMDIR_PATH_MAX - 1)
		return;
	long off = len - KPLEG_ID_LEN;

	if (off > 0) {
		long slash = off - 1;

		if (slash < 0 || slash >= KPLEG_RMDIR_PATH_MAX)
			return;
		if (buf[slash] != '/')
			return;
	}
	if (off < 0 || off > KPLEG_RMDIR_PATH_MAX - KPLEG_ID_LEN)
		return;
	char id[KPLEG_ID_LEN];

	if (bpf_probe_read_kernel(id, sizeof(id), buf + off) < 0)
		return;
	__u64 *armed = bpf_map_lookup_elem(&removal_watch, id);

	if (!armed) {
		__u64 now = bpf_ktime_get_ns();

		bpf_map_update_elem(&removal_early, id, &now, BPF_ANY);
		return;
	}
	/* Once per arming, even when two CPUs remove directories of the same id at once. */
	__u8 one = 1;

	if (*armed != 1 || bpf_map_update_elem(&removal_claims, id, &one, BPF_NOEXIST) != 0)
		return;
	*armed = 0;
	struct kpleg_removal_hint_event *e = event__reserve(sizeof(*e), KPLEG_EVENT_REMOVAL_HINT);

	if (!e)
		return;
	__builtin_memcpy(e->id, id, sizeof(e->id));
	event__submit(e, true);
}

#define KPLEG_AT_REMOVEDIR 0x200 /* <linux/fcntl.h> */

SEC("tracepoint/syscalls/sys_enter_unlinkat")
int removal_hint_unlinkat(struct trace_event_raw_sys_enter *ctx)
{
	/* unlinkat(dirfd, pathname, flags) */
	if (!(BPF_CORE_READ(ctx, args[2]) & KPLEG_AT_REMOVEDIR))
		return 0;
	removal__hint((const char *)BPF_CORE_READ(ctx, args[1]));
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_rmdir")
int removal_hint_rmdir(struct trace_event_raw_sys_enter *ctx)
{
	/* rmdir(pathname) */
	removal__hint((const char *)BPF_CORE_READ(ctx, args[0]));
	return 0;
}
