// SPDX-License-Identifier: GPL-2.0
/*
 * vgpuha_mmio: traces a guest process's stores to its apertures inside the
 * kernel, with no process switch per store (vgpuha_mmio.h has the
 * interface).
 *
 * A guest's mapping is VM_PFNMAP | VM_SHARED with write notification: a
 * read fault maps a page read-only; a store to it faults into
 * vg_pfn_mkwrite (or vg_fault for a page not yet mapped).
 *   Per-write mode: the fault records the address, the instruction pointer
 *   and the instruction's bytes, sets the trap flag in the thread's user
 *   registers and lets the page become writable. The store runs; the debug
 *   trap that follows (die notifier, DIE_DEBUG: arch/x86/kernel/traps.c,
 *   exc_debug_user -> notify_debug) records the bytes now at the address as
 *   an event, clears the trap flag and queues a task_work that runs before
 *   the thread returns to user mode, which takes the page away again
 *   (zap_vma_ptes, under the mm's read lock). A store the kernel makes for
 *   a system call (copy_to_user into the aperture) is refused: EFAULT.
 *   Where the process has other threads, one of them may store to the page
 *   while it is open for the step: the page is copied at the fault, and
 *   what changed beyond the stepped store is sent as range events.
 *   Page mode: the first store to a page marks it open and leaves it
 *   writable; VG_IOC_FLUSH takes the open pages away (zap) and hands the
 *   tracer their list, which it compares with what it last sent.
 * Anything the event ring has no room for leaves its page open: the next
 * flush lists it, so the tracer compares it. Nothing is lost silently.
 *
 * Lifetimes: an aperture is reference counted by its tracer file, each
 * guest mapping and each store in flight; its last reference frees it on
 * the module's workqueue. Every aperture holds a module reference, and
 * every mapping holds its file (whose fops pin the module), so rmmod is
 * refused while any exists. A tracer that closes its file (it died, or its
 * guest's session moved to another node) leaves its file-backed apertures
 * orphaned: the guest's stores go on into the file's pages, each page
 * marked open, until another tracer adopts the aperture (VG_IOC_ADOPT),
 * whose first flush lists them. A destroyed aperture, or one on the
 * module's own pages, refuses the guest's later stores (SIGBUS).
 * Lock order: mmap_lock > vg_lock (mutex) > ap->lock > file ring lock; pend_lock is
 * never held with another.
 */
#include <linux/anon_inodes.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/kdebug.h>
#include <linux/magic.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/poll.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task_stack.h>
#include <linux/shmem_fs.h>
#include <linux/slab.h>
#include <linux/task_work.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/workqueue.h>
#include <asm/debugreg.h>
#include <asm/ptrace.h>

#include "vgpuha_mmio.h"

#define VG_RING 4096			/* events per tracer file */
#define VG_MAX_APS_PER_FILE 64

static unsigned int max_pages = 1u << 18;	/* all apertures together: 1 GiB */
module_param(max_pages, uint, 0444);
MODULE_PARM_DESC(max_pages, "pages all apertures may hold together");

static unsigned int auto_streak = 4;
module_param(auto_streak, uint, 0644);
MODULE_PARM_DESC(auto_streak, "auto mode: stores to one page within a flush interval after which it is tracked per page");

struct vg_file {
	spinlock_t lock;		/* ring */
	struct vg_event *ring;		/* VG_RING slots, allocated at the first create */
	u32 head, tail;			/* free-running */
	u64 seq;
	wait_queue_head_t wait;
	struct list_head aps;		/* apertures this file created (vg_lock) */
	int naps;
};

struct vg_ap {
	struct kref ref;
	u32 id;
	u32 mode;
	u32 npages;
	struct pid *pid;		/* the guest's thread group */
	struct page **pages;
	struct file *memfd;		/* backing file, or NULL: then never adopted */
	pgoff_t file_pgoff;		/* the aperture's first page in it */
	bool pinned;			/* pages pinned from the tracer's mapping */
	bool orphan;			/* its tracer is gone: stores mark pages open (ap->lock) */
	spinlock_t lock;		/* owner, open, mm, start, nmaps */
	struct vg_file *owner;		/* NULL once destroyed or its tracer closed */
	struct list_head owner_link;	/* on owner->aps (vg_lock) */
	unsigned long *open;		/* pages left writable: compare at flush */
	u8 *streak;			/* auto mode: per page, stores since the last flush */
	struct mm_struct *mm;		/* the guest mapping's mm (mmgrab), or NULL */
	unsigned long start;		/* and its address */
	int nmaps;
	struct work_struct free_work;
};

/* A store in flight: faulted, trap flag set, waiting for the debug trap. */
struct vg_pend {
	struct list_head link;
	struct task_struct *task;	/* compared with current, never dereferenced */
	u64 start_time;
	struct vg_ap *ap;		/* a reference */
	unsigned long addr, ip;
	unsigned long page[2];		/* user addresses of the pages opened (a store may span two) */
	int npages;
	u8 insn[16];
	u8 insn_len;
	bool user_tf;			/* the thread had the trap flag set itself: leave it */
	u8 *snap;			/* with other threads: the pages' contents at the fault */
	struct callback_head work;
};

static DEFINE_MUTEX(vg_lock);		/* idr, file aperture lists */
static DEFINE_IDR(vg_idr);
static DEFINE_SPINLOCK(pend_lock);
static LIST_HEAD(pend_list);
static atomic_t npend = ATOMIC_INIT(0);
static struct workqueue_struct *vg_wq;
/* Caches of their own, so /proc/slabinfo shows what is live (boot with slab_nomerge). */
static struct kmem_cache *ap_cache, *pend_cache, *snap_cache;

static_assert(sizeof(struct vg_event) == 128);
static_assert(sizeof(struct vg_create) == 48);
static_assert(sizeof(struct vg_flush) == 24);
static_assert(sizeof(struct vg_stats) == 128);
static_assert(sizeof(struct vg_adopt) == 56);

static struct {
	atomic64_t faults, steps, events, overflows, window, refused, flushed, unfinished, streaks;
	atomic64_t orphan_stores, adopted;
	atomic64_t apertures, mappings, pages, files;
} st;

static const struct vm_operations_struct vg_guest_ops;
static const struct vm_operations_struct vg_tracer_ops;

