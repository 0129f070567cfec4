/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Kernel-version differences, in one place. Each helper names the kernel change it papers over
 * and works on both sides of it; the VM kernel matrix (vmtests/) runs the same programs on
 * kernels before and after each change.
 */
#ifndef KPLEG_CORE_FIXES_BPF_H
#define KPLEG_CORE_FIXES_BPF_H

#include <bpf/bpf_core_read.h>

/*
 * Whole-thread-group death at sched_process_exit.
 *
 * Linux 6.16 added a `group_dead` argument to the sched_process_exit tracepoint
 * (btf_trace_sched_process_exit gained a bool); older kernels pass only the task. Telling the two
 * prototypes apart needs BPF_TYPE_MATCHES relocations, which clang 14 cannot emit, and a tp_btf
 * program that reads ctx[1] is rejected by the verifier on kernels without the argument. On every
 * kernel do_exit() decrements signal->live (atomic_dec_and_test) *before* the tracepoint fires,
 * so a zero counter means the group is dead. Two threads exiting at once can both read zero: the
 * caller claims the exit (kpleg.bpf.c: claims) so only one record is emitted.
 */
static __always_inline bool kpleg__task_group_dead(struct task_struct *task)
{
	return BPF_CORE_READ(task, signal, live.counter) == 0;
}

/*
 * Whether the OOM killer chose this task's process as its victim: mark_oom_victim() sets
 * signal->oom_mm (since 4.8) on the victim and it stays until the signal struct is freed, after
 * the exit. An exiting task can be marked too (to let it free its memory first), so only a
 * death by SIGKILL counts.
 */
static __always_inline bool kpleg__oom_victim(struct task_struct *task, __u32 sig)
{
	return sig == 9 /* SIGKILL */ && BPF_CORE_READ(task, signal, oom_mm) != NULL;
}

/*
 * Parent of a cgroup.
 *
 * Linux 6.15 renamed kernfs_node::parent to __parent (RCU-protected access), so walking the
 * kernfs tree breaks across that change. struct cgroup embeds its css as the first member
 * `self`, and css.parent is stable on every kernel kpleg supports, so the parent is read there.
 */
static __always_inline struct cgroup *kpleg__cgroup_parent(struct cgroup *cgrp)
{
	struct cgroup_subsys_state *parent_css = BPF_CORE_READ(cgrp, self.parent);

	return parent_css ? (struct cgroup *)BPF_CORE_READ(parent_css, cgroup) : NULL;
}

/*
 * oom:mark_victim.
 *
 * Linux 6.8 changed the BTF prototype of the tracepoint from (int pid) to (struct task_struct *,
 * uid_t). The classic tracepoint's record keeps `int pid` as its first field on every kernel,
 * so kpleg attaches the classic tracepoint and reads the field through CO-RE.
 */

#endif /* KPLEG_CORE_FIXES_BPF_H */
