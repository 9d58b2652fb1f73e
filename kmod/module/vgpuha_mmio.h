/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vgpuha_mmio: the user-space interface of the in-kernel MMIO tracer.
 * kmod/device_linux.go mirrors these numbers and layouts; change both.
 *
 * A tracer (the hypervisor) opens /dev/vgpuha_mmio and creates an
 * aperture for a guest process (VG_IOC_CREATE). The guest maps it by
 * opening the device itself and mmap()ing guest_off; no other process can.
 * Writes the guest makes to its mapping fault into the module:
 *   VG_MODE_WRITE: every store is recorded (address, instruction pointer,
 *     instruction bytes, the bytes at the address after the store runs
 *     under the trap flag) as an event the tracer read()s;
 *   VG_MODE_PAGE: the first store to a page after a flush marks it open;
 *     VG_IOC_FLUSH takes the open pages away again and tells which.
 *   VG_MODE_AUTO: per write, until a page takes a streak of stores within
 *     one flush interval: it is then tracked as in page mode until the
 *     next flush (doorbell-like pages, stored to now and then, stay per
 *     write).
 * A tracer whose file closes without destroying an aperture backed by a
 * file (a memfd, or a shared mapping of one) leaves it to the guest: its
 * stores go on into the file's pages, each page marked open, until a
 * tracer adopts the aperture (VG_IOC_ADOPT: a node the guest's session
 * resumes on after a failover), which flushes and traces it from then on.
 * An aperture destroyed, or backed by the module's own pages (nobody else
 * can read them), refuses the guest's stores (SIGBUS) instead.
 */
#ifndef VGPUHA_MMIO_H
#define VGPUHA_MMIO_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define VG_MODE_WRITE 1
#define VG_MODE_PAGE 2
#define VG_MODE_AUTO 3	/* per write, but a page stored to more than auto_streak times
			 * between two flushes stays open (page mode) until the next */

#define VG_MAX_PAGES (1u << 20)	/* pages in one aperture (4 GiB) */
#define VG_VIEW_SHIFT 20	/* mmap page offset: id << 21 | view << 20 */

struct vg_create {
	__u64 size;	/* bytes, whole pages, at most VG_MAX_PAGES pages */
	__s32 pid;	/* the guest process (thread group id); 0: the caller */
	__u32 mode;	/* VG_MODE_* */
	__s32 memfd;	/* a tmpfs (memfd) file of at least size bytes whose pages back
			 * the aperture, or -1 */
	__u32 id;	/* out */
	__u64 guest_off;  /* out: the guest's mmap offset */
	__u64 tracer_off; /* out: the tracer's own mapping (never traced) */
	__u64 backing;	/* with memfd -1: the address of a mapping in the caller whose
			 * pages back the aperture (pinned), or 0 for zeroed pages of
			 * the module's own */
};

/*
 * VG_IOC_ADOPT: take over an aperture whose tracer is gone. The caller
 * must be allowed to trace pid (the aperture's guest), and map, at
 * backing, the file backing the aperture, at the same offsets (the
 * pages the guest writes are the pages the caller reads).
 */
struct vg_adopt {
	__u32 id;	/* the aperture (the guest's mapping offset names it) */
	__s32 pid;	/* the guest it was created for */
	__u32 mode;	/* VG_MODE_* from now on */
	__u32 pad;
	__u64 size;	/* the aperture's bytes */
	__u64 backing;	/* the caller's mapping of the backing file */
	__u64 guest_start; /* out: where the guest maps the aperture (0: nowhere) */
	__u64 guest_off;   /* out */
	__u64 tracer_off;  /* out */
};

struct vg_flush {
	__u32 id;
	__u32 npages;	/* bits in the buffer at bitmap; at least the aperture's pages */
	__u64 bitmap;	/* user pointer: set bits are the pages found open (compare them) */
	__u32 nopen;	/* out: pages found open */
	__u32 pad;
};

struct vg_stats {
	__u64 faults;		/* write faults handled */
	__u64 steps;		/* stores completed under the trap flag */
	__u64 events;		/* events queued */
	__u64 overflows;	/* events the ring had no room for: page left open, compared at flush */
	__u64 window;		/* bytes changed by other threads while a page was open for a step */
	__u64 refused;		/* write faults refused (SIGBUS / EFAULT) */
	__u64 flushed_pages;	/* pages taken away again by flushes */
	__u64 apertures;	/* live apertures */
	__u64 mappings;		/* live guest mappings */
	__u64 pending;		/* stores stepping now */
	__u64 pages;		/* pages held by apertures */
	__u64 files;		/* open device files */
	__u64 unfinished;	/* traps that found the thread moved elsewhere (a signal handler): pages compared at flush */
	__u64 streaks;		/* auto mode: pages switched to page tracking until the next flush */
	__u64 orphan_stores;	/* store faults on apertures whose tracer is gone (pages marked open) */
	__u64 adopted;		/* apertures taken over by another tracer (VG_IOC_ADOPT) */
};

#define VG_EV_STORE 1	/* one store: insn, ip, data from addr */
#define VG_EV_RANGE 2	/* bytes another thread changed on a page open for a step */

#define VG_EV_DATA 64

struct vg_event {
	__u64 seq;
	__u32 id;	/* aperture */
	__u16 type;	/* VG_EV_* */
	__u16 len;	/* valid bytes in data */
	__u64 off;	/* offset of addr in the aperture */
	__u64 ip;
	__u8 insn[16];
	__u8 insn_len;
	__u8 flags;
	__u8 pad[14];
	__u8 data[VG_EV_DATA];
};	/* 128 bytes */

#define VG_IOC_CREATE _IOWR('v', 1, struct vg_create)
#define VG_IOC_DESTROY _IOW('v', 2, __u32)
#define VG_IOC_FLUSH _IOWR('v', 3, struct vg_flush)
#define VG_IOC_STATS _IOR('v', 4, struct vg_stats)
#define VG_IOC_ADOPT _IOWR('v', 5, struct vg_adopt)

#endif