static void vg_free_work(struct work_struct *w)
{
	struct vg_ap *ap = container_of(w, struct vg_ap, free_work);
	u32 i;

	mutex_lock(&vg_lock);
	idr_remove(&vg_idr, ap->id);
	mutex_unlock(&vg_lock);
	for (i = 0; ap->pages && i < ap->npages; i++) {
		if (ap->pages[i] && ap->pinned)
			unpin_user_page(ap->pages[i]);
		else if (ap->pages[i])
			put_page(ap->pages[i]);
	}
	atomic64_sub(ap->npages, &st.pages);
	kvfree(ap->pages);
	kvfree(ap->streak);
	bitmap_free(ap->open);
	if (ap->memfd)
		fput(ap->memfd);
	put_pid(ap->pid);
	kmem_cache_free(ap_cache, ap);
	atomic64_dec(&st.apertures);
	module_put(THIS_MODULE);
}

/* The last reference may drop in atomic context (the debug trap): free later. */
static void vg_ap_release(struct kref *ref)
{
	struct vg_ap *ap = container_of(ref, struct vg_ap, ref);

	INIT_WORK(&ap->free_work, vg_free_work);
	queue_work(vg_wq, &ap->free_work);
}

static void vg_ap_put(struct vg_ap *ap)
{
	kref_put(&ap->ref, vg_ap_release);
}

/* vg_emit queues an event on the aperture's tracer ring; false: no room or no tracer. */
static bool vg_emit(struct vg_ap *ap, struct vg_event *ev)
{
	struct vg_file *f;
	unsigned long flags;
	bool ok = false;

	spin_lock_irqsave(&ap->lock, flags);
	f = ap->owner;	/* the file stays while ap->lock is held: vg_detach takes it */
	if (f) {
		spin_lock(&f->lock);
		if (f->ring && f->head - f->tail < VG_RING) {
			ev->seq = f->seq++;
			ev->id = ap->id;
			f->ring[f->head % VG_RING] = *ev;
			f->head++;
			ok = true;
		}
		spin_unlock(&f->lock);
		if (ok)
			wake_up_interruptible(&f->wait);
	}
	spin_unlock_irqrestore(&ap->lock, flags);
	if (ok)
		atomic64_inc(&st.events);
	return ok;
}

static void vg_pend_free(struct vg_pend *p)
{
	if (p->snap)
		kmem_cache_free(snap_cache, p->snap);
	kmem_cache_free(pend_cache, p);
}

static void vg_mark_open(struct vg_ap *ap, unsigned long uaddr)
{
	unsigned long flags;

	spin_lock_irqsave(&ap->lock, flags);
	if (ap->mm && uaddr >= ap->start && uaddr < ap->start + ((unsigned long)ap->npages << PAGE_SHIFT))
		set_bit((uaddr - ap->start) >> PAGE_SHIFT, ap->open);
	spin_unlock_irqrestore(&ap->lock, flags);
}

/* vg_page_of is the aperture page mapped at user address uaddr of ap's mapping, or NULL. */
static struct page *vg_page_of(struct vg_ap *ap, unsigned long start, unsigned long uaddr)
{
	unsigned long i = (uaddr - start) >> PAGE_SHIFT;

	return uaddr >= start && i < ap->npages ? ap->pages[i] : NULL;
}

/*
 * vg_send_changes sends, as range events, the bytes of page that differ
 * from snap outside [skip, skip+nskip), and makes snap equal to the page.
 * Too many ranges: the page is left for the flush to compare.
 */
static void vg_send_changes(struct vg_ap *ap, unsigned long uaddr, u8 *snap, unsigned long start,
			    unsigned int skip, unsigned int nskip)
{
	struct page *pg = vg_page_of(ap, start, uaddr & PAGE_MASK);
	u8 *cur;
	unsigned int i, sent = 0;

	if (!pg)
		return;
	cur = page_address(pg);
	if (nskip)	/* the stepped store's bytes: in its own event */
		memcpy(snap + skip, cur + skip, min_t(unsigned int, nskip, PAGE_SIZE - skip));
	if (!memcmp(cur, snap, PAGE_SIZE))
		return;	/* the common case: no other thread stored */
	for (i = 0; i < PAGE_SIZE; i++) {
		struct vg_event ev = { .type = VG_EV_RANGE };
		unsigned int n;

		if (cur[i] == snap[i])
			continue;
		n = min_t(unsigned int, VG_EV_DATA, PAGE_SIZE - i);
		ev.off = (uaddr & PAGE_MASK) - start + i;
		ev.len = n;
		memcpy(ev.data, cur + i, n);
		atomic64_add(n, &st.window);
		if (++sent > 8 || !vg_emit(ap, &ev)) {
			atomic64_inc(&st.overflows);
			vg_mark_open(ap, uaddr);
			break;
		}
		i += n - 1;
	}
	memcpy(snap, cur, PAGE_SIZE);
}

/* vg_reprotect runs before the stepping thread returns to user mode: it takes the pages away. */
static void vg_reprotect(struct callback_head *work)
{
	struct vg_pend *p = container_of(work, struct vg_pend, work);
	struct mm_struct *mm = current->mm;
	int i;

	if (mm && !(current->flags & PF_EXITING)) {
		mmap_read_lock(mm);
		for (i = 0; i < p->npages; i++) {
			struct vm_area_struct *vma = find_vma(mm, p->page[i]);

			if (!vma || vma->vm_start > p->page[i] || vma->vm_ops != &vg_guest_ops ||
			    vma->vm_private_data != p->ap)
				continue;
			zap_vma_ptes(vma, p->page[i], PAGE_SIZE);
			if (p->snap)	/* what other threads stored between the trap and now */
				vg_send_changes(p->ap, p->page[i], p->snap + i * PAGE_SIZE, vma->vm_start, 0, 0);
		}
		mmap_read_unlock(mm);
	}
	vg_ap_put(p->ap);
	vg_pend_free(p);
}

static struct vg_pend *vg_take_pend(void)
{
	struct vg_pend *p, *found = NULL;
	unsigned long flags;

	spin_lock_irqsave(&pend_lock, flags);
	list_for_each_entry(p, &pend_list, link) {
		if (p->task == current && p->start_time == current->start_time) {
			list_del(&p->link);
			atomic_dec(&npend);
			found = p;
			break;
		}
	}
	spin_unlock_irqrestore(&pend_lock, flags);
	return found;
}

/*
 * vg_step_done runs in the debug trap, interrupts off, one instruction
 * after the fault returned. That instruction was the store if the thread
 * stands just past it, or on it again (a REP string store takes a trap
 * per element). Elsewhere a signal handler moved the thread (Go's
 * asynchronous preemption does): the store has not run, or was a CALL or
 * PUSH; its pages are left for the flush to compare, and the store, if it
 * runs later, faults again.
 */
