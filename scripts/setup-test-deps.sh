#!/usr/bin/env bash
# Installs what the test suite needs beyond Go, on a Debian machine, and
# unpacks a Debian kernel for the VM tests into .vm/. Idempotent: quick when
# everything is already there. Without root or apt it says what is missing
# and carries on; the VM tests then skip with that reason.
set -euo pipefail
# apt_quiet is apt-get without the notes a root download into a folder apt's
# own user cannot write, and a system without apt-utils, print on every run
# (errors still show).
apt_quiet() {
	apt-get -o APT::Sandbox::User=root "$@" 2> >(grep -v -e '^W: Download is performed unsandboxed' -e '^debconf: delaying package configuration' >&2)
}
cd "$(dirname "$0")/.."

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && file /bin/busybox 2>/dev/null | grep -q static || [ -e /usr/share/doc/busybox-static ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v tc >/dev/null && command -v ip >/dev/null || need+=(iproute2)   # the drill's namespaces and link cuts
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)   # kbuild: the kernel module for the VM tests
ldconfig -p 2>/dev/null | grep -q 'libelf.so.1 ' || need+=(libelf1)   # kbuild's objtool
command -v zsh >/dev/null || need+=(zsh)   # shell completion scripts are syntax-checked
command -v fish >/dev/null || need+=(fish)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "setup: installing ${need[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt_quiet update -q >/dev/null
		apt_quiet install -y -q "${need[@]}" >/dev/null
	else
		echo "setup: missing ${need[*]} and cannot apt-get install them; VM tests will skip" >&2
	fi
fi

# A Debian kernel and its modules for the qemu VM tests (vsock, kmod).
if [ ! -f .vm/vmlinuz ] && command -v apt-get >/dev/null; then
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
	if [ -n "$pkg" ]; then
		echo "setup: fetching $pkg for the VM tests"
		rm -rf .vm/tmp && mkdir -p .vm/tmp
		(cd .vm/tmp && apt_quiet download -q "$pkg" >/dev/null)
		dpkg-deb -x .vm/tmp/*.deb .vm/tmp/root
		kver=${pkg#linux-image-}
		cp .vm/tmp/root/boot/vmlinuz-"$kver" .vm/vmlinuz.tmp
		rm -rf .vm/modules && mv .vm/tmp/root/lib/modules/"$kver" .vm/modules
		echo "$kver" > .vm/kernel-version
		mv .vm/vmlinuz.tmp .vm/vmlinuz
		rm -rf .vm/tmp
	else
		echo "setup: no linux-image package found; VM tests will skip" >&2
	fi
fi
# Headers for that kernel, to build kmod/module (the in-kernel MMIO tracer)
# for the VM: linux-headers-VER-amd64 and what it depends on (the common
# headers, kbuild), unpacked under .vm/headers; its Makefile is pointed at
# the common headers there (Debian's names /usr/src).
if [ -f .vm/kernel-version ] && [ ! -f .vm/headers/build/Makefile ] && command -v apt-get >/dev/null; then
	kver=$(cat .vm/kernel-version)
	hpkg=linux-headers-$kver
	deps=$(apt-cache depends "$hpkg" 2>/dev/null | awk '/Depends: linux-(headers|kbuild)-/ {print $2}')
	if [ -n "$deps" ]; then
		echo "setup: fetching $hpkg" $deps "for the kernel module"
		rm -rf .vm/htmp && mkdir -p .vm/htmp
		(cd .vm/htmp && apt_quiet download -q "$hpkg" $deps >/dev/null)
		for d in .vm/htmp/*.deb; do dpkg-deb -x "$d" .vm/htmp/root; done
		rm -rf .vm/headers && mkdir -p .vm/headers
		mv .vm/htmp/root/usr .vm/headers/usr
		common=$(cd .vm/headers/usr/src && ls -d linux-headers-*-common | head -1)
		ln -s "usr/src/$hpkg" .vm/headers/build
		sed -i "s|include /usr/src/$common/Makefile|include \$(dir \$(lastword \$(MAKEFILE_LIST)))../$common/Makefile|" .vm/headers/usr/src/"$hpkg"/Makefile
		rm -rf .vm/htmp
		# The compiler the kernel was built with (Debian names it: gcc-12).
		cc=$(awk '/^CC =/ {print $NF}' .vm/headers/build/.kernelvariables | sed 's/.*gcc/gcc/')
		if [ -n "$cc" ] && ! command -v "$cc" >/dev/null; then
			if [ "$(id -u)" = 0 ]; then
				apt-get install -y -q "$cc" >/dev/null || echo "setup: cannot install $cc; the kernel module tests will fail to build" >&2
			else
				echo "setup: $cc missing (apt-get install $cc); the kernel module tests will fail to build" >&2
			fi
		fi
	else
		echo "setup: no $hpkg package found; the kernel module tests will skip" >&2
	fi
fi
echo "setup: test dependencies ready"
