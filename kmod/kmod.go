// Package kmod holds vgpuha's kernel-side pieces.
//
// module/ is the in-kernel MMIO tracer, vgpuha_mmio (C, kbuild; its file
// comment says how it works), and Device (device_linux.go) its user-space
// interface: apertures a tracer creates for a guest process (or adopts
// from a tracer that went away: a node taking a guest's session over), the
// events the module records for each store, the pages it leaves open in
// page mode. Package mmiotrace's kmod modes use it; this package decides
// nothing about what a write means. Modules cannot be loaded on the
// development machines: `make kmod-test` builds the module against the
// headers of the Debian kernel scripts/setup-test-deps.sh fetches and
// runs it in a qemu VM (TestModuleInVM).
//
// faultcount/ is an eBPF page-fault counter, the independent check on
// every tracer's fault count (the lab's and the tests' only).
package kmod