static void vg_step_done(struct vg_pend *p, unsigned long ip)
{
	struct vg_ap *ap = p->ap;
	struct vg_event ev = { .type = VG_EV_STORE };
	unsigned long start, flags, end;
	unsigned int n = 0, pos;
	int i;

	spin_lock_irqsave(&ap->lock, flags);
	start = ap->start;
	spin_unlock_irqrestore(&ap->lock, flags);
	end = start + ((unsigned long)ap->npages << PAGE_SHIFT);
	if (ip < p->ip || ip > p->ip + 15) {
		atomic64_inc(&st.unfinished);
		for (i = 0; i < p->npages; i++)
			vg_mark_open(ap, p->page[i]);
		return;
	}
	ev.off = p->addr - start;
	ev.ip = p->ip;
	memcpy(ev.insn, p->insn, sizeof(ev.insn));
	ev.insn_len = p->insn_len;
	if (p->addr >= start && p->addr < end) {
		for (pos = 0; pos < VG_EV_DATA && p->addr + pos < end; pos += n) {
			unsigned long a = p->addr + pos;
			struct page *pg = vg_page_of(ap, start, a);

			n = min_t(unsigned long, VG_EV_DATA - pos, PAGE_SIZE - (a & ~PAGE_MASK));
			if (!pg)
				break;
			memcpy(ev.data + pos, (u8 *)page_address(pg) + (a & ~PAGE_MASK), n);
		}
		ev.len = min_t(unsigned long, VG_EV_DATA, end - p->addr);
	}
	atomic64_inc(&st.steps);
	if (!vg_emit(ap, &ev)) {
		atomic64_inc(&st.overflows);
		for (i = 0; i < p->npages; i++)
			vg_mark_open(ap, p->page[i]);
	}
	if (p->snap) {
		for (i = 0; i < p->npages; i++) {
			unsigned long pg = p->page[i];
			unsigned int skip = 0, nskip = 0;

			if (p->addr >= pg && p->addr < pg + PAGE_SIZE) {
				skip = p->addr - pg;
				nskip = ev.len;
			} else if (p->addr < pg) {
				nskip = min_t(unsigned long, ev.len, p->addr + ev.len - pg);
			}
			vg_send_changes(ap, pg, p->snap + i * PAGE_SIZE, start, skip, nskip);
		}
	}
}

static int vg_die(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	struct vg_pend *p;
	unsigned long dr6;
	bool user_tf;

	if (val != DIE_DEBUG || !atomic_read(&npend) || !user_mode(args->regs))
		return NOTIFY_DONE;
	/* exc_debug_user passes a pointer to dr6 as err (arch/x86/kernel/traps.c, notify_debug) */
	dr6 = *(unsigned long *)args->err;
	if (!(dr6 & DR_STEP))
		return NOTIFY_DONE;
	p = vg_take_pend();
	if (!p)
		return NOTIFY_DONE;
	vg_step_done(p, args->regs->ip);
	user_tf = p->user_tf;
	init_task_work(&p->work, vg_reprotect);
	if (task_work_add(current, &p->work, TWA_RESUME)) {
		/* exiting: its mm goes with it */
		vg_ap_put(p->ap);
		vg_pend_free(p);
	}
	if (user_tf)
		return NOTIFY_DONE;	/* the thread's own single step: its SIGTRAP as usual */
	args->regs->flags &= ~X86_EFLAGS_TF;
	*(unsigned long *)args->err &= ~DR_STEP;
	return NOTIFY_STOP;
}

static struct notifier_block vg_die_nb = { .notifier_call = vg_die };

/* vg_join adds a second page to the store in flight of this thread at the same instruction. */
static bool vg_join(unsigned long ip, unsigned long page, struct vg_ap *ap)
{
	struct vg_pend *p;
	unsigned long flags;
	bool joined = false;

	spin_lock_irqsave(&pend_lock, flags);
	list_for_each_entry(p, &pend_list, link) {
		if (p->task != current || p->start_time != current->start_time)
			continue;
		if (p->ip == ip && p->ap == ap && p->npages == 1 && p->page[0] != page) {
			struct page *pg = vg_page_of(ap, ap->start, page);

			p->page[1] = page;
			p->npages = 2;
			if (p->snap && pg)
				memcpy(p->snap + PAGE_SIZE, page_address(pg), PAGE_SIZE);
		}
		joined = true;	/* one step per thread at a time */
		break;
	}
	spin_unlock_irqrestore(&pend_lock, flags);
	return joined;
}

/*
 * vg_streak counts a store fault on page (auto mode) and reports whether
 * the page has taken a streak since the last flush: it is then left open
 * until the next flush, which compares it.
 */
static bool vg_streak(struct vg_ap *ap, unsigned long start, unsigned long page)
{
	unsigned long i = (page - start) >> PAGE_SHIFT, flags;
	bool streak;

	if (i >= ap->npages)
		return false;
	spin_lock_irqsave(&ap->lock, flags);
	if (!ap->streak) {	/* adopted in auto mode a moment ago: allocated under ap->lock */
		spin_unlock_irqrestore(&ap->lock, flags);
		return false;
	}
	if (ap->streak[i] < 255)
		ap->streak[i]++;
	streak = ap->streak[i] > auto_streak;
	spin_unlock_irqrestore(&ap->lock, flags);
	if (streak)
		atomic64_inc(&st.streaks);
	return streak;
}

/*
 * vg_write_fault decides a store fault on a guest mapping: 0 lets the page
 * become writable; *opened then says it was marked open (for the flush to
 * compare) rather than stepped.
 */
static vm_fault_t vg_write_fault(struct vm_fault *vmf, bool *opened)
{
	struct vm_area_struct *vma = vmf->vma;
	struct vg_ap *ap = vma->vm_private_data;
	struct pt_regs *regs = task_pt_regs(current);
	unsigned long page = vmf->address & PAGE_MASK;
	struct vg_pend *p;
	unsigned long flags;
	bool traced, orphan;
	u8 insn[16];
	int i;

	spin_lock_irqsave(&ap->lock, flags);
	traced = ap->owner != NULL;
	orphan = ap->orphan;
	spin_unlock_irqrestore(&ap->lock, flags);
	*opened = false;
	if (!traced && orphan) {
		/* its tracer is gone: the adopter's first flush lists the page */
		atomic64_inc(&st.orphan_stores);
		vg_mark_open(ap, page);
		*opened = true;
		return 0;
	}
	if (!traced) {
		atomic64_inc(&st.refused);
		return VM_FAULT_SIGBUS;	/* no tracer: refused, never lost */
	}
	atomic64_inc(&st.faults);
	if (READ_ONCE(ap->mode) == VG_MODE_PAGE) {
		vg_mark_open(ap, page);
		*opened = true;
		return 0;
	}
	if (!(vmf->flags & FAULT_FLAG_USER)) {
		atomic64_inc(&st.refused);
		return VM_FAULT_SIGBUS;	/* a system call storing into the aperture: EFAULT */
	}
	if (READ_ONCE(ap->mode) == VG_MODE_AUTO && vg_streak(ap, vma->vm_start, page)) {
		vg_mark_open(ap, page);
		*opened = true;
		return 0;
	}
	if (vg_join(regs->ip, page, ap))
		return 0;
	p = kmem_cache_zalloc(pend_cache, GFP_KERNEL);
	if (!p)
		return VM_FAULT_OOM;
	p->task = current;
	p->start_time = current->start_time;
	p->addr = vmf->real_address;
	p->ip = regs->ip;
	p->page[0] = page;
	p->npages = 1;
	p->user_tf = regs->flags & X86_EFLAGS_TF;
	for (i = 16; i > 0; i--)	/* the code page was just executed: present */
		if (!copy_from_user_nofault(insn, (void __user *)p->ip, i))
			break;
	memcpy(p->insn, insn, i);	/* (via the stack: hardened usercopy allows no slab object here) */
	p->insn_len = i;
	if (get_nr_threads(current) > 1) {
		p->snap = kmem_cache_alloc(snap_cache, GFP_KERNEL);
		if (!p->snap) {
			vg_pend_free(p);
			return VM_FAULT_OOM;
		}
		memcpy(p->snap, page_address(vg_page_of(ap, vma->vm_start, page)), PAGE_SIZE);
	}
	kref_get(&ap->ref);
	p->ap = ap;
	spin_lock_irqsave(&pend_lock, flags);
	list_add(&p->link, &pend_list);
	atomic_inc(&npend);
	spin_unlock_irqrestore(&pend_lock, flags);
	regs->flags |= X86_EFLAGS_TF;
	return 0;
}

/* vg_still_open: ap is traced, or an orphan: its stores may go on. */
static bool vg_still_open(struct vg_ap *ap)
{
	unsigned long flags;
	bool open;

	spin_lock_irqsave(&ap->lock, flags);
	open = ap->owner || ap->orphan;
	spin_unlock_irqrestore(&ap->lock, flags);
	return open;
}

static vm_fault_t vg_guest_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct vg_ap *ap = vma->vm_private_data;
	struct page *pg = vg_page_of(ap, vma->vm_start, vmf->address);
	pgprot_t prot = vm_get_page_prot(vma->vm_flags & ~VM_WRITE);
	bool opened = false;
	vm_fault_t r;

	if (!pg)
		return VM_FAULT_SIGBUS;
	if (vmf->flags & FAULT_FLAG_WRITE) {
		r = vg_write_fault(vmf, &opened);
		if (r)
			return r;
		prot = vm_get_page_prot(vma->vm_flags);
	}
	r = vmf_insert_pfn_prot(vma, vmf->address, page_to_pfn(pg), prot);
	/*
	 * Marked open again once writable: a flush that took the mark and
	 * zapped between the first mark and the insert would otherwise leave
	 * the page writable and unlisted. (pfn_mkwrite needs no second mark:
	 * a zap in between makes the core retry the fault.)
	 */
	if (opened && vg_still_open(ap))
		vg_mark_open(ap, vmf->address & PAGE_MASK);
	else if (opened)	/* destroyed meanwhile, maybe after its zap: refuse the store */
		zap_vma_ptes(vma, vmf->address & PAGE_MASK, PAGE_SIZE);
	return r;
}

static vm_fault_t vg_guest_mkwrite(struct vm_fault *vmf)
{
	bool opened;

	return vg_write_fault(vmf, &opened);
}

static void vg_drop_pends(struct vg_ap *ap)
{
	struct vg_pend *p, *n;
	unsigned long flags;
	LIST_HEAD(gone);

	spin_lock_irqsave(&pend_lock, flags);
	list_for_each_entry_safe(p, n, &pend_list, link) {
		if (p->ap == ap) {
			list_move(&p->link, &gone);
			atomic_dec(&npend);
		}
	}
	spin_unlock_irqrestore(&pend_lock, flags);
	list_for_each_entry_safe(p, n, &gone, link) {
		vg_ap_put(p->ap);
		vg_pend_free(p);
	}
}

static void vg_guest_open(struct vm_area_struct *vma)
{
	struct vg_ap *ap = vma->vm_private_data;
	unsigned long flags;

	kref_get(&ap->ref);
	spin_lock_irqsave(&ap->lock, flags);
	ap->nmaps++;
	spin_unlock_irqrestore(&ap->lock, flags);
	atomic64_inc(&st.mappings);
}

static void vg_guest_close(struct vm_area_struct *vma)
{
	struct vg_ap *ap = vma->vm_private_data;
	struct mm_struct *mm = NULL;
	unsigned long flags;

	spin_lock_irqsave(&ap->lock, flags);
	if (--ap->nmaps == 0) {
		mm = ap->mm;
		ap->mm = NULL;
	}
	spin_unlock_irqrestore(&ap->lock, flags);
	if (mm) {
		vg_drop_pends(ap);
		mmdrop(mm);
	}
	atomic64_dec(&st.mappings);
	vg_ap_put(ap);
}

static int vg_refuse_split(struct vm_area_struct *vma, unsigned long addr)
{
	return -EINVAL;
}

static int vg_refuse_mremap(struct vm_area_struct *vma)
{
	return -EINVAL;
}

static const struct vm_operations_struct vg_guest_ops = {
	.open = vg_guest_open,
	.close = vg_guest_close,
	.fault = vg_guest_fault,
	.pfn_mkwrite = vg_guest_mkwrite,
	.may_split = vg_refuse_split,
	.mremap = vg_refuse_mremap,
};

static vm_fault_t vg_tracer_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct page *pg = vg_page_of(vma->vm_private_data, vma->vm_start, vmf->address);

	if (!pg)
		return VM_FAULT_SIGBUS;
	return vmf_insert_pfn_prot(vma, vmf->address, page_to_pfn(pg), vm_get_page_prot(vma->vm_flags));
}

static void vg_tracer_open(struct vm_area_struct *vma)
{
	kref_get(&((struct vg_ap *)vma->vm_private_data)->ref);
}

static void vg_tracer_close(struct vm_area_struct *vma)
{
	vg_ap_put(vma->vm_private_data);
}

static const struct vm_operations_struct vg_tracer_ops = {
	.open = vg_tracer_open,
	.close = vg_tracer_close,
	.fault = vg_tracer_fault,
	.may_split = vg_refuse_split,
	.mremap = vg_refuse_mremap,
};

static int vg_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct vg_file *f = file->private_data;
	u32 id = vma->vm_pgoff >> (VG_VIEW_SHIFT + 1);
	bool tracer_view = (vma->vm_pgoff >> VG_VIEW_SHIFT) & 1;
	unsigned long len = vma->vm_end - vma->vm_start, flags;
	struct vg_ap *ap;
	int err = 0;

	if (!(vma->vm_flags & VM_SHARED) || (vma->vm_pgoff & ((1ul << VG_VIEW_SHIFT) - 1)))
		return -EINVAL;
	mutex_lock(&vg_lock);
	ap = idr_find(&vg_idr, id);
	if (!ap || !kref_get_unless_zero(&ap->ref)) {
		mutex_unlock(&vg_lock);
		return -ENOENT;
	}
	mutex_unlock(&vg_lock);
	if (len != (unsigned long)ap->npages << PAGE_SHIFT) {
		err = -EINVAL;
		goto out;
	}
	spin_lock_irqsave(&ap->lock, flags);
	if (tracer_view) {
		if (ap->owner != f)
			err = -EACCES;	/* only the file that created it */
	} else if (task_tgid(current) != ap->pid) {
		err = -EACCES;		/* only the guest it was created for */
	} else if (!ap->owner) {
		err = -ENODEV;		/* destroyed, or its tracer is gone */
	} else if (ap->nmaps) {
		err = -EBUSY;		/* one mapping: the one the tracer knows */
	} else {
		ap->nmaps = 1;
		ap->mm = current->mm;
		mmgrab(ap->mm);
		ap->start = vma->vm_start;
	}
	spin_unlock_irqrestore(&ap->lock, flags);
	if (err)
		goto out;
	vma->vm_flags |= VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY;
	vma->vm_private_data = ap;	/* the reference taken above */
	if (tracer_view) {
		vma->vm_ops = &vg_tracer_ops;
	} else {
		vma->vm_ops = &vg_guest_ops;
		atomic64_inc(&st.mappings);
	}
	return 0;
out:
	vg_ap_put(ap);
	return err;
}

static int vg_open(struct inode *inode, struct file *file)
{
	struct vg_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	spin_lock_init(&f->lock);
	init_waitqueue_head(&f->wait);
	INIT_LIST_HEAD(&f->aps);
	file->private_data = f;
	atomic64_inc(&st.files);
	return 0;
}

/*
 * vg_detach ends ap's tracing by f; with orphan (f is closing), an aperture
 * backed by a file is left to the guest until a tracer adopts it.
 * Precondition: vg_lock held.
 */
static void vg_detach(struct vg_file *f, struct vg_ap *ap, bool orphan)
{
	unsigned long flags;

	spin_lock_irqsave(&ap->lock, flags);
	ap->owner = NULL;
	ap->orphan = orphan && ap->memfd;
	spin_unlock_irqrestore(&ap->lock, flags);
	list_del(&ap->owner_link);
	f->naps--;
	vg_ap_put(ap);
}

static int vg_release(struct inode *inode, struct file *file)
{
	struct vg_file *f = file->private_data;
	struct vg_ap *ap, *n;

	mutex_lock(&vg_lock);
	list_for_each_entry_safe(ap, n, &f->aps, owner_link)
		vg_detach(f, ap, true);
	mutex_unlock(&vg_lock);
	kvfree(f->ring);
	kfree(f);
	atomic64_dec(&st.files);
	return 0;
}

/*
 * vg_backing_file records the file a shared mapping of the caller at
 * backing maps, if it covers the whole aperture: a tracer that adopts the
 * aperture must map the same file at the same offsets.
 */
static void vg_backing_file(struct vg_ap *ap, u64 backing)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	u64 size = (u64)ap->npages << PAGE_SHIFT;

	mmap_read_lock(mm);
	vma = vma_lookup(mm, backing);
	if (vma && vma->vm_file && (vma->vm_flags & VM_SHARED) && !(vma->vm_flags & (VM_IO | VM_PFNMAP)) &&
	    backing + size > backing &&
	    backing + size <= vma->vm_end) {
		ap->memfd = get_file(vma->vm_file);
		ap->file_pgoff = vma->vm_pgoff + ((backing - vma->vm_start) >> PAGE_SHIFT);
	}
	mmap_read_unlock(mm);
}

/*
 * vg_check_backing keeps the recorded backing file only if the pages
 * pinned are that file's, at the recorded offsets (the caller could have
 * mapped something else between the two looks): else nobody may adopt.
 */
static void vg_check_backing(struct vg_ap *ap)
{
	u32 i;

	for (i = 0; ap->memfd && i < ap->npages; i++) {
		struct page *pg = ap->pages[i];
		struct folio *folio = page_folio(pg);

		/* a page cache folio of the file: its index is the file offset in pages */
		if (READ_ONCE(folio->mapping) != ap->memfd->f_mapping ||
		    READ_ONCE(folio->index) + folio_page_idx(folio, pg) != ap->file_pgoff + i) {
			fput(ap->memfd);
			ap->memfd = NULL;
		}
	}
}

static int vg_back_pages(struct vg_ap *ap, int memfd, u64 backing)
{
	struct address_space *mapping;
	u32 i;
	long n;

	if (memfd < 0 && backing) {
		if (backing & ~PAGE_MASK)
			return -EINVAL;
		vg_backing_file(ap, backing);
		ap->pinned = true;
		n = pin_user_pages_fast(backing, ap->npages, FOLL_LONGTERM, ap->pages);
		if (n == ap->npages) {
			vg_check_backing(ap);
			return 0;
		}
		for (i = 0; n > 0 && i < n; i++) {
			unpin_user_page(ap->pages[i]);
			ap->pages[i] = NULL;
		}
		return n < 0 ? n : -EFAULT;
	}
	if (memfd < 0) {
		for (i = 0; i < ap->npages; i++) {
			ap->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
			if (!ap->pages[i])
				return -ENOMEM;
		}
		return 0;
	}
	ap->memfd = fget(memfd);
	if (!ap->memfd)
		return -EBADF;
	if (file_inode(ap->memfd)->i_sb->s_magic != TMPFS_MAGIC ||
	    i_size_read(file_inode(ap->memfd)) < ((loff_t)ap->npages << PAGE_SHIFT))
		return -EINVAL;	/* a memfd (tmpfs) file covering the aperture */
	mapping = ap->memfd->f_mapping;
	for (i = 0; i < ap->npages; i++) {
		struct page *pg = shmem_read_mapping_page_gfp(mapping, i, mapping_gfp_mask(mapping));

		if (IS_ERR(pg))
			return PTR_ERR(pg);
		ap->pages[i] = pg;	/* its reference, dropped at free */
	}
	return 0;
}

/* vg_may_trace: the caller may trace task (same user, or CAP_SYS_PTRACE). */
static bool vg_may_trace(struct task_struct *task)
{
	const struct cred *me = current_cred(), *them;
	bool ok;

	if (capable(CAP_SYS_PTRACE))
		return true;
	rcu_read_lock();
	them = __task_cred(task);
	ok = uid_eq(me->uid, them->uid) && uid_eq(me->uid, them->euid) && uid_eq(me->uid, them->suid);
	rcu_read_unlock();
	return ok;
}

/* vg_file_ring gives f its event ring, at its first aperture. */
static int vg_file_ring(struct vg_file *f)
{
	struct vg_event *ring;
	unsigned long flags;

	if (READ_ONCE(f->ring))
		return 0;
	ring = kvcalloc(VG_RING, sizeof(*ring), GFP_KERNEL);
	if (!ring)
		return -ENOMEM;
	spin_lock_irqsave(&f->lock, flags);
	if (!f->ring)
		swap(f->ring, ring);
	spin_unlock_irqrestore(&f->lock, flags);
	kvfree(ring);
	return 0;
}

static struct vg_ap *vg_new_ap(struct vg_create *c)
{
	struct vg_ap *ap;
	u64 npages = c->size >> PAGE_SHIFT;

	if (!c->size || (c->size & ~PAGE_MASK) || npages > VG_MAX_PAGES)
		return ERR_PTR(-EINVAL);
	if (c->mode != VG_MODE_WRITE && c->mode != VG_MODE_PAGE && c->mode != VG_MODE_AUTO)
		return ERR_PTR(-EINVAL);
	if (atomic64_add_return(npages, &st.pages) > max_pages) {
		atomic64_sub(npages, &st.pages);
		return ERR_PTR(-ENOSPC);
	}
	ap = kmem_cache_zalloc(ap_cache, GFP_KERNEL);
	if (!ap) {
		atomic64_sub(npages, &st.pages);
		return ERR_PTR(-ENOMEM);
	}
	kref_init(&ap->ref);
	spin_lock_init(&ap->lock);
	ap->npages = npages;
	ap->mode = c->mode;
	atomic64_inc(&st.apertures);
	__module_get(THIS_MODULE);	/* dropped by vg_free_work */
	ap->pages = kvcalloc(npages, sizeof(*ap->pages), GFP_KERNEL);
	ap->open = bitmap_zalloc(npages, GFP_KERNEL);
	if (c->mode == VG_MODE_AUTO)
		ap->streak = kvzalloc(npages, GFP_KERNEL);
	return ap;
}

static long vg_create(struct vg_file *f, struct vg_create __user *uc)
{
	struct vg_create c;
	struct vg_ap *ap;
	struct pid *pid;
	struct task_struct *task;
	long err;
	int id;

	if (copy_from_user(&c, uc, sizeof(c)))
		return -EFAULT;
	pid = c.pid ? find_get_pid(c.pid) : get_pid(task_tgid(current));
	task = pid ? get_pid_task(pid, PIDTYPE_TGID) : NULL;
	if (!task) {
		put_pid(pid);
		return -ESRCH;
	}
	err = vg_may_trace(task) ? 0 : -EPERM;
	put_task_struct(task);
	if (err) {
		put_pid(pid);
		return err;
	}
	ap = vg_new_ap(&c);
	if (IS_ERR(ap)) {
		put_pid(pid);
		return PTR_ERR(ap);
	}
	ap->pid = pid;	/* freed with ap from here on */
	if (!ap->pages || !ap->open || (c.mode == VG_MODE_AUTO && !ap->streak)) {
		err = -ENOMEM;
		goto fail;
	}
	err = vg_back_pages(ap, c.memfd, c.backing);
	if (!err)
		err = vg_file_ring(f);
	if (err)
		goto fail;
	mutex_lock(&vg_lock);
	if (f->naps >= VG_MAX_APS_PER_FILE) {
		mutex_unlock(&vg_lock);
		err = -EMFILE;
		goto fail;
	}
	id = idr_alloc_cyclic(&vg_idr, ap, 1, 1 << 20, GFP_KERNEL);
	if (id < 0) {
		mutex_unlock(&vg_lock);
		err = id;
		goto fail;
	}
	ap->id = id;
	ap->owner = f;
	list_add(&ap->owner_link, &f->aps);
	f->naps++;
	mutex_unlock(&vg_lock);
	c.id = id;
	c.guest_off = ((u64)id << (VG_VIEW_SHIFT + 1)) << PAGE_SHIFT;
	c.tracer_off = c.guest_off | ((1ull << VG_VIEW_SHIFT) << PAGE_SHIFT);
	if (copy_to_user(uc, &c, sizeof(c))) {
		mutex_lock(&vg_lock);
		vg_detach(f, ap, false);	/* drops the last reference */
		mutex_unlock(&vg_lock);
		return -EFAULT;
	}
	return 0;
fail:
	vg_ap_put(ap);	/* not in the idr yet: id 0 is never allocated, idr_remove ignores it */
	return err;
}

/* vg_own_ap finds aperture id created by f. Precondition: vg_lock held. */
static struct vg_ap *vg_own_ap(struct vg_file *f, u32 id)
{
	struct vg_ap *ap = idr_find(&vg_idr, id);

	return ap && ap->owner == f ? ap : NULL;
}

/* vg_zap_guest takes every page of ap's guest mapping away. */
static void vg_zap_guest(struct vg_ap *ap)
{
	struct vm_area_struct *vma;
	struct mm_struct *mm;
	unsigned long flags, start;

	spin_lock_irqsave(&ap->lock, flags);
	mm = ap->mm;
	start = ap->start;
	if (mm && !mmget_not_zero(mm))
		mm = NULL;
	spin_unlock_irqrestore(&ap->lock, flags);
	if (!mm)
		return;
	mmap_read_lock(mm);
	vma = find_vma(mm, start);
	if (vma && vma->vm_start == start && vma->vm_ops == &vg_guest_ops && vma->vm_private_data == ap)
		zap_vma_ptes(vma, start, (unsigned long)ap->npages << PAGE_SHIFT);
	mmap_read_unlock(mm);
	mmput(mm);
}

static long vg_destroy(struct vg_file *f, u32 __user *uid)
{
	struct vg_ap *ap;
	u32 id;

	if (get_user(id, uid))
		return -EFAULT;
	mutex_lock(&vg_lock);
	ap = vg_own_ap(f, id);
	if (ap) {
		kref_get(&ap->ref);
		vg_detach(f, ap, false);
	}
	mutex_unlock(&vg_lock);
	if (!ap)
		return -ENOENT;
	vg_zap_guest(ap);	/* open pages too: every later store is refused */
	vg_ap_put(ap);
	return 0;
}

/* vg_take_open zaps ap's open pages in its guest mapping; their bits are left in open. */
static int vg_take_open(struct vg_ap *ap, unsigned long *open)
{
	struct mm_struct *mm;
	struct vm_area_struct *vma;
	unsigned long flags, start, i;
	int n = 0;

	spin_lock_irqsave(&ap->lock, flags);
	mm = ap->mm;
	start = ap->start;
	if (mm && !mmget_not_zero(mm))
		mm = NULL;
	bitmap_copy(open, ap->open, ap->npages);
	bitmap_zero(ap->open, ap->npages);
	if (ap->streak)
		memset(ap->streak, 0, ap->npages);
	spin_unlock_irqrestore(&ap->lock, flags);
	if (!mm)
		return bitmap_weight(open, ap->npages);	/* no mapping: nothing to zap, compare all the same */
	mmap_read_lock(mm);
	vma = find_vma(mm, start);
	if (vma && vma->vm_start == start && vma->vm_ops == &vg_guest_ops && vma->vm_private_data == ap) {
		for_each_set_bit(i, open, ap->npages) {
			zap_vma_ptes(vma, start + (i << PAGE_SHIFT), PAGE_SIZE);
			n++;
		}
	}
	mmap_read_unlock(mm);
	mmput(mm);
	atomic64_add(n, &st.flushed);
	return bitmap_weight(open, ap->npages);
}

static long vg_flush(struct vg_file *f, struct vg_flush __user *uf)
{
	struct vg_flush fl;
	struct vg_ap *ap;
	unsigned long *open;
	long err = 0;

	if (copy_from_user(&fl, uf, sizeof(fl)))
		return -EFAULT;
	mutex_lock(&vg_lock);
	ap = vg_own_ap(f, fl.id);
	if (ap)
		kref_get(&ap->ref);
	mutex_unlock(&vg_lock);
	if (!ap)
		return -ENOENT;
	if (fl.npages < ap->npages) {
		err = -EINVAL;
		goto out;
	}
	open = bitmap_zalloc(ap->npages, GFP_KERNEL);
	if (!open) {
		err = -ENOMEM;
		goto out;
	}
	fl.nopen = vg_take_open(ap, open);
	if (copy_to_user(u64_to_user_ptr(fl.bitmap), open, BITS_TO_LONGS(ap->npages) * sizeof(long)) ||
	    copy_to_user(uf, &fl, sizeof(fl))) {
		unsigned long flags;

		spin_lock_irqsave(&ap->lock, flags);	/* not told: the next flush lists them again */
		bitmap_or(ap->open, ap->open, open, ap->npages);
		spin_unlock_irqrestore(&ap->lock, flags);
		err = -EFAULT;
	}
	bitmap_free(open);
out:
	vg_ap_put(ap);
	return err;
}

/*
 * vg_adoptable checks that f may take over ap: an orphan of guest tgid,
 * backed by inode at pgoff, of npages. Precondition: vg_lock held.
 */
static int vg_adoptable(struct vg_file *f, struct vg_ap *ap, struct pid *tgid, struct inode *inode,
			pgoff_t pgoff, u64 npages)
{
	unsigned long flags;
	int err = 0;

	if (!ap)
		return -ENOENT;
	spin_lock_irqsave(&ap->lock, flags);
	if (ap->pid != tgid)
		err = -EACCES;	/* another guest's */
	else if (ap->owner || !ap->orphan)
		err = -EBUSY;	/* traced, or destroyed */
	else if (file_inode(ap->memfd) != inode || ap->file_pgoff != pgoff || ap->npages != npages)
		err = -EINVAL;	/* the caller does not hold its pages */
	spin_unlock_irqrestore(&ap->lock, flags);
	if (!err && f->naps >= VG_MAX_APS_PER_FILE)
		err = -EMFILE;
	return err;
}

/*
 * vg_take_over makes f ap's tracer, in mode; a.guest_start says where the
 * guest maps it. Precondition: vg_lock held, vg_adoptable passed.
 */
static int vg_take_over(struct vg_file *f, struct vg_ap *ap, struct vg_adopt *a, u8 **streak)
{
	unsigned long flags;

	if (!kref_get_unless_zero(&ap->ref))
		return -ENOENT;	/* being freed */
	spin_lock_irqsave(&ap->lock, flags);
	if (a->mode == VG_MODE_AUTO && !ap->streak)
		swap(ap->streak, *streak);
	WRITE_ONCE(ap->mode, a->mode);
	ap->owner = f;
	ap->orphan = false;
	a->guest_start = ap->nmaps ? ap->start : 0;
	spin_unlock_irqrestore(&ap->lock, flags);
	list_add(&ap->owner_link, &f->aps);
	f->naps++;
	atomic64_inc(&st.adopted);
	return 0;
}

/* vg_adopt takes over an orphaned aperture (struct vg_adopt says how). */
static long vg_adopt(struct vg_file *f, struct vg_adopt __user *ua)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct task_struct *task;
	struct vg_ap *ap = NULL;
	struct vg_adopt a;
	u8 *streak = NULL;
	struct pid *pid;
	long err;

	if (copy_from_user(&a, ua, sizeof(a)))
		return -EFAULT;
	if (a.mode < VG_MODE_WRITE || a.mode > VG_MODE_AUTO || !a.size || (a.size & ~PAGE_MASK) ||
	    (a.backing & ~PAGE_MASK) || (a.size >> PAGE_SHIFT) > VG_MAX_PAGES || a.pid <= 0)
		return -EINVAL;
	pid = find_get_pid(a.pid);
	task = pid ? get_pid_task(pid, PIDTYPE_TGID) : NULL;
	put_pid(pid);
	if (!task)
		return -ESRCH;
	err = vg_may_trace(task) ? 0 : -EPERM;
	if (!err)
		err = vg_file_ring(f);
	if (!err && a.mode == VG_MODE_AUTO) {
		streak = kvzalloc(a.size >> PAGE_SHIFT, GFP_KERNEL);
		err = streak ? 0 : -ENOMEM;
	}
	if (err)
		goto out;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, a.backing);
	err = -EINVAL;
	if (vma && vma->vm_file && a.backing + a.size > a.backing && a.backing + a.size <= vma->vm_end) {
		pgoff_t pgoff = vma->vm_pgoff + ((a.backing - vma->vm_start) >> PAGE_SHIFT);

		mutex_lock(&vg_lock);
		ap = idr_find(&vg_idr, a.id);
		err = vg_adoptable(f, ap, task_tgid(task), file_inode(vma->vm_file), pgoff, a.size >> PAGE_SHIFT);
		if (!err)
			err = vg_take_over(f, ap, &a, &streak);
		mutex_unlock(&vg_lock);
	}
	mmap_read_unlock(mm);
	if (err)
		goto out;
	a.guest_off = ((u64)a.id << (VG_VIEW_SHIFT + 1)) << PAGE_SHIFT;
	a.tracer_off = a.guest_off | ((1ull << VG_VIEW_SHIFT) << PAGE_SHIFT);
	if (copy_to_user(ua, &a, sizeof(a))) {
		mutex_lock(&vg_lock);
		vg_detach(f, ap, true);	/* an orphan again */
		mutex_unlock(&vg_lock);
		err = -EFAULT;
	}
out:
	kvfree(streak);
	put_task_struct(task);
	return err;
}

static long vg_stats(struct vg_stats __user *us)
{
	struct vg_stats s = {
		.faults = atomic64_read(&st.faults), .steps = atomic64_read(&st.steps),
		.events = atomic64_read(&st.events), .overflows = atomic64_read(&st.overflows),
		.window = atomic64_read(&st.window), .refused = atomic64_read(&st.refused),
		.flushed_pages = atomic64_read(&st.flushed), .apertures = atomic64_read(&st.apertures),
		.mappings = atomic64_read(&st.mappings), .pending = atomic_read(&npend),
		.pages = atomic64_read(&st.pages), .files = atomic64_read(&st.files),
		.unfinished = atomic64_read(&st.unfinished), .streaks = atomic64_read(&st.streaks),
		.orphan_stores = atomic64_read(&st.orphan_stores), .adopted = atomic64_read(&st.adopted),
	};

	return copy_to_user(us, &s, sizeof(s)) ? -EFAULT : 0;
}

static long vg_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct vg_file *f = file->private_data;
	void __user *u = (void __user *)arg;

	switch (cmd) {
	case VG_IOC_CREATE:
		return vg_create(f, u);
	case VG_IOC_DESTROY:
		return vg_destroy(f, u);
	case VG_IOC_FLUSH:
		return vg_flush(f, u);
	case VG_IOC_STATS:
		return vg_stats(u);
	case VG_IOC_ADOPT:
		return vg_adopt(f, u);
	}
	return -ENOTTY;
}

/* vg_read hands over whole events, oldest first. */
static ssize_t vg_read(struct file *file, char __user *buf, size_t len, loff_t *pos)
{
	struct vg_file *f = file->private_data;
	size_t done = 0;
	int err;

	if (len < sizeof(struct vg_event))
		return -EINVAL;
	for (;;) {
		while (done + sizeof(struct vg_event) <= len) {
			struct vg_event ev;
			unsigned long flags;
			bool any;

			spin_lock_irqsave(&f->lock, flags);
			any = f->ring && f->head != f->tail;
			if (any) {
				ev = f->ring[f->tail % VG_RING];
				f->tail++;
			}
			spin_unlock_irqrestore(&f->lock, flags);
			if (!any)
				break;
			if (copy_to_user(buf + done, &ev, sizeof(ev)))
				return done ? done : -EFAULT;	/* an event lost here is the reader's own doing */
			done += sizeof(ev);
		}
		if (done || (file->f_flags & O_NONBLOCK))
			return done ? done : -EAGAIN;
		err = wait_event_interruptible(f->wait, READ_ONCE(f->head) != READ_ONCE(f->tail));
		if (err)
			return err;
	}
}

static __poll_t vg_poll(struct file *file, poll_table *wait)
{
	struct vg_file *f = file->private_data;

	poll_wait(file, &f->wait, wait);
	return READ_ONCE(f->head) != READ_ONCE(f->tail) ? EPOLLIN | EPOLLRDNORM : 0;
}

static const struct file_operations vg_fops = {
	.owner = THIS_MODULE,
	.open = vg_open,
	.release = vg_release,
	.unlocked_ioctl = vg_ioctl,
	.mmap = vg_mmap,
	.read = vg_read,
	.poll = vg_poll,
	.llseek = noop_llseek,
};

static ssize_t stats_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf,
			  "faults %lld\nsteps %lld\nevents %lld\noverflows %lld\nwindow_bytes %lld\nrefused %lld\n"
			  "flushed_pages %lld\napertures %lld\nmappings %lld\npending %d\npages %lld\nfiles %lld\n"
			  "unfinished %lld\nstreaks %lld\norphan_stores %lld\nadopted %lld\n",
			  atomic64_read(&st.faults), atomic64_read(&st.steps), atomic64_read(&st.events),
			  atomic64_read(&st.overflows), atomic64_read(&st.window), atomic64_read(&st.refused),
			  atomic64_read(&st.flushed), atomic64_read(&st.apertures), atomic64_read(&st.mappings),
			  atomic_read(&npend), atomic64_read(&st.pages), atomic64_read(&st.files),
			  atomic64_read(&st.unfinished), atomic64_read(&st.streaks),
			  atomic64_read(&st.orphan_stores), atomic64_read(&st.adopted));
}
static DEVICE_ATTR_RO(stats);

static struct attribute *vg_attrs[] = { &dev_attr_stats.attr, NULL };
ATTRIBUTE_GROUPS(vg);

static struct miscdevice vg_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "vgpuha_mmio",
	.fops = &vg_fops,
	.groups = vg_groups,
	.mode = 0666,
};

static int __init vg_init(void)
{
	int err;

	ap_cache = kmem_cache_create("vgpuha_ap", sizeof(struct vg_ap), 0, 0, NULL);
	pend_cache = kmem_cache_create("vgpuha_pend", sizeof(struct vg_pend), 0, 0, NULL);
	snap_cache = kmem_cache_create("vgpuha_snap", 2 * PAGE_SIZE, PAGE_SIZE, 0, NULL);
	vg_wq = alloc_workqueue("vgpuha_mmio", 0, 0);
	err = -ENOMEM;
	if (!ap_cache || !pend_cache || !snap_cache || !vg_wq)
		goto wq;
	err = register_die_notifier(&vg_die_nb);
	if (err)
		goto wq;
	err = misc_register(&vg_misc);
	if (err)
		goto die;
	return 0;
die:
	unregister_die_notifier(&vg_die_nb);
wq:
	if (vg_wq)
		destroy_workqueue(vg_wq);
	kmem_cache_destroy(snap_cache);
	kmem_cache_destroy(pend_cache);
	kmem_cache_destroy(ap_cache);
	return err;
}

static void __exit vg_exit(void)
{
	misc_deregister(&vg_misc);
	unregister_die_notifier(&vg_die_nb);
	destroy_workqueue(vg_wq);	/* drains the last frees */
	idr_destroy(&vg_idr);
	kmem_cache_destroy(snap_cache);	/* complains in dmesg about anything left */
	kmem_cache_destroy(pend_cache);
	kmem_cache_destroy(ap_cache);
}

module_init(vg_init);
module_exit(vg_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vgpuha: in-kernel tracer of guest stores to MMIO apertures");
